#!/usr/bin/env bash
# shipyard against Ray Serve's throughput preset and the bare-uvicorn floor (raw_asgi) on
# the peer harness, in one run: per model, shipyard, raw_asgi and rayserve_tput one after
# the other (one instance/worker/replica), then shipyard and raw_asgi with 2. Each result
# JSON is kept in $OUT (default bench/results/lead) and a table of req/s (p99 ms), the
# ratios and the CPU probe (calib, ms: lower is a faster machine) is printed.
#   bench/peer/lead.sh            CONCS (default "8 32"), PEERS (default "raw_asgi rayserve_tput")
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
OUT=${OUT:-$HERE/../results/lead}
export CONCS=${CONCS:-"8 32"}
PEERS=${PEERS:-"raw_asgi rayserve_tput"}
mkdir -p "$OUT"
run() {  # PEER MODEL WORKERS
  (cd "$ROOT" && "$BENCH_DIR/run_one.sh" "$1" "$2" "$3")
  cp "$BENCH_DIR/results/${1}__${2}__w${3}.json" "$OUT/"
}
for model in sklearn echo; do
  for peer in shipyard $PEERS; do run "$peer" "$model" 1; done
done
for peer in shipyard raw_asgi; do run "$peer" sklearn 2; done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
runs, calib = {}, {}
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    data = json.loads(path.read_text())
    if data.get("status") != "ok":
        continue
    key = (data["peer"], data["model"], int(data["workers"]))
    runs[key] = {r["conc"]: r for r in data["runs"]}
    calib[key] = (data.get("calib_ms") or [None])[0], [r.get("calib_ms_after") for r in data["runs"]]
cell = lambda r: f"{r['rps']:,.0f} ({r['p99_ms']:.1f})" if r else "-"
ratio = lambda a, b: f"{a['rps'] / b['rps']:.2f}" if a and b else "-"
print("| model | w | conc | shipyard | raw_asgi | rayserve_tput | / raw_asgi | / rayserve_tput |")
print("|---|---|---|---|---|---|---|---|")
for model, workers in (("sklearn", 1), ("echo", 1), ("sklearn", 2)):
    ours = runs.get(("shipyard", model, workers), {})
    for conc in sorted(ours):
        s = ours[conc]
        f = runs.get(("raw_asgi", model, workers), {}).get(conc)
        r = runs.get(("rayserve_tput", model, workers), {}).get(conc)
        print(f"| {model} | {workers} | {conc} | {cell(s)} | {cell(f)} | {cell(r)} | {ratio(s, f)} | {ratio(s, r)} |")
print()
print("CPU probe (ms) before each server, and after each measured run:")
for key, (before, after) in sorted(calib.items()):
    print(f"- {key[0]} {key[1]} w{key[2]}: {before} -> {after}")
PY
