"""How often each of a few processes is running, and in which combinations, under load.

    python bench/process_states.py SECONDS PID [PID ...]

Reads each process's scheduler state (``/proc/PID/stat``: R running or runnable, S
sleeping, D waiting on a disk) about every 0.7 ms for SECONDS, and prints how often each
combination was seen, in the order the PIDs were given (``RSR``: the first and third
running, the second asleep), then each process's share of samples running. The sampler
costs CPU itself (about a tenth of a core on 2 cores), so compare runs taken the same
way, not its figures with a bench's throughput alone.

Used to tell why an endpoint with two instances leaves CPU idle under a closed load
(wrk, a fixed number of connections): an instance asleep while the other runs had no
request to work on at that moment (bench/results/gateway_floor.md).
"""

from __future__ import annotations

import collections
import sys
import time


def state(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name, in parentheses, may itself hold spaces.
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "?"


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    seconds = float(sys.argv[1])
    pids = sys.argv[2:]
    seen: collections.Counter[str] = collections.Counter()
    samples = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen["".join(state(pid) for pid in pids)] += 1
        samples += 1
        time.sleep(0.0007)
    print(f"{samples} samples of {', '.join(pids)}")
    for combination, n in seen.most_common():
        print(f"  {combination}: {n * 100 / samples:.1f}%")
    for i, pid in enumerate(pids):
        running = sum(n for combination, n in seen.items() if combination[i] == "R")
        print(f"  {pid} running: {running * 100 / samples:.1f}%")


if __name__ == "__main__":
    main()
