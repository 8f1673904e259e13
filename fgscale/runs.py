"""Run folders: the one module that writes and reads the files of a training run.

A run folder holds::

    config.json      the estimator's parameters, the store, the fgscale/torch/Python versions
    checkpoint.pt    model, optimiser, early-stopping and RNG state after the last epoch
    metrics.jsonl    one JSON line per epoch (train loss, validation loss and accuracy)
    estimator.pkl    the fitted estimator (without its bank), for ``fgscale evaluate``
    weights.nii.gz   first-layer weights as a 4D NIfTI image on the store's grid (one
                     volume per class for logistic regression, per hidden unit for the MLP)
    final.json       test metrics on the store's test rows and the run's summary

Every file is written under a temporary name and renamed (:func:`atomic_path`): a run killed
mid-write keeps the previous version of each file.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch

from fgscale._params import RUNTIME_PARAMS, check_device, params_to_json
from fgscale.cluster import get_client
from fgscale.estimators._base import _cuda, _History
from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.images._nifti import unmask
from fgscale.store._reader import open_store
from fgscale.training._loop import evaluate
from fgscale.training._stream import StoreSource

__all__ = ["RunFolder", "atomic_path", "cross_validate", "evaluate_run", "train_run"]

log = logging.getLogger(__name__)

@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    A crash mid-write leaves the previous file intact. The temporary name keeps the file's
    suffixes (``.nii.gz``, ``.json``) so that writers that look at them still work.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _versions() -> dict:
    try:
        fgscale_version = version("fgscale")
    except PackageNotFoundError:  # run from a source tree that was not installed
        fgscale_version = "unknown"
    return {"fgscale": fgscale_version, "torch": torch.__version__,
            "python": platform.python_version()}


class RunFolder:
    """The files of one run folder (see the module docstring), read and written here only.

    Parameters
    ----------
    path : str or Path
    """

    def __init__(self, path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def _write_json(self, obj, name: str) -> None:
        with atomic_path(self / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")

    def start(self, params: dict, store, *, resume: bool) -> dict | None:
        """Check that a run may start (or resume) here, then write ``config.json``.

        A folder with a run in it is refused unless ``resume``, and then only with the same
        parameters, bar :data:`RUNTIME_PARAMS`. Returns the summary of a run that already ended
        with exactly these parameters (nothing is written then), else None.
        """
        config = self / "config.json"
        if config.exists():
            if not resume:
                raise ValueError(f"{self.path}: a run already exists there; pass --resume to "
                                 "continue it or choose another --out")
            saved = json.loads(config.read_text())["params"]
            changed = sorted(k for k in params
                             if k not in RUNTIME_PARAMS and saved.get(k) != params[k])
            if changed:
                raise ValueError(f"{self.path}: --resume with other parameters than the saved "
                                 f"run ({', '.join(changed)}; see {config})")
            final = self / "final.json"
            if saved == params and final.exists():
                return json.loads(final.read_text())
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_json({"params": params, "store": str(store.path.resolve()),
                          "synthetic": bool(store.attrs.get("synthetic", False)),
                          "versions": _versions()}, "config.json")
        return None

    def checkpoints(self, estimator, optimizer, stopper) -> _Checkpoints:
        """The estimator's per-epoch hook: a checkpoint and the metrics after every epoch."""
        return _Checkpoints(self, estimator, optimizer, stopper)

    def write_estimator(self, clf) -> None:
        slim = copy.copy(clf)
        slim.bank_ = None  # the bank is in the store; the model alone predicts
        with atomic_path(self / "estimator.pkl") as tmp, open(tmp, "wb") as f:
            pickle.dump(slim, f)

    def read_estimator(self):
        path = self / "estimator.pkl"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no trained estimator (run fgscale train first)")
        with open(path, "rb") as f:
            return pickle.load(f)

    def write_weights(self, weight, store) -> Path:
        """First-layer weights ``weight`` (n_outputs, n_features) as a NIfTI on the store's grid."""
        path = self / "weights.nii.gz"
        with atomic_path(path) as tmp:
            unmask(weight, store.mask, store.affine).to_filename(tmp)
        return path

    def write_final(self, summary: dict) -> None:
        self._write_json(summary, "final.json")


class _Checkpoints(_History):
    """Checkpoints and per-epoch metrics of one fit in a run folder."""

    def __init__(self, folder: RunFolder, estimator, optimizer, stopper):
        super().__init__(estimator, optimizer, stopper)
        self.folder = folder
        self.params = {k: v for k, v in params_to_json(estimator.get_params()).items()
                       if k not in RUNTIME_PARAMS}
        self.gpu = _cuda(estimator.device)  # its generator is checkpointed

    def resume(self) -> int:
        """Load the checkpoint if there is one; return the first epoch left to run."""
        path = self.folder / "checkpoint.pt"
        if not path.exists():
            return 0
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["params"] != self.params:
            changed = sorted(k for k in self.params if state["params"].get(k) != self.params[k])
            raise ValueError(f"{path}: saved with other parameters ({', '.join(changed)}); "
                             "use a new run folder")
        self.estimator.model_.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.stopper is not None:
            self.stopper.load_state_dict(state["stopper"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and self.gpu is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.gpu)
        self.history = state["history"]
        log.info("resumed %s after epoch %d", self.folder.path, state["epoch"])
        return state["epoch"] + 1

    def epoch_end(self, metrics: dict) -> None:
        super().epoch_end(metrics)
        cuda_rng = None if self.gpu is None else torch.cuda.get_rng_state(self.gpu)
        state = {"epoch": metrics["epoch"], "model": self.estimator.model_.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state(),
                 "cuda_rng": cuda_rng,
                 "stopper": None if self.stopper is None else self.stopper.state_dict(),
                 "history": self.history, "params": self.params}
        with atomic_path(self.folder / "checkpoint.pt") as tmp:
            torch.save(state, tmp)
        with atomic_path(self.folder / "metrics.jsonl") as tmp:
            tmp.write_text("".join(json.dumps(h) + "\n" for h in self.history))


def train_run(store_path, out, *, params: dict | None = None, resume: bool = False,
              client=None) -> dict:
    """Train a :class:`FeatureGroupingClassifier` on a store, streaming, into a run folder.

    Parameters
    ----------
    store_path : str or Path
        A complete store.
    out : str or Path
        The run folder. An existing run is refused unless ``resume``: then the checkpoint
        is continued, and the run ends with the parameters of an uninterrupted one.
    params : dict, optional
        Estimator parameters (``model``, ``regularizer``, ``random_state``...).
    resume : bool, default=False
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster of thread
        workers, the fastest hand-over of blocks on one machine.

    Returns
    -------
    summary : dict
        Test metrics (on the store's test rows), epochs run, seconds, paths of the outputs.
    """
    folder = RunFolder(out)
    clf = FeatureGroupingClassifier(**(params or {}))
    clf._check_params()  # a bad parameter (or a GPU this machine lacks) stops before any write
    params = params_to_json(clf.get_params())  # every parameter, as saved
    store = open_store(store_path)
    done = folder.start(params, store, resume=resume)
    if done is not None:
        log.warning("%s: already complete with these parameters, nothing to do", folder.path)
        return done
    start = time.perf_counter()
    with get_client(client, processes=False) as client:
        clf._fit_store(store.path, client, folder.checkpoints)
        test = _evaluate(clf, store, client)
    seconds = time.perf_counter() - start
    folder.write_estimator(clf)
    weights = folder.write_weights(clf.model_.first.weight.detach().cpu().numpy(), store)
    refit = [h for h in clf.history_ if h.get("phase") == "refit"]
    summary = {"test": test, "epochs": len(clf.history_) - len(refit),
               "refit_epochs": len(refit), "seconds": round(seconds, 2),
               "n_iter": clf.n_iter_, "run": str(folder.path), "weights": str(weights),
               "selected": {"alpha": clf.alpha_, "dropout": clf.dropout_,
                            "n_clusters": clf.n_clusters_},
               "candidates": clf.cv_results_}
    folder.write_final(summary)
    return summary


def cross_validate(store_path, *, params: dict | None = None, n_folds: int = 5, client=None,
                   echo=None) -> dict:
    """K-fold cross-validation on a store's training rows, each fold trained by streaming.

    Folds are grouped by the store's ``group`` column when every row has one (rows of a
    subject never straddle folds), else stratified by class. Each fold standardizes with, and
    builds its banks from, its own training rows; the store's test rows are never read.

    Parameters
    ----------
    store_path : str or Path
    params : dict, optional
        Estimator parameters.
    n_folds : int, default=5
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster of threads.
    echo : callable, optional
        Called with a line of text after each fold.

    Returns
    -------
    scores : dict
        ``folds`` (a dict per fold: loss, accuracy, rows, the chosen hyper-parameters),
        ``mean_accuracy``, ``std_accuracy``, ``grouped``.
    """
    from sklearn.model_selection import GroupKFold, StratifiedKFold

    clf = FeatureGroupingClassifier(**(params or {}))
    clf._check_params()
    store = open_store(store_path)
    rows = store.train_rows()
    groups = store.groups[rows]
    grouped = bool((groups != "").all() and len(set(groups)) >= n_folds)
    if grouped:
        splits = GroupKFold(n_splits=n_folds).split(rows, groups=groups)
    else:
        splits = StratifiedKFold(n_splits=n_folds, shuffle=True,
                                 random_state=clf._seed()).split(rows, store.y[rows])
    folds = []
    with get_client(client, processes=False) as client:
        for fold, (train, test) in enumerate(splits):
            model = FeatureGroupingClassifier(**clf.get_params())
            model._fit_store(store.path, client, rows=rows[train])
            metrics = _evaluate(model, store, client, rows[test], stats_rows=rows[train])
            folds.append({"fold": fold, "n_train": int(train.size), **metrics,
                          "selected": {"alpha": model.alpha_, "dropout": model.dropout_,
                                       "n_clusters": model.n_clusters_}})
            if echo is not None:
                echo(f"fold {fold}: accuracy {metrics['accuracy']:.4f} on {metrics['n']} rows "
                     f"(trained on {train.size}; {folds[-1]['selected']})")
    accuracy = np.array([f["accuracy"] for f in folds])
    return {"folds": folds, "mean_accuracy": float(accuracy.mean()),
            "std_accuracy": float(accuracy.std()), "grouped": grouped}


def _evaluate(clf: FeatureGroupingClassifier, store, client, rows=None, stats_rows=None) -> dict:
    rows = store.test_rows() if rows is None else rows
    if rows.size == 0:
        log.warning("%s has no test rows: no test metrics", store.path)
        return {"loss": None, "accuracy": None, "n": 0}
    if list(clf.classes_) != list(store.classes):
        raise ValueError(f"{store.path}: classes {list(store.classes)} differ from the run's "
                         f"{list(clf.classes_)}")
    source = StoreSource(client, store.path, prefetch=clf.prefetch,
                         standardize=clf.mean_ is not None, stats_rows=stats_rows)
    return evaluate(clf._placed_model(), source.blocks(rows), device=clf.device)


def evaluate_run(run_dir, store_path, *, device: str | None = None, client=None) -> dict:
    """Score a trained run on a store's test rows, streamed; returns loss, accuracy, n.

    ``device`` is the torch device to evaluate on; by default the run's own, or the CPU
    where this machine has no such device (a run trained on a GPU node, scored on a login
    node).
    """
    clf = RunFolder(run_dir).read_estimator()
    if device is None:
        device = clf.device
        try:
            check_device(device)
        except ValueError as exc:
            log.warning("%s: evaluating on the CPU", exc)
            device = "cpu"
    else:
        check_device(device)
    clf.set_params(device=device)
    store = open_store(store_path)
    if store.n_features != clf.n_features_in_:
        raise ValueError(f"{store.path}: {store.n_features} features, the run was trained on "
                         f"{clf.n_features_in_}")
    with get_client(client, processes=False) as client:
        return _evaluate(clf, store, client)
