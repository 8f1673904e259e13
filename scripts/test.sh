#!/usr/bin/env bash
# One command: set up (with the test extra), lint, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/setup.sh "[test]" | tail -n 1)
"$PY" -m ruff check fgscale tests scripts
exec "$PY" -m pytest "$@"
