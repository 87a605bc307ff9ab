"""The stack file, whole: its schema (every section), and YAML read with the line of every
value. ``shipyard serve --config`` loads it at start (StackFile.load); ``shipyard apply``
converges its resource sections (cli/apply.py); ``PUT /stack`` changes its ``topics:`` and
``jobs:`` sections live (stack_config.py).

``models``, ``endpoint_configs``, ``endpoints`` and ``inference_components`` map a name to
the body of its SageMaker Create call without the name; ``scaling`` maps
``endpoint/variant`` to one scalable target and its target-tracking policy; ``alarms`` a
CloudWatch alarm's name to its PutMetricAlarm body. The fields
checked here are the ones a plan depends on (names, counts, weights, references);
everything else in a body is passed through to the gateway, which validates it against
the service model on the Create call.

Errors name the file, the line and the field, one per line::

    stack.yaml:12: endpoint_configs.scores-v1.ProductionVariants[0].InitialVariantWeight:
    Input should be a valid number
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"
"""SageMaker's pattern for model, endpoint config, endpoint and variant names."""


class ProductionVariant(BaseModel):
    """One entry of ``ProductionVariants`` (or ``ShadowProductionVariants``)."""

    model_config = ConfigDict(extra="allow")

    VariantName: str = Field(pattern=_NAME, max_length=63)
    """The variant's name, unique in its endpoint config."""
    ModelName: str | None = Field(default=None, pattern=_NAME, max_length=63)
    """A model the file declares (its deployed version is used) or one that exists."""
    InstanceType: str | None = None
    """The instance type (``ml.m5.large``): its memory and devices are what an instance is
    counted as; absent for a serverless variant (``ServerlessConfig``)."""
    InitialInstanceCount: int | None = Field(default=None, ge=0, strict=True)
    """Instances the variant starts with."""
    InitialVariantWeight: float | None = Field(default=None, ge=0, strict=True)
    """Its share of the endpoint's traffic, relative to the other variants' weights."""


class ModelBody(BaseModel):
    """CreateModel without ``ModelName``."""

    model_config = ConfigDict(extra="allow")

    PrimaryContainer: dict[str, Any] | None = None
    """The model's container: ``Image``, ``ModelDataUrl``, ``Environment``, ``Mode``."""
    Containers: list[dict[str, Any]] | None = None
    """An inference pipeline's containers, in order, instead of ``PrimaryContainer``."""
    Tags: list[dict[str, str]] = Field(default_factory=list)
    """``Key``/``Value`` pairs; ``shipyard apply`` adds its stack's own."""


class EndpointConfigBody(BaseModel):
    """CreateEndpointConfig without ``EndpointConfigName``."""

    model_config = ConfigDict(extra="allow")

    ProductionVariants: list[ProductionVariant] = Field(min_length=1)
    """The variants that serve the endpoint's traffic; at least one."""
    ShadowProductionVariants: list[ProductionVariant] | None = None
    """Variants sent a copy of the production traffic, whose answers are not returned."""
    Tags: list[dict[str, str]] = Field(default_factory=list)
    """``Key``/``Value`` pairs; ``shipyard apply`` adds its stack's own."""


class EndpointBody(BaseModel):
    """CreateEndpoint without ``EndpointName``."""

    model_config = ConfigDict(extra="forbid")

    EndpointConfigName: str = Field(pattern=_NAME, max_length=63)
    """An endpoint config the file declares (its deployed version is used) or one that
    exists."""
    DeploymentConfig: dict[str, Any] | None = None
    """How an update to a new config is carried out (canary, linear, rolling, with
    AutoRollbackConfiguration alarms, which may be ones the file declares)."""
    Tags: list[dict[str, str]] = Field(default_factory=list)
    """``Key``/``Value`` pairs; ``shipyard apply`` adds its stack's own."""


class AlarmBody(BaseModel):
    """PutMetricAlarm's body without ``AlarmName`` (the key it is listed under)."""

    model_config = ConfigDict(extra="allow")

    ComparisonOperator: str
    """How the statistic is compared with ``Threshold`` (``GreaterThanThreshold``, ...)."""
    EvaluationPeriods: int = Field(ge=1, strict=True)
    """Periods over which the statistic is compared with ``Threshold``."""
    Threshold: float | None = Field(default=None, strict=True)
    """The value compared with the statistic."""
    Tags: list[dict[str, str]] = Field(default_factory=list)
    """``Key``/``Value`` pairs; ``shipyard apply`` adds its stack's own."""


class ComponentBody(BaseModel):
    """CreateInferenceComponent without ``InferenceComponentName``."""

    model_config = ConfigDict(extra="forbid")

    EndpointName: str = Field(pattern=_NAME, max_length=63)
    """An endpoint the file declares, or one that exists."""
    VariantName: str | None = Field(default=None, pattern=_NAME, max_length=63)
    """The endpoint's variant the component is placed on."""
    Specification: dict[str, Any]
    """Its ``ModelName`` may name a model the file declares (its deployed version is used)."""
    RuntimeConfig: dict[str, Any] | None = None
    """``CopyCount``: copies of the component to start."""
    Tags: list[dict[str, str]] = Field(default_factory=list)
    """``Key``/``Value`` pairs; ``shipyard apply`` adds its stack's own."""


class ScalingTarget(BaseModel):
    """RegisterScalableTarget on one variant, and one target-tracking policy on it."""

    model_config = ConfigDict(extra="forbid")

    MinCapacity: int = Field(ge=0, strict=True)
    """Fewest instances the variant is scaled to; at most ``MaxCapacity``."""
    MaxCapacity: int = Field(ge=1, strict=True)
    """Most instances the variant is scaled to."""
    TargetValue: float = Field(gt=0, strict=True)
    """The value of the metric the policy keeps the variant at."""
    PredefinedMetricType: str = "SageMakerVariantInvocationsPerInstance"
    """The metric tracked, a PredefinedMetricType of Application Auto Scaling."""
    ScaleInCooldown: int | None = Field(default=None, ge=0, strict=True)
    """Seconds after a scale-in before another scale-in."""
    ScaleOutCooldown: int | None = Field(default=None, ge=0, strict=True)
    """Seconds after a scale-out before another scale-out."""


class StackResources(BaseModel):
    """What ``shipyard apply`` creates on a running gateway; ``serve`` leaves it alone."""

    model_config = ConfigDict()

    models: dict[str, ModelBody] = Field(default_factory=dict)
    """Model name -> CreateModel body without the name."""
    endpoint_configs: dict[str, EndpointConfigBody] = Field(default_factory=dict)
    """Endpoint config name -> CreateEndpointConfig body without the name."""
    endpoints: dict[str, EndpointBody] = Field(default_factory=dict)
    """Endpoint name -> CreateEndpoint body without the name."""
    scaling: dict[str, ScalingTarget] = Field(default_factory=dict)
    """``endpoint/variant`` -> its scalable target and target-tracking policy."""
    inference_components: dict[str, ComponentBody] = Field(default_factory=dict)
    """Inference component name -> CreateInferenceComponent body without the name."""
    alarms: dict[str, AlarmBody] = Field(default_factory=dict)
    """CloudWatch alarm name -> PutMetricAlarm body without the name."""

    def check_resources(self) -> None:
        """Names are SageMaker names and ``scaling`` keys name a declared endpoint."""
        for section in ("models", "endpoint_configs", "endpoints", "inference_components"):
            for name in getattr(self, section):
                if not _valid_name(name):
                    raise ValueError(f"{section}.{name}: not a SageMaker name ({_NAME})")
        for key in self.scaling:
            endpoint, _, variant = key.partition("/")
            if not (_valid_name(endpoint) and _valid_name(variant)):
                raise ValueError(f"scaling.{key}: not endpoint/variant")
            if endpoint not in self.endpoints:
                raise ValueError(f"scaling.{key}: endpoint {endpoint!r} is not declared")
            if self.scaling[key].MinCapacity > self.scaling[key].MaxCapacity:
                raise ValueError(f"scaling.{key}: MinCapacity is above MaxCapacity")


def _valid_name(name: str) -> bool:
    return len(name) <= 63 and re.fullmatch(_NAME, name) is not None


# -- reading YAML with line numbers ---------------------------------------------------------

Loc = tuple[str, ...]


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[Loc, int]]:
    """The mapping in ``path`` and the 1-based line of every key and item in it.

    Errors (unreadable file, bad YAML, not a mapping) are ValueErrors that start with
    ``<path>:<line>:`` where there is a line to name.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ValueError(f"{where}: {exc.problem or exc.context or exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}:1: a stack file is a YAML mapping")
    lines: dict[Loc, int] = {}
    if node is not None:
        _mark(node, (), lines)
    return data, lines


def _mark(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*loc, str(key.value))
            lines[here] = key.start_mark.line + 1
            _mark(value, here, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _mark(item, (*loc, str(index)), lines)


def validation_errors(path: Path, exc: ValidationError, lines: Mapping[Loc, int]) -> str:
    """One line per error: ``<path>:<line>: <field>: <message>``."""
    out = []
    for error in exc.errors(include_url=False):
        field = dotted(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        head, colon, _ = message.partition(": ")
        if colon and " " not in head and head.startswith(field):
            # A check over several fields names the one at fault at the head of its message.
            field, message = "", message
            loc = _loc(head)
        else:
            loc = tuple(str(part) for part in error["loc"])
        line = line_of(loc, lines)
        where = f"{path}:{line}" if line else str(path)
        out.append(f"{where}: {field}: {message}" if field else f"{where}: {message}")
    return "\n".join(out)


def _loc(dotted: str) -> Loc:
    """``auth.keys[1].x`` as ``("auth", "keys", "1", "x")``."""
    return tuple(part for part in re.split(r"[.\[\]]+", dotted) if part)


def line_of(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    """The line of ``loc``, else of its nearest enclosing key that the file has."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def dotted(loc: tuple[int | str, ...]) -> str:
    """``("endpoint_configs", "a", "ProductionVariants", 0, "x")`` as
    ``endpoint_configs.a.ProductionVariants[0].x``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# -- the sections beyond the resources: how the gateway serves them ------------------------


class JobsConfig(BaseModel):
    """The ``jobs:`` section: the ``POST /inference`` facade and job notifications."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=4, ge=1, strict=True)
    """Jobs active at once, from either door."""
    white_list: list[str] = Field(default_factory=list)
    """Job types ``POST /inference`` accepts; each needs a template."""
    s3_bucket: str | None = None
    """Output root: a job's output lands under ``<s3_bucket>/<job>/output/``."""
    role_arn: str = "arn:aws:iam::000000000000:role/shipyard"
    """Recorded on each job as its RoleArn."""
    templates: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per type, a partial CreateTrainingJob request."""
    notify: dict[str, list[str]] = Field(default_factory=dict)
    """TrainingJobStatus -> topics (names, SNS topic ARNs or apprise URLs)."""

    @model_validator(mode="after")
    def _check(self) -> JobsConfig:
        missing = [name for name in self.white_list if name not in self.templates]
        if missing:
            raise ValueError(f"jobs.templates: no template for white-listed type(s) {missing}")
        if self.white_list and not self.s3_bucket:
            raise ValueError("jobs.s3_bucket: required when jobs.white_list is set")
        known = {"InProgress", "Completed", "Failed", "Stopping", "Stopped"}
        unknown = sorted(set(self.notify) - known)
        if unknown:
            raise ValueError(f"jobs.notify: unknown TrainingJobStatus {unknown}")
        return self


class AccessKey(BaseModel):
    """One key that may sign requests (SECURITY.md, "With `auth:`"). The secret is read from the
    environment."""

    model_config = ConfigDict(extra="forbid")

    access_key_id: str = Field(min_length=1, max_length=128, pattern=r"^\w+$")
    """The key's id, as clients send it in the SigV4 ``Credential``."""
    secret_access_key_env: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable holding the secret; the file never holds it."""
    allow: list[str] = Field(default_factory=lambda: ["*"])
    """Actions this key may call, as ``service:Action`` with ``*`` wildcards
    (``sagemaker-runtime:InvokeEndpoint*``, ``sagemaker:Describe*``) or ``*`` for all."""
    resources: list[str] = Field(default_factory=lambda: ["*"])
    """ARN patterns (``*`` matches any characters, as IAM matches them) of the resources
    this key's actions may reach; List actions show only these."""
    bearer_token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable holding a token that the OpenAI-compatible door
    (``/v1``) takes as ``Authorization: Bearer <token>`` for this key, with its ``allow``
    and ``resources``; SigV4 with the key works there too."""


class AuthConfig(BaseModel):
    """The ``auth:`` section: who may call, and what the callers may make the host do."""

    model_config = ConfigDict(extra="forbid")

    keys: list[AccessKey] = Field(min_length=1)
    """Keys that may sign requests; at least one."""
    allow_commands: bool = Field(default=False, strict=True)
    """Whether ``cmd:`` images and ``ContainerEntrypoint`` (commands on this host) may run."""
    file_roots: list[Path] = Field(default_factory=list)
    """Folders that ``file://`` and plain-path locations must lie under (after ``..`` and
    links are resolved); empty means no local locations at all."""
    allow_environment: list[str] = Field(default_factory=list)
    """With ``allow_commands: false``, more variable names (or ``PREFIX_*``) a caller's
    ``Environment`` may set beyond SageMaker's; interpreter and loader variables stay
    refused whatever this says."""
    sandbox: bool = Field(default=True, strict=True)
    """Run instances and jobs of the local backend under bubblewrap, so that their code cannot
    reach what the gateway holds (SECURITY.md, "Model code runs in a sandbox")."""
    notify_targets: list[str] = Field(default_factory=list)
    """URL patterns (``*`` matches any characters) that notification targets named by
    callers must match; the stack file's own topics are always allowed."""
    allow_images: list[str] = Field(default_factory=list)
    """Container images callers may run (``*`` matches any characters:
    ``registry.example.com/team/*``); empty means none. The built-in runtime's images
    (``shipyard/python``, SageMaker's framework image URIs unless
    SHIPYARD_FRAMEWORK_IMAGES=container) and ``cmd:`` ones (``allow_commands``) are not
    container images."""

    @model_validator(mode="after")
    def _check(self) -> AuthConfig:
        ids = [key.access_key_id for key in self.keys]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise ValueError(f"auth.keys: access_key_id {duplicated} given more than once")
        relative = [str(root) for root in self.file_roots if not root.is_absolute()]
        if relative:
            raise ValueError(f"auth.file_roots: not absolute paths: {relative}")
        return self


class TlsConfig(BaseModel):
    """The ``tls:`` section: serve HTTPS (and gRPC over TLS) on the gateway's port."""

    model_config = ConfigDict(extra="forbid")

    cert: Path
    """PEM certificate (chain)."""
    key: Path
    """PEM private key."""


class AutoscalingConfig(BaseModel):
    """The ``autoscaling:`` section: who hears of scaling steps."""

    model_config = ConfigDict(extra="forbid")

    notify: list[str] = Field(default_factory=list)
    """Topics (names, SNS topic ARNs or apprise URLs) told of every scaling activity's
    end, successful or not."""


class DeploymentsConfig(BaseModel):
    """The ``deployments:`` section: who hears how deployments end."""

    model_config = ConfigDict(extra="forbid")

    notify: list[str] = Field(default_factory=list)
    """Topics (names, SNS topic ARNs or apprise URLs) told when an UpdateEndpoint's
    DeploymentConfig completes, rolls back or fails."""


class StackFile(StackResources):
    """A stack file (YAML). Sections this version does not converge are refused.

    The resource sections (``models``, ``endpoint_configs``, ``endpoints``, ``scaling``,
    from StackResources) are converged by ``shipyard apply``, not at start.
    """

    model_config = ConfigDict(extra="forbid")

    topics: dict[str, list[str]] = Field(default_factory=dict)
    """Topic name -> subscribers, as apprise URLs."""
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig)
    deployments: DeploymentsConfig = Field(default_factory=DeploymentsConfig)
    auth: AuthConfig | None = None
    """Without it, requests are not checked (local use); SECURITY.md says what it changes."""
    tls: TlsConfig | None = None
    """Serve HTTPS; ``shipyard serve --tls-cert/--tls-key`` win over it."""
    account_id: str | None = Field(default=None, pattern=r"^\d{12}$")
    """The account id written into ARNs, unless ``SHIPYARD_ACCOUNT_ID`` says otherwise."""
    allow_hosts: list[str] = Field(default_factory=list)
    """More ``Host`` names a gateway without ``auth:`` answers, besides ``--allow-host``:
    ``NAME`` on any port, or ``NAME:PORT`` (for a proxy that passes its own name on)."""

    @model_validator(mode="after")
    def _check_topics(self) -> StackFile:
        self.check_resources()
        for status, targets in self.jobs.notify.items():
            for target in targets:
                if "://" in target or target.startswith("arn:aws:sns:"):
                    continue
                if target not in self.topics:
                    raise ValueError(f"jobs.notify.{status}: unknown topic {target!r}")
        for section, targets in (
            ("autoscaling", self.autoscaling.notify),
            ("deployments", self.deployments.notify),
        ):
            for target in targets:
                if "://" not in target and not target.startswith("arn:aws:sns:"):
                    if target not in self.topics:
                        raise ValueError(f"{section}.notify: unknown topic {target!r}")
        return self

    @classmethod
    def load(cls, path: Path) -> StackFile:
        """Read and validate ``path``; errors name the file, the line and the field."""
        data, lines = read_yaml(path)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(validation_errors(path, exc, lines)) from exc
