"""Sleeps for the number of seconds in the request's "sleep" field, then answers.

Its load fails, with the text of the file SLEEPY_FAIL_FILE names, while that file exists.
With "hold_mb", it first fills that many MB of memory, 32 MB at a time; with "spin", it
then keeps the CPU busy for that many seconds.
"""

import json
import os
import time


def model_fn(model_dir):
    time.sleep(float(os.environ.get("SLEEPY_LOAD_S", "0")))
    broken = os.environ.get("SLEEPY_FAIL_FILE")
    if broken and os.path.exists(broken):  # a test breaks the model's later starts
        with open(broken) as why:
            raise RuntimeError(why.read())
    return os.getpid()


def transform_fn(model, body, content_type, accept):
    request = json.loads(body or b"{}")
    started = os.environ.get("SLEEPY_STARTED_FILE")
    if started:  # tells a test the prediction is under way
        with open(started, "a") as marker:
            marker.write(f"started {request.get('tag', '')}".rstrip() + "\n")
    held = []
    for _ in range(int(request.get("hold_mb", 0)) // 32):  # memory actually touched
        held.append(bytearray(b"\x01") * (32 << 20))
        time.sleep(0.01)
    time.sleep(float(request.get("sleep", 0)))
    spin_until = time.monotonic() + float(request.get("spin", 0))
    while time.monotonic() < spin_until:  # busy in Python, holding the GIL between switches
        pass
    return json.dumps({"pid": model, "slept": request.get("sleep", 0)}), "application/json"
