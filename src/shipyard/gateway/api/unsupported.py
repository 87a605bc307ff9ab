"""Members botocore's model has and this gateway does not do: refused by name.

A request botocore accepts may ask for something shipyard has no part of (a VPC, a KMS
key, SSM access to an instance, an instance pool). Accepting such a field and doing
otherwise would be worse than saying so, so each row below names one, when its value
asks for something not done (any value, or ``true`` for a switch whose ``false`` is
what happens anyway), and why. What is honoured, or asks nothing (a role ARN, which is
recorded), is not listed.

The table is checked on every control-plane request once botocore's shapes have passed
(gateway/api/control.py), and by ``shipyard apply`` on every body of a stack file before it
changes anything (cli/shapes.py), so an apply never stops half-way on one of them.

A path is dotted member names; ``[]`` steps into every item of a list. Rows under a
production variant hold for shadow variants too, and rows under ``PrimaryContainer``
for each of ``Containers``: the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shipyard.errors import InvalidParameter


def _present(value: object) -> bool:
    return value is not None


def _true(value: object) -> bool:
    return value is True


def _vpc_access(value: object) -> bool:
    return value == "Vpc"


@dataclass(frozen=True, slots=True)
class Refused:
    operation: str
    path: str
    why: str
    asks: Callable[[object], bool] = _present
    """Whether a value of the member asks for what is not done."""


_VARIANT = "ProductionVariants[]"
_CONTAINER = "PrimaryContainer"
_SAME_SHAPE = {_VARIANT: ("ShadowProductionVariants[]",), _CONTAINER: ("Containers[]",)}

TABLE: tuple[Refused, ...] = (
    # CreateEndpointConfig: each production (and shadow) variant.
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.InstancePools",
        "a variant runs on its one InstanceType here; give that instead.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.VariantInstanceProvisionTimeoutInSeconds",
        "instances here are not provisioned from a cloud's capacity; "
        "ContainerStartupHealthCheckTimeoutInSeconds bounds an instance's start.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.AcceleratorType",
        "there are no Elastic Inference accelerators to attach; an instance uses the "
        "host's devices.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.CoreDumpConfig",
        "an instance's core dumps are not collected or uploaded here.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.VolumeSizeInGB",
        "instances use the host's disk; there is no storage volume to size.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.EnableSSMAccess",
        "true asks for SSM sessions into the instances, which this gateway does not give.",
        _true,
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.InferenceAmiVersion",
        "instances run on the host, not on an AMI this gateway could choose.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.CapacityReservationConfig",
        "instances here are not drawn from reserved capacity.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.ManagedInstanceScaling.ScaleInPolicy",
        "managed instance scaling scales in by its own rule here, not by a ScaleInPolicy.",
    ),
    Refused(
        "CreateEndpointConfig",
        f"{_VARIANT}.RoutingConfig.PrefixAwareRoutingConfig",
        "prefix-aware routing is not done; RoutingStrategy RANDOM and "
        "LEAST_OUTSTANDING_REQUESTS are.",
    ),
    # CreateEndpointConfig: the config as a whole.
    Refused(
        "CreateEndpointConfig",
        "KmsKeyId",
        "nothing the endpoint stores is encrypted with a KMS key here.",
    ),
    Refused(
        "CreateEndpointConfig",
        "DataCaptureConfig.KmsKeyId",
        "captured data is not encrypted with a KMS key here.",
    ),
    Refused(
        "CreateEndpointConfig",
        "AsyncInferenceConfig.OutputConfig.KmsKeyId",
        "asynchronous outputs are not encrypted with a KMS key here.",
    ),
    Refused(
        "CreateEndpointConfig",
        "ExplainerConfig",
        "online explainability (SageMaker Clarify) is not served.",
    ),
    Refused(
        "CreateEndpointConfig",
        "VpcConfig",
        "instances use the host's network; they are placed in no VPC subnets or security groups.",
    ),
    Refused(
        "CreateEndpointConfig",
        "EnableNetworkIsolation",
        "true asks for instances without network access, which this gateway does not "
        "give its model servers.",
        _true,
    ),
    Refused(
        "CreateEndpointConfig",
        "MetricsConfig.EnableEnhancedMetrics",
        "true asks for enhanced metrics, which are not published here.",
        _true,
    ),
    Refused(
        "CreateEndpointConfig",
        "MetricsConfig.EnableDetailedObservability",
        "true asks for detailed observability, which is not published here.",
        _true,
    ),
    Refused(
        "CreateEndpointConfig",
        "MetricsConfig.MetricPublishFrequencyInSeconds",
        "the gateway publishes its metrics every 10 s and one minute, not at a "
        "frequency set per endpoint config.",
    ),
    # CreateModel.
    Refused(
        "CreateModel",
        "VpcConfig",
        "instances use the host's network; they are placed in no VPC subnets or security groups.",
    ),
    Refused(
        "CreateModel",
        "EnableNetworkIsolation",
        "true asks for instances without network access, which this gateway does not "
        "give its model servers.",
        _true,
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.ImageConfig.RepositoryAccessMode",
        "Vpc asks for the image to be pulled through a VPC; images are pulled by the "
        "host's container engine (Platform).",
        _vpc_access,
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.ImageConfig.RepositoryAuthConfig",
        "registry credentials come from the host's container engine, not from a "
        "credentials provider.",
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.ModelDataSource",
        "give the model's data as ModelDataUrl (a model.tar.gz, a folder, or a MultiModel prefix).",
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.AdditionalModelDataSources",
        "a container gets one model's data, from ModelDataUrl.",
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.ModelPackageName",
        "there are no model packages here; give the Image and ModelDataUrl.",
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.InferenceSpecificationName",
        "there are no model packages here; give the Image and ModelDataUrl.",
    ),
    Refused(
        "CreateModel",
        f"{_CONTAINER}.ContainerMetricsConfig",
        "a container's own metrics endpoint is not scraped here.",
    ),
)
"""Every member refused, with when and why; CreateEndpoint's are all honoured."""

Loc = tuple[str | int, ...]


def _rows(operation: str) -> Iterator[tuple[str, Refused]]:
    """Each row of ``operation`` at its path and the paths of the same shape."""
    for row in TABLE:
        if row.operation != operation:
            continue
        yield row.path, row
        for prefix, others in _SAME_SHAPE.items():
            if row.path.startswith(prefix + "."):
                for other in others:
                    yield other + row.path[len(prefix) :], row


def refused_paths(operation: str) -> list[str]:
    """Every member path ``operation`` refuses, the same-shaped ones included."""
    return [path for path, _ in _rows(operation)]


def _found(value: object, steps: list[str], loc: Loc) -> Iterator[tuple[Loc, object]]:
    """Every value at ``steps`` below ``value``, with where it is."""
    if not steps:
        yield loc, value
        return
    step, rest = steps[0], steps[1:]
    name = step.removesuffix("[]")
    if not isinstance(value, dict):
        return
    below = value.get(name)
    if step.endswith("[]"):
        for index, item in enumerate(below if isinstance(below, list) else []):
            yield from _found(item, rest, (*loc, name, index))
    elif below is not None:
        yield from _found(below, rest, (*loc, name))


def refusals(operation: str, params: object) -> list[tuple[Loc, str]]:
    """(where, why) for each member of ``params`` that asks for what is not done; list
    indices in ``where`` count from 0."""
    out: list[tuple[Loc, str]] = []
    for path, row in _rows(operation):
        for loc, value in _found(params, path.split("."), ()):
            if row.asks(value):
                out.append((loc, row.why))
    return out


def check(operation: str, params: object) -> None:
    """Raise InvalidParameter naming every member of ``params`` that is refused here."""
    found = refusals(operation, params)
    if found:
        raise InvalidParameter(
            "; ".join(f"{_dotted(loc)} is not supported: {why}" for loc, why in found)
        )


def _dotted(loc: Loc) -> str:
    """``ProductionVariants.1.EnableSSMAccess``: list items counted from 1, as AWS does."""
    return ".".join(str(p + 1) if isinstance(p, int) else p for p in loc)
