"""InvokeEndpointWithBidirectionalStream over HTTP/2 (h2c) against a real gateway and the
built-in runtime's ``stream_fn`` (tests/models/bidi_echo), driven by a raw h2 client
(tests/h2client.py): parts both ways, refusals before the stream, errors during it,
flow control, a client that goes away, many streams on one connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    free_port,
    in_flight,
    start_gateway,
    wait_until,
)
from tests.h2client import H2Client, envelope, request_event

ECHO = "bidi-echo"
GREETER = "bidi-greeter"
NONE = "bidi-none"
INVALID = "InputValidationError"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("bidi") / "home"
    port = free_port()
    gateway = start_gateway(home, args=["--http2-port", str(port)])
    gateway.env["HTTP2_PORT"] = str(port)
    try:
        deploy(gateway.sm, ECHO, (MODELS / "bidi_echo").as_uri(), wait=False)
        deploy(
            gateway.sm,
            GREETER,
            (MODELS / "bidi_echo").as_uri(),
            environment={"GREETING": "hello"},
            wait=False,
        )
        deploy(gateway.sm, NONE, (MODELS / "bidi_none").as_uri(), wait=False)
        for name in (ECHO, GREETER, NONE):
            gateway.sm.get_waiter("endpoint_in_service").wait(
                EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
            )
        yield gateway
    finally:
        gateway.stop()


def h2_port(gw: GatewayProcess) -> int:
    return int(gw.env["HTTP2_PORT"])


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def test_parts_are_echoed_in_order_text_and_binary(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        assert await stream.wait_head() == 200
        assert stream.headers[b"x-amzn-invoked-production-variant"] == b"v1"
        assert stream.headers[b"content-type"] == b"application/vnd.amazon.eventstream"
        sent: list[str | bytes] = []
        for n in range(20):
            part: str | bytes = f"text {n}" if n % 2 else bytes([n]) * (n + 1)
            sent.append(part)
            await stream.part(part)
        await stream.end()
        events = await stream.rest()
        assert [e.kind for e in events] == ["PayloadPart"] * 20
        assert [e.text for e in events] == sent
        assert all(e.headers["CompletionState"] == "COMPLETE" for e in events)
        await client.close()

    run(go())


def test_an_answer_arrives_before_the_input_ends(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("first")
        event = await stream.next_event()
        assert event is not None and event.text == "first"
        await stream.part(b"second")
        event = await stream.next_event()
        assert event is not None and event.text == b"second"
        await stream.end()
        assert await stream.rest() == []
        await client.close()

    run(go())


def test_the_model_speaks_before_the_first_part(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(GREETER)
        event = await stream.next_event()
        assert event is not None and event.text == "hello"
        await stream.end()
        assert await stream.rest() == []
        await client.close()

    run(go())


def test_partial_parts_reach_the_model_joined(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("hel", partial=True)
        await stream.part("lo ", partial=True)
        await stream.part("world")
        await stream.part(b"\x00\x01", partial=True)
        await stream.part(b"\x02")
        await stream.end()
        assert [e.text for e in await stream.rest()] == ["hello world", b"\x00\x01\x02"]
        await client.close()

    run(go())


def test_signed_envelopes_are_unwrapped_and_empty_ones_carry_nothing(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.send(envelope(request_event("wrapped")))
        await stream.send(envelope(b""))
        await stream.send(request_event("last"))
        await stream.end()
        assert [e.text for e in await stream.rest()] == ["wrapped", "last"]
        await client.close()

    run(go())


def test_a_model_error_mid_stream_is_a_model_stream_error(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("ok")
        await stream.part("fail")
        events = await stream.rest()
        assert [e.kind for e in events] == ["PayloadPart", "ModelStreamError"]
        assert events[1].error == {"Message": "asked to fail", "ErrorCode": "RuntimeError"}
        assert events[1].headers[":message-type"] == "exception"
        await client.close()

    run(go())


@pytest.mark.parametrize(
    ("endpoint", "headers", "status", "kind", "says"),
    [
        ("no-such-endpoint", {}, 400, "InputValidationError", "no-such-endpoint"),
        (ECHO, {"X-Amzn-SageMaker-Target-Variant": "v9"}, 400, "InputValidationError", "v9"),
        (ECHO, {"X-Amzn-SageMaker-Model-Invocation-Path": "../x"}, 400, INVALID, "Path"),
        (NONE, {}, 400, "InputValidationError", NONE),
    ],
)
def test_refusals_come_before_the_stream_without_waiting_for_its_end(
    gw: GatewayProcess, endpoint: str, headers: dict[str, str], status: int, kind: str, says: str
) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(endpoint, headers)
        # The client's side stays open: the refusal must not wait for it.
        assert await stream.wait_head() == status
        await stream.rest()
        assert stream.headers[b"x-amzn-errortype"] == kind.encode()
        assert says in stream.json_body()["Message"]
        await client.close()

    run(go())


def test_a_client_gone_closes_the_generator(gw: GatewayProcess, tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part(f"notes:{notes}")
        event = await stream.next_event()
        assert event is not None and event.text == "noted"
        stream.cancel()  # RST_STREAM
        await asyncio.sleep(0)
        await client.close()

    run(go())
    wait_until(lambda: notes.exists() and "closed" in notes.read_text(), "the generator closed")


def test_a_lost_connection_closes_the_generator(gw: GatewayProcess, tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part(f"notes:{notes}")
        assert (await stream.next_event()) is not None
        await client.close()

    run(go())
    wait_until(lambda: notes.exists() and "closed" in notes.read_text(), "the generator closed")


def test_many_streams_share_one_connection(gw: GatewayProcess) -> None:
    async def one(client: H2Client, n: int) -> list[object]:
        stream = await client.open(ECHO)
        for k in range(3):
            await stream.part(f"{n}-{k}")
        await stream.end()
        return [e.text for e in await stream.rest()]

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        answers = await asyncio.gather(*(one(client, n) for n in range(50)))
        assert answers == [[f"{n}-{k}" for k in range(3)] for n in range(50)]
        await client.close()

    run(go())


def test_a_client_that_stops_reading_holds_the_model_back(gw: GatewayProcess) -> None:
    """The client's window is 64 KiB and it stops acknowledging: the gateway may send
    only that much, and the rest waits (at the instance, not in the gateway); once it
    reads again every part arrives, in order."""

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw), window=65535)
        stream = await client.open(ECHO)
        client.read_paused = True
        block = b"x" * 16 * 1024
        for n in range(40):  # 650 KB asked back through a 64 KiB window
            await stream.part(bytes([n]) + block)
        got: list[bytes] = []
        while len(got) < 3:
            event = await stream.next_event()
            assert event is not None
            got.append(event.data)
        client.resume_reading()
        await stream.end()
        got += [e.data for e in await stream.rest()]
        assert [g[0] for g in got] == list(range(40))
        await client.close()

    run(go())


def test_streams_are_counted_in_metrics(gw: GatewayProcess) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("counted")
        assert (await stream.next_event()) is not None
        status, body = gw.get("/metrics")
        active = f'shipyard_bidi_streams_active{{endpoint="{ECHO}",variant="v1"}} 1.0'
        assert active in body.decode()
        await stream.end()
        await stream.rest()
        await client.close()

    run(go())
    text = gw.get("/metrics")[1].decode()
    assert f'shipyard_bidi_parts_total{{direction="in",endpoint="{ECHO}",variant="v1"}}' in text
    # Every variant is exported, at 0 before any stream.
    assert f'shipyard_bidi_streams_active{{endpoint="{NONE}",variant="v1"}} 0.0' in text
    wait_until(
        lambda: (
            f'shipyard_bidi_streams_active{{endpoint="{ECHO}",variant="v1"}} 0.0'
            in gw.get("/metrics")[1].decode()
        ),
        "no stream open",
    )


def test_an_open_stream_counts_in_flight_and_invocations_still_pass(gw: GatewayProcess) -> None:
    """The built-in instance works on one request at a time; a stream open on it runs
    on a thread of its own, so an InvokeEndpoint is served meanwhile, not queued behind
    the stream, while the stream counts in flight (draining and autoscaling read it)."""

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("open")
        assert (await stream.next_event()) is not None
        assert in_flight(gw, ECHO) == 1
        answer = await asyncio.to_thread(
            gw.rt.invoke_endpoint, EndpointName=ECHO, Body=b"[1]", ContentType="application/json"
        )
        assert answer["Body"].read() == b"[1]"
        await stream.end()
        await stream.rest()
        await client.close()

    run(go())
    wait_until(lambda: in_flight(gw, ECHO) == 0, "nothing in flight")


def test_a_malformed_event_ends_the_stream_with_internal_stream_failure(
    gw: GatewayProcess,
) -> None:
    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        stream = await client.open(ECHO)
        await stream.part("fine")
        assert (await stream.next_event()) is not None
        await stream.send(b"\x00\x00\x00\x20" + b"\xff" * 28)  # a prelude whose CRC fails
        events = await stream.rest()
        assert [e.kind for e in events] == ["InternalStreamFailure"]
        assert "malformed" in events[0].error["Message"]
        await client.close()

    run(go())


def test_an_authority_that_does_not_name_the_gateway_is_refused(gw: GatewayProcess) -> None:
    """Without auth:, the browser rules hold on the HTTP/2 door too: a page whose name
    points at this host cannot drive it."""

    async def go() -> None:
        client = await H2Client.connect(h2_port(gw))
        client.authority = f"evil.example:{h2_port(gw)}"
        stream = await client.open(ECHO)
        assert await stream.wait_head() == 403
        await stream.rest()
        assert "evil.example" in stream.json_body()["Message"]
        await client.close()

    run(go())
