"""One way to get a Dask client: reuse one, join a running cluster, or start a local one.

Every distributed step of fgscale (bank, training, evaluation) takes its client from
:func:`get_client`, so the same code runs on a laptop (an embedded ``LocalCluster``), on one big
machine with ``dask scheduler`` / ``dask worker`` started by hand, or on SLURM / Kubernetes
clusters (see the ``cluster/`` folder of the repository), which only differ in the address or
scheduler file given here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
from dask.system import CPU_COUNT
from distributed import Client, LocalCluster

log = logging.getLogger(__name__)

__all__ = ["dashboard_link", "get_client"]

# Dask sets MALLOC_TRIM_THRESHOLD_=65536 in its workers' environment. Setting it also freezes
# glibc's mmap threshold, so every large temporary array of a task is mmapped and page-faulted
# afresh: ReNA at p = 270k ran 2x slower in a worker than in the parent (0.6 s against 0.3 s).
# Our workers run one array-heavy task at a time, so glibc's defaults suit them; None unsets the
# variable. Workers started by hand get the same through cluster/dask-config/fgscale.yaml.
_WORKER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def dashboard_link(client: Client) -> str | None:
    """The client's dashboard URL, or None when the scheduler serves no dashboard."""
    try:
        return client.dashboard_link
    except (KeyError, AttributeError):  # dashboard disabled: no "dashboard" service
        return None


@contextmanager
def get_client(scheduler: str | None = None, *, scheduler_file: str | Path | None = None,
               n_workers: int | None = None, threads_per_worker: int = 1,
               memory_limit: str | int | float = "auto", processes: bool = True,
               client: Client | None = None) -> Iterator[Client]:
    """Yield a Dask client, and close what this call opened on exit.

    Exactly one source is used, first match wins: ``client`` as it is (never closed here);
    ``scheduler`` or ``scheduler_file`` to join a running cluster (only the client connection is
    closed on exit, the cluster keeps running); otherwise an embedded ``LocalCluster``, shut
    down on exit.

    Parameters
    ----------
    scheduler : str, optional
        Address of a running scheduler, e.g. ``"tcp://10.0.0.5:8786"``.
    scheduler_file : str or Path, optional
        JSON file written by ``dask scheduler --scheduler-file`` (or by a SLURM job).
    n_workers : int, optional
        Workers of the embedded cluster; default the number of usable cores.
    threads_per_worker : int, default=1
        Threads per worker of the embedded cluster.
    memory_limit : str, int or float, default="auto"
        Per-worker memory limit of the embedded cluster ("auto" splits the machine's memory
        between worker processes; thread workers get no limit of their own, see ``processes``).
    processes : bool, default=True
        Worker processes, or worker threads in this process. Processes suit conversion and the
        bank, long batch jobs: each worker has its own memory limit, and one that dies (out of
        memory, killed) is restarted without taking this process down; they run as fast as
        threads there (480 HCP files converted in 2.9 s against 3.0 s, a bank in 1.5 s against
        1.4 s, on 2 cores). Threads suit streamed training on one machine: reading and
        projecting rows runs in torch with the GIL released, and each (m x k) block reaches the
        model without being serialised and sent over a socket (21.6 MB per batch at HCP
        resolution, 36 ms of a 149 ms round trip through a worker process;
        ``scripts/bench_stream.py`` measures both).
    client : distributed.Client, optional
        An existing client, yielded as it is.

    Yields
    ------
    client : distributed.Client

    Raises
    ------
    ValueError
        If more than one of ``client``, ``scheduler`` and ``scheduler_file`` is given, or if
        ``n_workers`` / ``threads_per_worker`` is not a positive integer.
    FileNotFoundError
        If ``scheduler_file`` does not exist.
    """
    given = [name for name, value in (("client", client), ("scheduler", scheduler),
                                      ("scheduler_file", scheduler_file)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of client, scheduler and scheduler_file, got {given}")
    if client is not None:
        _log_dashboard(client, "using the given Dask client")
        yield client
        return
    if scheduler_file is not None:
        scheduler_file = Path(scheduler_file)
        if not scheduler_file.is_file():
            raise FileNotFoundError(f"{scheduler_file}: no such scheduler file (written by "
                                    "'dask scheduler --scheduler-file FILE')")
    if scheduler is not None or scheduler_file is not None:
        target = scheduler if scheduler is not None else scheduler_file
        with Client(scheduler, scheduler_file=None if scheduler_file is None
                    else str(scheduler_file)) as joined:
            _log_dashboard(joined, f"joined the Dask cluster at {target}")
            yield joined
        return
    n_workers = CPU_COUNT if n_workers is None else n_workers
    for name, value in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not processes and memory_limit == "auto":
        memory_limit = 0  # thread workers share this process: its memory is the bound
    with dask.config.set(_WORKER_CONFIG):  # read when the nannies are created
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                               processes=processes, memory_limit=memory_limit)
    with cluster, Client(cluster) as local:
        kind = "worker process(es)" if processes else "in-process worker(s)"
        _log_dashboard(local, f"started a local Dask cluster of {n_workers} {kind} "
                              f"x {threads_per_worker} thread(s)")
        yield local


def _log_dashboard(client: Client, what: str) -> None:
    log.info("%s; dashboard: %s", what, dashboard_link(client) or "none")
