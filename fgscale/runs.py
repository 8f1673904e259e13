"""Training runs on a store: :func:`train_run` (``fgscale train``), :func:`evaluate_run`,
:func:`predict_run` and :func:`load_run`, each on a run folder whose files
:mod:`fgscale._run_folder` writes and reads.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from fgscale._cli_runs import model_label, test_score
from fgscale._files import atomic_path, check_writable, exclusive_name
from fgscale._params import check_device, params_to_json
from fgscale._run_folder import RunFolder
from fgscale.cluster import get_client
from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.estimators._factory import make_estimator
from fgscale.maps import has_maps
from fgscale.reports import (
    STDOUT,
    check_store,
    check_table_name,
    predict_inputs,
    score_store,
    write_table,
)
from fgscale.store._reader import open_store

__all__ = ["RunFolder", "atomic_path", "evaluate_run", "load_run", "predict_line", "predict_run",
           "summary_lines", "train_run"]

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
        :func:`fgscale.cluster.get_client`).
    task : {"auto", "classification", "regression"}, default="auto"
        :class:`FeatureGroupingClassifier` on the store's labels or
        :class:`~fgscale.estimators.FeatureGroupingRegressor` on its target
        (:func:`make_estimator`); on ``resume``, "auto" is the saved run's task.

    Returns
    -------
    summary : dict
        ``test``, the report on the store's test rows
        (:func:`fgscale.scores.classification_report` or ``regression_report``), epochs
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
    clf = make_estimator(store, params, folder.saved_task(task, resume))
    clf._check_params(warn_level=3)  # a bad parameter (or a GPU this machine lacks) stops before any write
    params = params_to_json(clf.get_params())  # every parameter, as saved
    fresh = not (folder / "config.json").exists()
    task = "classification" if isinstance(clf, FeatureGroupingClassifier) else "regression"
    done = folder.start(params, store, resume=resume, task=task)
    if done is not None:
        log.info("%s: already complete with these parameters, nothing to do", folder.path)
        return {**done, "already_complete": True}
    start = time.perf_counter()
    try:
        # what the fit refuses before its cluster starts, refused before this one starts
        clf._store_plan(store, store.train_rows(), clf._seed())
        with get_client(client, processes="auto") as client:
            clf._fit_store(store.path, client, folder.checkpoints)
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
               "candidates": clf.cv_results_}
    folder.write_final(summary)
    return summary


def _evaluate(clf: FeatureGroupingClassifier, store, client, rows="test", *,
              progress: bool = False) -> tuple[dict, dict]:
    """The report and the per-row table of ``rows`` ("test", "train", "all")."""
    if rows == "test" and store.test_rows().size == 0:  # a run trained on all its rows
        log.warning("%s has no test rows (no split 'test' in its cohort table): no test "
                    "metrics", store.path)
    return score_store(clf, store, client, rows, progress=progress)


def load_run(run_dir, *, device: str | None = None) -> FeatureGroupingClassifier:
    """The fitted estimator of a finished run folder: the supported way for Python users.

    It loads data only (JSON, ``.npz`` arrays without pickles, the NIfTI mask): nothing in
    the folder can run code, unlike a pickle.

    Parameters
    ----------
    run_dir : str or Path
        A run folder written by :func:`train_run` (or ``fgscale train``).
    device : str, optional
        The torch device to predict on; by default the run's own, or the CPU where this
        machine has no such device (a run trained on a GPU node, used on a login node).

    Returns
    -------
    estimator : FeatureGroupingClassifier
        Fitted: ``predict``, ``predict_proba`` and ``score`` give what the trained one gave;
        ``mask_img_`` is the store's mask; ``bank_`` is None (the bank stays in the store).
    """
    clf = RunFolder(run_dir).read_estimator()
    if device is None:
        device = clf.device
        try:
            check_device(device)
        except ValueError as exc:
            log.warning("%s: using the CPU", exc)
            device = "cpu"
    else:
        check_device(device)
    return clf.set_params(device=device)


def summary_lines(summary: dict, params: dict) -> list[str]:
    """What ``fgscale train`` says of a run's summary (``final.json``): its epochs and the
    refit's, the test score, the values chosen among candidates, the run folder and its maps."""
    test = summary["test"]
    refit = f" (+ {summary['refit_epochs']} refit)" if summary.get("refit_epochs") else ""
    resumed = (f" this time, {summary['epoch_seconds']:.1f} s of epochs over all its sessions"
               if summary.get("resumed") else "")
    lines = [f"trained {model_label(params, 'r2' in test)} for {summary['epochs']} epochs"
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
        lines.append(f"chosen on the validation split among {len(candidates)} candidates: "
                     + ", ".join(said))
    maps = summary.get("maps", summary.get("weights"))  # "weights": a run of an older fgscale
    each = "the target's 3D map" if "r2" in test else "one 3D map per class"
    lines.append(f"run folder: {summary['run']} " + (
        "(no weight maps: the CNN has none)" if maps is None else
        f"(maps: {maps}, {each} in maps/, see maps.json); fgscale report RUN draws them"))
    return lines


def _said(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def evaluate_run(run_dir, store_path, *, device: str | None = None, client=None,
                 predictions=None, progress: bool = False, rows: str = "test") -> dict:
    """Score a trained run on a store's test rows (or others), streamed.

    Parameters
    ----------
    run_dir : str or Path
    store_path : str or Path
        A store of the run's mask (its own, or new subjects converted with its mask).
    device : str, optional
        As :func:`load_run`.
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster of thread
        workers: evaluation reads full rows, which worker processes would send over a socket.
    predictions : str or Path, optional
        Also write the per-row predictions there as CSV (``"-"``: on the standard output):
        ``row``, ``path``, ``volume``, ``label``, ``prediction``, ``proba_<class>``.
    progress : bool, default=False
        Show a progress bar over the rows (tqdm, on stderr).
    rows : {"test", "all", "train"}, default="test"
        The rows scored, by the split of the store's cohort table: "all" for new subjects
        converted without one.

    Returns
    -------
    report : dict
        :func:`fgscale.scores.classification_report` of the rows: n, loss, accuracy, chance,
        balanced accuracy, per-class precision, recall, f1 and support, confusion matrix.
    """
    clf = load_run(run_dir, device=device)
    store = open_store(store_path)
    if predictions is not None:  # not found unwritable once every row is predicted
        check_table_name(predictions, "--predictions")
        if str(predictions) != STDOUT:
            check_writable(predictions, "; choose another --predictions; nothing evaluated")
    check_store(clf, store)  # a store of other voxels: refused before a cluster starts
    if not isinstance(clf, FeatureGroupingClassifier):
        _check_target(RunFolder(run_dir).target(known=True), store)
    if rows in ("test", "train") and getattr(store, f"{rows}_rows")().size == 0:
        raise ValueError(f"{store.path}: no {rows} rows to score (its cohort table gave none the "
                         f"split {rows!r}); --rows all (rows='all') scores every row; nothing "
                         "evaluated")
    with get_client(client, processes=False) as client:  # full rows: no socket for them
        report, table = _evaluate(clf, store, client, rows, progress=progress)
    if predictions is not None:
        write_table(table, predictions)
    return report


def _check_target(trained: str | None, store) -> None:
    """Say when a regression run is scored on a store whose target is another column than the
    one it learnt (a mistake, or an outcome measured twice); not where either name is unknown
    (None: a store of arrays, or of an fgscale that did not keep it), which says nothing."""
    scored = store.attrs.get("target_name")
    if trained and scored and trained != scored:
        log.warning("%s: its target is %s, the run was trained on %s: the scores compare "
                    "predictions of %s with %s", store.path, scored, trained, trained, scored)


def predict_run(run_dir, inputs, out, *, rows: str = "all", resample: bool = False,
                device: str | None = None, progress: bool = False,
                columns: dict | None = None) -> dict:
    """Predict NIfTI files, a cohort table's files or a store's rows with a trained run, into
    a CSV; reads only the run folder and the inputs (no cluster).

    Parameters
    ----------
    run_dir : str or Path
    inputs : list of str or Path
        NIfTI files (3D or 4D), or one cohort table, or one store
        (:func:`fgscale.reports.predict_inputs`).
    out : str or Path
        The CSV (``"-"``: the standard output): one line per volume or store row,
        ``prediction`` and ``proba_<class>``.
    rows : {"all", "train", "test"}, default="all"
        A store's rows, or a cohort table's files, by split.
    resample : bool, default=False
        Resample images on another grid to the run's mask's; by default they are refused.
    device : str, optional
        As :func:`load_run`.
    progress : bool, default=False
        Show a progress bar over the rows (tqdm, on stderr).
    columns : dict, optional
        A cohort table's columns to copy as ``label`` and ``target``, such as
        ``{"target": "age"}`` (:func:`fgscale.images.read_cohort`).

    Returns
    -------
    summary : dict
        ``n`` predictions, ``out``; the ``counts`` of each predicted class, or a regressor's
        ``target`` (the name of its column) and ``min``, ``mean`` and ``max`` prediction
        (:func:`predict_line` says it).
    """
    clf = load_run(run_dir, device=device)
    check_table_name(out, "--out")
    if str(out) != STDOUT:
        check_writable(out, "; choose another --out; nothing predicted")
    table = predict_inputs(clf, inputs, rows=rows, resample=resample, progress=progress,
                           columns=columns)
    summary, predicted = {"out": str(write_table(table, out))}, np.asarray(table["prediction"])
    summary["n"] = len(predicted)
    if not isinstance(clf, FeatureGroupingClassifier):
        return {**summary, "target": RunFolder(run_dir).target(),
                **{f.__name__: float(f(predicted)) for f in (np.min, np.mean, np.max)}}
    labels, counts = np.unique(predicted.astype(str), return_counts=True)
    return {**summary, "counts": dict(zip(labels.tolist(), counts.tolist(), strict=True))}


def predict_line(summary: dict) -> str:
    """What ``fgscale predict`` says of :func:`predict_run`'s summary: how many predictions (of
    which target) went where, and the count of each class or the predictions' range."""
    if "counts" in summary:
        return (f"{summary['n']} predictions written to {summary['out']} ("
                + ", ".join(f"{label} {n}" for label, n in summary["counts"].items()) + ")")
    return (f"{summary['n']} predictions of {summary.get('target', 'target')} written to "
            f"{summary['out']} (" + ", ".join(f"{k} {summary[k]:.4g}" for k in ("min", "mean",
                                                                              "max")) + ")")
