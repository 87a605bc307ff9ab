#!/usr/bin/env bash
# Where a request's CPU goes: the gateway's and the instance's, measured apart.
#   bench/gateway_split.sh PYTHON [CONC] [DURATION]
# PYTHON is an interpreter with shipyard installed (compare two trees with two venvs,
# alternating runs). Starts the gateway with one echo instance (bench/peer/serve.py, the
# peer harness's echo model), drives it with wrk -t1 -cCONC (default 32) for DURATION
# seconds (default 8, after 2 s of warm-up), and prints one line: req/s, the gateway's
# and the instance's CPU µs per request (/proc/PID/stat), and the write and read system
# calls per request (/proc/PID/io). PROFILE=FILE also records the gateway's stacks with
# py-spy (PYSPY=its path). FRONT=floor puts bench/floor_proxy.py (nothing but the hop) in
# front of the same instance instead of the gateway, and the line says proxy_ for
# gateway_. LOAD=apart drives it with bench/apart_load.py instead of wrk: each request's
# head and body in two writes, as http.client sends them. Everything started is stopped
# by PID.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$1 CONC=${2:-32} DURATION=${3:-8}
BODY=${BODY:-$HERE/request.json}
work=$(mktemp -d)
mkdir -p "$work/echo/code"
cat > "$work/echo/code/inference.py" <<'PY'
import json


def transform_fn(model, body, content_type, accept):
    return json.dumps(json.loads(body)), "application/json"
PY
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
instance=""
if [[ ${FRONT:-gateway} == floor ]]; then
  front=proxy
  instance_port=$(free_port)
  "$PYTHON" -m shipyard.runtime --model-dir "$work/echo" --port "$instance_port" \
    >"$work/instance.log" 2>&1 &
  instance=$!
  for _ in $(seq 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$instance_port/ping" && break
    kill -0 "$instance" 2>/dev/null || { cat "$work/instance.log" >&2; exit 1; }
    sleep 0.2
  done
  "$PYTHON" "$HERE/floor_proxy.py" "$port" "$instance_port" >"$work/serve.log" 2>&1 &
else
  front=gateway
  "$PYTHON" "$HERE/peer/serve.py" --port "$port" --home "$work/home" --model echo \
    --model-dir "$work/echo" --instances 1 >"$work/serve.log" 2>&1 &
fi
serve=$!
trap 'kill $serve $instance 2>/dev/null; wait $serve $instance 2>/dev/null || true; rm -rf "$work"' EXIT
url=http://127.0.0.1:$port/endpoints/echo/invocations
for _ in $(seq 300); do
  curl -sf -o /dev/null -X POST -H 'content-type: application/json' --data-binary "@$BODY" "$url" \
    && break
  kill -0 "$serve" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.2
done
if [[ $front == proxy ]]; then
  gateway=$serve
else
  gateway=$(pgrep -P "$serve" | head -1)
  instance=$(pgrep -P "$gateway" | head -1)
fi
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
io() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/io"; }
export BENCH_BODY_FILE=$BODY
load() {  # SECONDS: wrk, or the two-write generator
  if [[ ${LOAD:-wrk} == apart ]]; then
    "$PYTHON" "$HERE/apart_load.py" "$url" "$BODY" "$CONC" "$1"
  else
    wrk -t1 -c"$CONC" -d"${1}s" -s "$HERE/post.lua" "$url"
  fi
}
load 2 >/dev/null
g0=$(cpu "$gateway") i0=$(cpu "$instance")
w0=$(io "$gateway" syscw) r0=$(io "$gateway" syscr) iw0=$(io "$instance" syscw)
if [[ -n ${PROFILE:-} ]]; then
  # py-spy's collapsed stacks of the gateway over the measured run (the numbers printed
  # then include py-spy's own cost): PROFILE=out.txt, PYSPY=path to py-spy.
  "${PYSPY:-py-spy}" record --pid "$gateway" --rate "${RATE:-250}" ${PYSPY_ARGS:---nonblocking} --duration "$DURATION" --format raw \
    --output "$PROFILE" >/dev/null 2>&1 &
  spy=$!
fi
out=$(load "$DURATION")
[[ -z ${spy:-} ]] || wait "$spy" || true
g1=$(cpu "$gateway") i1=$(cpu "$instance")
w1=$(io "$gateway" syscw) r1=$(io "$gateway" syscr) iw1=$(io "$instance" syscw)
python3 - "$out" "$CONC" "$(getconf CLK_TCK)" "$g0 $g1 $i0 $i1 $w0 $w1 $r0 $r1 $iw0 $iw1" "$front" <<'PY'
import re, sys
out, conc, tck, front = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
g0, g1, i0, i1, w0, w1, r0, r1, iw0, iw1 = map(int, sys.argv[4].split())
n = int(re.search(r"(\d+) requests in", out).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
us = 1e6 / tck / n
print(
    f"c={conc} req/s={rps:,.0f} {front}_us/req={(g1 - g0) * us:.0f} "
    f"instance_us/req={(i1 - i0) * us:.0f} {front}_writes/req={(w1 - w0) / n:.2f} "
    f"{front}_reads/req={(r1 - r0) / n:.2f} instance_writes/req={(iw1 - iw0) / n:.2f} "
    f"errors={errors.group(1) if errors else 0}"
)
PY
