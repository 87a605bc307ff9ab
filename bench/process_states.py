"""How often each of a few processes is running, and in which combinations, under load.

    python bench/process_states.py SECONDS PID [PID ...]
    python bench/process_states.py --waits-only SECONDS PID [PID ...]

Reads each process's scheduler state (``/proc/PID/stat``: R running or runnable, S
sleeping, D waiting on a disk) about every 0.7 ms for SECONDS, and prints how often each
combination was seen, in the order the PIDs were given (``RSR``: the first and third
running, the second asleep), then each process's share of samples running. The sampler
costs CPU itself (about a tenth of a core on 2 cores), so compare runs taken the same
way, not its figures with a bench's throughput alone.

Then, for each process, from the kernel's own accounting (``/proc/PID/task/*/schedstat``,
summed over its threads, read at the start and the end): milliseconds a second on a
core, milliseconds a second runnable but waiting for one (the run queue), and how many
times a second it was put on a core. R in the states above is both of the first two;
the wait is what a process woken for work lost before it could start it. With
``--waits-only`` nothing is sampled in between, so the figures are the load's alone.

Used to tell why an endpoint with two instances leaves CPU idle under a closed load
(wrk, a fixed number of connections): an instance asleep while the other runs had no
request to work on at that moment (bench/results/gateway_floor.md).
"""

from __future__ import annotations

import collections
import os
import sys
import time


def state(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name, in parentheses, may itself hold spaces.
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "?"


def schedstat(pid: str) -> tuple[int, int, int]:
    """Nanoseconds on a core, nanoseconds waiting for one, and times put on one, summed
    over the process's threads (those alive now)."""
    totals = [0, 0, 0]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return (0, 0, 0)
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue  # the thread ended meanwhile
        for i in range(3):
            totals[i] += int(fields[i])
    return (totals[0], totals[1], totals[2])


def main() -> None:
    args = sys.argv[1:]
    waits_only = bool(args) and args[0] == "--waits-only"
    if waits_only:
        args = args[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    seconds = float(args[0])
    pids = args[1:]
    before = [schedstat(pid) for pid in pids]
    started = time.monotonic()
    seen: collections.Counter[str] = collections.Counter()
    samples = 0
    end = started + seconds
    if waits_only:
        time.sleep(seconds)
    else:
        while time.monotonic() < end:
            seen["".join(state(pid) for pid in pids)] += 1
            samples += 1
            time.sleep(0.0007)
    elapsed = time.monotonic() - started
    after = [schedstat(pid) for pid in pids]
    if samples:
        print(f"{samples} samples of {', '.join(pids)}")
        for combination, n in seen.most_common():
            print(f"  {combination}: {n * 100 / samples:.1f}%")
        for i, pid in enumerate(pids):
            running = sum(n for combination, n in seen.items() if combination[i] == "R")
            print(f"  {pid} running: {running * 100 / samples:.1f}%")
    print(
        f"run queue over {elapsed:.1f} s "
        "(ms a second on a core / waiting for one; slices a second):"
    )
    for pid, (on0, wait0, n0), (on1, wait1, n1) in zip(pids, before, after, strict=True):
        slices = (n1 - n0) / elapsed
        wait_ms = (wait1 - wait0) / 1e6 / elapsed
        per_wait = wait_ms * 1000 / slices if slices else 0.0
        print(
            f"  {pid}: {(on1 - on0) / 1e6 / elapsed:.0f} / {wait_ms:.0f} ms; "
            f"{slices:,.0f} slices ({per_wait:.0f} µs waited each)"
        )


if __name__ == "__main__":
    main()
