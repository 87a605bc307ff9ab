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


def pause() -> None:
    """No collections while a process imports and loads what it keeps, until
    :func:`settle` or :func:`resume`.

    A start allocates a few hundred thousand objects that all stay; every collection
    run meanwhile walks them and finds next to nothing: 10-15% of the CPU of a gateway's
    or an instance's start (``bench/gateway_start.py``).
    """
    gc.disable()


def resume() -> None:
    """Collections on again, for a process that will not :func:`settle`."""
    gc.enable()


def settle(*, full: bool = True) -> None:
    """Collect, then freeze everything alive now out of later collections.

    ``full=False`` collects only the young generations: the gateway's start leaves a
    few hundred objects of cyclic garbage among 150,000 kept, and a full collection
    to find them costs 0.1-0.3 s of every start; frozen, they stay (a few KiB). After
    :func:`pause` every object of the start is young, so that collection would walk
    them all: it is skipped, and the start's garbage is frozen with the rest.
    An instance collects fully: loading a model can leave large cycles behind.
    """
    if full or gc.isenabled():
        gc.collect(2 if full else 1)
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    gc.enable()
