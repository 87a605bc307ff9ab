"""Says whether a library it imports was already imported when this file was loaded
(a warm spare preloads what earlier instances imported), with its process, working
folder, scheduling group (``/proc/self/autogroup``; null where the kernel has none) and
the GREETING of its Environment; it prints a line to its log as it loads,
and takes LOAD_S seconds (default 0) to load."""

import json
import os
import sys
import time

PRELOADED = "xml.dom.minidom" in sys.modules

import xml.dom.minidom  # noqa: E402,F401  the library a spare learns to preload


def model_fn(model_dir):
    print(f"preloaded model loading in {os.getpid()}", flush=True)
    time.sleep(float(os.environ.get("LOAD_S", "0")))
    return None


def _autogroup():
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def transform_fn(model, body, content_type, accept):
    answer = {
        "autogroup": _autogroup(),
        "preloaded": PRELOADED,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "greeting": os.environ.get("GREETING"),
    }
    return json.dumps(answer), "application/json"
