"""Bidirectional streams to a `cmd:` server over its WebSocket (tests/models/cmd_bidi, a
server written to SageMaker's contract with the websockets library alone): one frame
per part both ways, PARTIAL as a frame that does not end its message, the invocation
path and query, close codes both ways, and a ModelStreamError frame."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, free_port, start_gateway, wait_until
from tests.h2client import H2Client

CMD = "bidi-cmd"
LOST = "bidi-cmd-lost"
PING_S = 0.5  # the gateway pings each stream's WebSocket this often


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("bidi-cmd") / "home"
    port = free_port()
    gateway = start_gateway(
        home,
        args=["--http2-port", str(port)],
        extra_env={"SHIPYARD_BIDI_PING_INTERVAL_S": str(PING_S)},
    )
    gateway.env["HTTP2_PORT"] = str(port)
    try:
        server = MODELS / "cmd_bidi" / "server.py"
        image = f"cmd:{sys.executable} {server}"  # the websockets library is in our venv
        deploy(gateway.sm, CMD, (MODELS / "cmd_bidi").as_uri(), image=image)
        deploy(gateway.sm, LOST, (MODELS / "cmd_bidi").as_uri(), image=image)
        yield gateway
    finally:
        gateway.stop()


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


async def connect(gw: GatewayProcess) -> H2Client:
    return await H2Client.connect(int(gw.env["HTTP2_PORT"]))


def test_parts_go_frame_by_frame_both_ways(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(CMD)
        await stream.part("whole")
        await stream.part(b"\x01\x02")
        first = await stream.next_event()
        second = await stream.next_event()
        assert first is not None and second is not None
        assert (first.text, first.headers["CompletionState"]) == ("whole", "COMPLETE")
        assert (second.text, second.headers["DataType"]) == (b"\x01\x02", "BINARY")
        # PARTIAL parts are frames of one message: the server gets them joined.
        await stream.part("par", partial=True)
        await stream.part("tial")
        joined = await stream.next_event()
        assert joined is not None and joined.text == "partial"
        # The server's message in three frames: three PARTIAL parts, then its end.
        await stream.part("fragments:a,b,c")
        frames = [await stream.next_event() for _ in range(3)]
        assert [(f.text, f.headers["CompletionState"]) for f in frames if f] == [
            ("a", "PARTIAL"),
            ("b", "PARTIAL"),
            ("c", "PARTIAL"),
        ]
        last = await stream.next_event()
        assert last is not None and last.headers["CompletionState"] == "COMPLETE"
        assert last.headers["DataType"] == "UTF8"  # a continuation keeps its type
        await stream.end()
        assert await stream.rest() == []
        await client.close()

    run(go())


def test_the_invocation_path_and_query_reach_the_server(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        headers = {
            "X-Amzn-SageMaker-Model-Invocation-Path": "v1/chat",
            "X-Amzn-SageMaker-Model-Query-String": "lang=en&x=1",
        }
        stream = await client.open(CMD, headers)
        await stream.part("where?")
        event = await stream.next_event()
        assert event is not None and event.text == "/v1/chat?lang=en&x=1"
        await stream.end()
        await stream.rest()
        default = await client.open(CMD)
        await default.part("where?")
        event = await default.next_event()
        assert event is not None and event.text == "/invocations-bidirectional-stream"
        await default.end()
        await default.rest()
        await client.close()

    run(go())


def test_a_close_code_other_than_1000_is_a_model_stream_error(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(CMD)
        await stream.part("close:4001:the model gave up")
        events = await stream.rest()
        assert [e.kind for e in events] == ["ModelStreamError"]
        assert events[0].error == {"Message": "the model gave up", "ErrorCode": "4001"}
        await client.close()

    run(go())


def test_a_model_stream_error_frame_ends_the_stream(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(CMD)
        await stream.part("error")
        events = await stream.rest()
        assert [e.kind for e in events] == ["ModelStreamError"]
        assert events[0].error == {"Message": "bad input", "ErrorCode": "E42"}
        await client.close()

    run(go())


@pytest.mark.parametrize(("how", "code"), [("end", "1000"), ("reset", "1001")])
def test_the_server_sees_the_client_end_as_1000_and_its_going_as_1001(
    gw: GatewayProcess, tmp_path: Path, how: str, code: str
) -> None:
    notes = tmp_path / "notes"

    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(CMD)
        await stream.part(f"notes:{notes}")
        assert (await stream.next_event()) is not None
        if how == "end":
            await stream.end()
            assert await stream.rest() == []
        else:
            stream.cancel()
        await client.close()

    run(go())
    wait_until(lambda: notes.exists() and notes.read_text().strip() == code, f"close {code}")


def test_a_server_refusing_the_websocket_is_a_model_error(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(CMD, {"X-Amzn-SageMaker-Model-Invocation-Path": "refuse"})
        assert await stream.wait_head() == 424
        await stream.rest()
        assert stream.headers[b"x-amzn-errortype"] == b"ModelError"
        body = stream.json_body()
        assert body["OriginalStatusCode"] == 418
        assert body["OriginalMessage"] == "nope"
        await client.close()

    run(go())


def test_an_instance_lost_mid_stream_is_an_internal_stream_failure(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        stream = await client.open(LOST)
        await stream.part("still here")
        assert (await stream.next_event()) is not None
        await stream.part("exit")
        events = await stream.rest()
        assert [e.kind for e in events] == ["InternalStreamFailure"]
        assert "lost" in events[0].error["Message"]
        await client.close()

    run(go())


def test_five_unanswered_pings_are_an_internal_stream_failure(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await connect(gw)
        # Answered pings keep a quiet stream open past the five intervals that end a deaf one.
        stream = await client.open(CMD)
        await stream.part("before")
        assert (await stream.next_event()) is not None
        await asyncio.sleep(7 * PING_S)
        await stream.part("still answering")
        still = await stream.next_event()
        assert still is not None and still.text == "still answering"
        # A server that reads nothing more answers no ping: five go by, and the stream ends.
        await stream.part("deaf")
        deaf = await stream.next_event()
        assert deaf is not None and deaf.text == "deaf"
        events = await stream.rest()
        assert [e.kind for e in events] == ["InternalStreamFailure"]
        assert "five pings" in events[0].error["Message"]
        await client.close()

    run(go())
