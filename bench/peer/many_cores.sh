#!/usr/bin/env bash
# shipyard against the bare-uvicorn floor (raw_asgi) on a machine with cores to spare, on the
# peer harness: the same pickled sklearn model and echo model, wrk from outside, one run with
# the servers one after the other. For each model and N in $SIZES:
#   - shipyard with N instances behind one gateway (g1);
#   - shipyard with N instances behind `shipyard serve --workers N` (gN, N > 1);
#   - raw_asgi with N uvicorn workers.
# shipyard runs once per RoutingStrategy in $STRATEGIES. Each result JSON lands in $OUT as
# shipyard-gG[-lor]__MODEL__wN.json or raw_asgi__MODEL__wN.json, and $OUT/summary.md holds
# the table of req/s (p99 ms), the ratios to the floor, the server CPU per request and the
# CPU probe (ms: lower is a faster machine).
#   WHEELS=DIR bash bench/peer/many_cores.sh   (builds the venvs offline first: offline.sh)
#   bash bench/peer/many_cores.sh              (venvs already under $PEERS_ROOT)
# Knobs: SIZES (default "1 2 4"), MODELS (default "echo sklearn"), CONCS (default "8 32"),
# STRATEGIES (default RANDOM; LEAST_OUTSTANDING_REQUESTS too),
# WARMUP, DURATION, WRK_THREADS (default 2: one wrk thread can be the limit of a floor with
# several workers), OUT (default bench/results/many_cores).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
OUT=${OUT:-$ROOT/bench/results/many_cores}
SIZES=${SIZES:-"1 2 4"}
MODELS=${MODELS:-"echo sklearn"}
STRATEGIES=${STRATEGIES:-RANDOM}
export CONCS=${CONCS:-"8 32"} WRK_THREADS=${WRK_THREADS:-2}
export RESULTS_DIR=${RESULTS_DIR:-$(mktemp -d)}
mkdir -p "$OUT"
if [[ -n ${WHEELS:-} ]]; then bash "$HERE/offline.sh"; fi
{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
  echo "python: $("${PEERS_ROOT:-/tmp/peers}/shipyard/bin/python" -V 2>&1)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "started: $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

run() {  # PEER MODEL N GATEWAYS [STRATEGY]
  local name=$1
  [[ $1 == shipyard ]] && name=shipyard-g$4
  [[ ${5:-RANDOM} == LEAST_OUTSTANDING_REQUESTS ]] && name=$name-lor
  (cd "$ROOT" && SHIPYARD_BENCH_WORKERS=$4 SHIPYARD_BENCH_STRATEGY=${5:-RANDOM} \
    "$BENCH_DIR/run_one.sh" "$1" "$2" "$3") || echo "$name $2 w$3 failed" >&2
  if [[ -f $RESULTS_DIR/${1}__${2}__w${3}.json ]]; then
    mv "$RESULTS_DIR/${1}__${2}__w${3}.json" "$OUT/${name}__${2}__w${3}.json"
  fi
}
for n in $SIZES; do
  for model in $MODELS; do
    for strategy in $STRATEGIES; do
      run shipyard "$model" "$n" 1 "$strategy"
      if (( n > 1 )); then run shipyard "$model" "$n" "$n" "$strategy"; fi
    done
    run raw_asgi "$model" "$n" 1
  done
done

python3 - "$OUT" > "$OUT/summary.md" <<'PY'
import json, sys
from pathlib import Path
runs, calib = {}, {}
for path in sorted(Path(sys.argv[1]).glob("*__*__w*.json")):
    data = json.loads(path.read_text())
    if data.get("status") != "ok":
        print(f"- {path.name}: {data.get('status')} {data.get('notes')}")
        continue
    peer = path.name.split("__")[0]
    key = (peer, data["model"], int(data["workers"]))
    runs[key] = {r["conc"]: r for r in data["runs"]}
    calib[key] = (data.get("calib_ms") or [None])[0], [r.get("calib_ms_after") for r in data["runs"]]
cell = lambda r: f"{r['rps']:,.0f} ({r['p99_ms']:.1f})" if r else "-"
ratio = lambda a, b: f"{a['rps'] / b['rps']:.2f}" if a and b else "-"
us = lambda r: f"{r['server_cpu_cores'] / r['rps'] * 1e6:.0f}" if r and r.get("server_cpu_cores") else "-"
print("| model | N | conc | server | req/s (p99 ms) | / floor | CPU µs/req |")
print("|---|---|---|---|---|---|---|")
for model in ("echo", "sklearn"):
    for n in sorted({k[2] for k in runs if k[1] == model}):
        floor = runs.get(("raw_asgi", model, n), {})
        servers = sorted(k[0] for k in runs if k[1:] == (model, n) and k[0] != "raw_asgi")
        for conc in sorted({c for k in runs if k[1:] == (model, n) for c in runs[k]}):
            f = floor.get(conc)
            for server in servers + ["raw_asgi"]:
                r = runs[(server, model, n)].get(conc) if (server, model, n) in runs else None
                print(f"| {model} | {n} | {conc} | {server} | {cell(r)} | {ratio(r, f)} | {us(r)} |")
print()
print("Cells are req/s (p99 ms). CPU probe (ms) before each server, then after each measured run:")
for key, (before, after) in sorted(calib.items()):
    print(f"- {key[0]} {key[1]} w{key[2]}: {before} -> {', '.join(map(str, after))}")
PY
cat "$OUT/summary.md"
