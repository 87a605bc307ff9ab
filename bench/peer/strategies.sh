#!/usr/bin/env bash
# Two versions of shipyard under LEAST_OUTSTANDING_REQUESTS, with the second under RANDOM
# beside them, through the peer harness: usage strategies.sh BEFORE_SRC AFTER_SRC.
# For each round: before (LOR), after (LOR), after (RANDOM), one after the other, so this
# noisy machine's drift hits all alike. Knobs: MODEL (sklearn | echo, default sklearn),
# INSTANCES (the endpoint's instance count, default 2), ROUNDS (default 2), and run_one.sh's
# (CONCS default "8 32", WARMUP default 2, DURATION default 6). Prints the CPU probe (ms:
# lower is a faster machine) before and after, and a table of req/s (p99 ms) with the
# ratios; each result JSON is kept in $OUT/<label>-<round>__<model>__w<instances>.json.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd)
MODEL=${MODEL:-sklearn} INSTANCES=${INSTANCES:-2} ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$(mktemp -d)}
export CONCS=${CONCS:-"8 32"} WARMUP=${WARMUP:-2} DURATION=${DURATION:-6}
export RESULTS_DIR=${RESULTS_DIR:-$(mktemp -d)}
probe() { (cd "$ROOT/bench" && python3 -c 'import harness; print(harness.cpu_probe_ms())'); }
echo "CPU probe before: $(probe) ms; $(date -u '+%Y-%m-%d %H:%M') UTC"
for round in $(seq 1 "$ROUNDS"); do
  for label in before after after-random; do
    case $label in
      before) src=$BEFORE venv=shipyard-before strategy=LEAST_OUTSTANDING_REQUESTS ;;
      after) src=$AFTER venv=shipyard strategy=LEAST_OUTSTANDING_REQUESTS ;;
      *) src=$AFTER venv=shipyard strategy=RANDOM ;;
    esac
    (cd "$src" && SHIPYARD_SRC=$src SHIPYARD_VENV=$venv SHIPYARD_BENCH_STRATEGY=$strategy \
      "$BENCH_DIR/run_one.sh" shipyard "$MODEL" "$INSTANCES") >&2
    mv "$RESULTS_DIR/shipyard__${MODEL}__w${INSTANCES}.json" \
      "$OUT/$label-${round}__${MODEL}__w${INSTANCES}.json"
  done
done
echo "CPU probe after: $(probe) ms; $(date -u '+%Y-%m-%d %H:%M') UTC"
python3 - "$OUT" "$MODEL" "$INSTANCES" "$ROUNDS" <<'PY'
import json, sys
from pathlib import Path
out, model, n, rounds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
def runs(label, r):
    path = out / f"{label}-{r}__{model}__w{n}.json"
    return {x["conc"]: x for x in json.loads(path.read_text()).get("runs", [])}
print(f"\n{model}, {n} instance(s); req/s (p99 ms)\n")
print("| round | conc | LOR before | LOR after | RANDOM after | LOR after / before | LOR after / RANDOM |")
print("|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    b, a, x = runs("before", r), runs("after", r), runs("after-random", r)
    for c in sorted(a):
        cell = lambda d: f"{d[c]['rps']:,.0f} ({d[c]['p99_ms']:.1f})" if c in d else "-"
        ratio = lambda p, q: f"{p[c]['rps'] / q[c]['rps']:.2f}" if c in p and c in q else "-"
        print(f"| {r} | {c} | {cell(b)} | {cell(a)} | {cell(x)} | {ratio(a, b)} | {ratio(a, x)} |")
PY
