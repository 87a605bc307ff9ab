"""The data-plane doors put together: one EndpointAccess shared by every door, the path
router that reaches them, and the HTTP/2 server of bidirectional streams when the
gateway has a port for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.async_inference.queue import AsyncInvocations
from shipyard.gateway.doors.async_invocations import AsyncDoor
from shipyard.gateway.doors.bidi import BidiDoor, BidiLimits
from shipyard.gateway.doors.endpoint import EndpointAccess
from shipyard.gateway.doors.oip.protocol import InferenceProtocol
from shipyard.gateway.doors.oip.rest import OipRestDoor
from shipyard.gateway.doors.openai import OpenAIDoor
from shipyard.gateway.doors.runtime import RuntimeDoor
from shipyard.gateway.doors.streaming import ResponseStreamDoor
from shipyard.gateway.edge.assembly import stream_edge
from shipyard.http.h2server import H2Server
from shipyard.http.paths import PathRouter
from shipyard.metrics import Metrics
from shipyard.routing.invocation import Invocations
from shipyard.settings import Settings
from shipyard.stackfile import StackFile


@dataclass
class Doors:
    """Every data-plane door, and the path router in front of them."""

    paths: PathRouter
    oip: InferenceProtocol
    bidi: BidiDoor
    h2: H2Server | None = field(default=None)
    grpc: Any = field(default=None)

    async def start_grpc(self, settings: Settings, tls: tuple[Path, Path] | None) -> None:
        """Serve the Open Inference Protocol over gRPC on ``settings.grpc_port``, if set."""
        if settings.grpc_port is None:
            return
        from shipyard.gateway.doors.oip.grpc import start_grpc  # grpcio, loaded if asked

        pem = None
        if tls is not None:  # gRPC takes the PEM text, not the files
            pem = (tls[0].read_bytes(), tls[1].read_bytes())
        self.grpc = await start_grpc(
            self.oip,
            host=settings.host,
            port=settings.grpc_port,
            max_message_bytes=settings.max_payload_bytes + 64 * 1024,
            tls=pem,
        )

    async def stop_grpc(self, drain_timeout_s: float) -> None:
        """Take no more calls; answer those in flight."""
        if self.grpc is not None:
            await self.grpc.stop(drain_timeout_s)

    async def start_http2(self, settings: Settings, tls: tuple[Path, Path] | None) -> None:
        """Listen for bidirectional streams on ``settings.http2_port``, if it is set."""
        if settings.http2_port is None:
            return
        self.h2 = H2Server(
            self.bidi,
            idle_timeout_s=settings.idle_timeout_s,
            max_connections=settings.max_connections,
        )
        files = None if tls is None else (str(tls[0]), str(tls[1]))
        await self.h2.start(settings.host, settings.http2_port, tls=files)

    async def stop_http2(self, drain_timeout_s: float) -> None:
        """GOAWAY; the streams open go on for the drain."""
        if self.h2 is not None:
            await self.h2.stop(drain_timeout_s)


def build(
    settings: Settings,
    stack: StackFile,
    *,
    invocations: Invocations,
    async_requests: AsyncInvocations,
    metrics: Metrics,
    secure: bool,
    is_ready: Callable[[], bool],
    fallback: Any,
) -> Doors:
    """The doors over ``invocations``; ``fallback`` (the Starlette app of the control
    plane, the console and operations) takes every path that is no door's."""
    access = EndpointAccess(
        invocations=invocations,
        max_payload_bytes=settings.max_payload_bytes,
        body_timeout_s=settings.body_read_timeout_s,
    )
    bidi = BidiDoor(
        access=access,
        edge=stream_edge(settings, stack, secure=secure),
        limits=BidiLimits(
            idle_timeout_s=settings.bidi_idle_timeout_s,
            max_duration_s=settings.bidi_max_duration_s,
            max_part_bytes=settings.max_payload_bytes,
            ping_interval_s=settings.bidi_ping_interval_s,
        ),
        metrics=metrics.bidi,
    )
    metrics.bidi.watch(bidi.open_streams)
    oip = InferenceProtocol(access=access, is_ready=is_ready)
    async_door = AsyncDoor(
        router=invocations.router,
        invocations=async_requests,
        account_id=settings.account_id,
        region=settings.region,
        body_timeout_s=settings.body_read_timeout_s,
    )
    paths = PathRouter(
        endpoint_doors={
            "invocations": RuntimeDoor(access=access),
            "async-invocations": async_door,
            "invocations-response-stream": ResponseStreamDoor(access=access),
        },
        v2=OipRestDoor(oip),
        v1=OpenAIDoor(access=access),
        fallback=fallback,
    )
    return Doors(paths=paths, oip=oip, bidi=bidi)
