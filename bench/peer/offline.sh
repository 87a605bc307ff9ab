#!/usr/bin/env bash
# The peer harness's venvs for shipyard and raw_asgi on a machine with no package index:
# made from the machine's python3 (whose site-packages, numpy and scikit-learn included,
# each venv sees after its own) and a folder of wheels, then stamped so the harness's
# install.sh scripts find them up to date. Run lead.sh or run_one.sh after it.
#   WHEELS=DIR BENCH_DIR=HARNESS bash bench/peer/offline.sh
# (HARNESS: the peer-benchmark harness's folder, an optional checkout: harness_dir.sh)
# WHEELS holds, for the machine's Python, shipyard's dependencies that its python3 lacks
# (uvicorn and httptools among them), e.g. from `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 ...` where pip can reach an index.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${WHEELS:?WHEELS names the folder of wheels}"
source "$ROOT/bench/peer/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
source "$BENCH_DIR/_lib/common.sh"  # PEERS_ROOT, SKLEARN_SPEC
PY=${PY:-$(command -v python3)}
machine_site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
venv() {  # NAME MAKE_VENV_ARGS: prints the venv's site-packages
  local v=$PEERS_ROOT/$1 sp
  rm -rf "$v"
  "$PY" -m venv --without-pip "$v" >&2
  sp=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$machine_site" > "$sp/zz_machine.pth"
  printf '%s' "$2" > "$v/.bench-installed"  # what make_venv compares
  echo "$sp"
}
script() {  # VENV NAME MODULE FUNCTION: a console script, as pip would write it
  printf '#!%s\nimport sys\nfrom %s import %s\nif __name__ == "__main__":\n    sys.exit(%s())\n' \
    "$PEERS_ROOT/$1/bin/python" "$3" "$4" "$4" > "$PEERS_ROOT/$1/bin/$2"
  chmod +x "$PEERS_ROOT/$1/bin/$2"
}
install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$@"; }

venv _train "$SKLEARN_SPEC" >/dev/null
sp=$(venv raw_asgi "uvicorn[standard]==0.54.0 $SKLEARN_SPEC")
install "$sp" "$WHEELS"/uvicorn-*.whl "$WHEELS"/httptools-*.whl
script raw_asgi uvicorn uvicorn.main main

# SHIPYARD_SRC as the harness's shipyard slot sets it: the folder it is run from.
src=${SHIPYARD_SRC:-$ROOT}
sp=$(venv shipyard "$src $SKLEARN_SPEC fsspec>=2025.9 s3fs>=2025.9")
install "$sp" "$WHEELS"/*.whl
echo "$src/src" > "$sp/shipyard_src.pth"  # the tree itself, as an editable install
script shipyard shipyard shipyard.__main__ main
(cd "$src" && find src pyproject.toml -type f ! -name '*.pyc' -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16 | tr -d '\n') \
  > "$PEERS_ROOT/shipyard/.shipyard-src-hash"  # install.sh's stamp of the source
"$PEERS_ROOT/shipyard/bin/python" -c 'import shipyard.app, sklearn, uvicorn'
"$PEERS_ROOT/raw_asgi/bin/python" -c 'import uvicorn, httptools, uvloop, sklearn'
echo "offline venvs ready under $PEERS_ROOT ($("$PY" -V), site $machine_site)"
