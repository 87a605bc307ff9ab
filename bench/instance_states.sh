#!/usr/bin/env bash
# Where two instances' idle time comes from under a closed load: the gateway with one
# endpoint of INSTANCES instances (bench/peer/serve.py, the peer slot's start), wrk
# -t1 -cCONC for 12 s, and bench/process_states.py sampling the gateway's and the
# instances' scheduler states for 6 s of it. Prints the states and wrk's req/s.
#   bench/instance_states.sh PYTHON MODEL_DIR [STRATEGY] [CONC] [INSTANCES]
# MODEL_DIR: a model folder (the peer harness writes its sklearn one under
# $PEERS_ROOT/shipyard_models/sklearn); STRATEGY: the variant's RoutingStrategy
# (RANDOM by default, as the peer slot deploys it). WAITS_ONLY=1: no state sampling, only
# each process's time on a core and waiting for one (the sampler's own CPU left out).
# Everything started is stopped by PID.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$1 MODEL_DIR=$2 STRATEGY=${3:-RANDOM} CONC=${4:-8} INSTANCES=${5:-2}
BODY=${BODY:-$HERE/request.json}
work=$(mktemp -d)
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
SHIPYARD_BENCH_STRATEGY=$STRATEGY "$PYTHON" "$HERE/peer/serve.py" --port "$port" \
  --home "$work/home" --model m --model-dir "$MODEL_DIR" --instances "$INSTANCES" \
  >"$work/serve.log" 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true; rm -rf "$work"' EXIT
url=http://127.0.0.1:$port/endpoints/m/invocations
for _ in $(seq 300); do
  curl -sf -o /dev/null -X POST -H 'content-type: application/json' --data-binary "@$BODY" "$url" \
    && break
  kill -0 "$serve" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.2
done
gateway=$(pgrep -P "$serve" | head -1)
mapfile -t instances < <(pgrep -P "$gateway")
BENCH_BODY_FILE=$BODY wrk -t1 -c"$CONC" -d12s -s "$HERE/post.lua" "$url" >"$work/wrk.txt" &
load=$!
sleep 3
echo "states of the gateway, then its instances ($STRATEGY, c=$CONC):"
"$PYTHON" "$HERE/process_states.py" ${WAITS_ONLY:+--waits-only} 6 "$gateway" "${instances[@]}"
wait $load
grep Requests/sec "$work/wrk.txt"
