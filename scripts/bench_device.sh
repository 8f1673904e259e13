#!/usr/bin/env bash
# The streaming measurements of a machine with many cores and a GPU, prepared as one command for
# a lent device machine (16 cores, one H200, no network, a Python that holds torch but not
# Dask, Zarr or nibabel), whose time is short. Two steps:
#
#   bash scripts/bench_device.sh wheels   # here, where pip reaches a registry: the missing
#                                         # packages as wheels for that Python, into .whl/
#   bash scripts/bench_device.sh run      # there (the device tool's run, carrying .whl):
#                                         # installs them into /tmp/site, then measures
#
# `run` writes one Markdown file per measurement into $OUT (default /tmp/fgscale-bench-device),
# most needed first, each within what is left of BUDGET seconds (default 540): a measurement that
# would start with under 30 s left is skipped and named in skipped.txt, one that fails or runs
# out of time is named in failed.txt with its exit status, and its output so far is kept.
#   1. speeds.md: samples/s of streamed training at 1, 2, 4, 8 and 15 worker processes, the
#      model on the GPU, against the read limit of as many threads (bench_stream.py);
#   2. replicas.md: the MLP by one central process and by R = 1 and 2 data-parallel replicas;
#   3. feed.md: where the central process's time goes (the feed ratio), model on the CPU and
#      on the GPU;
#   4. speeds_cpu.md: as 1, the model on the CPU.
# Without a wheels folder, `run` uses the packages of the Python it finds. QUICK=1 makes every
# measurement bench_stream.py's --quick one at 1 and 2 workers (a check that all of it runs).
# Environment: PYTHON (default python3), WHEELS (the wheels' folder, default .whl), OUT, BUDGET,
# QUICK, BENCH_DIR (the store's folder, default /tmp/fgscale-bench: about 6 GB).
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=${WHEELS:-.whl}
# What the device machine's Python lacks, at the versions this project's CI tests: fgscale's
# dependencies (dask, distributed, zarr, google-crc32c, nibabel) and theirs that it lacks too
PACKAGES=(dask==2026.8.0 distributed==2026.8.0 zarr==3.1.6 numcodecs==0.16.6
          donfig==0.8.1.post1 google-crc32c==1.9.0 nibabel==5.4.2 tornado==6.6.1 tblib==3.2.2
          zict==3.0.0 partd==1.4.2 locket==1.0.0)
PY=${PYTHON:-python3}

case "${1:-}" in
wheels)
    # the device's Python is 3.12 on x86-64 (/work/.library/device/KINDS.md); the folder is
    # ignored by git, so that it travels with the device tool's carry and is never committed
    if [ -d .git ] && ! grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null; then
        echo "/$WHEELS/" >> .git/info/exclude
    fi
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" "${PACKAGES[@]}"
    ;;
run)
    ;;
*)
    echo "usage: bash scripts/bench_device.sh wheels|run" >&2
    exit 2
    ;;
esac

OUT=${OUT:-/tmp/fgscale-bench-device}
mkdir -p "$OUT"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    echo "no $WHEELS/ folder: the packages of $PY as they are"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
"$PY" -c "import fgscale, dask, zarr, torch; print('fgscale', fgscale.__version__, 'dask',
dask.__version__, 'zarr', zarr.__version__, 'torch', torch.__version__, 'cuda',
torch.cuda.is_available())" | tee "$OUT/versions.txt" || exit 1
GPU=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")

deadline=$((SECONDS + ${BUDGET:-540}))
if [ "${QUICK:-0}" = 1 ]; then
    COMMON=(--quick --n-workers 1,2)
else
    COMMON=(--rows 5600 --n-workers 1,2,4,8,15)
fi
COMMON+=(--dir "${BENCH_DIR:-/tmp/fgscale-bench}")

step() {  # step NAME ARGS...: bench_stream.py ARGS, its output into $OUT/NAME.md
    local name=$1 left=$((deadline - SECONDS))
    shift
    if [ "$left" -lt 30 ]; then
        echo "$name: not run, ${left} s left" | tee -a "$OUT/skipped.txt"
        return
    fi
    echo "== $name ($left s left): bench_stream.py $*"
    timeout "$left" "$PY" scripts/bench_stream.py "$@" > "$OUT/$name.md" 2> "$OUT/$name.err"
    local status=$?
    if [ "$status" -ne 0 ]; then
        echo "$name: exit $status$([ "$status" -eq 124 ] && echo ' (out of time)')" \
            | tee -a "$OUT/failed.txt"
        tail -n 20 "$OUT/$name.err"
    fi
    tail -n 3 "$OUT/$name.md"
}

step speeds "${COMMON[@]}" --kinds processes --device "$GPU" --no-feed
step replicas "${COMMON[@]}" --replicas 1,2
step feed "${COMMON[@]}" --feed --feed-models logreg,mlp
step speeds_cpu "${COMMON[@]}" --kinds processes --device cpu --no-feed
# the device tool brings back 8 files at most: the logs of the steps that went well stay there
for name in speeds replicas feed speeds_cpu; do
    if ! grep -qs "^$name:" "$OUT/failed.txt"; then rm -f "$OUT/$name.err"; fi
done
ls "$OUT"
