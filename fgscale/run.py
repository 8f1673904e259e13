"""Training runs on a store: a run folder with the config, checkpoints, metrics and weight maps.

A run folder holds::

    config.json      the estimator's parameters, the store, the versions
    checkpoint.pt    model, optimiser, early-stopping and RNG state after the last epoch
    metrics.jsonl    one JSON line per epoch (train loss, validation loss and accuracy)
    estimator.pkl    the fitted estimator (without its bank), for ``fgscale evaluate``
    weights.nii.gz   first-layer weights as a 4D NIfTI image on the store's grid (one
                     volume per class for logistic regression, per hidden unit for the MLP)
    final.json       test metrics on the store's test rows and the run's summary
"""

from __future__ import annotations

import copy
import json
import logging
import pickle
import platform
import time
from pathlib import Path

from fgscale.checkpoint import atomic_path
from fgscale.cluster import get_client
from fgscale.estimator import RUNTIME_PARAMS, FeatureGroupingClassifier, check_device
from fgscale.nifti import unmask
from fgscale.store import open_store
from fgscale.stream import StoreSource
from fgscale.training import evaluate

__all__ = ["evaluate_run", "train_run"]

log = logging.getLogger(__name__)


def _write_json(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def train_run(store_path, out, *, params: dict | None = None, resume: bool = False,
              client=None, **cluster) -> dict:
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
    client : distributed.Client, optional
    **cluster
        Else, arguments of :func:`fgscale.cluster.get_client` (``scheduler``,
        ``scheduler_file``, ``n_workers``...): default an embedded LocalCluster of thread
        workers (``processes=False``), the fastest hand-over of blocks on one machine.

    Returns
    -------
    summary : dict
        Test metrics (on the store's test rows), epochs run, seconds, paths of the outputs.
    """
    out = Path(out)
    clf = FeatureGroupingClassifier(**(params or {}))
    clf._check_params()  # a bad parameter (or a GPU this machine lacks) stops before any write
    params = json.loads(json.dumps(clf.get_params(), default=str))  # every parameter, as saved
    if (out / "config.json").exists():
        if not resume:
            raise ValueError(f"{out}: a run already exists there; pass --resume to continue it "
                             "or choose another --out")
        saved = json.loads((out / "config.json").read_text())["params"]
        changed = sorted(k for k in params if k not in RUNTIME_PARAMS and saved.get(k) != params[k])
        if changed:
            raise ValueError(f"{out}: --resume with other parameters than the saved run "
                             f"({', '.join(changed)}; see {out / 'config.json'})")
    out.mkdir(parents=True, exist_ok=True)
    store = open_store(store_path)
    _write_json({"params": params, "store": str(store.path.resolve()),
                 "synthetic": bool(store.attrs.get("synthetic", False)),
                 "python": platform.python_version()}, out / "config.json")
    start = time.perf_counter()
    with get_client(client=client, **{"processes": False, **cluster}) as client:
        clf.fit(store.path, client=client, run_dir=out)
        test = _evaluate(clf, store, client)
    seconds = time.perf_counter() - start
    slim = copy.copy(clf)
    slim.bank_ = None  # the bank is in the store; the model alone predicts
    with atomic_path(out / "estimator.pkl") as tmp, open(tmp, "wb") as f:
        pickle.dump(slim, f)
    weights = unmask(clf.model_.first.weight.detach().cpu().numpy(), store.mask, store.affine)
    with atomic_path(out / "weights.nii.gz") as tmp:
        weights.to_filename(tmp)
    summary = {"test": test, "epochs": len(clf.history_), "seconds": round(seconds, 2),
               "n_clusters": clf.n_clusters_, "run": str(out),
               "weights": str(out / "weights.nii.gz")}
    _write_json(summary, out / "final.json")
    return summary


def _evaluate(clf: FeatureGroupingClassifier, store, client) -> dict:
    rows = store.test_rows()
    if rows.size == 0:
        log.warning("%s has no test rows: no test metrics", store.path)
        return {"loss": None, "accuracy": None, "n": 0}
    if list(clf.classes_) != list(store.classes):
        raise ValueError(f"{store.path}: classes {list(store.classes)} differ from the run's "
                         f"{list(clf.classes_)}")
    source = StoreSource(client, store.path, prefetch=clf.prefetch)
    return evaluate(clf._placed_model(), source.blocks(rows), device=clf.device)


def evaluate_run(run_dir, store_path, *, device: str | None = None, client=None,
                 **cluster) -> dict:
    """Score a trained run on a store's test rows, streamed; returns loss, accuracy, n.

    ``device`` is the torch device to evaluate on; by default the run's own, or the CPU
    where this machine has no such device (a run trained on a GPU node, scored on a login
    node).
    """
    path = Path(run_dir) / "estimator.pkl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained estimator (run fgscale train first)")
    with open(path, "rb") as f:
        clf = pickle.load(f)
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
    with get_client(client=client, **{"processes": False, **cluster}) as client:
        return _evaluate(clf, store, client)

