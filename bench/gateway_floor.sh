#!/usr/bin/env bash
# What the gateway's own work costs per request, against the least a Python hop costs.
#   bench/gateway_floor.sh PYTHON [CONC] [DURATION] [ROUNDS]
# Per round, alternating: bench/floor_proxy.py (uvloop + httptools, nothing but the hop)
# in front of one built-in runtime instance serving the echo model, then the gateway with
# one such instance; each is bench/gateway_split.sh (FRONT=floor for the first), whose
# line says req/s and the CPU per request of the proxy (or gateway) and of the instance.
# CONC defaults to 8, DURATION to 8 s (after 2 s of warm-up), ROUNDS to 2.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$1 CONC=${2:-8} DURATION=${3:-8} ROUNDS=${4:-2}
for _ in $(seq "$ROUNDS"); do
  echo "floor_proxy $(FRONT=floor bash "$HERE/gateway_split.sh" "$PYTHON" "$CONC" "$DURATION")"
  echo "gateway $(bash "$HERE/gateway_split.sh" "$PYTHON" "$CONC" "$DURATION")"
done
