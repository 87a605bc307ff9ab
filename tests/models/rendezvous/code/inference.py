"""Requests meet: each waits (up to 1 s) for the others to be inside the handler too.

Answers "met" when RENDEZVOUS_PARTIES requests (default 2) were running at the same
time, else "alone": how a test sees how many requests an instance works on at once
without timing anything.
"""

import os
import threading

_meeting = threading.Barrier(int(os.environ.get("RENDEZVOUS_PARTIES", "2")), timeout=1.0)


def transform_fn(model, body, content_type, accept):
    try:
        _meeting.wait()
    except threading.BrokenBarrierError:
        _meeting.reset()
        return '"alone"', "application/json"
    return '"met"', "application/json"
