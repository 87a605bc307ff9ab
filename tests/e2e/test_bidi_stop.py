"""Stopping a gateway that serves HTTPS and bidirectional streams over TLS: what is open
gets the drain, what is not holds nothing back.

A botocore client keeps its connection in a pool and reads nothing from it between
requests, so it never answers the gateway's TLS close_notify. The gateway stops at once
all the same; the stream still open when it was told to stop goes on to its end."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import boto3
import hyperframe.frame

from tests.conftest import MODELS, deploy, free_port
from tests.e2e.test_tls import self_signed, start_https_gateway
from tests.h2client import H2Client

STOP_WITHIN_S = 5.0
"""Far below the default drain (30 s), which only an open request or stream may use."""


def test_a_stopped_gateway_drains_an_open_stream_and_waits_for_no_idle_connection(
    tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path / "tls")
    port = free_port()
    args = ["--http2-port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)]
    gateway = start_https_gateway(tmp_path / "home", cert, args)
    try:
        # Kept, as a test module's fixture keeps it: its pooled connection stays open.
        sm = boto3.client(
            "sagemaker",
            endpoint_url=gateway.url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            verify=str(cert),
        )
        deploy(sm, "echo", (MODELS / "bidi_echo").as_uri())

        async def go() -> None:
            client = await H2Client.connect(port, tls=True, cafile=str(cert))
            stream = await client.open("echo")
            await stream.part("before")
            event = await stream.next_event()
            assert event is not None and event.text == "before"

            gateway.process.send_signal(signal.SIGTERM)
            # The HTTP/2 port says GOAWAY once the HTTPS port has closed its connections.
            await asyncio.wait_for(client.goaway.wait(), STOP_WITHIN_S)
            # The stream open at the stop holds the gateway until it ends. (h2 sends
            # nothing more after a GOAWAY: its end goes as a frame of our own.)
            assert gateway.process.poll() is None
            end = hyperframe.frame.DataFrame(stream.stream_id)
            end.flags.add("END_STREAM")
            client.writer.write(end.serialize())
            await client.writer.drain()
            # The connection stays open: the stream's end, not the connection's, frees it.
            try:
                await asyncio.to_thread(gateway.process.wait, STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"the gateway still runs {STOP_WITHIN_S} s after its last stream ended:\n"
                    + gateway.log()[-3000:]
                ) from None
            await client.close()

        asyncio.run(asyncio.wait_for(go(), 60))
        sm.close()
    finally:
        gateway.stop()
