"""Drives InvokeEndpointWithBidirectionalStream with AWS's own Python client
(``aws-sdk-sagemaker-runtime-http2``, its CRT transport), unchanged.

Run by tests/e2e/test_bidi_aws_client.py in a side environment of Python >= 3.12 (the
client's floor; the project runs on 3.11): ``python driver.py SCENARIO URL ENDPOINT``,
with the gateway's certificate trusted through SSL_CERT_FILE. Prints one JSON object:
what the client received, and when, for the test to judge. Imports nothing of shipyard.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from aws_sdk_sagemaker_runtime_http2.client import AsyncSageMakerRuntimeHTTP2Client
from aws_sdk_sagemaker_runtime_http2.config import AsyncSageMakerRuntimeHTTP2Config
from aws_sdk_sagemaker_runtime_http2.models import (
    InvokeEndpointWithBidirectionalStreamInput,
    RequestPayloadPart,
    RequestStreamEventPayloadPart,
    ResponseStreamEventModelStreamError,
    ResponseStreamEventPayloadPart,
)
from smithy_aws_core.identity import StaticCredentialsResolver
from smithy_http.aio.crt import AWSCRTHTTPClient


async def client(url: str) -> AsyncSageMakerRuntimeHTTP2Client:
    return AsyncSageMakerRuntimeHTTP2Client(
        config=await AsyncSageMakerRuntimeHTTP2Config.resolve(
            endpoint_uri=url,
            region="us-east-1",
            aws_credentials_identity_resolver=StaticCredentialsResolver(),
            aws_access_key_id=sys.argv[4] if len(sys.argv) > 4 else "test",
            aws_secret_access_key=sys.argv[5] if len(sys.argv) > 5 else "test",
            transport=AWSCRTHTTPClient(),
        )
    )


def part(data: str | bytes) -> RequestStreamEventPayloadPart:
    if isinstance(data, str):
        value = RequestPayloadPart(bytes_=data.encode(), data_type="UTF8")
    else:
        value = RequestPayloadPart(bytes_=data, data_type="BINARY")
    return RequestStreamEventPayloadPart(value=value)


async def echo(url: str, endpoint: str, count: int) -> dict[str, Any]:
    """Send ``count`` mixed parts, one at a time; note when the first answer came."""
    sent: list[str | bytes] = [
        f"part {n}" if n % 2 else bytes([n % 256]) * (n % 7 + 1) for n in range(count)
    ]
    got: list[Any] = []
    errors: list[dict[str, Any]] = []
    first_answer_after = None
    stream = await (await client(url)).invoke_endpoint_with_bidirectional_stream(
        InvokeEndpointWithBidirectionalStreamInput(endpoint_name=endpoint)
    )
    sending_done = asyncio.Event()

    async def send() -> None:
        for n, data in enumerate(sent):
            await stream.input_stream.send(part(data))
            if n == 0:  # wait for the first answer before the rest: it comes at once
                await first.wait()
            await asyncio.sleep(0)
        sending_done.set()
        await stream.input_stream.close()

    first = asyncio.Event()
    sender = asyncio.create_task(send())
    output, events = await stream.await_output()
    async for event in events:
        if isinstance(event, ResponseStreamEventPayloadPart):
            value = event.value
            data = value.bytes_ or b""
            got.append(data.decode() if value.data_type == "UTF8" else list(data))
            if first_answer_after is None:
                first_answer_after = not sending_done.is_set()
            first.set()
        elif isinstance(event, ResponseStreamEventModelStreamError):
            errors.append({"message": event.value.message, "code": event.value.error_code})
            first.set()
    await sender
    return {
        "sent": [s if isinstance(s, str) else list(s) for s in sent],
        "got": got,
        "errors": errors,
        "first_before_last_sent": first_answer_after,
        "variant": output.invoked_production_variant,
    }


async def failing(url: str, endpoint: str) -> dict[str, Any]:
    stream = await (await client(url)).invoke_endpoint_with_bidirectional_stream(
        InvokeEndpointWithBidirectionalStreamInput(endpoint_name=endpoint)
    )
    await stream.input_stream.send(part("ok"))
    await stream.input_stream.send(part("fail"))
    got: list[Any] = []
    errors: list[dict[str, Any]] = []
    try:
        _, events = await stream.await_output()
        async for event in events:
            if isinstance(event, ResponseStreamEventPayloadPart):
                got.append((event.value.bytes_ or b"").decode())
            elif isinstance(event, ResponseStreamEventModelStreamError):
                errors.append({"message": event.value.message, "code": event.value.error_code})
    except Exception as exc:  # the SDK may raise the modelled error instead
        errors.append({"raised": type(exc).__name__, "message": str(exc)})
    return {"got": got, "errors": errors}


async def refused(url: str, endpoint: str) -> dict[str, Any]:
    started = time.monotonic()
    try:
        stream = await (await client(url)).invoke_endpoint_with_bidirectional_stream(
            InvokeEndpointWithBidirectionalStreamInput(endpoint_name=endpoint)
        )
        await stream.input_stream.send(part("hello"))
        await stream.await_output()
    except Exception as exc:
        return {
            "raised": type(exc).__name__,
            "message": str(getattr(exc, "message", "") or exc),
            "seconds": time.monotonic() - started,
        }
    return {"raised": None}


def main() -> None:
    scenario, url, endpoint = sys.argv[1:4]
    if scenario == "echo":
        result = asyncio.run(echo(url, endpoint, 200))
    elif scenario == "fail":
        result = asyncio.run(failing(url, endpoint))
    else:
        result = asyncio.run(refused(url, endpoint))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
