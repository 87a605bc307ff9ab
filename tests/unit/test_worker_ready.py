"""``cli/workers.py``: how the supervisor reads whether a worker served, from real child
processes that write to the pipe (as ``say_ready`` does) or die without a word."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from shipyard.cli.workers import _Worker

pytestmark = pytest.mark.processes  # child interpreters writing to the pipe


def _worker(code: str) -> tuple[_Worker, int]:
    """A child running ``code`` with the pipe's write end as ``fd``; the worker and the
    write end, still open here."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    child = subprocess.Popen(
        [sys.executable, "-c", f"import os; fd = {write}; {code}"], pass_fds=(write,)
    )
    return _Worker(child, read, time.monotonic()), write


def test_a_worker_that_said_so_served_though_it_died() -> None:
    worker, write = _worker("os.write(fd, b'\\n'); os.close(fd)")
    os.close(write)
    assert worker.process.wait(30) == 0
    assert worker.has_served()
    assert worker.has_served(), "asked again: the answer is kept, the byte read once"
    worker.close()


def test_a_worker_that_died_without_a_word_did_not_serve() -> None:
    worker, write = _worker("raise SystemExit(3)")
    os.close(write)
    assert worker.process.wait(30) == 3
    assert not worker.has_served()  # the pipe's end: no byte
    worker.close()


def test_a_writer_still_open_elsewhere_is_no_answer_yet() -> None:
    worker, write = _worker("pass")
    assert worker.process.wait(30) == 0
    assert not worker.has_served()  # the write end is held here: nothing to read yet
    os.write(write, b"\n")
    assert worker.has_served()
    os.close(write)
    worker.close()
