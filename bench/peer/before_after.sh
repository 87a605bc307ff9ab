#!/usr/bin/env bash
# Two versions of shipyard and Ray Serve's throughput preset through the peer harness, in
# one run: usage before_after.sh BEFORE_SRC AFTER_SRC (two source trees of the project).
# Interleaved (before, after, rayserve_tput per model) so this noisy machine's drift hits
# all alike; each result JSON is kept in bench/results/before_after/<label>__<model>.json
# and a table of req/s (p99 ms) is printed. Knobs as run_one.sh (CONCS default "8 32");
# LABELS="before after" leaves Ray Serve out (make bench-guard does).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
OUT=${OUT:-$HERE/../results/before_after}
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd)
export CONCS=${CONCS:-"8 32"}
mkdir -p "$OUT"
for model in sklearn echo; do
  for label in ${LABELS:-before after rayserve_tput}; do
    case $label in
      before) peer=shipyard; export SHIPYARD_SRC=$BEFORE SHIPYARD_VENV=shipyard-before ;;
      after) peer=shipyard; export SHIPYARD_SRC=$AFTER SHIPYARD_VENV=shipyard ;;
      *) peer=$label ;;
    esac
    (cd "$SHIPYARD_SRC" && "$BENCH_DIR/run_one.sh" "$peer" "$model" 1)
    cp "$BENCH_DIR/results/${peer}__${model}__w1.json" "$OUT/${label}__${model}.json"
  done
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {}
for path in sorted(out.glob("*.json")):
    label, model = path.stem.split("__")
    result = json.loads(path.read_text())
    runs[(label, model)] = {r["conc"]: r for r in result.get("runs", [])}
print("| model | conc | before req/s (p99 ms) | after req/s (p99 ms) | after / before | rayserve_tput | after / rayserve_tput |")
print("|---|---|---|---|---|---|---|")
for model in ("sklearn", "echo"):
    concs = sorted({c for (l, m), r in runs.items() if m == model for c in r})
    for c in concs:
        b, a, r = (runs.get((l, model), {}).get(c) for l in ("before", "after", "rayserve_tput"))
        cell = lambda x: f"{x['rps']:,.0f} ({x['p99_ms']:.1f})" if x else "-"
        ratio = lambda x, y: f"{x['rps'] / y['rps']:.2f}" if x and y else "-"
        print(f"| {model} | {c} | {cell(b)} | {cell(a)} | {ratio(a, b)} | {cell(r)} | {ratio(a, r)} |")
PY
