"""The runtime door: ``POST /endpoints/{name}/invocations`` as a raw ASGI handler.

Raw ASGI rather than a Starlette route because this is the data path: the body is passed
through as bytes (never parsed), the routing table is read from memory, and the only
per-request work is picking an instance and copying bytes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from shipyard.contract import BATCH, FORWARDED, parse_batch
from shipyard.errors import (
    AuthFailure,
    BodyTimeout,
    EndpointNotFound,
    InternalFailure,
    ModelError,
    PayloadTooLarge,
    RuntimeFailure,
    RuntimeValidationError,
)
from shipyard.gateway import bodies
from shipyard.gateway.auth import admitted, resource_arn
from shipyard.gateway.errors import runtime_error_response
from shipyard.gateway.http_limits import on_disconnect
from shipyard.gateway.runtime_headers import INVOKE_ENDPOINT, check_header
from shipyard.routing.client import Response
from shipyard.routing.multimodel import refusal, target_model
from shipyard.routing.pipeline import FAILED_CONTAINER
from shipyard.routing.router import Call, ClientGone, Router
from shipyard.routing.shadow import ShadowCopier
from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

_TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
_CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"


class RuntimeDoor:
    """Translates sagemaker-runtime requests to router calls and back."""

    def __init__(
        self,
        *,
        router: Router,
        max_payload_bytes: int,
        account_id: str,
        region: str = "us-east-1",
        body_timeout_s: float = 30.0,
        shadows: ShadowCopier | None = None,
    ) -> None:
        self.router = router
        self.max_payload_bytes = max_payload_bytes
        self.account_id = account_id
        self.region = region
        self.body_timeout_s = body_timeout_s
        self.shadows = shadows

    async def __call__(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        started = time.perf_counter()
        chosen: list[VariantRoute] = []  # filled once a variant is picked, for its metrics
        try:
            status = await self._invoke(scope, receive, send, name, started, chosen)
        except (RuntimeFailure, AuthFailure) as exc:
            status = exc.status_code
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
            await runtime_error_response(exc, send)
        except ClientGone:
            return
        except Exception:
            log.exception("invocation of %s failed", name)
            status = 500
            await runtime_error_response(InternalFailure("Internal failure."), send)
        count_invocation(chosen, status)

    async def _invoke(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        started: float,
        chosen: list[VariantRoute],
    ) -> int:
        self.reach(scope, name)
        route = self.route_of(name)
        forward: list[tuple[bytes, bytes]] = []
        target: str | None = None
        content_length: int | None = None
        for key, value in scope["headers"]:
            check_header(INVOKE_ENDPOINT, key, value)
            wire = FORWARDED.get(key)
            if wire is not None:
                forward.append((wire, value))
            elif key == b"content-length":
                content_length = int(value)
            elif key == _TARGET_VARIANT:
                target = value.decode()
        if content_length is not None and content_length > self.max_payload_bytes:
            raise self.too_large(body_left=True)
        # The whole body before any instance is chosen: a client that trickles it must
        # not hold an instance's slot (or a place in its queue) while it does.
        body = await self.read_body(scope, receive)
        variant = self.router.variant_for(route, target)
        chosen.append(variant)
        multi = variant.multi_model
        model = target_model(route.name, forward) if multi is not None else None
        call = Call(
            forward,
            body,
            content_length=content_length,
            model=model,
            watch_gone=on_disconnect(scope),
        )
        shadows = self.shadows
        copies = shadows.pick(route, variant) if shadows is not None and route.copies else None
        try:
            response, model_s = await self.router.invoke(route, variant, call)
        finally:
            # Copies start once the production answer is in (or failed), and run only
            # when this request next yields: after the client's answer is written.
            if shadows is not None and copies:
                shadows.send(route, copies, call)
        observe_batch(variant, response)
        if response.status >= 300:
            if multi is not None and model is not None:
                failure = refusal(response, model, multi.prefix)
                if failure is not None:
                    raise failure
            raise self.model_error(name, response)
        headers = [
            (b"content-type", response.header(b"content-type") or b"application/octet-stream"),
            (b"content-length", str(len(response.body)).encode()),
            (b"x-amzn-invoked-production-variant", variant.name.encode()),
        ]
        attributes = response.header(_CUSTOM_ATTRIBUTES)
        if attributes is not None:
            headers.append((b"x-amzn-sagemaker-custom-attributes", attributes))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        total = time.perf_counter() - started
        variant.metrics.model_latency.observe(model_s)
        variant.metrics.overhead_latency.observe(max(total - model_s, 0.0))
        if variant.capture is not None:  # one random draw; sampled records only buffered
            variant.capture.offer(forward, body, response.body, headers[0][1])
        return 200

    def reach(self, scope: Scope, name: str) -> None:
        """AccessDenied unless the caller's key reaches endpoint ``name`` (its
        ``resources``, DESIGN 2.9); every runtime door asks before it acts."""
        edge = admitted(scope)
        if edge.caller is not None:
            edge.reach(resource_arn(self.region, self.account_id, "endpoint", name))

    def route_of(self, name: str) -> EndpointRoute:
        """The routing table of a real-time endpoint, or the error its clients get."""
        route = self.router.routes.get(name)
        if route is None:
            raise EndpointNotFound(f"Endpoint {name} of account {self.account_id} not found.")
        if route.async_config is not None:
            raise RuntimeValidationError(
                f"Endpoint {name} is an asynchronous endpoint: invoke it with InvokeEndpointAsync."
            )
        return route

    def model_error(self, name: str, response: Response) -> ModelError:
        """The ModelError for an instance's error answer (see _model_error)."""
        return _model_error(name, response, self._log_group_arn(name))

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, at most ``max_payload_bytes``, within ``body_timeout_s``, in
        the runtime doors' errors (gateway/bodies.py reads it)."""
        try:
            return await bodies.read_body(
                scope, receive, max_bytes=self.max_payload_bytes, timeout_s=self.body_timeout_s
            )
        except bodies.BodyTooLarge as exc:
            raise self.too_large(body_left=exc.body_left) from None
        except bodies.BodyTimedOut as exc:
            raise BodyTimeout(
                f"The request body did not arrive within {exc.timeout_s:g} seconds."
            ) from None
        except bodies.ClientLeft:
            raise ClientGone() from None

    def too_large(self, *, body_left: bool) -> PayloadTooLarge:
        exc = PayloadTooLarge(
            f"Request body is larger than the maximum of {self.max_payload_bytes} bytes."
        )
        exc.body_left = body_left
        return exc

    def _log_group_arn(self, endpoint: str) -> str:
        """The endpoint's instance logs, as the CloudWatch Logs door serves them."""
        group = f"/aws/sagemaker/Endpoints/{endpoint}"
        return f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{group}"


def observe_batch(variant: VariantRoute, response: Response) -> None:
    """Record the server-side batch an instance says answered the request, if any."""
    value = response.header(BATCH)
    if value is not None:
        batch = parse_batch(value)
        if batch is not None:
            variant.metrics.observe_batch(*batch)


def count_invocation(chosen: list[VariantRoute], status: int) -> None:
    """Count one answered request, and its 4xx/5xx, on the variant it was routed to."""
    if chosen:
        m = chosen[0].metrics
        m.invocations.inc()
        if status >= 500:
            m.errors_5xx.inc()
        elif status >= 400:
            m.errors_4xx.inc()


def _model_error(name: str, response: Response, log_group_arn: str) -> ModelError:
    """The instance answered with an error status: the model's own failure. A step of a
    multi-container model is named by its ContainerHostname or position (DESIGN 2.7)."""
    message = response.body.decode(errors="replace")
    kind = "client" if response.status < 500 else "server"
    source = (response.header(FAILED_CONTAINER) or b"primary").decode(errors="replace")
    return ModelError(
        f"Received {kind} error ({response.status}) from {source} with message "
        f'"{message}". See the instance log for more information.',
        original_status_code=response.status,
        original_message=message,
        log_stream_arn=log_group_arn,
    )
