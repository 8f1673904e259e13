#!/usr/bin/env bash
# Set up fgscale: the active virtual environment if there is one, else ./.venv.
# torch==2.13.0 (a CPU wheel) is installed first when no torch is present, so that the
# loose `torch>=2.2` of pyproject.toml does not pull a multi-GB CUDA build.
# The editable install is skipped when this environment already holds it, from this folder,
# for the same pyproject.toml, with the extra asked for: pip would take 15 s to reinstall
# the same thing at every run of scripts/demo.sh.
# The last line printed is the environment's python (scripts/test.sh and demo.sh read it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VIRTUAL_ENV:-}" ]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    PY=.venv/bin/python
fi
EXTRA="${1:-}"
HERE=$(pwd -P)
# the stamp: a hash of pyproject.toml and this folder (an environment shared by two clones
# must point at the one asked for), then a line per extra installed with them ("[]": none)
WANT=$({ cat pyproject.toml; echo "$HERE"; } | "$PY" -c \
    "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())")
STAMP="$("$PY" -c 'import sys; print(sys.prefix)')/.fgscale-setup"
EXTRAS=""
[ "$(head -n 1 "$STAMP" 2>/dev/null)" = "$WANT" ] && EXTRAS=$(tail -n +2 "$STAMP")
# fgscale must still import from here: a `pip uninstall`, or another clone's install into
# this environment, leaves the stamp behind
if [ -n "$EXTRAS" ] && { [ -z "$EXTRA" ] || grep -qxF -- "$EXTRA" <<<"$EXTRAS"; } \
        && "$PY" -c "import os, sys, fgscale; sys.exit(not os.path.realpath(fgscale.__file__)
                     .startswith(os.path.join(sys.argv[1], 'fgscale', '')))" "$HERE" 2>/dev/null; then
    echo "fgscale$EXTRA already installed from $HERE (pyproject.toml unchanged)" >&2
else
    rm -f "$STAMP"  # a failed install below must leave no stamp that claims it done
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install --quiet "torch==2.13.0"
    "$PY" -m pip install --quiet -e ".$EXTRA"
    # pip keeps the extras installed before: they stay recorded
    printf '%s\n' "$WANT" "${EXTRA:-[]}" $EXTRAS | awk '!seen[$0]++' > "$STAMP"
fi
echo "$PY"
