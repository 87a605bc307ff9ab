"""The limits of a bidirectional stream, each ending it as a client gone would (the
model's input ends, its generator is closed) with InternalStreamFailure for the client:
no part either way for SHIPYARD_BIDI_IDLE_TIMEOUT_S, a stream older than
SHIPYARD_BIDI_MAX_DURATION_S, a part over the payload limit. And the model's own limit,
SHIPYARD_BIDI_MAX_STREAMS, refusing one stream more with 503."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.exceptions
import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, free_port, start_gateway, wait_until
from tests.h2client import H2Client

ECHO = "limits-echo"
TWO = "limits-two"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("bidi-limits") / "home"
    port = free_port()
    env = {
        "SHIPYARD_BIDI_IDLE_TIMEOUT_S": "1",
        "SHIPYARD_BIDI_MAX_DURATION_S": "4",
        "SHIPYARD_MAX_PAYLOAD_BYTES": "1000",
    }
    gateway = start_gateway(home, extra_env=env, args=["--http2-port", str(port)])
    gateway.env["HTTP2_PORT"] = str(port)
    try:
        deploy(gateway.sm, ECHO, (MODELS / "bidi_echo").as_uri())
        model = (MODELS / "bidi_echo").as_uri()
        deploy(gateway.sm, TWO, model, environment={"SHIPYARD_BIDI_MAX_STREAMS": "2"})
        yield gateway
    finally:
        gateway.stop()


def run(coro: object) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


async def connect(gw: GatewayProcess) -> H2Client:
    return await H2Client.connect(int(gw.env["HTTP2_PORT"]))


def closed(notes: Path) -> bool:
    return notes.exists() and "closed" in notes.read_text()


def test_an_idle_stream_is_ended(gw: GatewayProcess, tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def go() -> list[Any]:
        client = await connect(gw)
        stream = await client.open(ECHO)
        await stream.part(f"notes:{notes}")
        events = await stream.rest()
        await client.close()
        return events

    events = run(go())
    assert [e.kind for e in events] == ["PayloadPart", "InternalStreamFailure"]
    assert "1 seconds" in events[1].error["Message"]
    wait_until(lambda: closed(notes), "the generator closed")


def test_a_stream_past_its_duration_is_ended(gw: GatewayProcess, tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def go() -> list[Any]:
        client = await connect(gw)
        stream = await client.open(ECHO)
        await stream.part(f"notes:{notes}")
        kinds = []
        while True:  # a part every 0.3 s: never idle
            event = await stream.next_event()
            if event is None:
                break
            kinds.append(event)
            if event.kind != "PayloadPart":
                continue
            await asyncio.sleep(0.3)
            try:
                await stream.part("tick")
            except h2.exceptions.StreamClosedError:
                pass  # ended meanwhile: its last event is on its way
        await client.close()
        return kinds

    events = run(go())
    assert events[-1].kind == "InternalStreamFailure"
    assert "4 seconds" in events[-1].error["Message"]
    assert len(events) > 5
    wait_until(lambda: closed(notes), "the generator closed")


def test_a_part_over_the_limit_ends_the_stream_before_it_reaches_the_model(
    gw: GatewayProcess,
) -> None:
    async def go() -> list[Any]:
        client = await connect(gw)
        stream = await client.open(ECHO)
        await stream.part(b"x" * 999)
        events = [await stream.next_event()]
        await stream.part(b"y" * 1001)
        events += await stream.rest()
        await client.close()
        return events

    events = run(go())
    assert [e.kind for e in events] == ["PayloadPart", "InternalStreamFailure"]
    assert events[0].data == b"x" * 999
    assert "1001 bytes" in events[1].error["Message"]


def test_one_stream_past_the_models_limit_is_refused_with_503(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        held = [await client.open(TWO) for _ in range(2)]
        for stream in held:  # both open at the instance
            await stream.part("here")
            assert (await stream.next_event()) is not None
        third = await client.open(TWO)
        assert await third.wait_head() == 503
        await third.rest()
        assert third.headers[b"x-amzn-errortype"] == b"ServiceUnavailableError"
        for stream in held:
            await stream.end()
            assert await stream.rest() == []
        await client.close()

    run(go())
