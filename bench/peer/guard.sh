#!/usr/bin/env bash
# make bench-guard: today's data path against a recorded reference commit, on the peer
# harness (before_after.sh: one instance, reference and working tree interleaved), failing
# when the working tree serves less than BENCH_GUARD_MIN (0.9) of the reference's
# requests/s for the sklearn or echo model at any concurrency. One 10 s run on this
# 2-core machine moves by 20% and more, so the ratio judged is the median of
# BENCH_GUARD_ROUNDS rounds (4); the server's CPU per request, steadier, is shown beside
# it. The rounds alternate which tree goes first, and an even number of them lets each
# order count alike: the side that ran later in a round read 8 % lower on echo, whichever
# tree it was, over three runs of three rounds (bench/results/bench_guard.md). Not part of CI (it needs a quiet machine and some 12 minutes); run it before
# resolving an issue that touches the data path.
#   BENCH_GUARD_REF     the reference commit (default: the one in bench/peer/reference)
#   BENCH_GUARD_MIN     the least median ratio that passes (default 0.9)
#   BENCH_GUARD_ROUNDS  rounds (default 4; keep it even)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
ROOT="$(cd "$HERE/../.." && pwd)"
REF=${BENCH_GUARD_REF:-$(tr -d '[:space:]' < "$HERE/reference")}
MIN=${BENCH_GUARD_MIN:-0.9}
ROUNDS=${BENCH_GUARD_ROUNDS:-4}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src"
git -C "$ROOT" archive "$REF" | tar -x -C "$WORK/src"
probe() { python3 -c "import sys; sys.path.insert(0, '$ROOT/bench'); from harness import cpu_probe_ms; print(cpu_probe_ms())"; }
echo "bench-guard: $(git -C "$ROOT" rev-parse --short HEAD) (working tree) against $REF," \
  "median of $ROUNDS rounds, at least ${MIN}x; $(date -u '+%Y-%m-%d %H:%M UTC'), CPU probe $(probe) ms"
for round in $(seq "$ROUNDS"); do
  # The guard's runs only: bench/results/before_after stays as recorded. Odd rounds run
  # the reference first, even ones the working tree, so going first or second (a warm
  # cache, the machine's drift) favours neither.
  order="before after"; (( round % 2 )) || order="after before"
  OUT="$WORK/results/$round" LABELS=$order "$HERE/before_after.sh" "$WORK/src" "$ROOT"
done
echo "after the rounds: $(date -u '+%H:%M UTC'), CPU probe $(probe) ms (lower is faster)"
python3 - "$WORK/results" "$MIN" <<'PY'
import json, statistics, sys
from pathlib import Path
results, least = Path(sys.argv[1]), float(sys.argv[2])
failed = []
print("| model | conc | req/s after / before (rounds) | median | CPU µs/req before → after |")
print("|---|---|---|---|---|")
for model in ("sklearn", "echo"):
    ratios, cpu = {}, {}
    for round_dir in sorted(results.iterdir()):
        runs = {}
        for label in ("before", "after"):
            path = round_dir / f"{label}__{model}.json"
            data = json.loads(path.read_text()) if path.exists() else {}
            runs[label] = {r["conc"]: r for r in data.get("runs", [])}
        for conc, before in runs["before"].items():
            after = runs["after"].get(conc)
            if after is None:
                continue
            ratios.setdefault(conc, []).append(after["rps"] / before["rps"])
            for label, run in (("before", before), ("after", after)):
                cpu.setdefault((conc, label), []).append(1e6 * run["server_cpu_cores"] / run["rps"])
    if not ratios:
        failed.append(f"{model}: no runs")
    for conc, values in sorted(ratios.items()):
        median = statistics.median(values)
        b, a = (statistics.median(cpu[(conc, label)]) for label in ("before", "after"))
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {model} | {conc} | {shown} | {median:.2f} | {b:.0f} → {a:.0f} |")
        if median < least:
            failed.append(f"{model} c={conc}: {median:.2f}x < {least}x")
if failed:
    sys.exit("bench-guard failed: " + "; ".join(failed))
print("bench-guard passed")
PY
