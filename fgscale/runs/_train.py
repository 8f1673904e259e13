"""Training a run on a store: :func:`train_run` (``fgscale train``) writes a run folder, whose
files :mod:`fgscale.runs._folder` writes and reads; :func:`summary_lines` says what it did.
"""

from __future__ import annotations

import logging
import time

from fgscale._dask.client import deferred_cluster, get_client
from fgscale._utils.files import exclusive_name
from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.estimators._factory import make_estimator
from fgscale.estimators._params import params_to_json
from fgscale.runs._folder import RunFolder
from fgscale.runs._listing import model_label, test_score
from fgscale.runs._maps import has_maps
from fgscale.runs._reports import (
    score_store,
)
from fgscale.store._reader import open_store

__all__ = ["summary_lines", "train_run"]

log = logging.getLogger(__name__)


def train_run(store_path, out, *, params: dict | None = None, resume: bool = False,
              client=None, task: str = "auto") -> dict:
    """Train an estimator on a store, streaming, into a run folder.

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
        Default the active ``distributed`` client, else an embedded LocalCluster, of threads
        up to 4 workers, of processes beyond (``processes="auto"`` of
        :func:`fgscale._dask.client.get_client`).
    task : {"auto", "classification", "regression"}, default="auto"
        :class:`FeatureGroupingClassifier` on the store's labels or
        :class:`~fgscale.estimators.FeatureGroupingRegressor` on its target
        (:func:`make_estimator`); on ``resume``, "auto" is the saved run's task.

    Returns
    -------
    summary : dict
        ``test``, the report on the store's test rows
        (:func:`fgscale.runs._scores.classification_report` or ``regression_report``), epochs
        run, seconds, the selected hyper-parameters, paths of the outputs (``maps``: the 4D
        map, beside maps.json and a 3D map per class; ``predictions``: each test row's
        prediction, as ``fgscale evaluate --predictions`` writes them). A run that had already ended with
        these parameters is not run again: its saved summary comes back, with
        ``already_complete`` set.
    """
    # a second command on the folder, its job submitted twice or resubmitted while the first
    # still runs, would write checkpoints and metrics between the first's
    with exclusive_name(out, busy=f"{out}: another fgscale train is running in this run folder; "
                                  "wait for it to end (--resume then finds its result), or "
                                  "choose another --out"):
        return _train_run(store_path, out, params=params, resume=resume, client=client,
                          task=task)


def _train_run(store_path, out, *, params, resume, client, task) -> dict:
    """:func:`train_run`, while it holds the run folder."""
    folder = RunFolder(out)
    store = open_store(store_path)
    # a bad parameter (or a GPU this machine lacks) stops before any write
    clf = make_estimator(store, params, folder.saved_task(task, resume))
    params = params_to_json(clf.get_params())  # every parameter, as saved
    fresh = not (folder / "config.json").exists()
    task = "classification" if isinstance(clf, FeatureGroupingClassifier) else "regression"
    done = folder.start(params, store, resume=resume, task=task)
    if done is not None:
        log.info("%s: already complete with these parameters, nothing to do", folder.path)
        return {**done, "already_complete": True}
    start = time.perf_counter()
    try:
        # the fit refuses what it would refuse before it starts the cluster, which the
        # evaluation then uses too
        # replicas each need a worker process of their own (as the estimator's own cluster)
        with deferred_cluster(processes=clf.replicas > 1 or "auto"):
            clf.fit(store, client=client, checkpoint=folder.checkpoints)
            with get_client(client, processes="auto") as client:
                test, table = _evaluate(clf, store, client, progress=bool(clf.verbose))
    except BaseException:
        if fresh:
            folder.forget_unstarted()
        raise
    seconds = time.perf_counter() - start
    folder.write_estimator(clf, store)
    maps = folder.write_maps(clf, store) if has_maps(clf) else None
    predictions = folder.write_predictions(table)
    refit = [h for h in clf.history_ if h.get("phase") == "refit"]
    summary = {"test": test, "n_train": int(store.train_rows().size),
               "epochs": len(clf.history_) - len(refit),
               "refit_epochs": len(refit), "seconds": round(seconds, 2), "n_iter": clf.n_iter_,
               # a resumed run's seconds are this command's; its epochs', those of all commands
               "resumed": bool(resume and not fresh),
               "epoch_seconds": round(sum(h.get("seconds", 0.0) for h in clf.history_), 2),
               "run": str(folder.path), "maps": None if maps is None else str(maps),
               "predictions": str(predictions),
               "selected": {"alpha": clf.alpha_, "dropout": clf.dropout_,
                            "n_clusters": clf.n_clusters_},
               "candidates": clf.cv_results_,
               # with cv, the epochs above are those of the chosen candidate's folds, summed
               "folds": len(next(iter(clf.cv_params_.values()))["n_epochs"])
               if getattr(clf, "cv_params_", None) else 1}
    folder.write_final(summary)
    return summary


def _evaluate(clf: FeatureGroupingClassifier, store, client, rows="test", *,
              progress: bool = False) -> tuple[dict, dict]:
    """The report and the per-row table of ``rows`` ("test", "train", "all")."""
    if rows == "test" and store.test_rows().size == 0:  # a run trained on all its rows
        log.warning("%s has no test rows (no split 'test' in its cohort table): no test "
                    "metrics", store.path)
    return score_store(clf, store, client, rows, progress=progress)


def summary_lines(summary: dict, params: dict) -> list[str]:
    """What ``fgscale train`` says of a run's summary (``final.json``): its epochs and the
    refit's, the test score, the values chosen among candidates, the run folder and its maps."""
    test = summary["test"]
    refit = f" (+ {summary['refit_epochs']} refit)" if summary.get("refit_epochs") else ""
    resumed = (f" this time, {summary['epoch_seconds']:.1f} s of epochs over all its sessions"
               if summary.get("resumed") else "")
    folds = summary.get("folds", 1)
    on = f" on {folds} folds" if folds > 1 else ""
    lines = [f"trained {model_label(params, 'r2' in test)} for {summary['epochs']} epochs{on}"
             f"{refit} in {summary['seconds']:.1f} s{resumed}; test {test_score(test)} on "
             f"{test['n']} rows" + ("" if test.get("chance") is None else
                                    f" (the most frequent class alone {test['chance']:.4f})")]
    candidates = summary.get("candidates") or []
    if len(candidates) > 1:  # the epochs above are the chosen candidate's
        said = []
        for key, value in summary.get("selected", {}).items():
            values = list(dict.fromkeys(c.get(key) for c in candidates))  # in the grid's order
            if len(values) > 1:
                said.append(f"{key} {_said(value)} (of {', '.join(map(_said, values))})")
        split = f"the mean of {folds} validation folds" if folds > 1 else "the validation split"
        lines.append(f"chosen on {split} among {len(candidates)} candidates: "
                     + ", ".join(said))
    maps = summary.get("maps", summary.get("weights"))  # "weights": a run of an older fgscale
    each = "the target's 3D map" if "r2" in test else "one 3D map per class"
    lines.append(f"run folder: {summary['run']} " + (
        "(no weight maps: the CNN has none)" if maps is None else
        f"(maps: {maps}, {each} in maps/, see maps.json); fgscale report RUN draws them"))
    return lines


def _said(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
