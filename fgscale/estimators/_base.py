"""What the estimators share: parameters, data in memory or on a store, standardization, the
bank, and training in two phases (early stopping on a validation split, then a refit).

The estimators are thin: they resolve their parameters, then call the bank builder
(:mod:`fgscale.grouping`), the statistics of :mod:`fgscale.store` and the planner and training
loop of :mod:`fgscale.training`.
"""

from __future__ import annotations

import copy
import logging
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from sklearn.base import BaseEstimator, clone, is_classifier
from sklearn.utils.validation import check_is_fitted, validate_data

from fgscale.estimators._inputs import (
    check_not_empty,
    check_store_smoothing,
    cnn_grid,
    images_to_rows,
    is_store,
    mask_image_of,
    refuse_multioutput,
    refuse_smoothing,
    refuse_table_of_images,
    resolve_graph,
    rows_of,
    warn_unused_client,
    warn_unused_mask,
)
from fgscale.estimators._params import (
    NILEARN_PARAMS,
    check_device,
    params_of,
    resolve_seed,
    validate_params,
)
from fgscale.estimators._regularizers import model_dropout, regularizer_named
from fgscale.estimators._scoring import fold_score
from fgscale.estimators._selection import (
    candidates,
    check_cv,
    check_groups,
    fold_splits,
    image_groups,
    use_validation,
    warn_chain,
    warn_ignored,
    warn_not_converged,
)
from fgscale.grouping._bank import make_bank
from fgscale.store._stats import array_stats
from fgscale.training._loop import (
    EarlyStopping,
    History,
    check_finite,
    cuda_device,
    fit,
    make_optimizer,
    torch_threads,
)
from fgscale.training._memory import MemorySource, standardize_rows
from fgscale.training._models import build_model
from fgscale.training._plan import epoch_plan
from fgscale.training._screening import adjusted_percentile, kept_clusters
from fgscale.training._sgd import LipschitzStep

log = logging.getLogger(__name__)

_BATCH_RANGE = (32, 200)  # batch_size="auto": a tenth of the rows, within this range


def average_models(models: list[torch.nn.Module]) -> torch.nn.Module:
    """The first of ``models`` holding the mean of their parameters: the fold models of one
    candidate, which share their architecture. For a linear model, the model of the averaged
    weights gives the mean of the models' logits (nilearn FREM's average of fold weights)."""
    if len(models) == 1:
        return models[0]
    states = [m.state_dict() for m in models]
    mean = {name: torch.stack([s[name] for s in states]).mean(dim=0) for name in states[0]}
    models[0].load_state_dict(mean)
    return models[0]


class FeatureGroupingBase(BaseEstimator):
    """The machinery of the estimators; subclasses set the targets and the outputs, their
    task (``_task``, which picks their parameters from the table) and ``__init__``'s signature."""

    _task = "classification"

    def __init__(self, *args, **params):
        if args:  # else Python's error names this base class, not the estimator
            raise TypeError(f"{type(self).__name__} takes keyword arguments only, as scikit-learn's "
                            f"estimators: got {args[0]!r} by position")
        own = params_of(self._task)
        unknown = sorted(set(params) - {p.name for p in own})
        if unknown:
            hints = "".join(f"; {name}: {NILEARN_PARAMS[name]}" for name in unknown
                            if name in NILEARN_PARAMS)
            raise TypeError(f"{type(self).__name__} got unexpected parameter(s) {unknown}"
                            + (f" (nilearn's names; here, {hints[2:]})" if hints else ""))
        for p in own:
            setattr(self, p.name, params.get(p.name, p.default))

    def _check_params(self, warn_level: int = 0):
        """Check every parameter (the table's constraints), before any work; with
        ``warn_level``, warn of those that have no effect, naming that frame of the stack
        (``warnings.warn``'s ``stacklevel``: 3 is the caller of this method)."""
        # deep=False: a parameter's own parameters (an estimator given as mask=) are not ours
        validate_params(self.get_params(deep=False), type(self).__name__)
        check_cv(self)
        self._check_replicas()
        if warn_level:
            warn_ignored(self, warn_level)

    def _check_replicas(self) -> None:
        """Refuse ``replicas > 1`` with what the replicas cannot train: full rows (no feature
        grouping: each step would sum an h x p gradient across them), a CNN (no grouped first
        layer) and a GPU (the replicas train on the workers' CPUs)."""
        if self.replicas == 1:
            return
        said = f"replicas={self.replicas}"
        if not regularizer_named(self.regularizer).grouping:
            raise ValueError(f"{said} needs feature grouping, regularizer='feature_grouping': "
                             f"with regularizer={self.regularizer!r} every step would sum an "
                             "h x p gradient of full rows across the replicas; give "
                             "replicas=1 to train it")
        if self.model not in ("logreg", "mlp"):
            raise ValueError(f"{said} needs model='logreg' or 'mlp', whose first layer feature "
                             f"grouping reduces; give replicas=1 to train model={self.model!r}")
        if self.device != "cpu":
            raise ValueError(f"{said} trains on the CPUs of the cluster's worker processes: "
                             f"device must be 'cpu', got {self.device!r}; give replicas=1 to "
                             "train on it")

    def _seed(self) -> int:
        """The run's seed (:func:`resolve_seed` of ``random_state``)."""
        return resolve_seed(self.random_state)

    # ------------------------------------------------------------------ data in

    def fit(self, X, y=None, *, groups=None, client=None, rows=None, checkpoint=None):
        """Check the parameters, then fit on a store (streamed), on images or on arrays; the
        subclasses document it and encode ``y`` (:meth:`_encode_targets`)."""
        from fgscale.images._masking import is_images, refuse_odd_item

        self._check_params(warn_level=5)  # the caller of the subclass's fit
        # a refit refused or interrupted leaves the previous model whole, not half replaced
        fitted = dict(self.__dict__)
        try:
            # what this fit may not set again (no coef_ for an MLP, no names for a store)
            # must not be left from a previous fit
            for name in ("coef_", "intercept_", "feature_names_in_"):
                self.__dict__.pop(name, None)
            check_not_empty(X, "fit on")
            refuse_table_of_images(X)
            refuse_odd_item(X)
            refuse_multioutput(self, y)
            refuse_smoothing(self.smoothing_fwhm, X)
            if is_store(X):
                if y is not None or groups is not None:
                    from fgscale.store import open_group_checked

                    open_group_checked(X)  # a path that is no store is named as such first
                    raise ValueError(f"{'y' if y is not None else 'groups'} must be None when X is a "
                                     "store: the targets and groups come from the store")
                return self._fit_store(X, client, checkpoint or History, rows)
            if rows is not None or checkpoint is not None:
                raise ValueError(f"{'rows' if rows is not None else 'checkpoint'} applies to a fit "
                                 "on a store (X a store's path or Store); with arrays or images, "
                                 "pass the rows to fit on as X")
            if self.replicas > 1:
                raise ValueError(f"replicas={self.replicas}: replicas apply to a fit streamed "
                                 "from a store (X a store's path or Store); with arrays or "
                                 "images, give replicas=1")
            mask_img = None
            if is_images(X):
                if groups is None:
                    groups = image_groups(self, X)
                X, mask_img = self._images_in(X)
                if y is not None and len(X) != np.shape(y)[0]:
                    raise ValueError(f"the images hold {len(X)} volumes but y has {np.shape(y)[0]} "
                                     "targets: give one target per volume (a 4D image gives one "
                                     "row per volume)")
            # rows in C order: every batch, validation block and bootstrap reads whole rows
            X, y = validate_data(self, X, y, dtype=np.float32, order="C",
                                 y_numeric=not self._is_classifier())
            return self._fit_arrays(X, self._encode_targets(y), mask_img,
                                    check_groups(groups, len(X)), client=client)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(fitted)
            raise

    def _images_in(self, X):
        """Images to fit on, as rows, and the mask they came through (``images_to_rows``)."""
        return images_to_rows(X, self.mask, bool(self.resample), self.smoothing_fwhm)

    def _rows_in(self, X):
        """``X`` for predict and score: images are masked with ``mask_img_`` and smoothed as
        those of the fit; rows are taken as given (already smoothed, where the fit's were)."""
        # a model saved before smoothing_fwhm_ existed was fitted unsmoothed
        return rows_of(X, getattr(self, "mask_img_", None), type(self).__name__,
                       bool(self.resample), getattr(self, "smoothing_fwhm_", None))

    def _fit_arrays(self, X: np.ndarray, y_idx: np.ndarray, mask_img=None, groups=None,
                    client=None):
        """Fit on in-memory rows ``X`` (float32) with target indices ``y_idx``; ``mask_img``:
        the mask the rows came through, when they came as images; ``groups``: the rows'
        subjects, which the validation split keeps on one side; ``client``: the cluster that
        trains the phases of a search (the folds of ``cv``, the candidates), if several."""
        self.mask_img_ = mask_img if mask_img is not None else mask_image_of(self.mask)
        self.smoothing_fwhm_ = self.smoothing_fwhm or None
        graph = resolve_graph(self.mask if self.mask_img_ is None else self.mask_img_, X.shape[1])
        warn_chain(self, X.shape[1])
        self.n_features_in_ = X.shape[1]
        seed, rows = self._seed(), np.arange(len(y_idx))
        mean = scale = None
        if self.standardize:
            mean, std = array_stats(X)
            scale = (1.0 / std).astype(np.float32)
        self.mean_, self.scale_ = mean, scale
        sources, rows_source = {}, MemorySource(X, y_idx, mean=mean, scale=scale)
        for k in self._cluster_counts(y_idx[rows]):
            bank = None
            if k is not None:  # on the raw rows, as the bank tasks of a store read them
                bank = make_bank(X, graph, k, n_groupings=self.n_groupings,
                                 n_bootstrap=self.n_bootstrap, rows=rows, seed=seed)
            sources[k] = (rows_source.with_bank(bank), bank)
        return self._train(sources, y_idx, rows, seed, groups=groups, client=client)

    def _cluster_counts(self, y_idx: np.ndarray) -> list:
        """The distinct k (ints) of the candidates for training targets ``y_idx``; [None]
        without feature grouping."""
        grid = candidates(self, self.n_features_in_, use_validation(self, y_idx))
        return sorted({c["n_clusters"] for c in grid}, key=lambda k: -1 if k is None else k)

    def check_store_fit(self, store, rows=None) -> None:
        """Refuse now what a fit on ``rows`` of ``store`` would refuse before it trains.

        What a run or a cross-validation calls before it writes anything or starts a cluster:
        a bad parameter, rows without training rows or classes, and statistics or banks that
        are missing with nowhere to write them (a store that may not be written, no cache
        dir).

        Parameters
        ----------
        store : str, Path or Store
            A complete fgscale store.
        rows : array-like of int, optional
            The rows the fit would train on; default the store's training rows.
        """
        from fgscale.store import open_store

        self._check_params()
        store = open_store(store)
        # on a copy: the plan sets what a fit learns of the store (n_features_in_, the classes),
        # which would make this estimator look fitted
        clone(self)._store_plan(store, self._store_rows(store, rows), self._seed())

    @staticmethod
    def _store_rows(store, rows) -> np.ndarray:
        return store.train_rows() if rows is None else np.unique(np.asarray(rows, np.int64))

    def _store_plan(self, store, rows, seed: int) -> dict:
        """The bank each k of the candidates trains with (k -> :class:`BankSpec`, None without
        feature grouping), each key resolved here once. Refuses, before any cluster starts,
        rows that lack classes and a fit that would have to write missing statistics or banks
        with nowhere to write them."""
        from fgscale.grouping import bank_ready, bank_spec
        from fgscale.store import stats_ready, write_location

        self.n_features_in_ = store.n_features
        check_store_smoothing(self.smoothing_fwhm, store)
        self.smoothing_fwhm_ = store.smoothing_fwhm
        if not len(rows):  # said as such, not as "0 class" or an empty bootstrap
            raise ValueError(f"{store.path}: no training rows, every row's split is 'test'; "
                             "expected some rows of split 'train' (or empty) in the cohort")
        self._set_store_targets(store, rows)
        counts = self._cluster_counts(self._store_targets(store)[rows])
        specs = {k: None if k is None else bank_spec(
            store, n_clusters=k, n_bootstrap=self.n_bootstrap, seed=seed, rows=rows,
            n_groupings=self.n_groupings) for k in counts}
        if (self.standardize and not stats_ready(store, rows)) or not all(
                bank_ready(store, spec) for spec in specs.values() if spec is not None):
            write_location(store)  # raises: nowhere to write what is missing
        return specs

    def _fit_store(self, store, client, history, rows=None):
        """Fit on a store's training rows (or on ``rows``, a subset: a fold), streamed; the
        store is opened here once and passed down, each bank's key resolved once."""
        from fgscale._dask.client import get_client
        from fgscale.grouping import ensure_bank
        from fgscale.store import compute_stats, open_store
        from fgscale.training import StoreSource

        store = open_store(store)
        warn_unused_mask(self.mask, store, stacklevel=5)  # the caller of the subclass's fit
        self.mask_img_ = store.mask_img()
        seed = self._seed()
        rows = self._store_rows(store, rows)
        specs = self._store_plan(store, rows, seed)
        targets = self._store_targets(store)
        # replicas each need a worker process of their own; else threads up to 4 workers
        with get_client(client=client, processes=self.replicas > 1 or "auto") as client:
            if self.replicas > 1:  # a cluster too small, refused before any work on it
                from fgscale.training._replicas import replica_workers

                replica_workers(client, self.replicas)
            self.mean_ = self.scale_ = None
            if self.standardize:
                mean, std = compute_stats(store, rows, client=client, progress=bool(self.verbose))
                self.mean_, self.scale_ = mean, (1.0 / std).astype(np.float32)
            grouped = store.groups != ""
            groups = store.groups if grouped.all() else None
            if grouped.any() and groups is None:  # its subjects may straddle the split
                log.warning("%s: %d of its rows have no group: the validation split is by row, not "
                            "by subject; give each row its subject", store.path, (~grouped).sum())
            sources = {}
            for k, spec in specs.items():
                bank, info = None, {"key": "", "location": None}
                if spec is not None:
                    # the bank of exactly these parameters and training rows, built if missing
                    bank, info = ensure_bank(store, spec, client=client,
                                             progress=bool(self.verbose))
                    log.info("using bank %s of %s", info["key"], info["location"])
                sources[k] = (StoreSource(client, store, n_clusters=k or 0,
                                          bank_key=info["key"], bank_at=info["location"],
                                          prefetch=self.prefetch,
                                          standardize=bool(self.standardize), stats_rows=rows,
                                          lipschitz=self._steps_on_workers(),
                                          model_bytes=self._first_layer_bytes()
                                          if cuda_device(self.device) is None else 0,
                                          **self._store_source_kwargs()), bank)
            return self._train(sources, targets, rows, seed, history, groups=groups,
                               client=client, streamed=True)

    def _store_source_kwargs(self) -> dict:
        """What the streamed source carries as targets (class indices by default)."""
        return {}

    # ------------------------------------------------------------------ training

    def _batch_size(self, n_rows: int) -> int:
        """``batch_size_`` for ``n_rows`` training rows: each replica's rows of a step (all of
        them with one). "auto" sizes the step, a tenth of the rows within
        :data:`_BATCH_RANGE`, and the replicas share it (rounded up): more replicas read a
        step's rows faster, they do not take fewer, larger steps."""
        if self.batch_size == "auto":
            step = int(np.clip(n_rows // 10, *_BATCH_RANGE))
            return -(-step // self.replicas)
        return int(self.batch_size)

    def _is_classifier(self) -> bool:
        return is_classifier(self)

    def _step_size(self, alpha: float, dropout: float):
        """The per-batch step of ``learning_rate="auto"`` (None: the optimizer's fixed one)."""
        if self.learning_rate != "auto":
            return None
        # input dropout scales kept inputs by 1 / (1 - p): so much steeper a loss
        keep = 1.0 - regularizer_named(self.regularizer).dropout_rates(dropout)[0]
        # half the squared error is twice as steep as the cross-entropy (training.batch_loss)
        steepness = (1.0 if self._is_classifier() else 2.0) / keep
        return LipschitzStep(steepness, alpha)

    def _steps_on_workers(self) -> bool:
        """Whether the streamed source's workers compute each batch's Lipschitz constant for
        the step size: with ``learning_rate="auto"``, unless class weights weigh the rows (the
        step then needs the rows' weights, and the central process computes it)."""
        return self.learning_rate == "auto" and getattr(self, "class_weight", None) is None

    def _set_class_weights(self, y_idx: np.ndarray):
        """The classes' weights in the loss for training targets ``y_idx``, set as a fitted
        attribute by the classifier; None here."""
        return None

    def _train(self, sources: dict, y_idx, rows, seed, history=History, groups=None,
               client=None, streamed: bool = False):
        """Train on ``sources`` (k -> (in-memory or streamed source, bank)) over ``rows``.

        With validation rows (one split, or the folds of ``cv``), each candidate
        (:func:`~fgscale.estimators._selection.candidates`) trains on each fold's training rows
        and keeps the weights of its best epoch on the fold's validation rows (least loss, or
        error with ``stop_on="accuracy"``); the candidate of best mean over the folds
        (validation loss, or ``scoring``'s score) wins. With ``refit``, a fresh model then
        trains on all ``rows`` for as many epochs as the chosen candidate's folds took on
        average; without, the model is the chosen candidate's (with ``cv``, its fold models'
        weights averaged). Without validation rows (a single candidate), one phase on all rows
        stops on the training loss.

        ``client``: the phases of the search (each candidate on each fold) train as tasks on
        its workers, when there are several and the device is the CPU
        (:mod:`fgscale.estimators._parallel`); the refit trains here. Else, in memory, it is
        unused, and said so. ``streamed``: ``sources`` are a store's, streamed from
        ``client``, whose workers then train the phases only where :meth:`_search_client`
        finds room; else the phases train here, their batches streamed as ever.
        """
        validation = use_validation(self, y_idx[rows], warn=True)
        grid = candidates(self, self.n_features_in_, validation)
        # from all the training rows: every candidate, and the refit, weigh the classes alike
        weights = self._set_class_weights(y_idx[rows])
        self.screening_percentile_ = 100.0 if not regularizer_named(self.regularizer).grouping else \
            adjusted_percentile(self.screening_percentile, self.mask_img_, self.n_features_in_)
        splits = fold_splits(self, y_idx, rows, seed, groups, validation=validation,
                             n_candidates=len(grid))
        self.batch_size_ = self._batch_size(min(len(fit_rows) for fit_rows, _ in splits))
        gpu = cuda_device(self.device)
        widths = [self.n_features_in_ if k is None else k for k in sources]
        client = self._search_client(client, len(grid) * len(splits), history, streamed)
        # the caller's generators are left as they were, the GPU's too (dropout draws there)
        with torch.random.fork_rng(devices=[] if gpu is None else [gpu]), \
                torch_threads(self.batch_size_ * max(widths)):
            validated = splits[0][1] is not None
            refit = validated and self.refit
            screens = {}
            chosen, folds = self._search(grid, sources, splits, seed, history, weights, screens,
                                         keep_models=not refit, client=client,
                                         batch_values=self.batch_size_ * max(widths))
            warn_not_converged(self, all(f["stopped"] for f in folds), validated)
            self.alpha_, self.dropout_, self.n_clusters_ = (
                chosen["alpha"], chosen["dropout"], chosen["n_clusters"])
            self.bank_ = sources[chosen["n_clusters"]][1]
            self.n_iter_ = chosen["best_epoch"] + 1  # the folds' mean
            self._set_cv_attributes(chosen, folds)
            self.history_ = folds[0]["history"] if len(folds) == 1 else [
                dict(h, fold=i + 1) for i, f in enumerate(folds) for h in f["history"]]
            if refit:
                self.model_ = None  # the last fold's, released before the refit's is built
                torch.manual_seed(seed)
                source, bank = sources[chosen["n_clusters"]]
                params = {name: chosen[name] for name in ("alpha", "dropout", "n_clusters")}
                again = self._phase(source, bank, rows, None, seed, history, self.n_iter_,
                                    params, weights, stop=False, phase="refit", screens=screens,
                                    rows_key="all")
                self.history_ = self.history_ + [dict(h, phase="refit") for h in again.history]
            else:
                self.model_ = average_models([f["model"] for f in folds])
        check_finite(self.model_, self.n_iter_, self.learning_rate)
        self._set_outputs()
        return self

    def _first_layer_bytes(self) -> int:
        """The bytes of the model's first layer, all of its weights but a CNN's (p x width
        float32): what sizes a phase's memory."""
        width = self.hidden_layer_sizes[0] if self.model == "mlp" else self._n_outputs()
        return 4 * self.n_features_in_ * int(width)

    def _search_client(self, client, n_phases: int, history=History, streamed: bool = False):
        """The cluster that trains the ``n_phases`` phases of a search as tasks, or None: they
        train here, one after the other.

        In memory: ``client`` when there are several phases on the CPU; else None, with a
        warning that ``client`` is unused (given to a fit that trains in this process).
        Streamed from a store (``streamed``), the phases also need room: two worker processes
        or more (a phase on a worker reads its own blocks, and thread workers share this
        process), each with the memory for a phase's model (:data:`PHASE_COPIES` copies of
        its first layer, within half the worker's memory limit), ``replicas=1`` (the replicas
        take the worker processes), and ``history`` History itself (a run folder's
        checkpoints are written by this process). Else None, silently: the store's batches
        still stream from ``client``, and the model is this process's."""
        if client is None:
            return None
        on_cpu = torch.device(self.device).type == "cpu"
        if streamed:
            from fgscale.estimators._parallel import PHASE_COPIES, fits_on_workers, other_processes

            room = (n_phases > 1 and on_cpu and self.replicas == 1 and history is History
                    and other_processes(client) > 1
                    and fits_on_workers(client, PHASE_COPIES * self._first_layer_bytes()))
            return client if room else None
        if n_phases > 1 and on_cpu:
            return client
        # the caller of the subclass's fit: fit, _fit_arrays, _train, here, the warning's
        warn_unused_client(client, stacklevel=7, device=None if on_cpu else self.device)
        return None

    def _search(self, grid, sources, splits, seed, history, weights, screens, *,
                keep_models: bool, client=None, batch_values: int = 0):
        """Train every candidate of ``grid`` on every fold of ``splits``; return the chosen
        candidate's row of ``cv_results_`` (set here) and its folds (a dict each: epochs,
        validation loss and score, history, whether it stopped early, and with
        ``keep_models`` its model). With ``client``, the phases train as tasks on its workers
        (their torch threads as ``batch_values`` values a batch set them, as here), and only
        the chosen candidate's models come back."""
        if client is None:
            return self._choose(self._trained_folds(grid, sources, splits, seed, history,
                                                    weights, screens, keep_models))
        from fgscale.estimators._parallel import parallel_phases

        self.model_ = None  # a previous fit's, not kept while the phases train
        with parallel_phases(self, client, grid, sources, splits, seed, weights, batch_values,
                             keep_states=keep_models) as phases:
            chosen, folds = self._choose(zip(grid, phases.folds(len(grid)), strict=True))
            for fold in folds:
                fold["model"] = self._new_model(chosen["dropout"], phases.state(fold["key"])) \
                    if keep_models else None
        return chosen, folds

    @staticmethod
    def _phase_name(candidate: int, fold: int, n_candidates: int, n_folds: int) -> str:
        """A phase's name in a search (its checkpoint's, its progress bar's)."""
        return "-".join(([f"candidate-{candidate + 1}"] if n_candidates > 1 else [])
                        + ([f"fold-{fold + 1}"] if n_folds > 1 else []))

    def _trained_folds(self, grid, sources, splits, seed, history, weights, screens,
                       keep_models: bool):
        """Each candidate of ``grid`` with its folds, trained here one after the other."""
        for i, params in enumerate(grid):
            source, bank = sources[params["n_clusters"]]
            folds = []
            for f, (fit_rows, val_rows) in enumerate(splits):
                torch.manual_seed(seed)
                phase = self._phase_name(i, f, len(grid), len(splits))
                # the last phase's model is released before the next one is built: only the
                # folds of the best candidate so far are kept, and none with a refit
                self.model_ = None
                run = self._phase(source, bank, fit_rows, val_rows, seed, history,
                                  self.max_epochs, params, weights, phase=phase,
                                  screens=screens, rows_key=f)
                folds.append(dict(self._fold_result(run, source, val_rows),
                                  model=self.model_ if keep_models else None))
                run = None  # its optimizer holds the model's parameters: not kept past the phase
            yield params, folds

    def _fold_result(self, run, source, val_rows) -> dict:
        """A trained phase's fold: the epochs it kept, its validation loss and ``model_``'s
        score on ``val_rows`` (None without), its history and whether it stopped early."""
        stopper = run.stopper
        return {"epochs": stopper.best_epoch + 1 if stopper.best_epoch >= 0 else len(run.history),
                "loss": stopper.best_loss if val_rows is not None else None,
                "score": None if val_rows is None else self._fold_score(
                    source, val_rows, run.history, stopper.best_epoch),
                "history": run.history, "stopped": run.stopped_early}

    def _choose(self, trained) -> tuple[dict, list[dict]]:
        """The best of ``trained`` (each candidate's parameters and folds, in the grid's
        order): its ``cv_results_`` row (all rows set here) and its folds."""
        results, best, best_value = [], None, None
        by_score = self.scoring is not None
        for params, folds in trained:
            row = self._result_row(params, folds)
            results.append(row)
            value = row.get("val_score") if by_score else row.get(self._loss_key())
            if best is None or (value is not None and (
                    value > best_value if by_score else value < best_value)):
                best, best_value = (row, folds), value
            # released while the next candidate trains, unless the best (its models, if kept)
            params = folds = row = None
        self.cv_results_ = results
        return best

    def _loss_key(self) -> str:
        return f"val_{'loss' if self.stop_on == 'loss' else 'error'}"

    def _result_row(self, params: dict, folds: list[dict]) -> dict:
        """A candidate's row of ``cv_results_``: its parameters, its best epoch and validation
        loss (error) and score, as means over the folds, and with several folds each fold's."""
        validated = folds[0]["loss"] is not None
        row = {**params, "best_epoch": int(round(np.mean([f["epochs"] for f in folds]))) - 1,
               self._loss_key(): float(np.mean([f["loss"] for f in folds])) if validated else None}
        if validated:
            row["val_score"] = float(np.mean([f["score"] for f in folds]))
        if len(folds) > 1:
            row["fold_epochs"] = [f["epochs"] for f in folds]
            row[f"fold_{self._loss_key()}"] = [f["loss"] for f in folds]
            row["fold_val_score"] = [f["score"] for f in folds]
        return row

    def _fold_score(self, source, val_rows, history=(), best_epoch: int = -1) -> float:
        """The score (``scoring``'s, else accuracy or R²) of ``model_`` on ``val_rows``.

        Without ``scoring`` or class weights, it is the accuracy or R² that validation
        recorded in ``history`` at ``best_epoch``, whose weights ``model_`` holds: a streamed
        fit's validation rows are not read, nor brought to this process, once more."""
        from fgscale.training._loop import predict_logits

        if self.scoring is None and getattr(self, "class_weight", None) is None:
            name = "val_accuracy" if self._is_classifier() else "val_r2"
            recorded = [h[name] for h in history if h.get("epoch") == best_epoch and name in h]
            if recorded:
                return float(recorded[-1])
        blocks = list(source.blocks(val_rows))
        outputs = predict_logits(self.model_, (x for x, _ in blocks), device=self.device)
        if not np.isfinite(outputs).all():  # diverged: check_finite says so once chosen
            return float("nan")
        return fold_score(self, outputs, np.concatenate([y for _, y in blocks]))

    def _set_cv_attributes(self, chosen: dict, folds: list[dict]) -> None:
        """``cv_scores_`` and ``cv_params_`` as nilearn's decoders set them, keyed by class (a
        regressor: ``"beta"``): each fold's validation score of the chosen candidate, and the
        values it trained with on each fold (with the epochs each fold kept)."""
        keys = self.classes_.tolist() if self._is_classifier() else ["beta"]
        scores = [f["score"] for f in folds]
        params = {name: [chosen[name]] * len(folds) for name in ("alpha", "dropout", "n_clusters")}
        params["n_epochs"] = [f["epochs"] for f in folds]
        self.cv_scores_ = {key: list(scores) for key in keys} if scores[0] is not None else {}
        self.cv_params_ = {key: {name: list(v) for name, v in params.items()} for key in keys}

    def _phase(self, source, bank, rows, val_rows, seed, history, max_epochs, params,
               class_weight=None, stop=True, phase="", *, screens: dict, rows_key):
        """Train a fresh model with ``params`` (and ``class_weight``: an array of the classes'
        weights, or None) on ``rows`` for up to ``max_epochs``; return its history hook (its
        stopper holds the best epoch and loss). ``phase`` names it for the hook: each phase
        of a run folder has its own checkpoint. ``rows_key`` names ``rows`` (a fold's index, or
        "all"): the screening of a bank on them is computed once, in ``screens``. With
        ``replicas > 1`` each epoch's steps run on the replicas (:meth:`_replica_epochs`), kept
        for the phase; validation, the stopper and the hook's checkpoints stay here, as with
        one process."""
        alpha, dropout = params["alpha"], params["dropout"]
        self.model_ = self._new_model(dropout)
        fixed = 0.0 if self.learning_rate == "auto" else self.learning_rate
        optimizer = make_optimizer(self.model_, fixed, alpha)
        stopper = EarlyStopping(self.patience if stop else max_epochs + 1, self.tol)
        run = history(self, optimizer, stopper, phase=phase, params=params)
        start_epoch = run.resume()
        n_groupings = 0 if bank is None else len(bank)
        bank_t = None if bank is None else torch.as_tensor(bank, device=self.device)

        def epoch_batches(epoch):
            return source.batches(epoch_plan(rows, batch_size=self.batch_size_, epoch=epoch,
                                             seed=seed, n_groupings=n_groupings))

        validation = None if val_rows is None else (lambda: source.blocks(val_rows))
        if not run.stopped_early:  # the epochs left: none once max_epochs are done
            # the clusters kept, on the rows this phase trains on (the refit's: all the
            # training rows), once for the candidates that share them and their bank
            key = (id(bank), rows_key)
            if bank is not None and self.screening_percentile_ < 100 and key not in screens:
                regression = not self._is_classifier()
                sums = source.screen_sums(rows, bank_t, params["n_clusters"],
                                          self._n_outputs(), regression)
                screens[key] = torch.from_numpy(kept_clusters(
                    sums, self.screening_percentile_, regression=regression,
                    one_vs_rest=self.model == "logreg"))  # a linear model: each class, as FREM
            keep = screens.get(key)
            replicated = (self._replica_epochs(source, rows, seed, n_groupings, fixed, alpha,
                                               dropout, class_weight, keep)
                          if self.replicas > 1 else nullcontext())
            with replicated as run_epoch:
                fit(self.model_, optimizer,
                    epoch_batches=epoch_batches if run_epoch is None else None,
                    run_epoch=run_epoch, max_epochs=max_epochs,
                    bank=bank_t, device=self.device, validation=validation,
                    stopper=stopper if stop else None, start_epoch=start_epoch,
                    on_epoch_end=run.epoch_end, progress=bool(self.verbose) and run.label,
                    step_size=self._step_size(alpha, dropout), monitor=self.stop_on,
                    regression=not self._is_classifier(), class_weight=class_weight,
                    keep=None if keep is None else keep.to(self.device))
            if stop and stopper.best_state is not None:
                self.model_.load_state_dict(stopper.best_state)
        elif stopper.best_state is not None:
            self.model_.load_state_dict(stopper.best_state)
        # the model now holds the best epoch's weights: its snapshot (as large) is released
        stopper.best_state = None
        return run

    def _new_model(self, dropout: float, state: dict | None = None) -> torch.nn.Module:
        """A fresh model of the parameters and ``dropout``, on ``device``; with ``state``, its
        weights those (a state dict)."""
        model = build_model(self.model, self.n_features_in_, self._n_outputs(),
                            **model_dropout(self.regularizer, dropout),
                            hidden_layer_sizes=self.hidden_layer_sizes, grid=cnn_grid(self))
        if state is not None:
            model.load_state_dict(state)
        return model.to(self.device)

    @contextmanager
    def _replica_epochs(self, source, rows, seed, n_groupings, learning_rate, alpha, dropout,
                        class_weight, keep):
        """``run_epoch`` of :func:`~fgscale.training.fit` for ``replicas > 1``, over one
        :class:`~fgscale.training._replicas.ReplicaGroup` for the phase: its replicas start at
        the first epoch, hold ``model_``'s weights between epochs (each epoch's brought back
        into ``model_``) and stop when the block ends (on an error or Ctrl-C as well). Each
        replica trains on ``batch_size_`` rows of every step of the plan of ``replicas *
        batch_size_`` rows, with the bank, step size, screening and class weights of one
        process."""
        from fgscale.training._replicas import ReplicaGroup

        with ReplicaGroup(source.prefetcher.client, source, self.model_, rows,
                          replicas=self.replicas, batch_size=self.batch_size_, seed=seed,
                          n_groupings=n_groupings, learning_rate=learning_rate,
                          weight_decay=alpha, step_size=self._step_size(alpha, dropout),
                          regression=not self._is_classifier(), class_weight=class_weight,
                          keep=keep) as group:
            yield lambda epoch: group.run_epoch(epoch)["train_loss"]

    # ------------------------------------------------------------------ data out

    def _outputs(self, X) -> np.ndarray:
        """The model's outputs on rows or images ``X``, shape (n_samples, n_outputs)."""
        from fgscale.training._loop import predict_logits

        check_is_fitted(self)
        X = validate_data(self, self._rows_in(X), dtype=np.float32, reset=False)
        return predict_logits(self._placed_model(), self._standardized_blocks(X),
                              device=self.device)

    def _standardized_blocks(self, X: np.ndarray):
        # each block standardized into a copy, then to float64 to predict: 256 MB at most
        block = int(np.clip((1 << 25) // max(X.shape[1], 1), 1, 4096))
        for i in range(0, len(X), block):
            x = X[i : i + block]
            if self.mean_ is not None:
                x = standardize_rows(x, self.mean_, self.scale_)
            yield x

    def _placed_model(self) -> torch.nn.Module:
        """``model_`` on ``device``, checked: set since the fit, or a pickle's (on the CPU)."""
        check_device(self.device)
        return self.model_.to(self.device)

    def __getstate__(self):
        # The model on the CPU: a run trained on a GPU node loads on a CPU-only one.
        state = super().__getstate__()
        model = state.get("model_")
        if model is not None and any(p.device.type != "cpu" for p in model.parameters()):
            state["model_"] = copy.deepcopy(model).cpu()
        return state
