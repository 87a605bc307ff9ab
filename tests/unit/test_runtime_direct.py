"""The instance's protocol answering invocations without an ASGI task (http/direct.py),
in process on loopback: what it must keep of uvicorn's own cycle under pipelining, a
client that does not read, a handler that raises anything, and keep-alive."""

from __future__ import annotations

import asyncio
import socket
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from shipyard.http.direct import Answer, direct_protocol
from shipyard.http.keepalive import LazyKeepAlive
from shipyard.http.writes import coalescing
from shipyard.runtime.handlers import Handlers
from shipyard.runtime.server import RuntimeApp
from tests.runtime.test_runtime_wire import invocation

CODE = """
import time

calls = 0


class Stop(BaseException):
    pass


def transform_fn(model, body, content_type, accept):
    global calls
    calls += 1
    if body == b"slow":
        def pieces():
            for _ in range(5):
                time.sleep(0.1)
                yield b"s"
        return pieces(), "text/plain"
    if body == b"stop":
        raise Stop("not an Exception")
    if body == b"big":
        return b"B" * 262144, "text/plain"
    return b"echo:" + body, "text/plain"
"""


PING = b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n"

Serve = Callable[[Callable[[int, types.ModuleType, uvicorn.Server], Awaitable[None]]], None]


@pytest.fixture
def serve() -> Serve:
    """Runs ``scenario(port, module, server)`` against a runtime served in this process
    with the instance's protocol and a keep-alive timeout of 0.3 s."""

    def run(scenario: Callable[[int, types.ModuleType, uvicorn.Server], Awaitable[None]]) -> None:
        module = types.ModuleType("direct_model")
        exec(CODE, module.__dict__)
        app = RuntimeApp(Handlers(model=None, module=module))
        config = uvicorn.Config(
            app,
            loop="none",
            http=direct_protocol(coalescing(LazyKeepAlive), app),
            ws="none",
            lifespan="off",
            log_level="critical",
            timeout_keep_alive=0.3,  # type: ignore[arg-type]
        )

        async def main() -> None:
            server = uvicorn.Server(config)
            config.load()
            server.lifespan = config.lifespan_class(config)
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                await server.startup(sockets=[sock])
                try:
                    await scenario(sock.getsockname()[1], module, server)
                finally:
                    server.should_exit = True
                    await server.shutdown()

        asyncio.run(main())

    return run


async def read_until_quiet(reader: asyncio.StreamReader, quiet_s: float = 1.5) -> bytes:
    """Everything the server sends until it closes or says nothing for ``quiet_s``."""
    data = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(1 << 20), quiet_s)
        except TimeoutError:
            return data
        if not chunk:
            return data + b"<closed>"
        data += chunk


def test_hundreds_of_pipelined_invocations_behind_a_ping_are_all_answered(serve: Serve) -> None:
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PING + invocation(b"x") * 400)
        data = await read_until_quiet(reader)
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 401
        assert b"HTTP/1.1 500" not in data

    serve(scenario)


def test_a_body_begun_behind_a_ping_and_ended_in_later_reads_is_answered_whole(
    serve: Serve,
) -> None:
    # The ping goes to the app's task; the invocation behind it waits in uvicorn's
    # pipeline with the first half of its body already read, the rest still to come.
    body = b"A" * 1000 + b"B" * 1000
    whole = invocation(body)

    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PING + whole[:-1000])
        await writer.drain()
        await asyncio.sleep(0.2)  # shapes the input into separate reads; nothing waits on it
        writer.write(whole[-1000:])
        data = await read_until_quiet(reader)
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 2
        assert data.removesuffix(b"<closed>").endswith(b"echo:" + body), data[-60:]

    serve(scenario)


def test_a_request_pipelined_behind_a_direct_answer_is_not_cut_by_keep_alive(
    serve: Serve,
) -> None:
    # "slow" is collected on a task for 0.5 s, longer than the 0.3 s keep-alive timeout
    # that the direct answer before it started.
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(invocation(b"one") + invocation(b"slow"))
        data = await read_until_quiet(reader)
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 2
        assert b"echo:one" in data and data.split(b"\r\n\r\n")[-1].startswith(b"sssss")

    serve(scenario)


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(serve: Serve) -> None:
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(invocation(b"one"))
        started = asyncio.get_running_loop().time()
        data = await read_until_quiet(reader, quiet_s=3)
        writer.close()
        assert data.endswith(b"echo:one<closed>")
        assert asyncio.get_running_loop().time() - started < 2

    serve(scenario)


def test_nothing_runs_for_requests_behind_an_answer_that_closed_the_connection(
    serve: Serve,
) -> None:
    # HTTP/1.0 is answered and closed; the parser would go on with the rest of the read.
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(invocation(b"a", "Connection: keep-alive", version="1.0") * 5)
        data = await read_until_quiet(reader)
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 1
        assert module.calls == 1

    serve(scenario)


def test_a_handler_raising_a_base_exception_is_a_500_as_on_the_asgi_path(serve: Serve) -> None:
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(invocation(b"stop"))
        data = await read_until_quiet(reader)
        writer.close()
        assert data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
        assert data.endswith(b"Internal Server Error<closed>")

    serve(scenario)


def test_a_client_that_does_not_read_holds_back_the_answers_behind(serve: Serve) -> None:
    # 40 answers of 256 KiB pipelined: without backpressure all 10 MB would sit in the
    # server's write buffer; with it, the requests behind wait until the client reads.
    async def scenario(port: int, module: Any, server: Any) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.set_write_buffer_limits(0)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        writer.write(invocation(b"big") * 40)
        (connection,) = server.server_state.connections
        for _ in range(500):  # until the server finds its client not reading
            if connection.flow.write_paused:
                break
            await asyncio.sleep(0.01)
        assert connection.flow.write_paused
        assert connection.transport.get_write_buffer_size() < 2 * 1024 * 1024
        assert module.calls < 40
        data = await read_until_quiet(reader)
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 40
        assert module.calls == 40

    serve(scenario)


def test_custom_attributes_go_out_in_utf_8_and_a_line_break_is_refused() -> None:
    module = types.ModuleType("attributes_model")
    exec(
        "def transform_fn(model, body, content_type, accept, context):\n"
        "    context.response_custom_attributes = body.decode()\n"
        "    return b'ok', 'text/plain'\n",
        module.__dict__,
    )
    app = RuntimeApp(Handlers(model=None, module=module))
    answer = app.answer([(b"content-type", b"text/plain")], "checked=✓".encode())
    assert isinstance(answer, Answer) and answer.status == 200
    assert (b"x-amzn-sagemaker-custom-attributes", "checked=✓".encode()) in answer.headers
    refused = app.answer([(b"content-type", b"text/plain")], b"a\r\nx-injected: 1")
    assert isinstance(refused, Answer) and refused.status == 500
    assert all(name != b"x-injected" for name, _ in refused.headers)
