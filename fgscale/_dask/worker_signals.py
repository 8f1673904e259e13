"""Dask worker preload of the embedded cluster's worker processes: Ctrl-C and SIGTERM are for
the command.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group, which holds the worker
processes of the LocalCluster that a command starts; a batch scheduler's SIGTERM (SLURM's time
limit, ``scancel``) goes to every process of the job. Each worker would die of it on its own,
with a traceback, and the scheduler would warn of the results lost with it, over the one line
the stopped command prints. Ignoring both there leaves the command to stop its workers as it
closes its cluster (the nanny asks a worker to stop, then kills it: it never relies on
SIGTERM; SIGKILL, the scheduler's last word, still ends them). Imported in the workers: nothing
but the standard library.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["dask_setup"]


def dask_setup(worker) -> None:
    """Ignore SIGINT and SIGTERM in this worker process (distributed calls it as the worker
    starts)."""
    # signal.signal works in the main thread only: the worker's own in a worker process; an
    # in-process worker (a thread of the command) leaves the command's handler alone
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
