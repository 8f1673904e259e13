"""The phases of a search trained on a Dask cluster: each (candidate, fold) one task.

A fit with several phases to train (the folds of ``cv``, several candidate values) trains them
on the cluster's workers rather than one after the other in this process
(:meth:`FeatureGroupingBase._search`). Each task trains one phase with the code of the
sequential fit (the estimator's ``_phase``, seeded alike) and returns what the choice needs
(epochs, validation loss and score, history, whether it stopped early): the same numbers as the
sequential fit's. The model's weights stay on the worker unless asked for, and only those of
the chosen candidate's folds come back, for the average of ``refit=False``.

In memory (arrays or images given ``client=``), the rows, their statistics and the banks go to
the workers once (``client.scatter(..., broadcast=True)``). Streamed from a store, a task
carries the source's paths and keys (:meth:`~fgscale.training.StoreSource.in_process`), and
its worker reads its fold's minibatches, validation rows and bank from the store itself, one
block at a time, rather than through the cluster: the sequential fit keeps every worker busy
with the blocks of one phase, whose steps this process takes; here each worker process reads
for, and steps, a phase of its own. That needs worker processes, two or more
(:func:`other_processes`); the refit streams from the cluster, in this process, as ever.

Screening: each task computes the clusters kept of its bank on its fold's training rows
itself, on its worker (the sequential fit computes them once per bank and fold, and reuses
them for the candidates that share both); the same values, computed where the phase trains
rather than sent to it.

torch's random generator (the model's initial weights, dropout's draws) is one per process:
tasks that share a worker process (its threads, or the workers of a ``processes=False``
cluster) take turns, so that each phase draws what it would alone. Worker processes train side
by side.
"""

from __future__ import annotations

import copy
import logging
import threading
from contextlib import contextmanager

import torch

from fgscale._dask.client import task_result, this_process, worker_info, worker_processes
from fgscale._utils.progress import tqdm
from fgscale.training import StoreSource
from fgscale.training._loop import History, torch_threads

log = logging.getLogger(__name__)

# one phase at a time in a process: torch's default generator and thread count are the
# process's, which concurrent phases would interleave
_PROCESS_TURN = threading.Lock()

# the estimator's attributes that a phase does not read: left out of what goes to the workers
_NOT_SHIPPED = ("model_", "history_", "cv_results_", "bank_", "cv_scores_", "cv_params_")


def shipped_estimator(estimator):
    """A shallow copy of ``estimator`` holding what ``_phase`` and ``_fold_score`` read (its
    parameters and what the fit set before the search), without a previous fit's model and
    results, its ``cv`` splitter, and progress bars (the workers' would interleave)."""
    light = copy.copy(estimator)
    for name in _NOT_SHIPPED:
        light.__dict__.pop(name, None)
    light.verbose = 0
    # each task is given its fold's rows: the splitter, perhaps of a class that the workers
    # cannot import (a script's), stays here
    light.cv = None
    return light


# a phase's first layer on its worker: the weights, their gradient, the reduced weights and
# their gradient (at most as large), the best epoch's snapshot
PHASE_COPIES = 4


def fits_on_workers(client, nbytes: int) -> bool:
    """Whether every worker of ``client`` has ``nbytes`` within half its memory limit (a
    worker without a limit always has): a phase on a worker that passes its limit is paused,
    then restarted by its nanny, where this process streams the same phase in bounded memory."""
    limits = [w.get("memory_limit") or 0 for w in worker_info(client).values()]
    return all(not limit or nbytes <= limit / 2 for limit in limits)


def other_processes(client) -> int:
    """The worker processes of ``client`` other than this one: those that can train phases
    side by side (the thread workers of a ``processes=False`` cluster run in this process,
    where the phases would take turns)."""
    here = this_process()
    return len([process for process in worker_processes(client) if process != here])


def _phase_source(source, bank):
    """The source and bank a phase trains with: in memory, ``source`` (the rows) given its
    ``bank``; streamed, ``source`` as it is (:meth:`StoreSource.in_process`) and its bank read
    from the store here, in the worker's cache, rather than sent."""
    if isinstance(source, StoreSource):
        return source, source.bank_labels()
    return source.with_bank(bank), bank


def train_phase(estimator, source, bank, params: dict, fit_rows, val_rows, seed: int, weights,
                phase: str, batch_values: int, keep_state: bool) -> dict:
    """Train one phase on a worker as the sequential search does; return its fold's dict
    (:meth:`_fold_result`) and, with ``keep_state``, the model's state dict (on the CPU) as
    ``"state"``. ``source``: the in-memory rows without a bank, or a store's source of the
    candidate's bank that reads its blocks in this process (None for ``bank`` then);
    ``bank``: the candidate's."""
    with _PROCESS_TURN, torch.random.fork_rng(devices=[]), torch_threads(batch_values):
        own = copy.copy(estimator)  # model_ is set on this task's copy, not the shared one
        source, bank = _phase_source(source, bank)
        torch.manual_seed(seed)
        run = own._phase(source, bank, fit_rows, val_rows, seed, History, own.max_epochs, params,
                         weights, phase=phase, screens={}, rows_key="fold")
        fold = own._fold_result(run, source, val_rows)
        fold["state"] = None if not keep_state else {
            name: value.detach().cpu().clone() for name, value in own.model_.state_dict().items()}
        return fold


def without_state(fold: dict) -> dict:
    """``fold`` less its model's weights: what comes back to choose the candidate."""
    return {name: value for name, value in fold.items() if name != "state"}


def state_of(fold: dict) -> dict:
    return fold["state"]


class ParallelPhases:
    """The phases of a search, submitted to ``client``: :meth:`folds` waits for them and gives
    each candidate's folds (``"key"``: the phase's index); :meth:`state` fetches a phase's
    model weights (with ``keep_states``). Made by :func:`parallel_phases`."""

    def __init__(self, client, phases: list, futures: list, summaries: list, *,
                 progress: bool = False):
        self.client, self.phases = client, phases
        self.futures, self.summaries = futures, summaries
        self.progress = progress

    def folds(self, n_candidates: int) -> list[list[dict]]:
        """Each candidate's folds in fold order, once all phases are done (a progress bar of
        the phases with ``progress``); the first error of a phase (in the order they end) is
        raised as the worker raised it, the others cancelled."""
        from distributed import as_completed

        with tqdm(total=len(self.summaries), unit="phase", desc="phases",
                  disable=not self.progress) as bar:
            for future in as_completed(self.summaries, loop=self.client.loop):
                if future.status == "error":
                    task_result(future)  # the worker's exception, as the sequential fit's
                bar.update()
        out = [[] for _ in range(n_candidates)]
        for key, ((i, _), future) in enumerate(zip(self.phases, self.summaries, strict=True)):
            out[i].append(dict(future.result(), key=key))
        return out

    def state(self, key: int) -> dict:
        """The model weights of phase ``key``, fetched from its worker."""
        return task_result(self.client.submit(state_of, self.futures[key], pure=False))


@contextmanager
def parallel_phases(estimator, client, grid: list[dict], sources: dict, splits: list, seed: int,
                    weights, batch_values: int, *, keep_states: bool):
    """Submit every (candidate, fold) phase of ``grid`` x ``splits`` to ``client``: in-memory
    data scattered to its workers once, a store's sources (:class:`StoreSource`) read by each
    phase on its worker; yield their :class:`ParallelPhases`. On leaving (done, an error,
    Ctrl-C) the tasks left are cancelled and the data released."""
    shipped = []

    def scatter(value):
        if value is None:
            return None
        future = client.scatter(value, broadcast=True, hash=False)
        shipped.append(future)
        return future

    futures, summaries = [], []
    try:
        streamed = isinstance(next(iter(sources.values()))[0], StoreSource)
        if streamed:  # paths and keys: each phase reads its blocks and bank on its worker
            shipped_sources = {k: (source.in_process(), None)
                               for k, (source, _) in sources.items()}
        else:
            # the sources share their rows (and standardized copy): the rows go once, and
            # each bank once
            rows = scatter(next(iter(sources.values()))[0].with_bank(None))
            shipped_sources = {k: (rows, scatter(bank)) for k, (_, bank) in sources.items()}
        light = scatter(shipped_estimator(estimator))
        phases = [(i, f) for i in range(len(grid)) for f in range(len(splits))]
        workers = client.nthreads()
        log.info("training %d phases (%d candidate(s) x %d fold(s)) on %d Dask worker(s), "
                 "%d thread(s)%s", len(phases), len(grid), len(splits), len(workers),
                 sum(workers.values()),
                 ", each phase reading its rows from the store" if streamed else "")
        for i, f in phases:
            params = grid[i]
            fit_rows, val_rows = splits[f]
            name = estimator._phase_name(i, f, len(grid), len(splits))
            source, bank = shipped_sources[params["n_clusters"]]
            futures.append(client.submit(
                train_phase, light, source, bank, params, fit_rows, val_rows, seed, weights,
                name, batch_values, keep_states, pure=False))
        # with the weights kept on the workers, only the numbers come back to choose
        summaries = futures if not keep_states else [
            client.submit(without_state, future, pure=False) for future in futures]
        yield ParallelPhases(client, phases, futures, summaries,
                             progress=bool(estimator.verbose))
    finally:  # done, a failed phase or Ctrl-C: the tasks left are cancelled
        for future in summaries + futures + shipped:
            future.cancel()
