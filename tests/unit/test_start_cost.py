"""What a gateway's start pays for (bench/results/gateway_start.md): collections paused
until it is up, and no numpy until a tensor comes. Each check runs in a fresh
interpreter, as a start does."""

from __future__ import annotations

import pytest

from tests.conftest import python_output as run

pytestmark = pytest.mark.processes  # a fresh interpreter per check


def test_a_paused_start_settles_its_garbage_and_turns_collections_back_on() -> None:
    code = """
import gc, weakref
from shipyard import heap
heap.pause()
paused = gc.isenabled()
class Cycle: pass
dropped = Cycle()
dropped.me = dropped
gone = weakref.ref(dropped)
del dropped
kept = [[n] for n in range(1000)]
heap.settle(full=False)
print(paused, gone() is None, gc.isenabled(), gc.get_freeze_count() >= 1000)
"""
    assert run(code) == "False True True True"


def test_collections_pause_and_resume() -> None:
    code = """
import gc
from shipyard import heap
heap.pause()
paused = gc.isenabled()
heap.resume()
print(paused, gc.isenabled())
"""
    assert run(code) == "False True"


def test_resume_leaves_collections_off_that_were_turned_off_elsewhere() -> None:
    code = """
import gc
from shipyard import heap
gc.disable()
heap.resume()
print(gc.isenabled())
"""
    assert run(code) == "False"


def test_every_command_but_serve_runs_with_collections_on() -> None:
    code = """
import gc
from shipyard import heap
heap.pause()
from typer.testing import CliRunner
from shipyard.cli import app
@app.command("probe")
def probe() -> None:
    print("collections on:", gc.isenabled())
print(CliRunner().invoke(app, ["probe"]).output.strip())
"""
    assert run(code) == "collections on: True"


def test_the_gateway_imports_no_numpy_until_a_tensor_comes() -> None:
    code = """
import sys
import shipyard.cli, shipyard.app
import asyncio
from shipyard.tensors import json_to_raw, numpy_imported
before = "numpy" in sys.modules
asyncio.run(numpy_imported())
asyncio.run(numpy_imported())  # another loop: already imported
raw = json_to_raw("x", "INT32", [2], [1, 2])
print(before, "numpy" in sys.modules, raw.hex())
"""
    assert run(code) == "False True 0100000002000000"
