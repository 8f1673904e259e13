"""What stops a command on a cluster it joined (``--scheduler``): the scheduler lost, or every
worker paused for memory. Dask runs no task on a paused worker, and a worker whose memory
limit is below what its process itself takes stays paused for good: without this watch a
command would wait for ever, silently."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["PATIENCE", "PausedWatch", "SchedulerLost", "WorkersPaused"]

PATIENCE = 30.0  # seconds every worker stays paused, tasks waiting, before the command stops

log = logging.getLogger(__name__)


class SchedulerLost(ConnectionError):
    """The cluster joined by :func:`fgscale._dask.client.connect` stopped serving a command mid-job:
    its scheduler no longer answers."""


class WorkersPaused(SchedulerLost):
    """Every worker of the joined cluster stayed paused for memory while tasks waited."""


class PausedWatch:
    """Within: a thread asks the scheduler every ``every`` s how its workers are; when all of
    them have been paused for ``patience`` s while this client has tasks, it cancels them, so
    that the command stops where it waits, and keeps why in ``reason``. When the cluster has
    had no worker at all for ``patience`` s while tasks wait (every worker lost, their jobs
    requeued), it says so once in a warning, and the command goes on waiting for them.

    Parameters
    ----------
    client : distributed.Client
    target : str
        The cluster, as the command names it.
    every, patience : float
    """

    def __init__(self, client, target: str, every: float = 5.0, patience: float = PATIENCE):
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(client, target, every, patience),
                                        name="fgscale-paused-watch", daemon=True)

    def __enter__(self) -> PausedWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()  # not joined: it may be waiting on a scheduler that is gone

    def _watch(self, client, target, every, patience) -> None:
        since = none_since = None
        while not self._stop.wait(every):
            try:
                workers = list(client.scheduler_info()["workers"].values())
            except Exception:  # noqa: BLE001 - the scheduler gone or the client closing
                return
            paused = [w for w in workers if w.get("status") == "paused"]
            if not workers and client.futures and none_since is None:
                none_since = time.monotonic()
            elif workers:
                none_since = None
            if none_since is not None and time.monotonic() - none_since >= patience:
                log.warning("the Dask cluster at %s has had no worker for %.0f s: the work "
                            "waits until one joins", target, time.monotonic() - none_since)
                none_since = float("inf")  # said once, until workers come back
            if not workers:  # none yet (a batch queue), or restarted by their nannies for
                continue  # memory, paused before they were: the clock goes on if it started
            if len(paused) < len(workers) or not client.futures:
                since = None
                continue
            since = time.monotonic() if since is None else since
            if time.monotonic() - since < patience:
                continue
            used = max(w.get("metrics", {}).get("memory", 0) for w in paused) / 2**20
            limit = min(w.get("memory_limit") or 0 for w in paused) / 2**20
            self.reason = (
                f"every worker of the Dask cluster at {target} has been paused for "
                f"{patience:g} s ({len(paused)} of them, a process taking {used:.0f} MiB of its "
                f"memory limit of {limit:.0f} MiB, above Dask's distributed.worker.memory.pause)"
                ": no task can run; give the workers more memory (dask worker --memory-limit)")
            from distributed import Future

            client.cancel([Future(key, client) for key in list(client.futures)],
                          reason="workers-paused", msg=self.reason)
            return
