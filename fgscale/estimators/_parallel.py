"""The phases of an in-memory search trained on a Dask cluster: each (candidate, fold) one task.

A fit on arrays or images given ``client=`` with several phases to train (the folds of ``cv``,
several candidate values) trains them on the cluster's workers rather than one after the other
in this process (:meth:`FeatureGroupingBase._search`). The rows, their statistics and the banks
go to the workers once (``client.scatter(..., broadcast=True)``); each task trains one phase
with the code of the sequential fit (the estimator's ``_phase``, seeded alike) and returns what
the choice needs (epochs, validation loss and score, history, whether it stopped early): the
same numbers as the sequential fit's. The model's weights stay on the worker unless asked for,
and only those of the chosen candidate's folds come back, for the average of ``refit=False``.

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

from fgscale._dask.client import task_result
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


def train_phase(estimator, source, bank, params: dict, fit_rows, val_rows, seed: int, weights,
                phase: str, batch_values: int, keep_state: bool) -> dict:
    """Train one phase on a worker as the sequential search does; return its fold's dict
    (:meth:`_fold_result`) and, with ``keep_state``, the model's state dict (on the CPU) as
    ``"state"``. ``source``: the in-memory rows without a bank; ``bank``: the candidate's."""
    with _PROCESS_TURN, torch.random.fork_rng(devices=[]), torch_threads(batch_values):
        own = copy.copy(estimator)  # model_ is set on this task's copy, not the shared one
        source = source.with_bank(bank)
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

    def __init__(self, client, phases: list, futures: list, summaries: list):
        self.client, self.phases = client, phases
        self.futures, self.summaries = futures, summaries

    def folds(self, n_candidates: int) -> list[list[dict]]:
        """Each candidate's folds in fold order, once all phases are done; the first error of
        a phase (in the order they end) is raised as the worker raised it, the others
        cancelled."""
        from distributed import as_completed

        for future in as_completed(self.summaries, loop=self.client.loop):
            if future.status == "error":
                task_result(future)  # the worker's exception, as the sequential fit raises it
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
    """Submit every (candidate, fold) phase of ``grid`` x ``splits`` to ``client``, the data
    scattered to its workers once; yield their :class:`ParallelPhases`. On leaving (done,
    an error, Ctrl-C) the tasks left are cancelled and the data released."""
    shipped = []

    def scatter(value):
        if value is None:
            return None
        future = client.scatter(value, broadcast=True, hash=False)
        shipped.append(future)
        return future

    futures, summaries = [], []
    try:
        # the sources share their rows (and standardized copy): the rows go once, and each
        # bank once
        rows = scatter(next(iter(sources.values()))[0].with_bank(None))
        banks = {k: scatter(bank) for k, (_, bank) in sources.items()}
        light = scatter(shipped_estimator(estimator))
        phases = [(i, f) for i in range(len(grid)) for f in range(len(splits))]
        workers = client.nthreads()
        log.info("training %d phases (%d candidate(s) x %d fold(s)) on %d Dask worker(s), "
                 "%d thread(s)", len(phases), len(grid), len(splits), len(workers),
                 sum(workers.values()))
        for i, f in phases:
            params = grid[i]
            fit_rows, val_rows = splits[f]
            name = estimator._phase_name(i, f, len(grid), len(splits))
            futures.append(client.submit(
                train_phase, light, rows, banks[params["n_clusters"]], params, fit_rows,
                val_rows, seed, weights, name, batch_values, keep_states, pure=False))
        # with the weights kept on the workers, only the numbers come back to choose
        summaries = futures if not keep_states else [
            client.submit(without_state, future, pure=False) for future in futures]
        yield ParallelPhases(client, phases, futures, summaries)
    finally:  # done, a failed phase or Ctrl-C: the tasks left are cancelled
        for future in summaries + futures + shipped:
            future.cancel()
