"""Dask worker preload of the embedded cluster's worker processes: Ctrl-C is for the command.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group, which holds the worker
processes of the LocalCluster that a command starts. Each would die of it on its own, with a
traceback, and the scheduler would warn of the results lost with it, over the one line the
interrupted command prints. Ignoring SIGINT there leaves the command to stop its workers as it
closes its cluster. Imported in the workers: nothing but the standard library.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["dask_setup"]


def dask_setup(worker) -> None:
    """Ignore SIGINT in this worker process (distributed calls it as the worker starts)."""
    # signal.signal works in the main thread only: the worker's own in a worker process; an
    # in-process worker (a thread of the command) leaves the command's handler alone
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
