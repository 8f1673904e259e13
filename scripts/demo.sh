#!/usr/bin/env bash
# One command: set up, then run the main job on the embedded default
# (a synthetic cohort, a local Zarr store, a LocalCluster). Extra arguments go to `fgscale demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/setup.sh | tail -n 1)
exec "$PY" -m fgscale demo "$@"
