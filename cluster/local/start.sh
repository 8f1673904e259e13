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
# fgscale's worker settings (unsets Dask's MALLOC_TRIM_THRESHOLD_, see the file), unless given.
export DASK_CONFIG=${DASK_CONFIG:-$(cd "$(dirname "$0")/../dask-config" && pwd)}
rm -f "$SCHEDULER_FILE"

dask scheduler --port "$PORT" --dashboard-address ":$DASHBOARD" \
    --scheduler-file "$SCHEDULER_FILE" >"$LOG_DIR/scheduler.log" 2>&1 &
echo $! >"$LOG_DIR/scheduler.pid"
for _ in $(seq 50); do [ -s "$SCHEDULER_FILE" ] && break; sleep 0.2; done

# One thread per worker process: ReNA holds the GIL much of the time, processes scale better.
dask worker --scheduler-file "$SCHEDULER_FILE" --nworkers "$N_WORKERS" --nthreads 1 \
    --memory-limit "$MEMORY" >"$LOG_DIR/workers.log" 2>&1 &
echo $! >"$LOG_DIR/workers.pid"

echo "scheduler tcp://$(hostname):$PORT  file: $SCHEDULER_FILE  dashboard: http://$(hostname):$DASHBOARD/status"
echo "$N_WORKERS worker(s) starting; logs in $LOG_DIR/; stop with cluster/local/stop.sh"
