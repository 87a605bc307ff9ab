"""The control-plane door: ``POST /`` in AWS JSON (1.1 as boto3's ``sagemaker`` sends it,
1.0 as its ``cloudwatch`` can), and ``POST /service/<prefix>/operation/<action>`` in Smithy
RPC v2 CBOR, as botocore sends CloudWatch's by default. One pipeline behind both wires.

Whatever arrives, the answer is an AWS JSON error or a result, never a 500 or a hang:
the body is read up to a cap (``MAX_BODY_BYTES``) within a time limit, JSON nested
deeper than any SageMaker shape is refused before anything walks it, and the request is
checked against botocore's service model, and SageMaker's against the members not done
here (gateway/api/unsupported.py), before an action sees it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import cache
from typing import Any

import cbor2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from shipyard.cloudwatch.service import reserved
from shipyard.errors import (
    BodyTimedOut,
    BodyTooLarge,
    ClientLeft,
    InvalidParameter,
    MetricsValidationError,
    RequestTooLarge,
    SerializationException,
    UnknownOperation,
)
from shipyard.gateway.api import unsupported
from shipyard.gateway.edge.auth import REQUEST_KEY, Admitted, admitted, authorize
from shipyard.gateway.wire import query
from shipyard.gateway.wire.errors import (
    AMZ_JSON,
    CBOR,
    control_error_response,
    rpc_v2_error_response,
)
from shipyard.gateway.wire.registry import (
    SAGEMAKER,
    Action,
    ActionRegistry,
    query_target,
    rpc_v2_target,
)
from shipyard.gateway.wire.validation import service_model
from shipyard.http import bodies
from shipyard.logs.service import ENDPOINTS_GROUP, JOBS_GROUP

MAX_BODY_BYTES = 1 << 20
"""SageMaker's control-plane requests are a few KiB; a bigger body is refused unread."""

MAX_DEPTH = 64
"""Deepest JSON nesting accepted; SageMaker's input shapes nest about ten levels."""

BODY_TIMEOUT_S = 30.0
"""How long the whole body may take to arrive; a slower client gets a 400."""

_NAMED = {
    "ModelName": "model",
    "EndpointConfigName": "endpoint-config",
    "EndpointName": "endpoint",
    "InferenceComponentName": "inference-component",
    "BaseInferenceComponentName": "inference-component",
    "TrainingJobName": "training-job",
    "TransformJobName": "transform-job",
    "ProcessingJobName": "processing-job",
    "MonitoringScheduleName": "monitoring-schedule",
    "JobDefinitionName": "data-quality-job-definition",
    "MonitoringJobDefinitionName": "data-quality-job-definition",
}
"""Request members that name a resource, and the kind of ARN its name makes."""

_ALARM_LISTS = frozenset({"AlarmNames", "AlarmActions", "OKActions", "InsufficientDataActions"})
"""Request members listing alarms, or the actions of one (scaling policies by ARN)."""

_DIMENSION = "dimension"
"""A metric dimension (``{"Name", "Value"}``): ``EndpointName`` names an endpoint."""
_ALARM = "alarm"
"""A CloudWatch alarm by name below the top level (a deployment's rollback alarms)."""
_NAMESPACE = "namespace"
"""A CloudWatch metric's namespace below the top level (GetMetricData's queries, a
metric math alarm's metrics)."""
_PUT_METRICS = "PutMetricData"
"""The one action that writes a namespace: it needs the namespace's ARN even for the
gateway's own namespaces (which it then refuses); reads need it outside them."""

_DRAIN_BYTES = 8 << 20
_DRAIN_S = 2.0


def _json_default(value: object) -> object:
    # AWS JSON 1.1 sends timestamps as epoch seconds.
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"cannot serialise {type(value).__name__}")


class ControlDoor:
    """Runs the ``X-Amz-Target`` the edge read (``auth.Admitted``), validated against the
    service model, from the action registry (gateway/wire/registry.py).

    ``arn(kind, name)`` makes the ARN of a resource a request names by name, for keys
    scoped by resource.
    """

    def __init__(
        self,
        *,
        actions: ActionRegistry,
        arn: Callable[[str, str], str],
        alarm_arn: Callable[[str], str] | None = None,
        namespace_arn: Callable[[str], str] | None = None,
    ) -> None:
        self.actions = actions
        self.arn = arn
        self.alarm_arn = alarm_arn
        """A CloudWatch alarm's ARN by its name: what a scoped key must reach to put,
        read, set, tag or delete it (``resources: [arn:aws:cloudwatch:*:*:alarm:team-*]``)."""
        self.namespace_arn = namespace_arn
        """A CloudWatch namespace's ARN: what a scoped key must reach to put a metric
        in it, or read one outside the gateway's own namespaces
        (``resources: [arn:aws:cloudwatch:*:*:namespace/TeamA*]``)."""

    async def handle(self, request: Request) -> Response:
        """AWS JSON: the action named by ``X-Amz-Target``, the body a JSON object."""
        request_id = {"x-amzn-RequestId": str(uuid.uuid4())}
        edge = admitted(request.scope)
        if not edge.target:
            return await self._handle_query(request, edge, request_id)
        media_type = AMZ_JSON
        try:
            # The target the edge read and authorised, never the header again: a second
            # reading could pick another value (a request is read once, at the edge).
            action = self.actions.find(edge.target)
            media_type = action.service.media_type
            params = _parse(await read_body(request, max_bytes=MAX_BODY_BYTES))
            result = await self._run(action, params, edge)
        except Exception as exc:  # every error leaves through the one renderer
            response = control_error_response(exc, media_type=media_type)
            response.headers.update(request_id)
            return response
        body = json.dumps(result, default=_json_default)
        return Response(body, media_type=media_type, headers=request_id)

    async def _handle_query(
        self, request: Request, edge: Admitted, request_id: dict[str, str]
    ) -> Response:
        """The AWS query protocol (gateway/wire/query.py): no X-Amz-Target, the action named
        by the form body (as the edge read it from the same bytes). A body that names
        no action of a service served so is answered as AWS JSON answers a request with
        no target."""
        rid = request_id["x-amzn-RequestId"]
        try:
            body = await read_body(request, max_bytes=MAX_BODY_BYTES)
        except Exception as exc:
            body, failure = b"", exc
        else:
            failure = UnknownOperation("The operation (none) is not supported.")
        target = query_target(body)
        if target is None:  # not the query protocol either: AWS JSON's answer
            response = control_error_response(failure)
            response.headers.update(request_id)
            return response
        try:
            action = self.actions.find(target)
            operation = service_model(action.service.botocore).operation_model(action.name)
            params = query.params(body, operation.input_shape)
            result = await self._run(action, params, edge)
        except Exception as exc:  # every error leaves through the one renderer
            status, payload = query.error(exc, rid)
            return Response(payload, status_code=status, media_type="text/xml", headers=request_id)
        xmlns = operation.service_model.metadata.get("xmlNamespace", "")
        payload = query.render(action.name, result, operation.output_shape, xmlns, rid)
        return Response(payload, media_type="text/xml", headers=request_id)

    async def handle_rpc_v2(self, request: Request) -> Response:
        """Smithy RPC v2 CBOR: the action named by the path (which the signature covers
        and the edge authorised), the body a CBOR map."""
        request_id = {"x-amzn-RequestId": str(uuid.uuid4()), "smithy-protocol": "rpc-v2-cbor"}
        try:
            action = self.actions.find(rpc_v2_target(request.url.path) or "", rpc_v2=True)
            params = _parse_cbor(await read_body(request, max_bytes=MAX_BODY_BYTES))
            result = await self._run(action, params, admitted(request.scope))
        except Exception as exc:  # every error leaves through the one renderer
            response = rpc_v2_error_response(exc)
            response.headers.update(request_id)
            return response
        body = cbor2.dumps(result, datetime_as_timestamp=True, timezone=UTC)
        return Response(body, media_type=CBOR, headers=request_id)

    async def _run(self, action: Action, params: object, edge: Admitted) -> dict[str, Any]:
        if edge.caller is not None:
            # Authorised as what runs, where it runs: whichever way the action was named
            # (X-Amz-Target, a query form's Action, an RPC v2 path) and read at the edge.
            authorize(edge.caller, action.iam, account_id=edge.account_id)
            if edge.action != action.iam:  # a query form names its action in the body
                edge = edge._replace(action=action.iam)  # what a refusal below names
        try:
            action.validator.validate(action.name, params)
        except InvalidParameter as exc:
            if not action.service.own_errors:
                raise
            raise MetricsValidationError(exc.message) from None
        assert isinstance(params, dict)  # validate refuses anything but a JSON object
        _drop_nulls(params)
        if action.service is SAGEMAKER:  # members it has that are not done here
            unsupported.check(action.name, params)
        scoped = not edge.reaches_all
        if scoped:  # keys scoped by resource: every resource the call names
            # In a worker: the first call of an action reads botocore's model (_nested_paths).
            nested = await run_in_threadpool(self._nested, action, params)
            for arn in self._resources(params, params, action) + nested:
                edge.reach(arn)
        # Who the action runs for, for what it records of its maker (CloudWatch's per-key
        # quotas); the worker thread runs in a copy of this context.
        token = REQUEST_KEY.set("" if edge.caller is None else edge.caller.access_key_id)
        try:
            result: dict[str, Any] = await run_in_threadpool(action.run, params)
        finally:
            REQUEST_KEY.reset(token)
        if scoped and action.lists:  # only what the key may see
            self._only_reached(result, params, edge, action)
        return result

    def _resources(
        self, value: dict[str, Any], params: dict[str, Any], action: Action
    ) -> list[str]:
        """The ARNs of the resources a request (or an item of an answer to ``params``)
        of ``action`` names at its top level: by name (``EndpointName``...), by ARN
        (``ResourceArn``, ``EndpointArn``...), by Application Auto Scaling's
        ``ResourceId``, by log group and stream, or a CloudWatch metric's namespace. A
        Create names the resource it creates; CreateEndpoint both the endpoint and its
        config, as IAM asks of both."""
        arn = self.arn
        found = []
        for key, item in value.items():
            if isinstance(item, list):
                found.extend(self._listed_resources(key, item))
                continue
            if not isinstance(item, str):
                continue
            found.extend(self._cloudwatch_resources(key, item, action))
            if key in _NAMED:
                found.append(arn(_NAMED[key], item))
            elif key.lower().endswith("arn") and item.lower().startswith("arn:aws:sagemaker:"):
                found.append(item)
            elif key == "ResourceId" and item.startswith("endpoint/"):
                found.append(arn("endpoint", item.split("/")[1]))
            elif key == "ResourceId" and item.startswith("inference-component/"):
                found.append(arn("inference-component", item.split("/")[1]))
            elif key == "logGroupName" and item.startswith(ENDPOINTS_GROUP):
                found.append(arn("endpoint", item.removeprefix(ENDPOINTS_GROUP)))
            elif key == "logStreamName" and params.get("logGroupName") == JOBS_GROUP:
                found.append(arn("training-job", item.split("/")[0]))
        return found

    def _cloudwatch_resources(self, key: str, item: str, action: Action) -> list[str]:
        """What a top-level string names in CloudWatch's terms: an alarm (by name or
        ARN), a metric's namespace."""
        if key == "AlarmName" and self.alarm_arn is not None:
            return [self.alarm_arn(item)]
        if key.lower().endswith("arn") and item.lower().startswith("arn:aws:cloudwatch:"):
            return [item]
        if key == "Namespace" and action.service.iam == "cloudwatch":
            return self._namespace_resources(item, action)
        return []

    def _namespace_resources(self, namespace: str, action: Action) -> list[str]:
        """A metric's namespace, as a scoped key must reach it: always to put a metric,
        to read one outside the gateway's own namespaces (whose metrics are reached
        through the endpoint or component their dimensions name)."""
        if self.namespace_arn is None or (action.name != _PUT_METRICS and reserved(namespace)):
            return []
        return [self.namespace_arn(namespace)]

    def _listed_resources(self, key: str, items: list[Any]) -> list[str]:
        """What a list member names: a metric's (or alarm's) dimensions, alarms by name,
        an alarm's actions."""
        if key == "Dimensions":
            return self._dimension_resources(items)
        if key in _ALARM_LISTS:
            return self._alarm_resources(key, items)
        return []

    def _alarm_resources(self, key: str, items: list[Any]) -> list[str]:
        """The alarms AlarmNames names, and the endpoints (or components) of the scaling
        policies an alarm's actions would run."""
        found = []
        for item in items:
            if not isinstance(item, str):
                continue
            if key == "AlarmNames" and self.alarm_arn is not None:
                found.append(self.alarm_arn(item))
            elif item.startswith("arn:aws:autoscaling:"):
                _, _, resource = item.partition(":resource/sagemaker/")
                parts = resource.split(":policyName/")[0].split("/")
                if parts[0] == "endpoint" and len(parts) > 1:
                    found.append(self.arn("endpoint", parts[1]))
                elif parts[0] == "inference-component" and len(parts) > 1:
                    found.append(self.arn("inference-component", parts[1]))
                else:
                    found.append(item)  # not a policy of ours: reached only by "*"
        return found

    def _dimension_resources(self, dimensions: list[Any]) -> list[str]:
        """The endpoints and inference components a metric's dimensions name."""
        kinds = {"EndpointName": "endpoint", "InferenceComponentName": "inference-component"}
        return [
            self.arn(kinds[d["Name"]], str(d.get("Value", "")))
            for d in dimensions
            if isinstance(d, dict) and d.get("Name") in kinds
        ]

    def _nested(self, action: Action, params: dict[str, Any]) -> list[str]:
        """The ARNs of the resources a request names below its top level: the models of
        CreateEndpointConfig's ``ProductionVariants`` and ``ShadowProductionVariants``,
        the endpoint a scaling policy's metric dimension reads, and any other member
        the action's input shape has at ``_nested_paths``."""
        found = []
        for path, kind in _nested_paths(action.service.botocore, action.name):
            for item in _at(params, path):
                if kind == _DIMENSION:
                    found.extend(self._dimension_resources([item]))
                elif not isinstance(item, str):
                    continue
                elif kind == _NAMESPACE:
                    found.extend(self._namespace_resources(item, action))
                elif kind == _ALARM:
                    if self.alarm_arn is not None:
                        found.append(self.alarm_arn(item))
                elif kind in _NAMED.values():
                    found.append(self.arn(kind, item))
                elif item.lower().startswith("arn:aws:sagemaker:"):
                    found.append(item)
        return found

    def _only_reached(
        self, result: dict[str, Any], params: dict[str, Any], edge: Admitted, action: Action
    ) -> None:
        """Drop from each list of the answer the items naming a resource the key does
        not reach. Each page is filtered as it is served: a page may come out short or
        empty, with its NextToken, which clients and boto3's paginators follow."""
        for key, value in result.items():
            if isinstance(value, list):
                result[key] = [
                    item
                    for item in value
                    if not isinstance(item, dict)
                    or all(edge.reaches(arn) for arn in self._resources(item, params, action))
                ]


@cache
def _nested_paths(service: str, action: str) -> tuple[tuple[tuple[str, ...], str], ...]:
    """Where below its top level a request of ``action`` names a resource, read from
    botocore's input shape once: (path, kind) with ``"*"`` for a list's items, kind a
    value of ``_NAMED`` (a member of that name), ``"arn"`` (a member ending in ``Arn``),
    ``_ALARM``, ``_NAMESPACE`` or ``_DIMENSION``. Maps (``Environment``,
    ``HyperParameters``, tags) hold the caller's own names, not the service's, and are
    not walked."""
    model = service_model(service)
    if action not in model.operation_names or model.operation_model(action).input_shape is None:
        return ()
    found: list[tuple[tuple[str, ...], str]] = []

    def walk(shape: Any, path: tuple[str, ...], seen: frozenset[str]) -> None:
        if shape.name in seen or len(path) > MAX_DEPTH:
            return
        seen = seen | {shape.name}
        if shape.type_name == "list":
            walk(shape.member, (*path, "*"), seen)
        if shape.type_name != "structure":
            return
        members = shape.members
        if path and set(members) == {"Name", "Value"}:
            found.append((path, _DIMENSION))
            return
        for name, member in members.items():
            kind = _member_kind(service, name) if member.type_name == "string" else None
            if path and kind is not None:
                found.append(((*path, name), kind))
            walk(member, (*path, name), seen)

    walk(model.operation_model(action).input_shape, (), frozenset())
    return tuple(found)


def _member_kind(service: str, name: str) -> str | None:
    """What a string member of this name names below a request's top level, if anything."""
    if name in _NAMED:
        return _NAMED[name]
    if name == "AlarmName":  # a deployment's rollback alarms, by name
        return _ALARM
    if name == "Namespace" and service == "cloudwatch":
        return _NAMESPACE
    if name.lower().endswith("arn"):
        return "arn"
    return None


def _at(value: object, path: tuple[str, ...]) -> list[object]:
    """The values at ``path`` in a request (``"*"``: each item of a list)."""
    values = [value]
    for step in path:
        if step == "*":
            values = [item for v in values if isinstance(v, list) for item in v]
        else:
            values = [v[step] for v in values if isinstance(v, dict) and step in v]
    return values


async def read_body(request: Request, *, max_bytes: int) -> bytes:
    """The body, refused with RequestTooLarge as soon as it is known to pass ``max_bytes``.

    Shared by the doors that buffer small JSON bodies (the control plane, the facade);
    http/bodies.py reads it.
    """
    declared = admitted(request.scope).head.content_length or ""
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)  # unread: the edge drops what comes after the answer
    try:
        return await bodies.read_body(
            request.scope, request.receive, max_bytes=max_bytes, timeout_s=BODY_TIMEOUT_S
        )
    except BodyTooLarge as exc:
        if exc.body_left:
            await bodies.drain(request.receive, max_bytes=_DRAIN_BYTES, timeout_s=_DRAIN_S)
        raise _too_large(max_bytes) from None
    except BodyTimedOut:
        raise SerializationException(
            f"The request body did not arrive within {BODY_TIMEOUT_S:g} seconds."
        ) from None
    except ClientLeft:
        # Nobody is left to read the answer; say so without a traceback in the log.
        raise SerializationException("The client closed the connection mid-body.") from None


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than {max_bytes} bytes, the most this door accepts."
    )


def _parse(raw: bytes) -> object:
    """The body as JSON; ``SerializationException`` for anything else or too deep."""
    try:
        params = json.loads(raw or b"{}")
    except RecursionError:  # the decoder recurses once per level
        raise _too_deep() from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise SerializationException(f"Request body is not valid JSON: {exc}") from exc
    _check_depth(params)
    return params


def _parse_cbor(raw: bytes) -> object:
    """The body as CBOR, in JSON's terms (timestamps as epoch seconds, as AWS JSON sends
    them); ``SerializationException`` for anything else, too deep or of a type no
    CloudWatch shape has (sets, decimals, tags beyond timestamps)."""
    try:
        params = cbor2.loads(raw) if raw else {}
    except RecursionError:
        raise _too_deep() from None
    except (cbor2.CBORDecodeError, ValueError, OverflowError) as exc:
        raise SerializationException(f"Request body is not valid CBOR: {exc}") from None
    params = _plain(params)
    _check_depth(params)
    return params


def _plain(value: object) -> object:
    """``value`` with datetimes as epoch seconds; SerializationException for a type no
    JSON value has, or a container met twice. Iterative, like ``_check_depth``: the
    decoder caps nesting, this never recurses, and each container is walked once."""
    root: list[object] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    seen: set[int] = set()
    while stack:
        holder, key = stack.pop()
        item = holder[key]
        if isinstance(item, dict | list):
            # CBOR's shared values (tags 28/29) can make a container hold itself, or hold
            # one container many times over: a walk would never end, or take 2^n steps.
            if id(item) in seen:
                raise SerializationException(
                    "Request body is not valid CBOR here: a shared or self-referencing value."
                )
            seen.add(id(item))
        if isinstance(item, datetime):
            holder[key] = item.timestamp()
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise SerializationException(
                    "Request body is not valid CBOR: a map key is not text."
                )
            stack.extend((item, k) for k in item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif not (item is None or isinstance(item, str | bool | int | float | bytes)):
            raise SerializationException(
                f"Request body holds a CBOR value of type {type(item).__name__}, which no "
                "parameter takes."
            )
    return root[0]


def _check_depth(value: object) -> None:
    """Refuse nesting past MAX_DEPTH, walking without recursion (the validator and
    error messages recurse along the value), and strings no UTF-8 can hold (a lone
    surrogate escape such as ``"\\udfff"``), which nothing downstream could store."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if isinstance(item, dict):
            for key in item:
                _check_text(key)
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise _too_deep()
        stack.extend((child, depth + 1) for child in children)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError:
        raise SerializationException(
            "Request body is not valid JSON: a string holds a lone surrogate, which is no "
            "Unicode character."
        ) from None


def _drop_nulls(value: object) -> None:
    """Remove null members, which AWS's deserialiser reads as absent, so that actions
    see ``"MaxResults": null`` as no MaxResults. Validation has already refused nulls
    where they are not allowed (list items, map values)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in [k for k, v in item.items() if v is None]:
                del item[key]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _too_deep() -> SerializationException:
    return SerializationException(f"Request body nests deeper than {MAX_DEPTH} levels.")
