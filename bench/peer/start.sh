#!/usr/bin/env bash
# shipyard's slot in the peer harness: usage start.sh MODEL PORT WORKERS
#   MODEL   echo | sklearn
#   PORT    the gateway binds 127.0.0.1:PORT (its instances take free ports of their own)
#   WORKERS InitialInstanceCount of the endpoint (instance processes behind the gateway)
# Writes the model directory, then launches serve.py in a new session (launch = setsid, so
# the harness stops the wrapper, the gateway and its instances by PID) and returns at once.
# serve.py starts the gateway, deploys endpoint MODEL and waits; until the endpoint is
# InService the URL answers 4xx, which the harness counts as part of the cold start.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
source "$BENCH_DIR/_lib/common.sh"
MODEL=$1 PORT=$2 WORKERS=${3:-1}
case $MODEL in echo|sklearn) ;; *) echo "unsupported model $MODEL" >&2; exit 3;; esac

models=$PEERS_ROOT/shipyard_models
model_dir=$models/$MODEL
rm -rf "$model_dir"
mkdir -p "$model_dir/code"
if [[ $MODEL == echo ]]; then
  # The same work as the other peers' echo: parse the JSON body, serialise it back.
  cat > "$model_dir/code/inference.py" <<'PY'
import json


def transform_fn(model, body, content_type, accept):
    return json.dumps(json.loads(body)), "application/json"
PY
else
  cp "$ARTIFACTS/model.pkl" "$model_dir/model.pkl"
  # The default input_fn parses the JSON, the default output_fn serialises the dict.
  cat > "$model_dir/code/inference.py" <<'PY'
import os
import pickle

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "model.pkl"), "rb") as f:
        return pickle.load(f)


def predict_fn(data, model):
    return {"predictions": model.predict(np.asarray(data["instances"])).tolist()}
PY
fi

home=$PEERS_ROOT/shipyard_home/$MODEL-w$WORKERS
rm -rf "$home"
mkdir -p "$home"
launch "${SERVER_LOG:-$LOG_DIR/shipyard.log}" "$PEERS_ROOT/${SHIPYARD_VENV:-shipyard}/bin/python" "$HERE/serve.py" \
  --port "$PORT" --home "$home" --model "$MODEL" --model-dir "$model_dir" --instances "$WORKERS"
echo "URL=http://127.0.0.1:$PORT/endpoints/$MODEL/invocations"
