"""The action registry of ``POST /``: which ``X-Amz-Target`` runs what, checked how, and
allowed as which IAM action.

One table for the control-plane door (gateway/api/control.py), which looks an action up to
validate and run it, and for the signature layer (gateway/edge/signatures.py, through
``iam_action``), which names the action a key must be allowed before the door sees the
request. A new control-plane action is one line in its family's ``ACTIONS``
(gateway/api/actions/); a new service is one ``Service`` here and one ``add`` where the
gateway is composed.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from shipyard.errors import UnknownOperation
from shipyard.gateway.wire.validation import RequestValidator

S = TypeVar("S")
Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Service:
    """An AWS service the door speaks: its ``X-Amz-Target`` prefix, its IAM prefix, and
    botocore's name for it (whose service model validates its requests)."""

    target: str
    iam: str
    botocore: str
    json_version: str = "1.1"
    rpc_v2: bool = False
    """Whether it is also served in Smithy RPC v2 CBOR (``RPC_V2``)."""
    own_errors: bool = False
    """Whether it answers a request botocore's model refuses in its own error code
    (CloudWatch's ValidationError) rather than ValidationException."""

    @property
    def prefix(self) -> str:
        return self.target + "."

    @property
    def media_type(self) -> str:
        """Its AWS JSON answers' Content-Type."""
        return f"application/x-amz-json-{self.json_version}"


SAGEMAKER = Service("SageMaker", "sagemaker", "sagemaker")
SCALING = Service("AnyScaleFrontendService", "application-autoscaling", "application-autoscaling")
LOGS = Service("Logs_20140328", "logs", "logs")
CLOUDWATCH = Service(
    "GraniteServiceVersion20100801",
    "cloudwatch",
    "cloudwatch",
    json_version="1.0",
    rpc_v2=True,
    own_errors=True,
)

SERVICES = {s.target: s for s in (SAGEMAKER, SCALING, LOGS, CLOUDWATCH)}

RPC_V2 = "/service/"
"""Where Smithy RPC v2 (CBOR) requests go: ``POST /service/<prefix>/operation/<action>``,
as botocore sends CloudWatch's; the path names the action ``X-Amz-Target`` names in
AWS JSON."""


QUERY_VERSIONS = {"2010-08-01": CLOUDWATCH}
"""Services also served in the AWS query protocol (a form body naming ``Action`` and
``Version``, answered in XML), by API version: CloudWatch, as botocore before its JSON
protocol sent it."""


def query_target(body: bytes) -> str | None:
    """The ``X-Amz-Target`` equivalent of a query-protocol body (``<prefix>.<Action>``),
    or None when ``body`` is not one of a service served so."""
    if not body or len(body) > 1 << 20:
        return None
    try:
        form = urllib.parse.parse_qs(body.decode("ascii"), max_num_fields=10_000)
    except (UnicodeDecodeError, ValueError):
        return None
    action, version = form.get("Action", [""]), form.get("Version", [""])
    service = QUERY_VERSIONS.get(version[0]) if len(version) == 1 else None
    if service is None or len(action) != 1 or not action[0].isalnum():
        return None
    return f"{service.target}.{action[0]}"


def rpc_v2_target(path: str) -> str | None:
    """The ``X-Amz-Target`` equivalent of an RPC v2 path (``<prefix>.<action>``), or None
    when ``path`` is not one."""
    if not path.startswith(RPC_V2):
        return None
    parts = path[len(RPC_V2) :].split("/")
    if len(parts) != 3 or parts[1] != "operation" or not parts[0] or not parts[2]:
        return None
    return f"{parts[0]}.{parts[2]}"


def iam_action(target: str | None) -> str:
    """The IAM action a request with ``target`` is allowed as (``sagemaker:CreateModel``);
    a target of no known service counts as SageMaker's, so an unknown one is still scoped."""
    prefix, _, name = (target or "").partition(".")
    service = SERVICES.get(prefix, SAGEMAKER)
    return f"{service.iam}:{name or 'UnknownOperation'}"


@dataclass(frozen=True, slots=True)
class Action:
    """One control-plane action, ready to run."""

    service: Service
    name: str
    validator: RequestValidator
    run: Callable[[Json], Json]

    @property
    def iam(self) -> str:
        """The IAM action it is allowed as (``sagemaker:CreateModel``)."""
        return f"{self.service.iam}:{self.name}"

    @property
    def lists(self) -> bool:
        """Whether its answer lists resources (then a scoped key sees only those it
        reaches): the List calls, and the Describe* of Logs, Application Auto Scaling and
        CloudWatch."""
        return self.name.startswith("List") or self.service is not SAGEMAKER


class ActionRegistry:
    """Every action the control-plane door serves, by ``X-Amz-Target``."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}
        self._validators: dict[Service, RequestValidator] = {}

    def __repr__(self) -> str:
        return f"ActionRegistry(actions={len(self._actions)})"

    def add(
        self,
        service: Service,
        actions: Mapping[str, Callable[[S, Json], Json]],
        on: S,
        *,
        validator: RequestValidator | None = None,
    ) -> None:
        """Serve ``actions`` of ``service``, each called with ``on`` and the request's
        JSON object; validated by ``validator`` (by default botocore's model of the
        service). A target served twice is a mistake in the composition: refused."""
        if validator is None:
            validator = self._validators.get(service) or RequestValidator(service.botocore)
        self._validators.setdefault(service, validator)
        for name, run in actions.items():
            target = service.prefix + name
            if target in self._actions:
                raise ValueError(f"{target} is registered twice")
            self._actions[target] = Action(service, name, validator, partial(run, on))

    def find(self, target: str, *, rpc_v2: bool = False) -> Action:
        """The action of ``target``, or UnknownOperation (also for an action of a service
        not served in RPC v2, asked ``rpc_v2``)."""
        action = self._actions.get(target)
        if action is None or (rpc_v2 and not action.service.rpc_v2):
            raise UnknownOperation(f"The operation {target[:200] or '(none)'} is not supported.")
        return action

    def targets(self) -> list[str]:
        return sorted(self._actions)
