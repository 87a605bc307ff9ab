"""Two requests meet: each waits (up to 1 s) for another to be inside the handler too.

Answers "met" when another request was running at the same time, else "alone": how a
test sees how many handler threads an instance runs without timing anything.
"""

import threading

_meeting = threading.Barrier(2, timeout=1.0)


def transform_fn(model, body, content_type, accept):
    try:
        _meeting.wait()
    except threading.BrokenBarrierError:
        _meeting.reset()
        return '"alone"', "application/json"
    return '"met"', "application/json"
