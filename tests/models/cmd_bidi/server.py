"""A user's own server of bidirectional streams (a `cmd:` image), written to SageMaker's
WebSocket contract with the websockets library alone (nothing of shipyard): GET /ping
answers 200; a WebSocket opened on /refuse is refused with 418; a WebSocket per stream,
one frame per part both ways.

Each message is echoed whole once all its frames are in, except:
- "fragments:a,b,c": answers one text message in three frames "a", "b", "c" (and the
  library's empty last frame);
- "where?": answers the path and query the WebSocket was opened on;
- "close:<code>:<reason>": closes the WebSocket with that code;
- "error": sends {"ModelStreamError": {"ErrorCode": "E42", "Message": "bad input"}};
- "exit": the process exits at once (an instance lost mid-stream);
- "deaf": stops reading the WebSocket, so the gateway's pings go unanswered;
- "notes:<path>": once the WebSocket is closed, writes there the close code the gateway
  sent ("1000", "1001", ...).
"""

import asyncio
import json
import os
from http import HTTPStatus

from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.http11 import Response


def ping(connection, request):
    if request.path == "/ping":
        return Response(HTTPStatus.OK, "OK", Headers([("Content-Length", "0")]), b"")
    if request.path.startswith("/refuse"):
        return Response(418, "I'm a teapot", Headers([("Content-Length", "4")]), b"nope")
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return Response(HTTPStatus.NOT_FOUND, "Not Found", Headers([("Content-Length", "0")]), b"")
    return None


async def stream(ws):
    notes = None
    try:
        while True:
            first = await ws.recv()
            if isinstance(first, str) and first.startswith("fragments:"):
                await ws.send(first[len("fragments:") :].split(","))
                continue
            if first in ("where?", b"where?"):
                await ws.send(ws.request.path)
                continue
            if isinstance(first, str) and first.startswith("close:"):
                _, code, reason = first.split(":", 2)
                await ws.close(int(code), reason)
                return
            if first == "exit":
                os._exit(1)
            if first == "deaf":
                ws.transport.pause_reading()  # no ping is read, so none is answered
                await ws.send("deaf")
                continue
            if first == "error":
                error = {"ModelStreamError": {"ErrorCode": "E42", "Message": "bad input"}}
                await ws.send(json.dumps(error))
                continue
            if isinstance(first, str) and first.startswith("notes:"):
                notes = first[len("notes:") :]
                await ws.send("noted")
                continue
            await ws.send(first)
    except Exception:
        pass
    finally:
        await ws.wait_closed()
        if notes:
            with open(notes, "a") as out:
                out.write(f"{ws.close_code}\n")


async def main():
    port = int(os.environ["SAGEMAKER_BIND_TO_PORT"])
    async with serve(stream, "127.0.0.1", port, process_request=ping, ping_interval=None):
        await asyncio.Future()


asyncio.run(main())
