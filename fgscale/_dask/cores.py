"""The cores this process may use, the check of a worker or thread count and the kind of worker
that streamed training gets: what sizing a cluster needs without importing dask (a small
conversion never imports it)."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

__all__ = ["THREAD_WORKERS_UP_TO", "auto_processes", "cpu_count",
           "main_reruns_in_workers"]

log = logging.getLogger("fgscale._dask.client")

THREAD_WORKERS_UP_TO = 4
"""``processes="auto"``: an embedded cluster of at most this many workers runs threads, a larger
one worker processes (the README's "Streaming, prefetch and worker kinds" gives the figures)."""


def cpu_count() -> int:
    """The cores this process may use, read now: the machine's, narrowed by its CPU affinity
    (taskset, a SLURM allocation) and by a cgroup CPU quota (a container's limit, rounded up),
    as Dask counts them, without importing dask (a small conversion never does)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def _cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, else v1 CFS), None if unlimited."""
    try:
        quota, period = Path(root, "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in ("cpu,cpuacct", "cpu"):
        try:
            quota = int(Path(root, folder, "cpu.cfs_quota_us").read_text())
            period = int(Path(root, folder, "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def auto_processes(n_workers: int, *, guarded: bool = False) -> bool:
    """Whether ``processes="auto"`` gives worker processes to an embedded cluster of
    ``n_workers`` workers that streams training blocks.

    Up to :data:`THREAD_WORKERS_UP_TO` workers, threads in this process: they start at once
    and hand each block to the model without a copy, which makes them the faster kind on a few
    cores. Beyond, threads stop scaling and worker processes stream up to twice as fast. Worker
    processes are given only where starting them does not run this program again in each of
    them (see :func:`main_reruns_in_workers`), or where the caller says that its main module is
    guarded (``guarded=True``: fgscale's command line).
    """
    if n_workers <= THREAD_WORKERS_UP_TO:
        return False
    if guarded or not main_reruns_in_workers():
        return True
    log.info("%d worker threads, not processes: each worker process would run %s again; for "
             "processes, guard its code with `if __name__ == \"__main__\":` and pass a client of "
             "fgscale._dask.client.get_client(processes=True)", n_workers,
             getattr(sys.modules.get("__main__"), "__file__", "the main module"))
    return False


def main_reruns_in_workers() -> bool:
    """Whether a worker process started now would run this program's main module again.

    Dask starts worker processes with multiprocessing's "spawn", which imports the main module
    afresh in each (as ``__mp_main__``) when it is a script or a module run with ``python -m``:
    a script whose work is not under ``if __name__ == "__main__":`` would start it again in every
    worker. A notebook, a REPL, ``python -c`` and a package's ``__main__`` are not imported again.
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return not (name == "__main__" or name.endswith(".__main__"))
    return getattr(main, "__file__", None) is not None
