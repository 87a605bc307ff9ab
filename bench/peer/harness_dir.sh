# Sourced by every script that runs on the peer-benchmark harness: sets and exports
# BENCH_DIR, or stops the script (exit 2) saying what it needs.
#
# The harness is an optional checkout, not part of this repository: a folder holding
# run_one.sh, _lib/ (common.sh, bench.py, post.lua), one folder per peer server (raw_asgi/,
# rayserve_tput/, shipyard/, ...) and results/ (bench/README.md, "The peer harness").
# BENCH_DIR names it; without BENCH_DIR it is looked for as shared/bench-peers in the
# folder that holds this repository.
_bench_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH_DIR=${BENCH_DIR:-$(dirname "$_bench_repo")/shared/bench-peers}
if [[ ! -f $BENCH_DIR/run_one.sh || ! -f $BENCH_DIR/_lib/common.sh ]]; then
  echo "$(basename "$0"): needs the peer-benchmark harness, an optional checkout that is not" \
    "part of this repository (bench/README.md, \"The peer harness\"): set BENCH_DIR to its" \
    "folder. Not found: $BENCH_DIR (no run_one.sh and _lib/common.sh there)." >&2
  exit 2
fi
export BENCH_DIR
