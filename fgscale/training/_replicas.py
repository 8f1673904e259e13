"""Data-parallel training: R replicas of the model in worker processes of the Dask cluster.

One central process feeds one model, and on CPUs it keeps about one worker busy
(``scripts/results/bench_stream_feed_2cores.md``). Here each of R worker processes holds a copy
of the model and takes its own contiguous share of every minibatch of the
:class:`~fgscale.training.EpochPlan`, read and reduced where it runs, with the step's grouping;
``torch.distributed`` (gloo) sums the gradients across the replicas in the reduced space (the
first layer's ``W0_hat``, h x k, never the h x p gradient of ``W0``). Each replica's loss is its
rows' summed loss divided by the whole minibatch's rows, so the sum is the gradient of the
minibatch's mean loss, and the step size of ``learning_rate="auto"`` is the Lipschitz constant
of the whole minibatch, computed across the replicas (:func:`_lipschitz`). R replicas with
minibatches of m rows then take the steps of one process with minibatches of R·m rows, to float
rounding (``tests/training/test_replicas.py``).

Screening (each grouping's kept clusters), class weights (the loss's, and the rows' weights in
the step size) and regression (half the squared error, and the average of the epoch's iterates
that :func:`~fgscale.training.train_epoch` ends a regression epoch with, taken on every
replica from the same parameters) are those of one process. Feature grouping is required (full
rows, L2, would sum an h x p gradient per step), and dropout draws its own masks on each
replica, seeded by the run's seed, the replica and the epoch (the same distribution as one
process's, not the same masks).

The replicas live for one phase of training (:class:`ReplicaGroup`): their tasks start at the
phase's first epoch, join one process group and receive the model once, then wait between the
epochs, holding the weights, for the central process to name the next epoch. After each epoch
rank 0's weights come back to the central process, straight from its worker, for validation,
early stopping and checkpoints, which stay the caller's: the estimators run the epochs from
their training loop (:func:`~fgscale.training.fit`'s ``run_epoch``). The plain SGD of
:func:`~fgscale.training.make_optimizer` keeps no state between steps (no momentum), so the
replicas' optimizer carries nothing from one epoch to the next that one process would not.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from fgscale._dask.client import task_result, worker_processes
from fgscale.training._loop import IterateAverage, batch_loss, make_optimizer, torch_threads
from fgscale.training._models import GroupedLinear
from fgscale.training._plan import epoch_plan
from fgscale.training._sgd import _GRAM_ROWS, LipschitzStep, lipschitz
from fgscale.training._stream import StoreSource, _bank, load_batch

__all__ = ["ReplicaGroup", "ReplicaLost", "ReplicaTask", "fit_replicas", "replica_workers"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaTask:
    """What every replica needs to train: the store as a :class:`StoreSource` names it, the
    plan's parameters and the optimizer's. Small and picklable: rows and seeds, no arrays of
    data.

    Attributes
    ----------
    path, key, bank_at, stats, stats_at, target, n_clusters
        As :class:`~fgscale.training.StoreSource` holds them.
    rows : ndarray of int64
        The training rows.
    batch_size : int
        Rows of each replica's share of a step; the plan's minibatches have
        ``batch_size * world`` rows.
    seed, n_groupings : int
        The plan's (:func:`~fgscale.training.epoch_plan`).
    learning_rate, weight_decay : float
    step_size : LipschitzStep or None
        The step of ``learning_rate="auto"``; None for the fixed ``learning_rate``.
    regression : bool, default=False
        Half the squared error on float targets, and each epoch ends at the average of its
        iterates, instead of the cross-entropy of class indices.
    class_weight : ndarray of float32 of shape (n_classes,) or None, default=None
        Each class's weight in the loss and in the step size's rows.
    keep : ndarray of bool of shape (n_groupings, [h,] n_clusters) or None, default=None
        Screening: the clusters each grouping keeps, its row given to the model's forward.
    """

    path: str
    key: str
    bank_at: str
    stats: str | None
    stats_at: str
    target: tuple[float, float] | None
    n_clusters: int
    rows: np.ndarray
    batch_size: int
    seed: int
    n_groupings: int
    learning_rate: float
    weight_decay: float
    step_size: LipschitzStep | None
    regression: bool = False
    class_weight: np.ndarray | None = None
    keep: np.ndarray | None = None


def fit_replicas(client, source: StoreSource, model: nn.Module, rows, *, replicas: int,
                 batch_size: int, max_epochs: int, seed: int, n_groupings: int,
                 learning_rate: float = 0.01, weight_decay: float = 0.0,
                 step_size: LipschitzStep | None = None, start_epoch: int = 0,
                 regression: bool = False, class_weight=None, keep=None,
                 timeout: float = 300.0) -> list[dict]:
    """Train ``model`` with ``replicas`` data-parallel copies in worker processes of ``client``.

    Equal, to float rounding, to :func:`~fgscale.training.fit` (no validation, no stopper) on
    the batches of ``source`` planned with ``batch_size * replicas`` rows per minibatch, with
    the same ``regression``, ``class_weight`` and ``keep``. The epochs run in one
    :class:`ReplicaGroup`, the weights brought back once, after the last.

    Parameters
    ----------
    client : distributed.Client
        Its cluster needs ``replicas`` worker processes (not threads of one process: each
        replica joins the process group once).
    source : StoreSource
        The store, its bank (required) and its standardization.
    model : nn.Module
        On the CPU, with a :class:`~fgscale.training.GroupedLinear` first layer (``model.first``);
        trained in place: its weights are the replicas' after the last epoch.
    rows : array-like of int of shape (n_rows,)
        The training rows.
    replicas : int
    batch_size : int
        Each replica's rows per step.
    max_epochs, seed, n_groupings : int
        The epochs to run and the plan's seed and bank size.
    learning_rate : float, default=0.01
    weight_decay : float, default=0.0
    step_size : LipschitzStep, optional
        ``learning_rate="auto"``: each step's size from its whole minibatch.
    start_epoch : int, default=0
    regression : bool, default=False
        Squared error on the source's float targets, each epoch ending at the average of its
        iterates (see :func:`~fgscale.training.train_epoch`).
    class_weight : array-like of shape (n_classes,), optional
        Each class's weight in the loss (:func:`~fgscale.training._loop.batch_loss`) and in
        the step size of ``step_size``.
    keep : array-like or Tensor of bool of shape (n_groupings, [h,] n_clusters), optional
        Screening: the clusters each grouping keeps (see :func:`~fgscale.training.train_epoch`).
    timeout : float, default=300.0
        Seconds a replica waits for the others to join the process group (one that never
        joins: a TimeoutError naming it), and at a collective, before it fails. When one
        replica fails, or its worker leaves the cluster (its process killed or lost), the run
        fails at once (a :class:`ReplicaLost` that names it).

    Returns
    -------
    history : list of dict
        Per epoch: epoch, train_loss (the mean over the epoch's rows) and seconds.
    """
    with ReplicaGroup(client, source, model, rows, replicas=replicas, batch_size=batch_size,
                      seed=seed, n_groupings=n_groupings, learning_rate=learning_rate,
                      weight_decay=weight_decay, step_size=step_size, regression=regression,
                      class_weight=class_weight, keep=keep, timeout=timeout) as group:
        return [group.run_epoch(epoch, weights=epoch == max_epochs - 1)
                for epoch in range(start_epoch, max_epochs)]


class ReplicaGroup:
    """``replicas`` data-parallel copies of ``model`` in worker processes of ``client``, kept
    for the epochs of one phase of training.

    The replicas start at the first :meth:`run_epoch`: ``replicas`` long-running tasks, one per
    worker process, join one gloo process group and receive the model once. Between epochs
    they wait, holding the weights, and leave the worker's threads to other tasks (validation
    reads rows there). Each :meth:`run_epoch` hands every replica the epoch's number through a
    small task on its worker, the one on rank 0's worker returning, once the epoch is done,
    its history and weights, fetched straight from that worker where the workers share this
    machine (never through the scheduler). :meth:`close`, or the end of a ``with`` block,
    stops them and tears the group down: on an exception (Ctrl-C included) their tasks are
    cancelled, and each replica leaves at its next step or within half a second when it is
    waiting, all of them at the same step (the step's one collective carries the signal).

    Parameters
    ----------
    client, source, model, rows, replicas, batch_size, seed, n_groupings
        As :func:`fit_replicas` takes them; ``model`` is sent out at the first epoch and holds
        rank 0's weights after each one.
    learning_rate : float, default=0.01
    weight_decay : float, default=0.0
    step_size : LipschitzStep, optional
    regression : bool, default=False
    class_weight : array-like of shape (n_classes,), optional
    keep : array-like or Tensor of bool of shape (n_groupings, [h,] n_clusters), optional
    timeout : float, default=300.0
        As :func:`fit_replicas` takes them.
    """

    def __init__(self, client, source: StoreSource, model: nn.Module, rows, *, replicas: int,
                 batch_size: int, seed: int, n_groupings: int, learning_rate: float = 0.01,
                 weight_decay: float = 0.0, step_size: LipschitzStep | None = None,
                 regression: bool = False, class_weight=None, keep=None,
                 timeout: float = 300.0):
        if not source.n_clusters or not source.bank_at:
            raise ValueError("replicas need feature grouping: the source has no bank (with full "
                             "rows each step would sum an h x p gradient across the replicas)")
        if not isinstance(getattr(model, "first", None), GroupedLinear):
            raise ValueError(f"replicas need a model whose first layer is a GroupedLinear, got "
                             f"{type(model).__name__}")
        if class_weight is not None and regression:
            raise ValueError("class_weight weighs classes: it must be None with regression=True")
        self.client, self.source, self.model = client, source, model
        self.workers = replica_workers(client, replicas)
        self.timeout = float(timeout)
        self.task = ReplicaTask(
            source.path, source.key, source.bank_at, source.stats, source.stats_at,
            source.target, source.n_clusters, np.asarray(rows, dtype=np.int64),
            int(batch_size), int(seed), int(n_groupings), float(learning_rate),
            float(weight_decay), step_size, bool(regression),
            None if class_weight is None else _as_numpy(class_weight, np.float32),
            None if keep is None else _as_numpy(keep, bool))
        self._futures = None  # the replicas' tasks, once started
        self._shipped = None  # the model scattered to the workers, until every replica has it

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(abort=kind is not None)

    def run_epoch(self, epoch: int, *, weights: bool = True) -> dict:
        """Train the replicas for ``epoch`` (starting them first, at the phase's first call).

        Parameters
        ----------
        epoch : int
            The epoch of the plan; its dropout masks are drawn from the seed, the replica and
            the epoch, so that epochs give the same weights whichever phase runs them.
        weights : bool, default=True
            Load rank 0's weights into ``model`` after the epoch (for validation, the early
            stopper and checkpoints); False leaves ``model`` as it is.

        Returns
        -------
        history : dict
            The epoch, its train_loss (the mean over the epoch's rows) and seconds (the
            replicas' own).
        """
        client = self.client
        if self._futures is None:
            self._start()
        else:  # a worker that left between two epochs took its replica with it
            _raise_if_a_worker_left(client, self._futures, self.workers)
        commands = [client.submit(_command, self._session, epoch, rank == 0, weights,
                                  workers=[address], allow_other_workers=False, pure=False)
                    for rank, address in enumerate(self.workers)]
        try:
            _raise_first_error(client, self._futures, self.workers, reply=commands[0])
            history, state = self._fetch(commands[0])
        finally:
            for command in commands:  # rank 0's reply: references to its live weights
                command.release()
        if self._shipped is not None:  # every replica joined the epoch: each holds the model
            self._shipped.release()
            self._shipped = None
        if state is not None:
            self.model.load_state_dict(state)
        return history

    def close(self, abort: bool = False) -> None:
        """Stop the replicas: told to leave, and waited for until each has torn its process
        group down; with ``abort`` (an error, Ctrl-C) their tasks are cancelled instead, and
        leave at their next step, without waiting for them here."""
        futures, self._futures = self._futures, None
        if futures is None:
            return
        try:
            if not abort:
                # held until the replicas have ended: the task of a future released at once
                # might never run
                stops = [self.client.submit(_command, self._session, None, False, False,
                                            workers=[address], allow_other_workers=False,
                                            pure=False)
                         for address in self.workers]
                _raise_first_error(self.client, futures, self.workers)
                del stops
        finally:
            for future in futures:
                future.cancel()
            if self._shipped is not None:
                self._shipped.release()
                self._shipped = None

    def _start(self) -> None:
        """Start the replicas: rank 0 first, which opens the group's store on a port of its
        machine and says which; then the others, told that port. The model is scattered once
        to their workers."""
        client = self.client
        # straight to and from the workers where they share this machine: through the
        # scheduler, the model's hundreds of MB would pass through one more process each way
        self._direct = self.source._slots() is not None
        self._session = uuid.uuid4().hex
        self._shipped = client.scatter(self.model, hash=False, broadcast=True,
                                       direct=self._direct)
        host = _address_host(self.workers[0])

        def replica(rank: int, port: int | None):
            # ahead of the tasks queued on its worker: the other replicas wait for this one
            return client.submit(serve_replica, rank, len(self.workers), host, port,
                                 self._shipped, self.task, self.timeout, self._session,
                                 workers=[self.workers[rank]], allow_other_workers=False,
                                 pure=False, priority=_PRIORITY)

        self._futures = [replica(0, None)]
        opened = client.submit(_store_port, self._session, workers=[self.workers[0]],
                               allow_other_workers=False, pure=False, priority=_PRIORITY)
        try:
            _raise_first_error(client, self._futures, self.workers[:1], reply=opened)
            port = task_result(opened)
        finally:
            opened.release()
        self._futures += [replica(rank, port) for rank in range(1, len(self.workers))]

    def _fetch(self, reply):
        """Rank 0's finished reply, gathered in a thread of its own while the replicas'
        workers are watched: were rank 0's worker to leave mid-transfer, Dask would wait for
        ever to compute the reply again on it."""
        box, got = {}, threading.Event()

        def gather():
            try:
                box["reply"] = self.client.gather(reply, direct=self._direct)
            except BaseException as exc:  # raised below, in the caller's thread
                box["error"] = exc
            finally:
                got.set()

        threading.Thread(target=gather, daemon=True, name="fgscale-replica-weights").start()
        while not got.wait(_WATCH):
            _raise_if_a_worker_left(self.client, self._futures, self.workers)
        if "error" in box:
            raise box["error"]
        return box["reply"]


def _as_numpy(values, dtype) -> np.ndarray:
    """``values`` (a Tensor, on any device, or array-like) as a numpy array of ``dtype``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


class ReplicaLost(ConnectionError):
    """A replica left the run: its worker left the cluster (its process killed or lost), or
    a collective failed because another replica left (its error, or its process lost). A
    ConnectionError: the command line reports it in one line, as it does a lost cluster."""


_GRACE = 30.0  # seconds the run waits for the cause once a replica saw another one leave
_WATCH = 0.5  # seconds between two looks at the cluster's workers while the replicas train
_JOIN_POLL = 0.05  # seconds between two looks at the store while the replicas join it
_PRIORITY = 100  # the replicas' tasks before those queued on their workers (Dask's default: 0)


def _raise_first_error(client, futures: list, workers: list[str], reply=None) -> None:
    """Wait for the replicas (replica ``i``: ``futures[i]``, on ``workers[i]``) to end, or
    with ``reply`` (rank 0's command, a future on its worker) for that to finish; raise the
    first error of one that failed on its own (reading its rows, say) rather than the
    :class:`ReplicaLost` of those that saw it leave, which may come first. The reply's error
    is rank 0's, which it carries.

    A replica whose worker left the cluster (its process killed or lost) raises nothing: its
    task, bound to that worker, would wait for it for ever, even once the others are done
    (its process lost after its last collective). The workers are looked at every
    ``_WATCH`` seconds, and such a replica is the error, a :class:`ReplicaLost` that names
    it and its worker, before any error of the others (theirs follow from its loss). A
    replica that left without its worker leaving (a network failure between machines): a
    grace after the first :class:`ReplicaLost`, that is the error.
    """
    ended = threading.Event()  # set (in a thread of Dask's) whenever a task watched ends
    watched = futures if reply is None else [*futures, reply]
    for future in watched:
        future.add_done_callback(lambda _: ended.set())
    seen, lost, deadline = set(), None, None
    while not seen.issuperset(futures):
        ended.wait(_WATCH)  # none ended meanwhile: still, a worker may have left
        ended.clear()  # before looking: a task that ends from now on sets it again
        done = [f for f in watched if f.done() and f not in seen]
        seen.update(done)
        errors = [f for f in done if f.status == "error"]
        if errors or not seen.issuperset(futures):
            _raise_if_a_worker_left(client, futures, workers)
        for future in errors:
            if not isinstance(future.exception(), ReplicaLost):
                task_result(future)
            if lost is None:
                lost, deadline = future, time.monotonic() + _GRACE
        if reply is not None and reply.status == "finished" and lost is None:
            return
        if lost is not None and time.monotonic() > deadline:
            break
    if lost is not None:
        task_result(lost)
    if reply is not None:  # every replica ended, none with an error, before the epoch did
        raise ReplicaLost(f"the {len(futures)} replicas ended before their epoch did (their "
                          "tasks were cancelled)")


def _raise_if_a_worker_left(client, futures: list, workers: list[str]) -> None:
    """A :class:`ReplicaLost` naming the first replica not done whose worker is no longer in
    the cluster (its task then waits for a worker that will not come back: Dask reruns the
    task of a lost worker, but this one is bound to it)."""
    present = set(client.nthreads())
    for rank, (future, address) in enumerate(zip(futures, workers, strict=True)):
        if not future.done() and address not in present:
            raise ReplicaLost(f"replica {rank} of {len(futures)} was lost: its worker "
                              f"{address} left the Dask cluster (its process ended, or its "
                              "machine was lost)")


def replica_workers(client, replicas: int) -> list[str]:
    """``replicas`` addresses of workers in distinct processes of ``client``'s cluster, in a
    fixed order; a ValueError when it has fewer worker processes. What an estimator calls
    before any work, to refuse a cluster too small for its replicas."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    # a process of each (host, pid): process ids alone repeat across machines
    firsts = sorted(addresses[0] for addresses in worker_processes(client).values())
    if len(firsts) < replicas:
        raise ValueError(f"replicas={replicas} needs as many worker processes; the cluster has "
                         f"{len(firsts)} (a LocalCluster of processes=True and n_workers >= "
                         f"{replicas}; on the command line, --n-workers {replicas} or more, not "
                         "--worker-threads)")
    return firsts[:replicas]


def _address_host(address: str) -> str:
    from distributed.comm import get_address_host

    return get_address_host(address)


# The replicas of this worker process, by phase: what the small command tasks hand the epochs
# to, and rank 0's replies come back from.
_MAILBOXES: dict[str, _Mailbox] = {}
_MAILBOXES_LOCK = threading.Lock()
# The phases whose process group this process holds now. Each phase has a group object of its
# own, not torch's default group: a process whose default group failed to form keeps torch's
# count of groups one ahead of the other processes', and every later group it joins waits for
# keys under another name than theirs.
_LIVE: set[str] = set()


def in_process_group() -> bool:
    """Whether this process holds a replica's process group now (from the moment its group
    formed until it was torn down)."""
    return bool(_LIVE)


class _Group:
    """One phase's gloo process group, as this replica sees it; a failed collective is a
    :class:`ReplicaLost`."""

    def __init__(self, store: dist.Store, rank: int, world: int, timeout: float):
        self.rank, self.world = rank, world
        self._group = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """``tensor``, in place, the sum of every replica's."""
        self._wait(lambda: self._group.allreduce([tensor]))

    def all_gather(self, parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """``parts[r]``: replica ``r``'s ``tensor``."""
        self._wait(lambda: self._group.allgather([parts], [tensor]))

    def close(self) -> None:
        """Tear the group down: its connections close with the last reference to it, which
        this drops (an error's traceback keeps this object), so that the other replicas'
        collectives fail at once rather than after their timeout."""
        group, self._group = self._group, None
        if group is not None:
            group.shutdown()

    def _wait(self, start) -> None:
        try:
            start().wait()
        except RuntimeError as exc:
            # gloo's first sentence says what failed, after the source line that raised it;
            # the rest is advice on debugging gloo and, where torch adds it, its C++ stack
            first = (str(exc).splitlines() or [""])[0]
            reason = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0].rstrip(".")[:200]
            raise ReplicaLost(f"replica {self.rank} of {self.world}: another replica left the "
                              f"run ({reason})") from None


class _Mailbox:
    """A replica's queues in its worker process: the epochs to run (None: stop) and, on rank
    0, each epoch's reply (its history, or the error that ended the replica)."""

    def __init__(self):
        self.epochs: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self.ports: queue.Queue = queue.Queue()  # rank 0's: its store's port
        self.model: nn.Module | None = None


def _mailbox(session: str) -> _Mailbox:
    """The mailbox of ``session`` in this process, made by whichever of its replica and its
    first command comes first."""
    with _MAILBOXES_LOCK:
        return _MAILBOXES.setdefault(session, _Mailbox())


class _Stopped(Exception):  # a signal between the replicas, never raised to a user
    """Some replica's task was cancelled: every replica leaves at the same step."""


def _cancelled_check():
    """A function that tells whether the task running this thread was cancelled (its
    client gone, Ctrl-C, another replica's error): the worker keeps a cancelled task's state
    until its thread returns, since Dask cannot interrupt it."""
    from distributed import get_worker
    from distributed.worker import thread_state

    worker, key = get_worker(), thread_state.key

    def cancelled() -> bool:
        task = worker.state.tasks.get(key)
        return task is None or task.state == "cancelled"

    return cancelled


def serve_replica(rank: int, world: int, host: str, port: int | None, model: nn.Module,
                  task: ReplicaTask, timeout: float, session: str) -> None:
    """Worker task: replica ``rank`` of ``world`` for one phase. It joins the process group
    (rank 0 opening its store on a free port of ``host``, the others connecting to ``port``
    there), then trains each epoch that a :func:`_command` hands it, until told to stop or
    cancelled; rank 0 replies after each epoch."""
    from distributed import secede

    cancelled = _cancelled_check()
    # out of the worker's thread pool: between epochs the worker's threads run other tasks
    # (the commands, validation's reads)
    secede()
    box = _mailbox(session)
    box.model = model
    try:
        store = _rendezvous(box, rank, world, host, port, timeout, cancelled)
        group = _Group(store, rank, world, timeout)
        _LIVE.add(session)
        try:
            _serve(box, model, task, group, cancelled)
        finally:
            group.close()
            _LIVE.discard(session)
    except _Stopped:
        pass
    except BaseException as exc:
        box.replies.put(exc)  # rank 0's command waiting for the epoch raises it
        box.ports.put(exc)  # and, before the others started, the command waiting for its port
        raise
    finally:
        with _MAILBOXES_LOCK:
            _MAILBOXES.pop(session, None)


def _rendezvous(box: _Mailbox, rank: int, world: int, host: str, port: int | None,
                timeout: float, cancelled) -> dist.Store:
    """The phase's store, once every replica has joined it: rank 0 opens it on a port free
    now (its own pick, which no other process can take between a look and the bind) and puts
    the port in ``box``; the others connect to it, started only once it listens.

    Every replica waits for the others here, where a cancelled phase is seen (:class:`_Stopped`
    within :data:`_WATCH` s) and a replica that never comes fails the others by name, rather
    than in gloo's own rendezvous, which nothing interrupts for ``timeout`` seconds."""
    wait = timedelta(seconds=timeout)
    if rank == 0:
        store = dist.TCPStore(host, 0, world, is_master=True, timeout=wait,
                              wait_for_workers=False)
        box.ports.put(store.port)
    else:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=wait)
    store.set(f"fgscale/joined/{rank}", "1")
    joined = [f"fgscale/joined/{r}" for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        while not store.check(joined):
            if cancelled():
                raise _Stopped
            if store.check(["fgscale/left"]):
                raise ReplicaLost(f"replica {rank} of {world}: replica "
                                  f"{store.get('fgscale/left').decode()} left before the "
                                  "process group formed")
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if not store.check([joined[r]])]
                raise TimeoutError(f"replica {rank} of {world}: replica(s) {missing} did not "
                                   f"join the process group within {timeout:g} s (their tasks "
                                   "did not start: their workers busy with other tasks, or "
                                   "gone)")
            time.sleep(_JOIN_POLL)
    except BaseException:
        # a replica that starts late (its worker was busy) leaves at once, not in gloo's own
        # rendezvous, which nothing interrupts for ``timeout`` seconds
        store.set("fgscale/left", str(rank))
        raise
    return store


def _store_port(session: str) -> int:
    """Worker task, on rank 0's worker: the port of the store that rank 0 of ``session``
    opened (or the error that ended it first)."""
    from distributed import secede

    cancelled = _cancelled_check()
    secede()  # the wait leaves the worker's threads to other tasks
    port = _get_unless_cancelled(_mailbox(session).ports, cancelled)
    if isinstance(port, BaseException):
        raise port
    return port


def _serve(box: _Mailbox, model: nn.Module, task: ReplicaTask, group: _Group,
           cancelled) -> None:
    """The epochs that ``box`` names, until it names None or the task is cancelled."""
    # plain SGD keeps no state between steps: one optimizer serves every epoch of the phase
    optimizer = make_optimizer(model, task.learning_rate, task.weight_decay)
    while (epoch := _next_epoch(box, cancelled)) is not None:
        # dropout's masks: seeded per replica and epoch, so that a run is repeatable, and
        # an epoch draws the same masks whichever phase trains it (a resumed run's)
        torch.manual_seed(int(np.random.SeedSequence([task.seed, group.rank, epoch])
                              .generate_state(1)[0]))
        history = _replica_epoch(model, optimizer, task, epoch, group, cancelled)
        if group.rank == 0:
            box.replies.put(history)


def _next_epoch(box: _Mailbox, cancelled) -> int | None:
    """The next epoch named in ``box``; None when told to stop or once cancelled."""
    return _get_unless_cancelled(box.epochs, cancelled)


def _get_unless_cancelled(items: queue.Queue, cancelled):
    """The next item of ``items``, looking every :data:`_WATCH` seconds whether the task was
    cancelled meanwhile; None once it was."""
    while True:
        try:
            return items.get(timeout=_WATCH)
        except queue.Empty:
            if cancelled():
                return None


def _command(session: str, epoch: int | None, reply: bool, weights: bool):
    """Worker task: hand ``epoch`` (None: stop) to this process's replica of ``session``; with
    ``reply`` (rank 0), wait for the epoch to end and return its history and, with
    ``weights``, the replica's state dict. The tensors are the replica's own, not copies: the
    central process fetches them before it names the next epoch."""
    cancelled = _cancelled_check()
    box = _mailbox(session)
    box.epochs.put(epoch)
    if not reply:
        return None
    history = _get_unless_cancelled(box.replies, cancelled)  # never None when not cancelled
    if history is None:
        return None
    if isinstance(history, BaseException):
        raise history
    state = None
    if weights:
        state = {name: t.detach() for name, t in box.model.state_dict().items()}
    return history, state


def _replica_epoch(model: nn.Module, optimizer, task: ReplicaTask, epoch: int, group: _Group,
                   cancelled=None) -> dict:
    """One epoch of this replica's steps; the epoch's mean loss over all the replicas' rows.
    :class:`_Stopped` once ``cancelled()`` is true on any replica (checked at every step)."""
    started = time.perf_counter()
    plan = epoch_plan(task.rows, batch_size=task.batch_size * group.world, epoch=epoch,
                      seed=task.seed, n_groupings=task.n_groupings)
    labels = _bank(task.path, task.key, task.bank_at)
    first = model.first
    first.defer = "grouped"  # the reduced (h x k) gradient is what the replicas sum
    decay = next(g for g in optimizer.param_groups if any(p is first.weight for p in g["params"]))
    class_weight = None if task.class_weight is None else torch.from_numpy(task.class_weight)
    keep = None if task.keep is None else torch.from_numpy(task.keep)
    # regression: the epoch ends at the mean of its iterates, as train_epoch's; every replica
    # holds the same iterates, so each averages its own
    average = IterateAverage(model) if task.regression else None
    model.train()
    total, count = 0.0, 0
    try:
        for rows, g in zip(plan.batches, plan.groupings, strict=True):
            share = np.array_split(rows, group.world)[group.rank]
            x, y = load_batch(task.path, share, int(g), task.n_clusters, task.key, task.stats,
                              task.target, task.bank_at, task.stats_at)
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            weights = None if class_weight is None else class_weight[y.long()]
            with torch_threads(x.numel()):
                if task.step_size is not None:
                    lr = task.step_size.of_constant(_lipschitz(x, len(rows), group, weights))
                    for params in optimizer.param_groups:
                        params["lr"] = lr
                total += _replica_step(model, optimizer, group, x, y,
                                       torch.from_numpy(labels[int(g)]).long(), len(rows),
                                       regression=task.regression, class_weight=class_weight,
                                       keep=None if keep is None else keep[int(g)],
                                       stop=cancelled is not None and cancelled())
            first.step_deferred(decay["lr"], decay["weight_decay"])
            count += len(rows)
            if average is not None:
                average.update()
    finally:
        first.defer, first._pending = False, None
    if average is not None:
        average.finish()
    optimizer.zero_grad(set_to_none=True)
    return {"epoch": epoch, "train_loss": total / max(count, 1),
            "seconds": time.perf_counter() - started}


def _replica_step(model: nn.Module, optimizer, group: _Group, x: torch.Tensor, y: torch.Tensor,
                  grouping: torch.Tensor, m: int, *, regression: bool = False,
                  class_weight: torch.Tensor | None = None,
                  keep: torch.Tensor | None = None, stop: bool = False) -> float:
    """This replica's share of one SGD step on a minibatch of ``m`` rows in all, the first
    layer's deferred step left to the caller; returns the minibatch's summed loss (weighted
    by ``class_weight``; over the rows, as :func:`~fgscale.training._loop.batch_loss`'s mean
    divides by the rows). With ``stop`` on any replica, every replica raises
    :class:`_Stopped` instead of stepping."""
    optimizer.zero_grad(set_to_none=True)
    first = model.first
    loss = batch_loss(model(x, grouping, keep), y, regression, reduction="sum",
                      class_weight=class_weight)
    (loss / m).backward()
    if first._pending is None:  # no rows here: this replica adds nothing to W0_hat's gradient
        k = x.shape[1]
        first._pending = (grouping, None, torch.zeros(first.weight.shape[0], k))
    rest = [p for p in model.parameters() if p is not first.weight]
    for p in rest:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    reduced = first._pending[2]
    # one collective per step: every gradient, the loss and whether to stop, in one flat
    # buffer; the stop travels with the step so that every replica leaves at the same one
    flat = torch.cat([reduced.reshape(-1), *(p.grad.reshape(-1) for p in rest),
                      loss.detach().reshape(1), torch.tensor([float(stop)], dtype=loss.dtype)])
    group.all_reduce(flat)
    if flat[-1] > 0:
        raise _Stopped
    reduced.copy_(flat[: reduced.numel()].view_as(reduced))
    offset = reduced.numel()
    for p in rest:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    optimizer.step()  # W0 has no .grad after a deferred forward: SGD leaves it alone
    return float(flat[-2])


def _lipschitz(x: torch.Tensor, m: int, group: _Group, weights: torch.Tensor | None = None,
               n_iter: int = 8) -> float:
    """:func:`~fgscale.training.lipschitz` of the whole minibatch of ``m`` rows whose share
    ``x`` (and its rows' ``weights``, with class weights) this replica holds: the same
    arithmetic, each product over the rows summed across the replicas. Up to 64 rows, the rows
    themselves are gathered (at most 64 x k values, and their weights) and the Gram matrix's
    eigenvalues computed on every replica."""
    if m <= _GRAM_ROWS:
        sizes = [len(s) for s in np.array_split(np.arange(m), group.world)]
        # the weights travel as one more column of the rows
        block = x if weights is None else torch.cat([x, weights.to(x.dtype)[:, None]], dim=1)
        padded = torch.zeros(max(sizes), block.shape[1], dtype=x.dtype)
        padded[: len(x)] = block
        parts = [torch.empty_like(padded) for _ in range(group.world)]
        group.all_gather(parts, padded)
        whole = torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])
        if weights is None:
            return lipschitz(whole)
        return lipschitz(whole[:, :-1].contiguous(), weights=whole[:, -1].contiguous())
    root = None if weights is None else weights.to(x.dtype).sqrt()
    if root is not None:  # the rows, and the intercept's column, scaled by sqrt(w_i)
        x = x * root[:, None]
    u = torch.full((x.shape[0],), 1.0 / np.sqrt(m), dtype=x.dtype)
    lam = 0.0
    for _ in range(n_iter):
        xtu = torch.cat([x.T @ u, (u.sum() if root is None else root @ u).reshape(1)])
        group.all_reduce(xtu)
        v = x @ xtu[:-1] + (xtu[-1] if root is None else root * xtu[-1])
        sums = torch.stack([u @ v, v @ v])
        group.all_reduce(sums)
        lam = float(sums[0])
        norm = sums[1].sqrt()
        if norm == 0:
            break
        u = v / norm
    return 0.5 * lam / m
