#!/usr/bin/env bash
# What the gateway's own work costs per request, against the least a Python hop costs.
#   bench/gateway_floor.sh PYTHON [CONC] [DURATION] [ROUNDS]
# Per round, alternating: bench/floor_proxy.py (uvloop + httptools, nothing but the
# hop) in front of one built-in runtime instance serving the echo model, then the
# gateway with one such instance (bench/gateway_split.sh). wrk -t1 -cCONC (default 8)
# for DURATION seconds (default 8) after 2 s of warm-up; each line says req/s and the
# CPU per request of the proxy (or gateway) and of the instance, from /proc/PID/stat.
# Everything started is stopped by PID.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$1 CONC=${2:-8} DURATION=${3:-8} ROUNDS=${4:-2}
BODY=${BODY:-${BENCH_DIR:-$HERE/../../shared/bench-peers}/shipyard/request.json}
export BENCH_BODY_FILE=$BODY
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

floor_round() {
  local work inst_port proxy_port inst proxy url
  work=$(mktemp -d)
  mkdir -p "$work/echo/code"
  cat > "$work/echo/code/inference.py" <<'PY'
import json


def transform_fn(model, body, content_type, accept):
    return json.dumps(json.loads(body)), "application/json"
PY
  inst_port=$(free_port) proxy_port=$(free_port)
  "$PYTHON" -m shipyard.runtime --model-dir "$work/echo" --port "$inst_port" >"$work/instance.log" 2>&1 &
  inst=$!
  proxy=""
  trap 'kill $inst $proxy 2>/dev/null; wait $inst $proxy 2>/dev/null || true; rm -rf "$work"' RETURN
  for _ in $(seq 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$inst_port/ping" && break
    kill -0 "$inst" 2>/dev/null || { cat "$work/instance.log" >&2; return 1; }
    sleep 0.2
  done
  "$PYTHON" "$HERE/floor_proxy.py" "$proxy_port" "$inst_port" >"$work/proxy.log" 2>&1 &
  proxy=$!
  url=http://127.0.0.1:$proxy_port/endpoints/echo/invocations
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -H 'content-type: application/json' --data-binary "@$BODY" "$url" && break
    sleep 0.1
  done
  wrk -t1 -c"$CONC" -d2s -s "$HERE/post.lua" "$url" >/dev/null
  local p0 i0 p1 i1 out
  p0=$(cpu "$proxy") i0=$(cpu "$inst")
  out=$(wrk -t1 -c"$CONC" -d"${DURATION}s" -s "$HERE/post.lua" "$url")
  p1=$(cpu "$proxy") i1=$(cpu "$inst")
  python3 - "$out" "$CONC" "$(getconf CLK_TCK)" "$p0 $p1 $i0 $i1" <<'PY'
import re, sys
out, conc, tck = sys.argv[1], sys.argv[2], int(sys.argv[3])
p0, p1, i0, i1 = map(int, sys.argv[4].split())
n = int(re.search(r"(\d+) requests in", out).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
us = 1e6 / tck / n
print(
    f"floor_proxy c={conc} req/s={rps:,.0f} proxy_us/req={(p1 - p0) * us:.0f} "
    f"instance_us/req={(i1 - i0) * us:.0f} errors={errors.group(1) if errors else 0}"
)
PY
}

for _ in $(seq "$ROUNDS"); do
  floor_round
  echo "gateway $(bash "$HERE/gateway_split.sh" "$PYTHON" "$CONC" "$DURATION")"
done
