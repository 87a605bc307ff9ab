#!/usr/bin/env bash
# The built-in runtime alone (no gateway) under wrk: req/s, p99 and its CPU per request.
#   bench/runtime_direct.sh PYTHON MODEL_DIR [VAR=VALUE ...]
# PYTHON is an interpreter with shipyard installed (compare two trees with two venvs),
# MODEL_DIR a model folder; the variables go to the runtime's environment (e.g.
# SAGEMAKER_MODEL_SERVER_WORKERS=2). CONCS (default "8 32"), DURATION (8 s, after a 2 s
# warm-up), BODY (default bench/request.json: the peer harness's 20-float request). The runtime is stopped by PID.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$1 MODEL_DIR=$2
shift 2
BODY=${BODY:-$HERE/request.json}
DURATION=${DURATION:-8}
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env "$@" "$PYTHON" -m shipyard.runtime --port "$port" --model-dir "$MODEL_DIR" >/dev/null 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break
  sleep 0.1
done
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
url=http://127.0.0.1:$port/invocations
for c in ${CONCS:-8 32}; do
  BENCH_BODY_FILE=$BODY wrk -t1 -c"$c" -d2s -s "$HERE/post.lua" "$url" >/dev/null
  before=$(cpu)
  summary=$(BENCH_BODY_FILE=$BODY wrk -t1 -c"$c" -d"${DURATION}s" --latency -s "$HERE/post.lua" "$url" \
    | sed -n 's/^BENCH_JSON //p')
  after=$(cpu)
  python3 - "$summary" "$c" "$before" "$after" "$DURATION" <<'PY'
import json, os, sys
run, conc, before, after, duration = sys.argv[1:]
run = json.loads(run)
n = run["requests"]
tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
print(f"c={conc}: {n / float(duration):,.0f} req/s, p99 {run['p99_us'] / 1000:.1f} ms, "
      f"CPU {(float(after) - float(before)) * tick_us / n:.0f} us/req")
PY
done
