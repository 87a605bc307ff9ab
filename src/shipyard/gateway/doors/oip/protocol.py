"""The Open Inference Protocol v2 (KServe / Triton / MLServer) over the same endpoints:
what its REST and gRPC doors share.

A model of the protocol is an endpoint; a version is one of its production variants.
An inference goes the way of InvokeEndpoint (gateway/doors/runtime.py): the same routing
table, variant choice, router, limits and per-variant metrics. Only the body differs:
the door checks the tensors (shipyard/tensors.py) and sends the instance the wire
format, ``application/vnd.shipyard.v2+tensors``, then reads the outputs from the answer.

Errors are the runtime's own (errors.py), rendered by each door in the protocol's shape
through :func:`status_of`: unknown model 404 / NOT_FOUND, bad request 400 /
INVALID_ARGUMENT, model failure 424 / INTERNAL, overload 429 or 503 / UNAVAILABLE or
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shipyard import __version__
from shipyard.errors import (
    AuthFailure,
    EndpointNotFound,
    ModelError,
    ModelNotReady,
    RuntimeValidationError,
    ServiceUnavailable,
    ShipyardError,
    TensorError,
    Throttling,
)
from shipyard.gateway.doors.endpoint import EndpointAccess
from shipyard.http.client import Response
from shipyard.routing import priorities
from shipyard.routing.call import Call
from shipyard.routing.table import EndpointRoute, VariantRoute
from shipyard.tensors import (
    HEADER_LENGTH,
    TENSORS,
    InferRequest,
    Tensor,
    header_length_of,
    parse_response,
    wire_request,
)

SERVER_NAME = "shipyard"
EXTENSIONS = ["binary_tensor_data", "schedule_policy"]
PLATFORM = "shipyard"

_ACCEPT = (b"Accept", TENSORS.encode())
_HEADER_LENGTH = HEADER_LENGTH.encode()
_HEADER_LENGTH_LOWER = HEADER_LENGTH.lower().encode()


@dataclass(frozen=True, slots=True)
class Status:
    """How a door reports one error: HTTP status, gRPC code name and message."""

    http: int
    grpc: str
    message: str


@dataclass(slots=True)
class Inference:
    """One answered inference: where it ran and what it gave."""

    model_name: str
    model_version: str
    outputs: list[Tensor]


class InferenceProtocol:
    """The protocol's operations over the router's tables, for both doors."""

    def __init__(self, *, access: EndpointAccess, is_ready: Callable[[], bool]) -> None:
        self.access = access
        self.invocations = access.invocations
        self.router = access.router
        self.is_ready = is_ready

    def __repr__(self) -> str:
        return f"InferenceProtocol({self.router!r})"

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """What the protocol says of a model. Inputs and outputs are whatever the model
        takes and gives (the SageMaker contract declares none), so both lists are empty."""
        route = self.invocations.route(name)
        if version is not None:
            _variant(route, version)
        return {
            "name": name,
            "versions": [v.name for v in route.variants if not _is_shadow(v)],
            "platform": PLATFORM,
            "inputs": [],
            "outputs": [],
        }

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether a request would find an instance: a healthy one, or a serverless
        variant that starts one on demand."""
        route = self.invocations.route(name)
        variants = [_variant(route, version)] if version is not None else route.variants
        return any(
            v.admission.starts_instances or any(i.healthy for i in v.instances)
            for v in variants
            if not _is_shadow(v)
        )

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        calls: list[Call],
        watch_gone: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    ) -> Inference:
        """Send one inference to an instance of ``name`` and return its outputs.

        ``calls`` receives the call as soon as it is made, for the door's counting
        (Invocations.count). ``watch_gone``: as ``Call.watch_gone``, so that a request
        whose client left while it waited for an instance is never sent. Raises the
        runtime's errors or TensorError.
        """
        started = time.perf_counter()
        route = self.invocations.route(name)
        body, length = wire_request(request)
        call = Call(
            [
                (b"Content-Type", f"{TENSORS}; header-length={length}".encode()),
                _ACCEPT,
                (_HEADER_LENGTH, str(length).encode()),
            ],
            body,
            content_length=len(body),
            watch_gone=watch_gone,
            started=started,
        )
        # Triton's scheduling parameters: the priority level and the queue timeout.
        call.priority, call.deadline_s = priorities.from_oip(request.parameters)
        calls.append(call)
        if version is not None:
            call.variant = _variant(route, version)
        variant = call.variant or self.router.variant_for(route, None)
        call.variant = variant
        self.invocations.rank(call, variant)
        if variant.dispatch.names_model:
            raise RuntimeValidationError(
                f"Endpoint {name} serves many models (Mode: MultiModel); call it with "
                "InvokeEndpoint and TargetModel."
            )
        response = await self.invocations.run(route, call)
        return Inference(name, variant.name, _outputs(name, response))


def _variant(route: EndpointRoute, version: str) -> VariantRoute:
    variant = route.by_name.get(version)
    if variant is None or _is_shadow(variant):
        raise EndpointNotFound(f"Model {route.name} has no version {version}.")
    return variant


def _is_shadow(variant: VariantRoute) -> bool:
    # Shadow variants only take copies: never a version a client can call.
    return bool(getattr(variant, "shadow", False))


def _outputs(name: str, response: Response) -> list[Tensor]:
    """The outputs of an instance's answer; one that is no inference response is the
    model's failure."""
    content_type = (response.header(b"content-type") or b"").decode("latin-1")
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind not in (TENSORS, "application/json"):
        raise ModelError(
            f"The model serving {name} answered {content_type or 'no content type'}, not "
            f"{TENSORS}: define predict_tensors_fn, or an output_fn that returns tensors.",
            original_status_code=response.status,
            original_message=response.body[:200].decode(errors="replace"),
        )
    header = response.header(_HEADER_LENGTH_LOWER)
    try:
        length = header_length_of(content_type, header.decode("latin-1") if header else None)
        return parse_response(response.body, length)
    except TensorError as exc:
        raise ModelError(
            f"The model serving {name} gave no valid inference response: {exc}",
            original_status_code=response.status,
            original_message=str(exc),
        ) from exc


def status_of(exc: Exception) -> Status:
    """How the protocol reports ``exc``: the one mapping both doors use."""
    if isinstance(exc, TensorError):
        return Status(400, "INVALID_ARGUMENT", str(exc))
    if not isinstance(exc, ShipyardError):
        return Status(500, "INTERNAL", "Internal failure.")
    message = exc.message
    if isinstance(exc, AuthFailure):
        return Status(403, "PERMISSION_DENIED", message)
    if isinstance(exc, EndpointNotFound):
        return Status(404, "NOT_FOUND", message)
    if isinstance(exc, RuntimeValidationError):
        return Status(exc.status_code, "INVALID_ARGUMENT", message)
    if isinstance(exc, ModelError):
        return Status(424, "INTERNAL", message)
    if isinstance(exc, Throttling):
        return Status(429, "RESOURCE_EXHAUSTED", message)
    if isinstance(exc, ModelNotReady | ServiceUnavailable):
        return Status(exc.status_code, "UNAVAILABLE", message)
    return Status(exc.status_code, "INTERNAL", message)
