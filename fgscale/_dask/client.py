"""One way to get a Dask client: the one given, the active one, or an embedded LocalCluster.

Every distributed step of fgscale (conversion, bank, statistics, training, evaluation) takes
``client=None`` and gets its client from :func:`get_client`, so the same code runs on a laptop
(an embedded ``LocalCluster``), in a notebook under ``with Client(...):``, or on one big machine
or a SLURM / Kubernetes cluster (see the ``cluster/`` folder of the repository), which the CLI
joins with :func:`connect` from ``--scheduler`` or ``--scheduler-file``.

The first time a client comes through :func:`get_client` or :func:`connect` (made here, given,
active or joined), its dashboard link is printed once, on stderr: where to watch a long fit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fgscale._dask.cores import auto_processes, cpu_count  # noqa: F401
from fgscale._dask.dashboard import dashboard_link, log_dashboard
from fgscale._dask.joined import PausedWatch, SchedulerLost, WorkersPaused
from fgscale._utils.checks import check_count, check_processes
from fgscale._utils.progress import tqdm

if TYPE_CHECKING:
    from distributed import Client

# distributed and dask are imported where a cluster is made or joined, not with this module:
# they take about 0.35 s to import, more than converting a small cohort in threads
# (ThreadTasks, scripts/bench_convert.py --end-to-end)

log = logging.getLogger(__name__)

__all__ = ["SchedulerLost", "ThreadTasks", "active_client", "check_count", "connect", "cpu_count",
           "dashboard_link", "deferred_cluster", "get_client", "run_tasks", "task_result",
           "this_process", "worker_info", "worker_processes"]

# Dask sets MALLOC_TRIM_THRESHOLD_=65536 in its workers' environment. Setting it also freezes
# glibc's mmap threshold, so every large temporary array of a task is mmapped and page-faulted
# afresh, and an array-heavy task such as ReNA runs much slower in a worker than in the parent.
# Our workers run one array-heavy task at a time, so glibc's defaults suit them; None unsets the
# variable. Workers started by hand get the same through cluster/dask-config/fgscale.yaml.
_WORKER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}

def active_client() -> Client | None:
    """The ``distributed`` default client of this process (``with Client(...):``), if any."""
    if "distributed" not in sys.modules:  # nothing imported it: there is no client
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:  # no client was made current
        return None


@contextmanager
def get_client(client: Client | None = None, *, n_workers: int | None = None,
               threads_per_worker: int = 1, memory_limit: str | int | float = "auto",
               processes: bool | str = True) -> Iterator[Client]:
    """Yield a Dask client, and close what this call opened on exit.

    The one way fgscale gets a cluster, first match wins: ``client`` as it is; else the active
    ``distributed`` default client (``with Client(...):`` around the call, as in a notebook);
    else, within :func:`deferred_cluster`, its cluster (started now if it was not yet, with its
    settings); else an embedded ``LocalCluster``, shut down on exit. A client given or found is
    never closed here. Joining a running scheduler by address is the CLI's job (:func:`connect`).
    The first time a client comes through here, its dashboard link is printed on stderr.

    Parameters
    ----------
    client : distributed.Client, optional
    n_workers : int, optional
        Workers of the embedded cluster; default the number of usable cores.
    threads_per_worker : int, default=1
        Threads per worker of the embedded cluster.
    memory_limit : str, int or float, default="auto"
        Per-worker memory limit of the embedded cluster ("auto" splits the machine's memory
        between worker processes; thread workers get no limit of their own, see ``processes``).
    processes : bool or "auto", default=True
        Worker processes, or worker threads in this process. Processes suit conversion and the
        bank, long batch jobs: each worker has its own memory limit, and one that dies (out of
        memory, killed) is restarted without taking this process down; they run as fast as
        threads there. For streamed training, ``"auto"`` (what fgscale's training asks for;
        its evaluation asks for threads) gives threads up to 4 workers: each (m x k) block
        reaches the model without being serialised and sent over a socket. Beyond, it gives
        worker processes, which stream faster there, unless they would run this program's main
        script again (:func:`fgscale._dask.cores.auto_processes`; the README's performance section
        gives the figures).

    Yields
    ------
    client : distributed.Client

    Raises
    ------
    ValueError
        If ``n_workers`` / ``threads_per_worker`` is not a positive integer, or ``processes``
        not True, False or "auto".
    """
    check_processes(processes)
    if client is not None:
        log_dashboard(client, "using the given Dask client")
        with told_of_lost_workers(client):
            yield client
        return
    active = active_client()
    if active is not None:
        log_dashboard(active, "using the active Dask client")
        with told_of_lost_workers(active):
            yield active
        return
    if _DEFERRED:
        deferred = _DEFERRED[-1]
        if deferred["client"] is None:
            deferred["client"] = deferred["stack"].enter_context(
                _embedded(deferred["n_workers"], threads_per_worker, memory_limit,
                          deferred["processes"]))
        with told_of_lost_workers(deferred["client"]):
            yield deferred["client"]
        return
    with _embedded(n_workers, threads_per_worker, memory_limit, processes) as local, \
            told_of_lost_workers(local):
        yield local


def worker_info(client: Client) -> dict[str, dict]:
    """Every worker of ``client``'s cluster, by address, as the scheduler describes it
    (``memory_limit``, ``nthreads``, ...)."""
    try:
        info = client.scheduler_info(n_workers=-1)  # every worker, not the first few
    except TypeError:  # a distributed that lists them all without being asked
        info = client.scheduler_info()
    return info["workers"]


def worker_processes(client: Client) -> dict[tuple[str, int], list[str]]:
    """The addresses of ``client``'s workers by the process they run in, (host name, process
    id), each process's in sorted order: thread workers of one process share it."""
    out: dict[tuple[str, int], list[str]] = {}
    for address, process in sorted(client.run(this_process).items()):
        out.setdefault(tuple(process), []).append(address)
    return out


def this_process() -> tuple[str, int]:
    """This process as :func:`worker_processes` names the workers': (host name, process id)."""
    return socket.gethostname(), os.getpid()


def _worker_addresses(client: Client) -> set[str]:
    return set(worker_info(client))


@contextmanager
def told_of_lost_workers(client: Client) -> Iterator[None]:
    """Within: work on ``client``'s cluster; once it has ended well, warn if workers that were
    there when it started are gone (killed, out of memory, their node lost).

    Dask reruns a lost worker's tasks elsewhere and fgscale's tasks write the same bytes when
    run twice, so the result is the same; but the user should know that work was redone, and
    that a worker is dying. A worker that left after a failure is not said: the error is.
    """
    before = _worker_addresses(client)
    yield
    gone = before - _worker_addresses(client)
    if gone:
        warnings.warn(f"{len(gone)} of the {len(before)} Dask worker(s) left during this step "
                      "(killed, out of memory, or their node lost; a nanny restarts a local "
                      "one): Dask ran their tasks again on the others, so the result is the "
                      "same, but work was redone; the workers' logs (or the dashboard) say why",
                      UserWarning, stacklevel=1)


# The clusters of deferred_cluster, innermost last: a command's settings for the embedded
# cluster, and the cluster once a step has needed it.
_DEFERRED: list[dict] = []


@contextmanager
def deferred_cluster(*, n_workers: int | None = None,
                     processes: bool | str = True) -> Iterator[None]:
    """Within: the first :func:`get_client` that would start an embedded ``LocalCluster``
    starts this one, later calls reuse it, and it is shut down on exit.

    What the command line wraps its work in: a command whose work is already done (a finished
    run resumed, a complete bank), or whose input is refused, starts no cluster at all, and
    one whose steps each need a cluster (a bank per k) starts one, not one per step. Within
    another one, this call changes nothing: the outermost caller (the command line, with its
    ``--n-workers``) sets the cluster.

    Parameters
    ----------
    n_workers : int, optional
        Workers of the embedded cluster; default the number of usable cores.
    processes : bool or "auto", default=True
        Worker processes, or worker threads in this process (see :func:`get_client`); this
        setting wins over that of the :func:`get_client` call that starts the cluster.
    """
    if n_workers is not None:
        check_count("n_workers", n_workers)
    check_processes(processes)
    if _DEFERRED:
        yield
        return
    with ExitStack() as stack:
        _DEFERRED.append({"n_workers": n_workers, "processes": processes, "client": None,
                          "stack": stack})
        try:
            yield
        finally:
            _DEFERRED.pop()


@contextmanager
def _embedded(n_workers, threads_per_worker, memory_limit, processes) -> Iterator[Client]:
    """A new LocalCluster on this machine and its client, both shut down on exit."""
    import dask
    from distributed import Client, LocalCluster

    n_workers = cpu_count() if n_workers is None else n_workers
    check_count("n_workers", n_workers)
    check_count("threads_per_worker", threads_per_worker)
    if processes == "auto":
        processes = auto_processes(n_workers)
    if not processes and memory_limit == "auto":
        memory_limit = 0  # thread workers share this process: its memory is the bound
    # worker processes leave Ctrl-C to this process, which stops them (fgscale._dask.worker_signals)
    preload = {"distributed.worker.preload": [*dask.config.get("distributed.worker.preload", []),
                                              "fgscale._dask.worker_signals"]} if processes else {}
    with dask.config.set({**_WORKER_CONFIG, **preload}), warnings.catch_warnings():
        # 8787 taken (a notebook's cluster, another command): distributed picks another port
        # and warns in four lines; the dashboard link printed below says where it is
        warnings.filterwarnings("ignore", message="Port 8787 is already in use")
        # The nannies read the config when they are created. This machine only: the
        # scheduler (worker processes talk to it over TCP), the dashboard and each worker's
        # HTTP server (thread workers' would take every interface) listen on the loopback
        # interface, not on every network the node is on.
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                               processes=processes, memory_limit=memory_limit,
                               host="127.0.0.1" if processes else None,
                               dashboard_address="127.0.0.1:8787",
                               worker_dashboard_address="127.0.0.1:0")
    with cluster, Client(cluster, set_as_default=False) as local:
        kind = "worker process(es)" if processes else "in-process worker(s)"
        log_dashboard(local, f"started a local Dask cluster of {n_workers} {kind} "
                             f"x {threads_per_worker} thread(s)")
        try:
            yield local
        except BaseException:  # an interrupt: the client leaves first, releasing its tasks, so
            local.close()  # that stopping the workers reports no result lost (log tracebacks)
            deadline = time.monotonic() + 15
            while local.id in cluster.scheduler.clients and time.monotonic() < deadline:
                time.sleep(0.05)
            raise


async def _probe(address: str, timeout: float, security=None) -> None:
    from distributed.comm import connect as comm_connect

    args = {} if security is None else security.get_connection_args("client")
    # comm_connect's timeout covers the connection, not the handshake read after it: a port
    # where a program accepts and stays silent (a dashboard's, taken for the scheduler's)
    # would hold it for ever
    comm = await asyncio.wait_for(comm_connect(address, timeout=timeout, **args), timeout)
    await comm.close()


def _scheduler_file_address(path: Path) -> str:
    """The address a scheduler file holds (``dask scheduler --scheduler-file`` writes it)."""
    import json

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such scheduler file (written by "
                                "'dask scheduler --scheduler-file FILE')")
    try:
        address = json.loads(path.read_text()).get("address")
    except (ValueError, AttributeError, UnicodeDecodeError):
        address = None
    if not isinstance(address, str) or "://" not in address:
        raise ValueError(f"{path}: not a Dask scheduler file (JSON with the scheduler's "
                         "\"address\", as 'dask scheduler --scheduler-file FILE' writes)")
    return address


@contextmanager
def connect(scheduler: str | None = None, scheduler_file: str | Path | None = None, *,
            timeout: float = 10.0, security=None, origin: str | None = None) -> Iterator[Client]:
    """Join a running cluster by address or scheduler file (the CLI's ``--scheduler`` and
    ``--scheduler-file``); only the client connection is closed on exit.

    Parameters
    ----------
    timeout : float, default=10.0
        Seconds to wait for the scheduler.
    security : distributed.Security, optional
        TLS certificates for a ``tls://`` scheduler (the CLI's ``--tls-*`` options).
    origin : str, optional
        Where ``scheduler`` came from, said in errors (``$DASK_SCHEDULER_ADDRESS``).

    Raises
    ------
    ValueError
        If both or neither are given.
    FileNotFoundError
        If ``scheduler_file`` does not exist (ValueError: it holds no scheduler's address).
    ConnectionError
        If no Dask scheduler answers at the address within ``timeout``;
        :class:`SchedulerLost` if it stops answering while the caller works with it, or
        :class:`~fgscale._dask.joined.WorkersPaused` if every worker stays paused for memory.
    """
    if (scheduler is None) == (scheduler_file is None):
        raise ValueError("give one of scheduler and scheduler_file")
    target = scheduler if origin is None else f"{scheduler} (from {origin})"
    if scheduler_file is not None:
        scheduler = _scheduler_file_address(Path(scheduler_file))
        target = f"{scheduler} (from {scheduler_file})"
    elif scheduler.lower().startswith(("http://", "https://")):
        raise ValueError(f"{target} is a web address (the dashboard's?); give the scheduler's "
                         "own, such as tcp://HOST:8786, which 'dask scheduler' prints")
    elif Path(scheduler).is_file() or scheduler.lower().endswith(".json"):
        raise ValueError(f"{target} is a file: give it as --scheduler-file (scheduler_file=), "
                         "not as the scheduler's address")
    if scheduler.startswith("tls://") and security is None:
        raise ValueError(f"{target} is a TLS scheduler: give its CA and this client's "
                         "certificate and key (--tls-ca-file, --tls-cert, --tls-key)")
    from distributed import Client

    try:
        # the comm handshake alone first: a port where something else listens fails it
        # (with a MemoryError: its bytes read as a frame length) without leaving a
        # half-built Client whose clean-up would time out and print
        asyncio.run(_probe(scheduler, timeout, security))
        joined = Client(scheduler, set_as_default=False, timeout=timeout, security=security)
    except (OSError, TimeoutError, ValueError, MemoryError) as exc:
        reason = ("its answer is not Dask's protocol" if isinstance(exc, MemoryError)
                  else (str(exc).splitlines() or [""])[0][:200])
        raise ConnectionError(f"cannot reach a Dask scheduler at {target} within {timeout:g} "
                              f"s ({type(exc).__name__}: {reason}); is it running, and is "
                              "this its address?") from None
    with joined, PausedWatch(joined, target) as watch:
        log_dashboard(joined, f"joined the Dask cluster at {target}")
        if not joined.nthreads():  # else its tasks wait, with no word of why
            log.warning("the Dask cluster at %s has no worker yet: the work waits until one "
                        "joins", target)
        try:
            yield joined
        except Exception as exc:
            if watch.reason is not None:  # the watch cancelled the tasks: say why
                raise WorkersPaused(watch.reason) from None
            # a scheduler gone mid-job surfaces as whatever the client was doing (a task
            # cancelled, a gather's stream closed): ask the scheduler, and say so in one line
            try:
                asyncio.run(_probe(scheduler, min(timeout, 5.0), security))
            except (OSError, TimeoutError, ValueError, MemoryError):
                raise SchedulerLost(f"lost the Dask scheduler at {target} while working "
                                    f"({type(exc).__name__})") from None
            raise


class ThreadTasks:
    """Threads of this process standing in for a cluster, for work too small to repay one.

    Importing ``distributed`` and starting a cluster cost about 0.4 s; converting a cohort of
    a few hundred small files costs about as much. Its tasks (inflating, masking, writing)
    release the GIL, so threads run them in parallel all the same. :func:`run_tasks` takes
    this in place of a client; there is no dashboard.

    Parameters
    ----------
    n_threads : int
    """

    def __init__(self, n_threads: int):
        check_count("n_threads", n_threads)
        self.n_threads = n_threads
        self._pool = concurrent.futures.ThreadPoolExecutor(n_threads,
                                                           thread_name_prefix="fgscale-task")

    def submit(self, func, *args) -> concurrent.futures.Future:
        return self._pool.submit(func, *args)

    def nthreads(self) -> dict:
        """Threads per worker, as ``distributed.Client.nthreads`` gives them: one worker."""
        return {"this-process": self.n_threads}

    def cancel(self, futures) -> None:
        """Cancel the tasks not started yet, as ``distributed.Client.cancel`` does."""
        for future in futures:
            future.cancel()

    def __enter__(self) -> ThreadTasks:
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def task_result(future):
    """``future.result()`` of a cluster's task; an error that names a path as missing, where
    this process sees it, says that a worker does not (another machine, or a worker started
    without the shared file system): its "no such store" alone sent the user to their path."""
    try:
        return future.result()
    except (OSError, ValueError) as exc:
        text = str(exc)
        path = text.split(": ", 1)[0]
        if "no such" not in text or not path or not os.path.exists(path):
            raise
        try:
            said = type(exc)(f"{text}; yet it is there for this process: a worker of the cluster "
                             "does not see it, and every worker must see the store and images "
                             "at the same path (a shared file system)")
        except TypeError:  # an exception that takes other arguments than its message
            raise exc from None
        raise said from None


def run_tasks(client: Client | ThreadTasks, func, args_list, *, progress: bool = True,
              desc: str | None = None, unit: str = "task", total: int | None = None,
              initial: int = 0, weight=lambda result: 1) -> list:
    """Run ``func(*args)`` for each ``args`` on the cluster (or the :class:`ThreadTasks`), with
    a progress bar; return the results in the order they finished.

    The first task error is raised only after every other task has finished, so that their
    work is kept (each task writes its own part of a store, which a re-run then reuses).

    Parameters
    ----------
    weight : callable, default=one per task
        How far a result moves the progress bar (rows converted, say).
    """
    if isinstance(client, ThreadTasks):
        futures = [client.submit(func, *args) for args in args_list]
        finished = concurrent.futures.as_completed(futures)
        failed = concurrent.futures.Future.exception
    else:
        from distributed import as_completed

        args_list = list(args_list)  # one graph for all: a submit each lags the scheduler
        futures = client.map(func, *zip(*args_list, strict=True), pure=False) if args_list else []
        # the client's own loop: as_completed would otherwise look for a default client
        finished = as_completed(futures, loop=client.loop)
        failed = lambda future: future.status == "error"  # noqa: E731
    results, errors = [], []
    try:
        with tqdm(total=len(futures) if total is None else total, initial=initial, desc=desc,
                  unit=unit, disable=not progress) as bar:
            for future in finished:
                if failed(future):
                    errors.append(future)
                    continue
                results.append(future.result())
                bar.update(weight(results[-1]))
        if errors:
            task_result(errors[0])  # re-raises the worker's exception, which names its input
    finally:  # a no-op when all are done; stops the rest on an interrupt
        if isinstance(client, ThreadTasks):
            client.cancel(futures)
        else:  # one by one: distributed's cancel of n keys takes the scheduler n² steps, and
            for future in futures:  # the cluster would be closed under it (tracebacks)
                future.release()
    return results
