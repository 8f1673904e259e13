"""Minibatches streamed from a Zarr store and projected on Dask workers.

The central process walks the same :class:`~fgscale.training.EpochPlan` as the in-memory trainer.
For each minibatch it submits one small task carrying the store path, the row indices and the
grouping index; the worker reads those rows, reduces them with the grouping (the bank is read from
the store, or its cache store, once per worker process and cached) and returns an (m x k) block. A
bounded window of in-flight tasks keeps the workers busy while the central memory holds only the
model and at most ``prefetch`` blocks, however many rows the store has. By default (``"auto"``)
the window holds two tasks per worker thread of the cluster, so that every thread has work while
finished blocks wait their turn, within :data:`PREFETCH_BYTES` of blocks.

What need not be done in the central process is done on the workers: each block's Lipschitz
constant for the step size (``lipschitz=True``), and the validation passes (the workers evaluate a
copy of the model on the rows they read, see :class:`Blocks`). Worker processes on the same machine
write their blocks into the central process's shared memory (:mod:`~fgscale.training._handoff`)
rather than send them through a socket.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
import zarr

from fgscale._dask.client import task_result
from fgscale._utils.checks import check_prefetch
from fgscale.grouping._projection import project_rows
from fgscale.store._banks import BANKS, LABELS, open_bank
from fgscale.store._buffers import POOL
from fgscale.store._reader import Store, open_store
from fgscale.store._stats import read_saved, stats_key, stats_location
from fgscale.training._handoff import Handed, Slot, Slots, write_into
from fgscale.training._loop import Batch, evaluation_sums
from fgscale.training._plan import EpochPlan
from fgscale.training._screening import block_sums
from fgscale.training._sgd import lipschitz

__all__ = ["CENTRE_BOUND_BLOCKS", "PREFETCH_BYTES", "SCREEN_REPLY_BYTES", "Blocks", "Prefetcher",
           "StoreSource", "auto_window", "load_screen_sums"]

log = logging.getLogger(__name__)

PREFETCH_BYTES = 2**30
"""With ``prefetch="auto"``: the bytes of the blocks in flight at most (1 GiB)."""

CENTRE_BOUND_BLOCKS = 8
"""With ``prefetch="auto"``: a model's first layer heavier than this many blocks keeps two
blocks in flight (:func:`auto_window`). Logistic regression on 20 classes weighs one 200-row
block at k = 10%; the MLP of 256 hidden units, thirteen."""

SCREEN_REPLY_BYTES = 16 << 20
"""The screening sums a worker task returns, at most about (16 MiB): a task covers a block of
rows and as many of the bank's groupings as fit (at least one)."""

# Per worker process: the open store and its bank, keyed by (path, key) and the bank's or the
# statistics' location. The key names the store's state (see StoreSource), so a store rewritten
# at the same path is opened afresh. Thread workers (``get_client(processes=False)``) share
# them, hence the lock.
_STORES: dict[tuple[str, str], Store] = {}
_BANKS: dict[tuple[str, str, str], np.ndarray] = {}
_STATS: dict[tuple[str, str, str, str], tuple[np.ndarray, np.ndarray]] = {}
_CACHE_LOCK = threading.Lock()


def _store(path: str, key: str) -> Store:
    with _CACHE_LOCK:
        if (path, key) not in _STORES:
            _STORES.clear()  # one store per worker at a time: a new run replaces the old one
            _STORES[path, key] = open_store(path)
        return _STORES[path, key]


def _bank(path: str, key: str, at: str) -> np.ndarray:
    """The labels of the bank named in ``key`` (its last ``|`` field, see StoreSource), read
    from the group ``at`` (the store's path or its cache store's)."""
    with _CACHE_LOCK:
        if (path, key, at) not in _BANKS:
            _BANKS.clear()
            group = zarr.open_group(at, mode="r")
            _BANKS[path, key, at] = open_bank(group, key.rpartition("|")[2]).labels[:]
        return _BANKS[path, key, at]


def _stats(path: str, key: str, stats: str, at: str) -> tuple[np.ndarray, np.ndarray]:
    """Float32 ``(mean, 1 / std)`` saved under ``stats/<stats>`` of the group ``at``."""
    with _CACHE_LOCK:
        if (path, key, stats, at) not in _STATS:
            _STATS.clear()
            mean, std = read_saved(zarr.open_group(at, mode="r"), stats)
            _STATS[path, key, stats, at] = mean, 1 / std  # float32, as MemorySource gets it
        return _STATS[path, key, stats, at]


def load_batch(path: str, rows: np.ndarray, grouping: int | None, n_clusters: int,
               key: str = "", stats: str | None = None,
               target: tuple[float, float] | None = None, bank_at: str = "",
               stats_at: str = "", slot: Slot | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Worker task: read a minibatch and reduce it with grouping ``grouping`` of the bank.

    With ``stats`` (a key of :func:`fgscale.store.compute_stats`'s results), each row is
    standardized first, ``(x - mean) * (1 / std)`` in float32. With ``target``, a
    ``(mean, scale)`` pair, the rows come with the store's target instead of their class,
    ``(target - mean) / scale`` computed in float64 and returned as float32. ``bank_at`` and
    ``stats_at`` are the paths of the groups holding the bank and the statistics (the store's
    or its cache store's); "" (the default) is the store itself. With ``slot``, the block is
    written into that file of the central process's shared memory where this worker can
    (:mod:`~fgscale.training._handoff`), and ``x`` is then a
    :class:`~fgscale.training._handoff.Handed` that says so.

    Returns
    -------
    x : ndarray of shape (m, n_clusters), or (m, n_features) when ``grouping`` is None
    y : ndarray of shape (m,), int64 (class indices), or float32 with ``target``
    """
    x, y, in_slot = _read_block(path, rows, grouping, n_clusters, key, stats, target, bank_at,
                                stats_at, slot)
    return (Handed(slot, x.shape) if in_slot else x), y


def _read_block(path, rows, grouping, n_clusters, key, stats, target, bank_at, stats_at,
                slot) -> tuple[np.ndarray, np.ndarray, bool]:
    """:func:`load_batch`'s block, its targets, and whether the block is in ``slot``."""
    store = _store(path, key)
    mean, scale = (None, None) if stats is None else _stats(path, key, stats, stats_at or path)
    width = store.n_features if grouping is None else n_clusters
    x = write_into(slot, (len(rows), width), zeros=grouping is not None)
    in_slot = x is not None
    if grouping is None:
        # blocks come from the pool: recycled memory, no page faults (fgscale.store._buffers)
        x = store.read_rows(rows, out=POOL.empty((len(rows), width)) if x is None else x)
        if mean is not None:
            np.subtract(x, mean, out=x)
            np.multiply(x, scale, out=x)
    else:  # reduce each row as it is read: the batch is never held whole
        x = project_rows(store.iter_rows(rows), _bank(path, key, bank_at or path)[grouping],
                         len(rows), n_clusters,
                         out=POOL.zeros((len(rows), width)) if x is None else x,
                         mean=mean, scale=scale)
    if target is None:
        return x, store.y[rows].astype(np.int64), in_slot
    target_mean, target_scale = target  # in float64, as the regressor standardizes in memory
    return x, ((store.target[rows] - target_mean) / target_scale).astype(np.float32), in_slot


def load_step(path: str, rows: np.ndarray, grouping: int | None, n_clusters: int,
              key: str = "", stats: str | None = None,
              target: tuple[float, float] | None = None, bank_at: str = "",
              stats_at: str = "", slot: Slot | None = None
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """Worker task: :func:`load_batch`'s block and targets (same arguments), with the
    block's :func:`~fgscale.training._sgd.lipschitz` constant: its power iterations run here,
    next to the block, rather than in the central process, which takes its step size from it
    (:class:`~fgscale.training._sgd.LipschitzStep`)."""
    x, y, in_slot = _read_block(path, rows, grouping, n_clusters, key, stats, target, bank_at,
                                stats_at, slot)
    constant = lipschitz(torch.from_numpy(x))
    return (Handed(slot, x.shape) if in_slot else x), y, constant


def load_rows(path: str, rows: np.ndarray, key: str = "", stats: str | None = None,
              target: tuple[float, float] | None = None, stats_at: str = "",
              slot: Slot | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Worker task: read full rows (evaluation), with their class indices or their target."""
    return load_batch(path, rows, None, 0, key, stats, target, "", stats_at, slot)


def evaluate_rows(path: str, rows: np.ndarray, key: str, stats: str | None,
                  target: tuple[float, float] | None, stats_at: str, model,
                  regression: bool, class_weight: np.ndarray | None) -> dict:
    """Worker task: :func:`~fgscale.training._loop.evaluation_sums` of ``model`` (on the CPU,
    in eval mode) on full rows read here (arguments as :func:`load_rows`)."""
    x, y = load_rows(path, rows, key, stats, target, stats_at)
    weight = None if class_weight is None else torch.from_numpy(class_weight)
    return evaluation_sums(model, x, y, regression=regression, class_weight=weight)


def load_screen_sums(path: str, rows: np.ndarray, span: tuple[int, int], n_clusters: int,
                     n_outputs: int, key: str = "", stats: str | None = None,
                     target: tuple[float, float] | None = None, bank_at: str = "",
                     stats_at: str = "") -> dict[str, np.ndarray]:
    """Worker task: :func:`~fgscale.training._screening.block_sums` of rows ``rows`` for the
    groupings ``span[0]`` to ``span[1] - 1`` of the bank (arguments as :func:`load_batch`)."""
    x, y = load_rows(path, rows, key, stats, target, stats_at)
    bank = _bank(path, key, bank_at or path)[span[0] : span[1]]
    return block_sums(x, y, bank, n_clusters, n_outputs, regression=target is not None)


class Prefetcher:
    """Run tasks in order with at most ``size`` of them submitted and not yet consumed.

    Parameters
    ----------
    client : distributed.Client or None
        None: each task runs in this process when its result is asked for, one at a time
        (a phase of a search trained on a worker, which reads its own blocks:
        :meth:`StoreSource.in_process`).
    size : int, default=4
        The bound on in-flight tasks; ``max_seen`` records the largest window reached.
    """

    def __init__(self, client, size: int = 4):
        if size < 1:
            raise ValueError(f"prefetch must be >= 1, got {size}")
        self.client = client
        self.size = size
        self.max_seen = 0

    def map(self, func: Callable, args: Iterable[tuple], size: int | None = None) -> Iterator:
        """Yield ``func(*a)`` for each ``a`` in ``args``, in order, computed on the cluster
        (in this process without a client), with at most ``size`` tasks in flight (default
        ``self.size``)."""
        if self.client is None:
            yield from self._here(func, args)
            return
        size = self.size if size is None else size
        args = iter(args)
        window: deque = deque()
        try:
            while True:
                while len(window) < size:
                    a = next(args, None)
                    if a is None:
                        break
                    window.append(self.client.submit(func, *a, pure=False))
                if not window:
                    return
                self.max_seen = max(self.max_seen, len(window))
                future = window.popleft()
                result = task_result(future)
                future.release()
                yield result
        finally:
            for future in window:
                try:
                    future.cancel()
                except (RuntimeError, OSError):  # the client closed first (Ctrl-C, shutdown)
                    break

    def _here(self, func: Callable, args: Iterable[tuple]) -> Iterator:
        """:meth:`map` without a client: lazily, so that one block at a time is in memory."""
        for a in args:
            self.max_seen = max(self.max_seen, 1)
            yield func(*a)


def auto_window(client, block_bytes: int, model_bytes: int = 0) -> int:
    """In-flight tasks for ``prefetch="auto"``: two per worker thread of the cluster (counted
    now: an adaptive cluster may have grown), at most :data:`PREFETCH_BYTES` of blocks of
    ``block_bytes``, and at least 2; just 2 where the model's first layer (``model_bytes``)
    weighs more than :data:`CENTRE_BOUND_BLOCKS` blocks.

    A fixed window smaller than the cluster's worker threads leaves the rest of them idle, and
    with one task per thread a worker idles while its finished block waits to be consumed; two
    per thread keep every worker busy. The byte bound caps what the central process holds.
    A model that large makes the central process the slower side: its step reduces and
    expands the whole first layer, and one such central process keeps about one worker busy
    (the MLP of ``scripts/results/bench_stream_feed_2cores.md``); then a block being consumed
    and one ready keep it fed, and more in flight would only hold memory beside the model.
    ``scripts/bench_stream.py`` measures the streaming (figures on 16 cores in the README's
    performance section).
    """
    if model_bytes > CENTRE_BOUND_BLOCKS * block_bytes:
        return 2
    threads = sum(client.nthreads().values())
    return max(2, min(2 * threads, PREFETCH_BYTES // max(block_bytes, 1)))


def _check_targets(path: str, group: zarr.Group, targets: str, mean: float,
                   scale: float) -> tuple[float, float] | None:
    """The ``(mean, scale)`` the workers standardize the target with, or None for labels;
    checked here, so that a store without what is asked for fails before any task runs."""
    if targets == "labels":
        if group["classes"].shape[0] == 0:
            raise ValueError(f"{path}: the store has no class labels (its cohort had no label "
                             "column); stream its target with targets='target'")
        return None
    if targets != "target":
        raise ValueError(f"targets must be 'labels' or 'target', got {targets!r}")
    if "target" not in group:
        raise ValueError(f"{path}: the store has no target (its cohort had no target column); "
                         "convert a cohort table with a numeric 'target' column")
    mean, scale = float(mean), float(scale)
    if not (np.isfinite(mean) and np.isfinite(scale) and scale > 0):
        raise ValueError(f"target_mean must be finite and target_scale finite and > 0, got "
                         f"{mean} and {scale}")
    return mean, scale


class StoreSource:
    """Batches and evaluation blocks of a store, computed on a Dask cluster.

    Parameters
    ----------
    client : distributed.Client
    path : str, Path or Store
        A complete store; with feature grouping, its bank ``bank_key`` is used.
    n_clusters : int
        k of the bank's groupings (0 without a bank).
    bank_key : str
        Key of the store's bank (:func:`fgscale.store.bank_key`, ``info["key"]`` of
        :func:`fgscale.grouping.load_bank`); "" without feature grouping. With the times the
        store's and the bank's metadata were last written, it keys the workers' caches: they
        reopen a store rewritten in place, and a bank rebuilt or extended.
    bank_at : str, optional
        The path of the group holding the bank: the store's or its cache store's
        (``info["location"]`` of :func:`fgscale.grouping.load_bank`); default the first that
        holds it (:func:`fgscale.store.open_bank`).
    prefetch : int or "auto"
        Blocks in flight at most; "auto" (the default): :func:`auto_window`, for each epoch's
        batches and each evaluation pass, given ``model_bytes``.
    block_size : int, optional
        Rows per evaluation block; default the store's rows per shard (about 64 MiB). The
        central process holds up to ``prefetch + 1`` blocks, so the block size bounds its
        memory, and one shard is already large enough that larger blocks evaluate no
        faster.
    standardize : bool, default=False
        Standardize every row on the workers before it is reduced or returned, with the
        statistics of ``stats_rows`` saved in the store or its cache store by
        :func:`fgscale.store.compute_stats` (compute them first).
    stats_rows : array-like of int, optional
        The rows whose statistics standardize; default the store's training rows.
    targets : {"labels", "target"}, default="labels"
        What batches and blocks carry beside the rows: "labels", the class indices (int64);
        "target", the store's numeric target (float32, for regression), standardized with
        ``target_mean`` and ``target_scale``.
    target_mean : float, default=0.0
    target_scale : float, default=1.0
        With ``targets="target"``, rows carry ``(target - target_mean) / target_scale``
        (the regressor trains on a standardized target).
    lipschitz : bool, default=False
        Each batch comes with its :func:`~fgscale.training._sgd.lipschitz` constant, computed
        on the worker that made it (``Batch.lipschitz``): for the step size of
        ``learning_rate="auto"`` (:class:`~fgscale.training._sgd.LipschitzStep`), which the
        central process would otherwise compute from the block.
    model_bytes : int, default=0
        The bytes of the first layer of the model that the blocks feed, where the model
        steps on the CPU, for ``prefetch="auto"`` (0: not known, or on a GPU, whose steps are
        not the slower side: the window is sized on the cluster alone).
    """

    def __init__(self, client, path, *, n_clusters: int = 0, bank_key: str = "",
                 bank_at: str | None = None, prefetch: int | str = "auto",
                 block_size: int | None = None, standardize: bool = False, stats_rows=None,
                 targets: str = "labels", target_mean: float = 0.0, target_scale: float = 1.0,
                 lipschitz: bool = False, model_bytes: int = 0):
        # a Store given is used as it is, not opened again from its path
        self.path = str(Path(path.path if isinstance(path, Store) else path).resolve())
        self.n_clusters = n_clusters
        if "|" in bank_key:
            raise ValueError(f"bank_key must be a bank's key, got {bank_key!r}")
        self.bank_at = ""  # where the workers read the bank: the store's path or its cache's
        if bank_key:
            self.bank_at = bank_at or open_bank(self.path, bank_key).location
        stamps = [Path(self.path) / "zarr.json"]
        if bank_key:
            stamps.append(Path(self.bank_at) / BANKS / bank_key / LABELS / "zarr.json")
        self.key = "|".join([*(str(os.stat(p).st_mtime_ns) if p.exists() else "" for p in stamps),
                             bank_key])  # the workers read the bank key in the last field
        group = zarr.open_group(self.path, mode="r")
        self.n_features = int(group["X"].shape[1])
        self.block_size = int(group.attrs["block_rows"]) if block_size is None else block_size
        self.stats, self.stats_at = None, ""  # the statistics the workers standardize with
        if standardize:
            store = open_store(path)
            if stats_rows is None:
                stats_rows = store.train_rows()
            self.stats = stats_key(stats_rows)
            # fails here, not on the workers, when not computed
            self.stats_at = stats_location(store, stats_rows)
        self.target = _check_targets(self.path, group, targets, target_mean, target_scale)
        self.prefetch = check_prefetch(prefetch)
        self.model_bytes = int(model_bytes)
        self.lipschitz = lipschitz
        self.prefetcher = Prefetcher(client)  # each pass sets its window: _window
        self._handoff: Slots | bool | None = None  # shared memory for blocks: _slots

    def in_process(self) -> StoreSource:
        """A copy of this source whose tasks run in the process that iterates it, in order and
        one block at a time, rather than on the cluster; it pickles without the client.

        A phase of a search trained as a task on a worker streams its fold from such a copy
        (:mod:`fgscale.estimators._parallel`): the worker reads and projects its blocks itself,
        with the store, bank and statistics it caches, so that the blocks never cross the
        cluster and the phases of the search train side by side. Validation then evaluates the
        blocks where they are read, in that process.
        """
        local = copy.copy(self)
        local.prefetcher = Prefetcher(None, 1)
        local.prefetch = 1  # no cluster to size a window on
        local._handoff = False  # the blocks are read in the process that consumes them
        return local

    def bank_labels(self) -> np.ndarray | None:
        """The labels of the source's bank, shape (n_groupings, n_features), read in this
        process as the tasks read them (cached by the process); None without a bank."""
        return _bank(self.path, self.key, self.bank_at) if self.bank_at else None

    def _window(self, rows: int, width: int) -> int:
        """Tasks in flight for blocks of ``rows`` x ``width`` float32."""
        if self.prefetch == "auto":
            return auto_window(self.prefetcher.client, 4 * rows * width, self.model_bytes)
        return self.prefetch

    def batches(self, plan: EpochPlan) -> Iterator[Batch]:
        """The plan's minibatches, projected on the workers, in plan order."""
        groupings = plan.groupings if plan.groupings is not None else [None] * len(plan)
        args = ((self.path, rows, None if g is None else int(g), self.n_clusters, self.key,
                 self.stats, self.target, self.bank_at, self.stats_at)
                for rows, g in zip(plan.batches, groupings, strict=True))
        width = self.n_features if plan.groupings is None else self.n_clusters
        rows = max(map(len, plan.batches), default=1)
        task = load_step if self.lipschitz else load_batch
        blocks = self._handed(task, args, self._window(rows, width), 4 * rows * width)
        for block, g in zip(blocks, groupings, strict=True):
            yield Batch(block[0], block[1], None if g is None else int(g),
                        block[2] if self.lipschitz else None)

    def _handed(self, task: Callable, args: Iterable[tuple], size: int, nbytes: int) -> Iterator:
        """``task(*a, slot)`` for each ``a`` in ``args``, in order (:class:`Prefetcher`), each
        given a slot of ``nbytes`` of this process's shared memory for its block where worker
        processes on this machine can write into it (:mod:`~fgscale.training._handoff`): the
        block then comes back in recycled memory, not through a socket."""
        slots = self._slots()
        if slots is None:
            yield from self.prefetcher.map(task, (a + (None,) for a in args), size)
            return
        slots.start_pass()
        given: deque = deque()  # the slots of the tasks submitted, in order

        def with_slots():
            for a in args:
                given.append(slots.acquire(nbytes))
                yield a + (given[-1],)

        try:
            for result in self.prefetcher.map(task, with_slots(), size):
                slot, x = given.popleft(), result[0]
                if isinstance(x, Handed):
                    x = slots.take(x)
                else:
                    slots.release(slot)
                yield (x, *result[1:])
        finally:  # the tasks cancelled may still write into theirs
            for slot in given:
                slots.abandon(slot)

    def _slots(self) -> Slots | None:
        """This process's shared memory for blocks, made on the first pass if a worker process
        can see it (None for thread workers, workers on other machines, or no /dev/shm)."""
        if self._handoff is None:
            slots = Slots()
            client = self.prefetcher.client
            seen = slots.folder is not None and any(
                pid != os.getpid() and visible for pid, visible in
                client.run(_sees, str(slots.folder)).values())
            if not seen:
                slots.close()
            self._handoff = slots if seen else False
        return self._handoff or None

    def blocks(self, rows) -> Blocks:
        """Full rows ``(x, y)`` in blocks of ``block_size``, for validation and testing; the
        workers evaluate a model on them for :func:`~fgscale.training.evaluate`."""
        return Blocks(self, np.asarray(rows, dtype=np.int64))

    def screen_sums(self, rows, bank, n_clusters: int, n_outputs: int,
                    regression: bool = False, reply_bytes: int = SCREEN_REPLY_BYTES) -> dict:
        """The screening sums of ``rows`` for every grouping of the bank (``bank`` gives their
        number; ``n_clusters`` is the source's k), as
        :func:`~fgscale.training._screening.merge_sums` gives them in memory, computed on the
        workers: a task per block of rows and share of the groupings, its sums within
        ``reply_bytes``."""
        if n_clusters != self.n_clusters:
            raise ValueError(f"the source's bank has k = {self.n_clusters}, not {n_clusters}")
        rows = np.asarray(rows, dtype=np.int64)
        n_groupings = len(bank)
        share = max(1, reply_bytes // (4 * (n_outputs + 2) * max(self.n_clusters, 1)))
        spans = [(g, min(g + share, n_groupings)) for g in range(0, n_groupings, share)]
        parts = [(rows[i : i + self.block_size], span)
                 for i in range(0, rows.size, self.block_size) for span in spans]
        args = ((self.path, part, span, self.n_clusters, n_outputs, self.key, self.stats,
                 self.target, self.bank_at, self.stats_at) for part, span in parts)
        total = {"n": np.zeros(n_outputs), "y": np.zeros(2),
                 "zy": np.zeros((n_groupings, n_outputs, self.n_clusters)),
                 "zz": np.zeros((n_groupings, self.n_clusters)),
                 "z": np.zeros((n_groupings, self.n_clusters))}
        window = self._window(self.block_size, self.n_features)
        log.info("screening: sums of %d rows for %d groupings, %d tasks", rows.size,
                 n_groupings, len(parts))
        for (_, (first, last)), sums in zip(parts, self.prefetcher.map(load_screen_sums, args,
                                                                        window), strict=True):
            for name in ("zy", "zz", "z"):
                total[name][first:last] += sums[name]
            if first == 0:  # the block's rows, counted once
                total["n"] += sums["n"]
                total["y"] += sums["y"]
        _trim_heap()
        return total


class Blocks:
    """Full rows of a store in blocks of its source's ``block_size``
    (:meth:`StoreSource.blocks`): iterated, ``(x, y)`` blocks read on the workers; or evaluated
    there (:meth:`evaluation_sums`), so that only their sums reach this process.

    Parameters
    ----------
    source : StoreSource
    rows : ndarray of int64
    """

    def __init__(self, source: StoreSource, rows: np.ndarray):
        self.source, self.rows = source, rows

    def _args(self) -> Iterator[tuple]:
        source, rows = self.source, self.rows
        return ((source.path, rows[i : i + source.block_size], source.key, source.stats,
                 source.target, source.stats_at) for i in range(0, rows.size, source.block_size))

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        source = self.source
        yield from source._handed(load_rows, self._args(),
                                 source._window(source.block_size, source.n_features),
                                 4 * source.block_size * source.n_features)
        _trim_heap()

    def evaluation_sums(self, model, *, regression: bool = False,
                        class_weight=None) -> Iterator[dict] | None:
        """Each block's :func:`~fgscale.training._loop.evaluation_sums`, in order, computed by
        the workers on a copy of ``model`` (in eval mode) sent to the cluster once; None when
        the model weighs more than the rows, which then come here to be evaluated, or when the
        source reads its blocks in this process (:meth:`StoreSource.in_process`).

        Validation rows are full rows, ten times the values of a reduced batch's rows at
        k = 10%: receiving them and the forward on them cost the central process more than the
        training steps did, while the workers read them anyway (``scripts/bench_stream.py
        --feed``). The model's copy is sent once a pass, straight to a worker when the workers
        share this machine, and reaches the other workers from it.
        """
        source = self.source
        if source.prefetcher.client is None:  # read in this process: evaluated here as well
            return None
        weights = [*model.parameters(), *model.buffers()]
        if sum(t.numel() * t.element_size() for t in weights) > 4 * self.rows.size * \
                source.n_features:
            return None
        cpu = model if all(t.device.type == "cpu" for t in weights) else _cpu_copy(model)
        weight = None if class_weight is None else class_weight.detach().cpu().numpy()
        return self._remote_sums(cpu, regression, weight)

    def _remote_sums(self, model, regression: bool, class_weight) -> Iterator[dict]:
        source = self.source
        # Through the scheduler, which lives in this process with an embedded cluster, the
        # model would cross a socket three times here (320 ms of CPU against 45 ms for the
        # MLP's 277 MB at 2 mm); workers that see this process's shared memory are reachable
        shipped = source.prefetcher.client.scatter(model, hash=False,
                                                   direct=source._slots() is not None)
        try:
            args = (a + (shipped, regression, class_weight) for a in self._args())
            # their replies are a few numbers: only the rows being read weigh
            yield from source.prefetcher.map(evaluate_rows, args,
                                             source._window(source.block_size, 1))
        finally:
            shipped.release()


def _sees(folder: str) -> tuple[int, bool]:
    """Run on each worker: its process id, and whether it sees ``folder``."""
    return os.getpid(), os.path.isdir(folder)


def _cpu_copy(model):
    """A copy of ``model`` on the CPU, made tensor by tensor from the device: no second copy of
    the model on the device, even for a moment."""
    memo = {id(p): torch.nn.Parameter(p.detach().cpu(), requires_grad=p.requires_grad)
            for p in model.parameters()}
    memo.update({id(b): b.cpu() for b in model.buffers()})
    return copy.deepcopy(model, memo)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library: nothing to do)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _trim_heap() -> None:
    """Give the heap's free pages back to the OS after a pass of full rows. From worker
    processes each block arrives as a fresh buffer of up to tens of MB; once freed, glibc's
    adaptive mmap threshold keeps one or two of them in the heap, a step in the resident memory
    of every epoch's validation pass (``scripts/bench_soak.py``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
