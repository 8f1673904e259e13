#!/usr/bin/env bash
# Set up fgscale: the active virtual environment if there is one, else ./.venv.
# torch==2.13.0 (a CPU wheel) is installed first when no torch is present, so that the
# loose `torch>=2.2` of pyproject.toml does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VIRTUAL_ENV:-}" ]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    PY=.venv/bin/python
fi
"$PY" -m pip install --quiet --upgrade pip
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet -e ".${1:-}"
echo "$PY"
