#!/usr/bin/env bash
# Stop the scheduler and workers started by cluster/local/start.sh (by their recorded ids),
# and wait until they have ended.
set -euo pipefail
LOG_DIR=${LOG_DIR:-dask-logs}
pids=()
for name in workers scheduler; do
    if [ -f "$LOG_DIR/$name.pid" ]; then
        pid=$(cat "$LOG_DIR/$name.pid")
        # the process group start.sh gave it: the nanny, its worker processes, their helpers
        kill -TERM -- "-$pid" 2>/dev/null && pids+=("$pid")
        rm -f "$LOG_DIR/$name.pid"
    fi
done
# Return once they have ended, a start.sh that follows finding the ports free. A worker told
# to stop while it was starting can wait for its scheduler forever: killed after 20 s.
for i in $(seq 101); do
    alive=()
    for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive+=("$pid"); done
    [ ${#alive[@]} = 0 ] && break
    if [ "$i" = 100 ]; then
        echo "stop.sh: process group(s) ${alive[*]} still running after 20 s: killed" >&2
        for pid in "${alive[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    fi
    sleep 0.2
done
rm -f "${SCHEDULER_FILE:-fgscale-scheduler.json}"
