"""The cores this process may use, and the check of a worker or thread count: what sizing a
cluster needs without importing dask (a small conversion never imports it)."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["check_count", "cpu_count"]


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


def check_count(name: str, value) -> None:
    """Raise ValueError unless ``value`` is a positive integer (a worker or thread count)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
