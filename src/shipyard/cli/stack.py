"""Stack files on a running gateway: the plan of changes (cli/converge.py carries it out).

What a stack owns is what it tagged. Every model, endpoint config and endpoint that
``apply`` creates carries three tags::

    shipyard:stack   the stack's name (``--stack-name``, default the file's stem)
    shipyard:name    the name the file declares it under
    shipyard:digest  a hash of the Create call's body, names of other resources resolved

and its scalable targets carry a policy named ``shipyard-stack-<stack>``. Nothing else is
ever updated or deleted: a resource of the same name that the stack did not create makes
the plan fail (an endpoint), or is left alone (a model or endpoint config, whose version
then takes a suffixed name).

Models and endpoint configs are immutable, as in SageMaker. A changed body becomes a new
version (``<name>-<digest>``, or the bare name when it is free), endpoints move to it by
UpdateEndpoint (blue/green: the old instances serve until the new ones are healthy), and
the old versions are deleted once no endpoint uses them. A changed model therefore also
updates the configs that use it and the endpoints that use those. A digest equal to the
deployed version's means "unchanged", so re-applying a file changes nothing.

"Delete" in ``apply`` is whatever the stack owns and the file no longer declares (plus
old versions); ``destroy`` deletes what the file declares and the stack owns.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shipyard.cli import sections
from shipyard.cli.client import Gateway, translated
from shipyard.errors import PlanError, SectionConflict
from shipyard.stackfile import StackFile, StackResources

STACK_TAG = "shipyard:stack"
NAME_TAG = "shipyard:name"
DIGEST_TAG = "shipyard:digest"
NAMESPACE = "sagemaker"
_TAG_READERS = 8
DIMENSION = "sagemaker:variant:DesiredInstanceCount"


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    UNCHANGED = "unchanged"


class Kind(StrEnum):
    MODEL = "model"
    ENDPOINT_CONFIG = "endpoint config"
    ENDPOINT = "endpoint"
    COMPONENT = "inference component"
    SCALING = "scaling"
    ALARM = "alarm"
    TOPIC = "topic"
    JOB_TEMPLATE = "job template"
    JOBS = "jobs settings"


@dataclass(frozen=True)
class Change:
    """One row of a plan: a resource the file declares (or the stack owns) and its fate."""

    kind: Kind
    name: str
    action: Action
    detail: str = ""


@dataclass(frozen=True)
class _Version:
    """A model, endpoint config or endpoint on the gateway that the stack created."""

    name: str
    declared: str
    digest: str
    arn: str
    tags: dict[str, str]


@dataclass
class Plan:
    """What ``converge`` will do, step by step, and the rows that say it to a person."""

    stack: str
    changes: list[Change] = field(default_factory=list)
    sections: dict[str, Any] | None = None
    """The ``PUT /stack`` body for topics and the jobs section (cli/sections.py)."""
    scaling_removed: list[str] = field(default_factory=list)
    """Resource ids whose scalable target (and the stack's policy) go first."""
    models: list[tuple[str, dict[str, Any], list[dict[str, str]]]] = field(default_factory=list)
    configs: list[tuple[str, dict[str, Any], list[dict[str, str]]]] = field(default_factory=list)
    endpoints: list[tuple[str, str, list[dict[str, str]] | None]] = field(default_factory=list)
    """(endpoint, config, tags): tags for a CreateEndpoint, None for an UpdateEndpoint."""
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Endpoint -> the DeploymentConfig its CreateEndpoint or UpdateEndpoint carries."""
    alarms: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(alarm, PutMetricAlarm body with the stack's tags) to put, before the endpoints."""
    alarms_removed: list[str] = field(default_factory=list)
    endpoint_tags: list[tuple[str, list[dict[str, str]], list[str]]] = field(default_factory=list)
    """(endpoint ARN, tags to put, tag keys to delete) for endpoints whose Tags changed."""
    scaling: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    components: list[tuple[str, dict[str, Any], list[dict[str, str]]]] = field(default_factory=list)
    """(name, CreateInferenceComponent body, tags) to create."""
    components_updated: list[tuple[str, dict[str, Any], str, list[dict[str, str]]]] = field(
        default_factory=list
    )
    """(name, body, ARN, tags) of owned components whose body changed: updated in place."""
    components_removed: list[str] = field(default_factory=list)
    endpoints_removed: list[str] = field(default_factory=list)
    configs_removed: list[str] = field(default_factory=list)
    models_removed: list[str] = field(default_factory=list)

    @property
    def pending(self) -> list[Change]:
        return [c for c in self.changes if c.action is not Action.UNCHANGED]

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action is action)


class _Live:
    """What the gateway holds now: names, the stack's versions, endpoints and scaling."""

    def __init__(self, gateway: Gateway, stack: str) -> None:
        self.gateway = gateway
        self.stack = stack
        sm = gateway.sagemaker
        self.models, self.owned_models = self._tagged(
            sm.list_models, "Models", "ModelName", "ModelArn"
        )
        self.configs, self.owned_configs = self._tagged(
            sm.list_endpoint_configs, "EndpointConfigs", "EndpointConfigName", "EndpointConfigArn"
        )
        endpoints, owned = self._tagged(
            sm.list_endpoints, "Endpoints", "EndpointName", "EndpointArn"
        )
        self.endpoints = endpoints
        self.owned_endpoints = {v.name: v for v in owned}
        self.endpoint_configs: dict[str, set[str]] = {}
        """Owned endpoint -> the configs it uses (current and being deployed)."""
        for name in sorted(self.owned_endpoints):
            with translated(gateway.url, about=name):
                described = sm.describe_endpoint(EndpointName=name)
            pending = described.get("PendingDeploymentSummary", {}).get("EndpointConfigName")
            in_use = {described["EndpointConfigName"]}
            self.endpoint_configs[name] = in_use | {pending} if pending else in_use
        self.targets, self.policies = self._scaling()
        components, owned_components = self._tagged(
            sm.list_inference_components,
            "InferenceComponents",
            "InferenceComponentName",
            "InferenceComponentArn",
        )
        self.components = components
        self.owned_components = {v.name: v for v in owned_components}

    @functools.cached_property
    def alarms(self) -> set[str]:
        """Every alarm's name; read when first asked (after the sections' plan, so a key
        without shipyard:GetStack is refused for that first)."""
        return self._alarms()[0]

    @functools.cached_property
    def owned_alarms(self) -> dict[str, str]:
        """The stack's own alarms (by their tags) with their digests."""
        return self._alarms()[1]

    @functools.cache  # noqa: B019 (one _Live per plan)
    def _alarms(self) -> tuple[set[str], dict[str, str]]:
        """Every alarm's name, and the stack's own (by their tags) with their digests."""
        client = self.gateway.client("cloudwatch")
        names: dict[str, str] = {}
        with translated(self.gateway.url, about="alarms"):
            for page in client.get_paginator("describe_alarms").paginate():
                names.update({a["AlarmName"]: a["AlarmArn"] for a in page["MetricAlarms"]})

        def tags(arn: str) -> dict[str, str]:
            with translated(self.gateway.url, about=arn):
                listed = client.list_tags_for_resource(ResourceARN=arn)["Tags"]
            return {t["Key"]: t["Value"] for t in listed}

        with ThreadPoolExecutor(_TAG_READERS) as pool:
            tagged = dict(zip(names, pool.map(tags, names.values()), strict=True))
        owned = {
            name: found.get(DIGEST_TAG, "")
            for name, found in tagged.items()
            if found.get(STACK_TAG) == self.stack
        }
        return set(names), owned

    def _tagged(
        self, lister: Callable[..., Any], key: str, name_key: str, arn_key: str
    ) -> tuple[set[str], list[_Version]]:
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"MaxResults": 100}
        while True:
            with translated(self.gateway.url):
                page = lister(**query)
            items.extend(page[key])
            if not page.get("NextToken"):
                break
            query["NextToken"] = page["NextToken"]
        # One ListTags per resource (there is no bulk form): a few at a time, since each
        # is a round trip that mostly waits.
        with ThreadPoolExecutor(max_workers=_TAG_READERS) as pool:
            all_tags = list(pool.map(self._tags, [item[arn_key] for item in items]))
        owned = [
            _Version(
                item[name_key],
                tags.get(NAME_TAG, item[name_key]),
                tags.get(DIGEST_TAG, ""),
                item[arn_key],
                tags,
            )
            for item, tags in zip(items, all_tags, strict=True)
            if tags.get(STACK_TAG) == self.stack
        ]
        return {item[name_key] for item in items}, owned

    def _tags(self, arn: str) -> dict[str, str]:
        found: dict[str, str] = {}
        query: dict[str, Any] = {"ResourceArn": arn}
        while True:
            with translated(self.gateway.url):
                page = self.gateway.sagemaker.list_tags(**query)
            found.update({t["Key"]: t["Value"] for t in page.get("Tags", [])})
            if not page.get("NextToken"):
                return found
            query["NextToken"] = page["NextToken"]

    def _scaling(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """Scalable targets by resource id, and the stack's policy by resource id."""
        client = self.gateway.client("application-autoscaling")
        targets: dict[str, dict[str, Any]] = {}
        policies: dict[str, dict[str, Any]] = {}
        for method, key, into in (
            (client.describe_scalable_targets, "ScalableTargets", targets),
            (client.describe_scaling_policies, "ScalingPolicies", policies),
        ):
            query: dict[str, Any] = {"ServiceNamespace": NAMESPACE}
            while True:
                with translated(self.gateway.url):
                    page = method(**query)
                for item in page[key]:
                    if key == "ScalableTargets" or item["PolicyName"] == policy_name(self.stack):
                        into[item["ResourceId"]] = item
                if not page.get("NextToken"):
                    break
                query["NextToken"] = page["NextToken"]
        return targets, policies

    def versions(self, kind: Kind, declared: str) -> list[_Version]:
        owned = self.owned_models if kind is Kind.MODEL else self.owned_configs
        return [v for v in owned if v.declared == declared]


def policy_name(stack: str) -> str:
    """The scaling policy ``apply`` puts on every target of ``stack``; it marks them."""
    return f"shipyard-stack-{stack}"


def resource_id(key: str) -> str:
    """``endpoint/variant`` as Application Auto Scaling's ResourceId."""
    endpoint, _, variant = key.partition("/")
    return f"endpoint/{endpoint}/variant/{variant}"


def digest(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _tags(stack: str, declared: str, body_digest: str, user: list[dict[str, str]]) -> list[Any]:
    ours = {STACK_TAG: stack, NAME_TAG: declared, DIGEST_TAG: body_digest}
    return [t for t in user if t["Key"] not in ours] + [
        {"Key": k, "Value": v} for k, v in ours.items()
    ]


def plan_apply(gateway: Gateway, stack: str, file: StackFile) -> Plan:
    """The changes that take the gateway to ``file``, for the stack named ``stack``."""
    live = _Live(gateway, stack)
    plan = Plan(stack)
    _plan_sections(plan, sections.plan_apply, gateway, file)
    model_names = _plan_versions(
        plan,
        live,
        Kind.MODEL,
        {n: b.model_dump(exclude_unset=True) for n, b in file.models.items()},
    )
    bodies: dict[str, dict[str, Any]] = {}
    for name, config in file.endpoint_configs.items():
        body = config.model_dump(exclude_unset=True)
        for key in ("ProductionVariants", "ShadowProductionVariants"):
            for variant in body.get(key) or []:
                model = variant.get("ModelName")
                if model is None:
                    continue
                if model not in model_names and model not in live.models:
                    raise PlanError(
                        f"endpoint_configs.{name}: model {model!r} is neither declared nor "
                        "on the gateway"
                    )
                variant["ModelName"] = model_names.get(model, model)
        bodies[name] = body
    config_names = _plan_versions(plan, live, Kind.ENDPOINT_CONFIG, bodies)
    _plan_alarms(plan, live, file)
    final_configs = _plan_endpoints(plan, live, file, config_names)
    _plan_scaling(plan, live, file)
    component_models = _plan_components(plan, live, file, model_names)
    final_models = component_models | {
        variant["ModelName"]
        for body in bodies.values()
        for key in ("ProductionVariants", "ShadowProductionVariants")
        for variant in body.get(key) or []
        if variant.get("ModelName")
    }
    final = {
        Kind.MODEL: final_models | set(model_names.values()),
        Kind.ENDPOINT_CONFIG: final_configs | set(config_names.values()),
    }
    _plan_leftovers(plan, live, file, final)
    return plan


def _plan_sections(
    plan: Plan, planner: sections.Planner, gateway: Gateway, file: StackFile
) -> None:
    """Topics and the jobs section, first: endpoint configs may name topics."""
    try:
        rows, plan.sections = planner(plan.stack, gateway.stack_config(), file)
    except SectionConflict as exc:
        raise PlanError(str(exc)) from None
    plan.changes += [Change(Kind(k), name, Action(a), detail) for k, name, a, detail in rows]


def _plan_versions(
    plan: Plan, live: _Live, kind: Kind, bodies: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """Plan each declared model (or config) as a version; declared name -> deployed name."""
    deployed: dict[str, str] = {}
    existing = live.models if kind is Kind.MODEL else live.configs
    into = plan.models if kind is Kind.MODEL else plan.configs
    for declared, body in bodies.items():
        user_tags = body.pop("Tags", [])
        body_digest = digest({**body, "Tags": user_tags})
        versions = live.versions(kind, declared)
        same = [v for v in versions if v.digest == body_digest]
        if same:
            deployed[declared] = same[0].name
            plan.changes.append(Change(kind, declared, Action.UNCHANGED, _as(declared, same[0])))
            continue
        name = declared if declared not in existing else f"{declared[:50]}-{body_digest[:8]}"
        if name in existing:
            raise PlanError(f"{kind} {name} exists and was not created by stack {plan.stack}")
        deployed[declared] = name
        into.append((name, body, _tags(plan.stack, declared, body_digest, user_tags)))
        if versions:
            old = ", ".join(v.name for v in versions)
            plan.changes.append(
                Change(kind, declared, Action.UPDATE, f"new version {name}, was {old}")
            )
        else:
            detail = "" if name == declared else f"as {name} ({declared} is taken)"
            plan.changes.append(Change(kind, declared, Action.CREATE, detail))
    return deployed


def _as(declared: str, version: _Version) -> str:
    return "" if version.name == declared else f"as {version.name}"


def _plan_endpoints(
    plan: Plan, live: _Live, file: StackResources, config_names: dict[str, str]
) -> set[str]:
    """Plan each declared endpoint; the configs they end up on."""
    final: set[str] = set()
    for name, body in file.endpoints.items():
        config = config_names.get(body.EndpointConfigName, body.EndpointConfigName)
        final.add(config)
        if config not in config_names.values() and config not in live.configs:
            raise PlanError(
                f"endpoints.{name}: endpoint config {config!r} is neither declared nor on "
                "the gateway"
            )
        # Tags are the endpoint's only other field; they change in place (AddTags).
        tags_digest = digest({"Tags": body.Tags})
        tags = _tags(plan.stack, name, tags_digest, body.Tags)
        if body.DeploymentConfig is not None:
            plan.deployments[name] = body.DeploymentConfig
        if name not in live.endpoints:
            plan.endpoints.append((name, config, tags))
            plan.changes.append(Change(Kind.ENDPOINT, name, Action.CREATE, f"config {config}"))
            continue
        if name not in live.owned_endpoints:
            raise PlanError(f"endpoint {name} exists and was not created by stack {plan.stack}")
        now = live.owned_endpoints[name]
        changed = []
        if live.endpoint_configs[name] != {config}:
            plan.endpoints.append((name, config, None))
            changed.append(f"config {', '.join(sorted(live.endpoint_configs[name]))} → {config}")
        if now.digest != tags_digest:
            stale = sorted(set(now.tags) - {t["Key"] for t in tags})
            plan.endpoint_tags.append((now.arn, tags, stale))
            changed.append("tags")
        action = Action.UPDATE if changed else Action.UNCHANGED
        plan.changes.append(
            Change(Kind.ENDPOINT, name, action, "; ".join(changed) or f"config {config}")
        )
    return final


def _plan_alarms(plan: Plan, live: _Live, file: StackResources) -> None:
    """Put each declared alarm whose body changed (its digest tag says), and remove the
    stack's alarms the file no longer declares."""
    for name, alarm in file.alarms.items():
        body = alarm.model_dump(exclude_unset=True)
        user_tags = body.pop("Tags", [])
        body_digest = digest({**body, "Tags": user_tags})
        if name in live.alarms and name not in live.owned_alarms:
            raise PlanError(f"alarm {name} exists and was not created by stack {plan.stack}")
        if live.owned_alarms.get(name) == body_digest:
            plan.changes.append(Change(Kind.ALARM, name, Action.UNCHANGED))
            continue
        body["Tags"] = _tags(plan.stack, name, body_digest, user_tags)
        plan.alarms.append((name, body))
        action = Action.UPDATE if name in live.owned_alarms else Action.CREATE
        plan.changes.append(Change(Kind.ALARM, name, action))
    for name in sorted(set(live.owned_alarms) - set(file.alarms)):
        plan.alarms_removed.append(name)
        plan.changes.append(Change(Kind.ALARM, name, Action.DELETE))


def _plan_components(
    plan: Plan, live: _Live, file: StackResources, model_names: dict[str, str]
) -> set[str]:
    """Plan each declared inference component; the models they end up on.

    Components change in place (UpdateInferenceComponent replaces their copies a few at a
    time), so a changed body is an update, not a new version.
    """
    models: set[str] = set()
    for name, declared in file.inference_components.items():
        body = declared.model_dump(exclude_unset=True)
        user_tags = body.pop("Tags", [])
        spec = body["Specification"] = dict(body["Specification"])
        model = spec.get("ModelName")
        if model is not None:
            if model not in model_names and model not in live.models:
                raise PlanError(
                    f"inference_components.{name}: model {model!r} is neither declared nor on "
                    "the gateway"
                )
            spec["ModelName"] = model_names.get(model, model)
            models.add(spec["ModelName"])
        if (
            body["EndpointName"] not in file.endpoints
            and body["EndpointName"] not in live.endpoints
        ):
            raise PlanError(
                f"inference_components.{name}: endpoint {body['EndpointName']!r} is neither "
                "declared nor on the gateway"
            )
        body_digest = digest({**body, "Tags": user_tags})
        tags = _tags(plan.stack, name, body_digest, user_tags)
        copies = (body.get("RuntimeConfig") or {}).get("CopyCount")
        summary = f"on {body['EndpointName']}" + (f", {copies} copies" if copies else "")
        if name not in live.components:
            plan.components.append((name, body, tags))
            plan.changes.append(Change(Kind.COMPONENT, name, Action.CREATE, summary))
            continue
        now = live.owned_components.get(name)
        if now is None:
            raise PlanError(
                f"inference component {name} exists and was not created by stack {plan.stack}"
            )
        if now.digest == body_digest:
            plan.changes.append(Change(Kind.COMPONENT, name, Action.UNCHANGED, summary))
            continue
        plan.components_updated.append((name, body, now.arn, tags))
        plan.changes.append(Change(Kind.COMPONENT, name, Action.UPDATE, summary))
    # Adapters after the components they run in (a stable sort keeps the file's order).
    plan.components.sort(key=lambda item: "BaseInferenceComponentName" in item[1]["Specification"])
    return models


def scaling_calls(stack: str, rid: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Application Auto Scaling calls that put ``body`` (``scaling_body``) on ``rid``,
    as (operation, parameters): what converge sends, and what cli/shapes.py checks."""
    common = {"ServiceNamespace": NAMESPACE, "ResourceId": rid, "ScalableDimension": DIMENSION}
    return [
        (
            "RegisterScalableTarget",
            {**common, "MinCapacity": body["MinCapacity"], "MaxCapacity": body["MaxCapacity"]},
        ),
        (
            "PutScalingPolicy",
            {
                **common,
                "PolicyName": policy_name(stack),
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingScalingPolicyConfiguration": body["Policy"],
            },
        ),
    ]


def scaling_body(target: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "TargetValue": float(target.TargetValue),
        "PredefinedMetricSpecification": {"PredefinedMetricType": target.PredefinedMetricType},
    }
    for key in ("ScaleInCooldown", "ScaleOutCooldown"):
        if getattr(target, key) is not None:
            policy[key] = getattr(target, key)
    return {"MinCapacity": target.MinCapacity, "MaxCapacity": target.MaxCapacity, "Policy": policy}


def _plan_scaling(plan: Plan, live: _Live, file: StackResources) -> None:
    for key, target in file.scaling.items():
        rid = resource_id(key)
        body = scaling_body(target)
        summary = f"{target.MinCapacity}..{target.MaxCapacity} at {target.TargetValue:g}"
        now = live.targets.get(rid)
        policy = live.policies.get(rid)
        if now is None or policy is None:
            plan.scaling.append((rid, body))
            plan.changes.append(Change(Kind.SCALING, key, Action.CREATE, summary))
            continue
        same = (
            now["MinCapacity"] == body["MinCapacity"]
            and now["MaxCapacity"] == body["MaxCapacity"]
            and policy.get("TargetTrackingScalingPolicyConfiguration") == body["Policy"]
        )
        if same:
            plan.changes.append(Change(Kind.SCALING, key, Action.UNCHANGED, summary))
        else:
            plan.scaling.append((rid, body))
            plan.changes.append(Change(Kind.SCALING, key, Action.UPDATE, summary))


def _plan_leftovers(
    plan: Plan, live: _Live, file: StackResources, final: dict[Kind, set[str]]
) -> None:
    """What the stack owns and the file no longer declares, and superseded versions.

    ``final`` holds the models and configs the file's resources end up using: never
    deleted, even when the stack made them and the file names them only as references.
    """
    declared = {resource_id(k) for k in file.scaling}
    for rid in sorted(live.policies):
        if rid not in declared:
            plan.scaling_removed.append(rid)
            key = "/".join(rid.split("/")[1::2])
            plan.changes.append(Change(Kind.SCALING, key, Action.DELETE))
    for name in sorted(set(live.owned_components) - set(file.inference_components)):
        plan.components_removed.append(name)
        plan.changes.append(Change(Kind.COMPONENT, name, Action.DELETE))
    for name in sorted(set(live.owned_endpoints) - set(file.endpoints)):
        plan.endpoints_removed.append(name)
        plan.changes.append(Change(Kind.ENDPOINT, name, Action.DELETE))
    updated = {(c.kind, c.name) for c in plan.changes if c.action is Action.UPDATE}
    for kind, owned, removed, section in (
        (Kind.ENDPOINT_CONFIG, live.owned_configs, plan.configs_removed, file.endpoint_configs),
        (Kind.MODEL, live.owned_models, plan.models_removed, file.models),
    ):
        for version in sorted(owned, key=lambda v: v.name):
            if version.name in final[kind]:
                continue
            removed.append(version.name)
            if version.declared not in section:
                detail = _as(version.declared, version)
                plan.changes.append(Change(kind, version.declared, Action.DELETE, detail))
            elif (kind, version.declared) not in updated:
                # Left over by an apply that failed half-way: the update row says it otherwise.
                detail = f"old version {version.name}"
                plan.changes.append(Change(kind, version.declared, Action.DELETE, detail))


def plan_destroy(gateway: Gateway, stack: str, file: StackFile) -> Plan:
    """Deleting what the file declares and the stack owns; nothing else."""
    live = _Live(gateway, stack)
    plan = Plan(stack)
    _plan_sections(plan, sections.plan_destroy, gateway, file)
    for key in file.scaling:
        if resource_id(key) in live.policies:
            plan.scaling_removed.append(resource_id(key))
            plan.changes.append(Change(Kind.SCALING, key, Action.DELETE))
    for name in file.inference_components:
        if name in live.owned_components:
            plan.components_removed.append(name)
            plan.changes.append(Change(Kind.COMPONENT, name, Action.DELETE))
    for name in file.endpoints:
        if name in live.owned_endpoints:
            plan.endpoints_removed.append(name)
            plan.changes.append(Change(Kind.ENDPOINT, name, Action.DELETE))
    for name in file.alarms:
        if name in live.owned_alarms:
            plan.alarms_removed.append(name)
            plan.changes.append(Change(Kind.ALARM, name, Action.DELETE))
    for kind, section, removed in (
        (Kind.ENDPOINT_CONFIG, file.endpoint_configs, plan.configs_removed),
        (Kind.MODEL, file.models, plan.models_removed),
    ):
        for declared in section:
            for version in live.versions(kind, declared):
                removed.append(version.name)
                plan.changes.append(Change(kind, declared, Action.DELETE, _as(declared, version)))
    return plan
