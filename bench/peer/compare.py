"""Side-by-side table: shipyard's peer-harness runs next to the peers' figures.

    python3 bench/peer/compare.py [--ours bench/results] [--published DIR]

``--ours`` holds the result JSON files of our own run_one.sh runs (shipyard, and any peers
re-run in the same session: compare with those first, since this machine's speed drifts by
2x and more between sessions). ``--published`` is the peer-benchmark harness's results
folder, the figures behind its RESULTS.md (default ``$BENCH_DIR/results``: the harness is an
optional checkout, see bench/README.md; without it the script says so and exits 2). Prints
req/s (p99 ms) per model, workers and concurrency.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from harness import PEER_HARNESS_NEEDED, peer_harness  # noqa: E402

PEERS = ["raw_asgi", "fastapi", "rayserve_tput", "mlserver", "torchserve", "bentoml"]

Runs = dict[tuple[str, str, int], dict[int, dict[str, Any]]]


def load(folder: Path) -> tuple[Runs, dict[tuple[str, str, int], str]]:
    runs: Runs = {}
    when: dict[tuple[str, str, int], str] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("status") != "ok":
            continue
        key = (result["peer"], result["model"], int(result["workers"]))
        runs[key] = {int(r["conc"]): r for r in result["runs"]}
        when[key] = result["when"]
    return runs, when


def cell(runs: Runs, key: tuple[str, str, int], conc: int) -> str:
    run = runs.get(key, {}).get(conc)
    return f"{run['rps']:,.0f} ({run['p99_ms']:.1f})" if run else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", type=Path, default=HERE.parent / "results")
    parser.add_argument("--published", type=Path, default=None)
    args = parser.parse_args()
    if args.published is None:
        args.published = peer_harness() / "results"
    elif not args.published.is_dir():
        print(f"compare.py: --published {args.published} is not a folder", file=sys.stderr)
        print(f"compare.py: {PEER_HARNESS_NEEDED}", file=sys.stderr)
        sys.exit(2)
    ours, when = load(args.ours)
    published, _ = load(args.published)
    same = sorted({p for p, _, _ in ours} - {"shipyard"})
    headers = ["model", "w", "conc", "**shipyard**"]
    headers += [f"{p} (same run)" for p in same]
    headers += ["shipyard / raw_asgi"] if "raw_asgi" in same else []
    headers += [f"{p} (RESULTS.md)" for p in PEERS]
    print("req/s (p99 ms); wrk -t1 -cC, 3 s warm-up + 10 s measured (the harness's defaults)\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for (peer, model, workers), by_conc in sorted(ours.items(), key=lambda kv: kv[0][1:]):
        if peer != "shipyard":
            continue
        for conc in sorted(by_conc):
            key = (peer, model, workers)
            row = [model, str(workers), str(conc), f"**{cell(ours, key, conc)}**"]
            row += [cell(ours, (p, model, workers), conc) for p in same]
            if "raw_asgi" in same:
                base = ours.get(("raw_asgi", model, workers), {}).get(conc)
                row.append(f"{by_conc[conc]['rps'] / base['rps']:.2f}" if base else "")
            row += [cell(published, (p, model, workers), conc) for p in PEERS]
            print("| " + " | ".join(row) + " |")
    stamps = sorted(set(when.values()))
    if stamps:
        print(f"\nour runs: {stamps[0]} to {stamps[-1]}")


if __name__ == "__main__":
    main()
