#!/usr/bin/env bash
# Stop the scheduler and workers started by cluster/local/start.sh (by their recorded ids).
set -euo pipefail
LOG_DIR=${LOG_DIR:-dask-logs}
for name in workers scheduler; do
    if [ -f "$LOG_DIR/$name.pid" ]; then
        kill "$(cat "$LOG_DIR/$name.pid")" 2>/dev/null || true
        rm -f "$LOG_DIR/$name.pid"
    fi
done
rm -f "${SCHEDULER_FILE:-fgscale-scheduler.json}"
