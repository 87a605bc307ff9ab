#!/usr/bin/env bash
# make bench-guard: today's data path against a recorded reference commit, on the peer
# harness (before_after.sh, interleaved, one instance), failing when the working tree
# serves less than BENCH_GUARD_MIN (0.9) of the reference's requests/s for the sklearn or
# echo model at any concurrency. Not part of CI (it needs a quiet machine and minutes);
# run it before resolving an issue that touches the data path.
#   BENCH_GUARD_REF  the reference commit (default: the one in bench/peer/reference)
#   BENCH_GUARD_MIN  the least ratio that passes (default 0.9)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
REF=${BENCH_GUARD_REF:-$(tr -d '[:space:]' < "$HERE/reference")}
MIN=${BENCH_GUARD_MIN:-0.9}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git -C "$ROOT" archive "$REF" | tar -x -C "$WORK"
echo "bench-guard: $(git -C "$ROOT" rev-parse --short HEAD) (working tree) against $REF, at least ${MIN}x"
OUT="$HERE/../results/before_after"
rm -f "$OUT"/before__*.json "$OUT"/after__*.json
LABELS="before after" "$HERE/before_after.sh" "$WORK" "$ROOT"
python3 - "$OUT" "$MIN" <<'PY'
import json, sys
from pathlib import Path
out, least = Path(sys.argv[1]), float(sys.argv[2])
failed = []
for model in ("sklearn", "echo"):
    runs = {}
    for label in ("before", "after"):
        result = json.loads((out / f"{label}__{model}.json").read_text())
        runs[label] = {r["conc"]: r for r in result.get("runs", [])}
    if not runs["before"] or set(runs["before"]) != set(runs["after"]):
        failed.append(f"{model}: a run is missing")
        continue
    for conc, before in sorted(runs["before"].items()):
        ratio = runs["after"][conc]["rps"] / before["rps"]
        print(f"{model} c={conc}: {ratio:.2f}x of the reference")
        if ratio < least:
            failed.append(f"{model} c={conc}: {ratio:.2f}x < {least}x")
if failed:
    sys.exit("bench-guard failed: " + "; ".join(failed))
print("bench-guard passed")
PY
