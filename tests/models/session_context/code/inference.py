"""A built-in-runtime model keeping sessions through its handler context: it opens each
with its own id (``chat-<n>``) and expiry (the body's ``{"ttl": seconds}``, else ten
minutes), counts its turns, and closes it on a body ``close``."""

import itertools
import json
import os
import time

TURNS: dict[str, int] = {}
NUMBERS = itertools.count(1)


def transform_fn(model, body, content_type, accept, context):
    session = context.session_id
    if session == "NEW_SESSION":
        ttl = json.loads(body).get("ttl", 600) if body.startswith(b"{") else 600
        new = f"chat-{os.getpid()}-{next(NUMBERS)}"
        TURNS[new] = 0
        context.open_session(new, time.time() + ttl)
        return json.dumps({"seen": session, "opened": new, "pid": os.getpid()})
    if session is not None:
        TURNS[session] = TURNS.get(session, 0) + 1
        if body == b"close":
            context.close_session()
    turns = TURNS.get(session or "", 0)
    return json.dumps({"seen": session, "turns": turns, "pid": os.getpid()})
