"""What a gateway's start pays for (bench/results/gateway_start.md): collections paused
until the heap is settled, and no numpy until a tensor comes. Each check runs in a fresh
interpreter, as a start does."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settling_a_paused_heap_freezes_it_and_turns_collections_back_on() -> None:
    code = """
import gc
from shipyard import heap
heap.pause()
paused = gc.isenabled()
kept = [[n] for n in range(1000)]
heap.settle(full=False)
print(paused, gc.isenabled(), gc.get_freeze_count() >= 1000, gc.get_threshold()[0])
"""
    assert run(code) == f"False True True {20_000}"


def test_resume_turns_collections_back_on_without_freezing() -> None:
    code = """
import gc
from shipyard import heap
heap.pause()
heap.resume()
print(gc.isenabled(), gc.get_freeze_count())
"""
    assert run(code) == "True 0"


def test_the_gateway_imports_no_numpy_until_a_tensor_comes() -> None:
    code = """
import sys
import shipyard.cli, shipyard.app
from shipyard.tensors import json_to_raw
before = "numpy" in sys.modules
raw = json_to_raw("x", "INT32", [2], [1, 2])
print(before, "numpy" in sys.modules, raw.hex())
"""
    assert run(code) == "False True 0100000002000000"
