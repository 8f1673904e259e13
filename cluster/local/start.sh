#!/usr/bin/env bash
# Start a Dask scheduler and N single-threaded worker processes on this machine, in the
# background, for fgscale commands to join with --scheduler or --scheduler-file.
#
#   cluster/local/start.sh [N_WORKERS] [MEMORY_PER_WORKER]    (defaults: all cores, auto)
#   fgscale bank STORE --scheduler-file fgscale-scheduler.json
#   cluster/local/stop.sh
#
# Environment: SCHEDULER_FILE (default ./fgscale-scheduler.json), PORT (8786),
# DASHBOARD (8787), LOG_DIR (./dask-logs). Run it from the Python environment holding fgscale.
set -euo pipefail
N_WORKERS=${1:-$(nproc)}
MEMORY=${2:-auto}
SCHEDULER_FILE=${SCHEDULER_FILE:-fgscale-scheduler.json}
PORT=${PORT:-8786}
DASHBOARD=${DASHBOARD:-8787}
LOG_DIR=${LOG_DIR:-dask-logs}
mkdir -p "$LOG_DIR"
# A cluster started from this LOG_DIR still running: starting another would overwrite its
# process ids, and stop.sh could no longer stop it.
for name in scheduler workers; do
    if [ -f "$LOG_DIR/$name.pid" ] && kill -0 "$(cat "$LOG_DIR/$name.pid")" 2>/dev/null; then
        echo "start.sh: the cluster started from $LOG_DIR/ is running ($name: process" \
             "$(cat "$LOG_DIR/$name.pid")); stop it with cluster/local/stop.sh, or give" \
             "another LOG_DIR" >&2
        exit 1
    fi
done
# fgscale's worker settings (unsets Dask's MALLOC_TRIM_THRESHOLD_, see the file), unless given.
export DASK_CONFIG=${DASK_CONFIG:-$(cd "$(dirname "$0")/../dask-config" && pwd)}
rm -f "$SCHEDULER_FILE"

# each in a process group of its own (setsid), which stop.sh stops whole: the worker processes
# and multiprocessing's helpers too
setsid dask scheduler --port "$PORT" --dashboard-address ":$DASHBOARD" \
    --scheduler-file "$SCHEDULER_FILE" >"$LOG_DIR/scheduler.log" 2>&1 &
scheduler=$!
echo $scheduler >"$LOG_DIR/scheduler.pid"
# the scheduler writes its file once it listens; one that exits first (a port taken) never will
for _ in $(seq 150); do
    [ -s "$SCHEDULER_FILE" ] && break
    kill -0 $scheduler 2>/dev/null || break
    sleep 0.2
done
if [ ! -s "$SCHEDULER_FILE" ]; then
    kill $scheduler 2>/dev/null || true
    rm -f "$LOG_DIR/scheduler.pid"
    echo "start.sh: the scheduler did not start (port $PORT or $DASHBOARD taken?); no worker" \
         "started. Its log, $LOG_DIR/scheduler.log, ends with:" >&2
    tail -n 3 "$LOG_DIR/scheduler.log" >&2
    exit 1
fi
address=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' \
          "$SCHEDULER_FILE")

# One thread per worker process: ReNA holds the GIL much of the time, processes scale better.
setsid dask worker --scheduler-file "$SCHEDULER_FILE" --nworkers "$N_WORKERS" --nthreads 1 \
    --memory-limit "$MEMORY" >"$LOG_DIR/workers.log" 2>&1 &
echo $! >"$LOG_DIR/workers.pid"

echo "scheduler $address  file: $SCHEDULER_FILE  dashboard: http://$(hostname):$DASHBOARD/status"
echo "$N_WORKERS worker(s) starting; logs in $LOG_DIR/; stop with cluster/local/stop.sh"
