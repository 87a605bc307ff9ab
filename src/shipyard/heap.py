"""The garbage collector's settings for the gateway and the instances.

Both hold a large heap that never becomes garbage (imported modules, botocore's service
models, the loaded model) and allocate many short-lived objects per request, some in
reference cycles. With CPython's defaults every full collection walks that whole heap:
in the gateway, 45-220 ms pauses every few seconds under load, which set the tail
latency of every request caught behind one (bench/results/handler_runner.md). So once a
process has loaded what it keeps, :func:`settle` collects once and freezes what is left
(``gc.freeze``: later collections skip it; reference counting still frees it), and raises
the young generation's threshold so the objects of requests in flight are not promoted
(and walked again) after a few hundred allocations.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (CPython: 700)."""


_paused = False


def pause() -> None:
    """No collections while a process starts, until :func:`settle` (or :func:`resume`).

    A start allocates a few hundred thousand objects that all stay; every collection run
    meanwhile walks them and finds next to nothing: with collections on, a gateway's
    start took 1.2x the CPU (``bench/results/gateway_start.md``). :func:`settle` then
    collects once, finding the start's garbage among everything it made.
    """
    global _paused
    _paused = True
    gc.disable()


def resume() -> None:
    """Collections on again after :func:`pause` (and left as they are without one)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def settle(*, full: bool = True) -> None:
    """Collect, then freeze everything alive now out of later collections, and resume
    collections paused by :func:`pause`.

    ``full=False`` collects only the young generations: the gateway's start leaves a
    few hundred objects of cyclic garbage among 150,000 kept, and a full collection
    to find them costs 0.1-0.3 s of every start; frozen, they stay (a few KiB). After
    :func:`pause` every object of the start is young, and that one collection walks them
    all (0.1 s), in place of the many a start would have run.
    An instance collects fully: loading a model can leave large cycles behind.
    """
    gc.collect(2 if full else 1)
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    resume()
