#!/usr/bin/env bash
# shipyard's slot in the peer-benchmark harness (an optional checkout: harness_dir.sh):
# install. Contract (the harness's _template/install.sh): idempotent; everything goes into
# $PEERS_ROOT/shipyard (a venv under /tmp/peers, never inside the repository), or
# $PEERS_ROOT/$SHIPYARD_VENV when set: before_after.sh keeps one venv per tree it compares,
# so switching trees costs no new venv.
# Exit 0 = ready, other = failure.
#
# make_venv re-creates the venv only when its argument list changes, and installing the
# project from its folder is the same argument whatever the source says. So the project is
# also reinstalled (--no-deps, --force-reinstall) whenever a hash of src/ and pyproject.toml
# differs from the one recorded at the last install: quick when nothing changed, never stale.
set -euo pipefail
source "$(dirname "$0")/harness_dir.sh"  # BENCH_DIR, the peer-benchmark harness, or exit 2
source "$BENCH_DIR/_lib/common.sh"
SHIPYARD_SRC=${SHIPYARD_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
[[ -f $SHIPYARD_SRC/pyproject.toml ]] || { echo "no pyproject.toml in $SHIPYARD_SRC" >&2; exit 1; }

name=${SHIPYARD_VENV:-shipyard}
venv=$PEERS_ROOT/$name
stamp=$venv/.shipyard-src-hash
src_hash=$(cd "$SHIPYARD_SRC" && find src pyproject.toml -type f ! -name '*.pyc' -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
before=$(stat -c %Y.%Z "$venv/.bench-installed" 2>/dev/null || echo none)

# The harness installs with the machine's pip (23.x), whose resolver gives up on fsspec /
# s3fs / aiobotocore without a hint; these bounds are that hint (newer pips need none).
make_venv "$name" "$SHIPYARD_SRC" "$SKLEARN_SPEC" "fsspec>=2025.9" "s3fs>=2025.9"

if [[ $(stat -c %Y.%Z "$venv/.bench-installed") != "$before" ]]; then
  printf '%s' "$src_hash" > "$stamp"  # make_venv just built the venv from this source
elif [[ ! -f $stamp || "$(cat "$stamp")" != "$src_hash" ]]; then
  echo "[shipyard] source changed ($src_hash): reinstalling the project"
  "$venv/bin/pip" install --no-input --progress-bar off --quiet --no-deps --force-reinstall \
    "$SHIPYARD_SRC"
  printf '%s' "$src_hash" > "$stamp"
else
  echo "[shipyard] project up to date ($src_hash)"
fi
"$venv/bin/python" -c 'import shipyard.runtime.server, sklearn' # fail here, not at start
