"""Using a trained run: :func:`load_run` (the fitted estimator, loaded as data),
:func:`evaluate_run` (``fgscale evaluate``: scores on a store's rows) and :func:`predict_run`
(``fgscale predict``: images, a cohort table, a store or a BIDS dataset's images predicted,
without a cluster).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fgscale._dask.client import get_client
from fgscale._utils.files import check_writable
from fgscale.estimators import FeatureGroupingClassifier
from fgscale.estimators._params import check_device
from fgscale.images import BidsCohort
from fgscale.runs._bids_inputs import bids_inputs
from fgscale.runs._folder import RunFolder
from fgscale.runs._reports import STDOUT, check_store, check_table_name, predict_inputs, write_table
from fgscale.runs._train import _evaluate
from fgscale.store import open_store

__all__ = ["evaluate_run", "load_run", "predict_line", "predict_run"]

log = logging.getLogger(__name__)


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
        :func:`fgscale.runs._scores.classification_report` of the rows: n, loss, accuracy, chance,
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
                columns: dict | None = None, bids_filter=None) -> dict:
    """Predict NIfTI files, a cohort table's files, a store's rows or a BIDS dataset's images
    with a trained run, into a CSV; reads only the run folder and the inputs (no cluster).

    Parameters
    ----------
    run_dir : str or Path
    inputs : list of str or Path, or BidsCohort
        NIfTI files (3D or 4D), or one cohort table, or one store
        (:func:`fgscale.runs._reports.predict_inputs`); or one BIDS dataset (a folder with
        ``dataset_description.json``), the images ``bids_filter`` selects predicted, or the
        images a :class:`fgscale.images.BidsCohort` of :func:`fgscale.images.read_bids` holds
        (every volume of each of its files; its labels and targets are not used).
    out : str or Path
        The CSV (``"-"``: the standard output; ``.tsv``: tabs): one line per volume or store
        row, ``prediction`` and ``proba_<class>``. For a BIDS dataset, ``path`` and each
        image's BIDS entities come first (:meth:`fgscale.images.BidsCohort.entity_table`:
        ``subject``, ``session``, ``task``, ``run``...; an entity named as a column of the
        predictions, such as ``label``, as ``entity_<name>``), then ``volume`` for a 4D image,
        ``prediction`` and ``proba_<class>``.
    rows : {"all", "train", "test"}, default="all"
        A store's rows, or a cohort table's files, by split; only "all" for a BIDS dataset
        (select its images with ``bids_filter``).
    resample : bool, default=False
        Resample images on another grid to the run's mask's; by default they are refused.
    device : str, optional
        As :func:`load_run`.
    progress : bool, default=False
        Show a progress bar over the rows (tqdm, on stderr).
    columns : dict, optional
        A cohort table's columns to copy as ``label`` and ``target``, such as
        ``{"target": "age"}`` (:func:`fgscale.images.read_cohort`); none for a BIDS dataset.
    bids_filter : dict, str, Path or list of str, optional
        With a BIDS dataset as ``inputs``: the entities its images must have, as
        :func:`fgscale.images.read_bids` takes them, such as ``{"space": "MNI152NLin2009cAsym",
        "suffix": "statmap", "sub": ["07", "08"]}``, ``["suffix=statmap", "sub=07,08"]`` or a
        JSON file of them (``fgscale predict --bids-filter``). Default: every NIfTI file of the
        dataset, which must then be of one kind. Refused with any other ``inputs``.

    Returns
    -------
    summary : dict
        ``n`` predictions, ``out``; the ``counts`` of each predicted class, or a regressor's
        ``target`` (the name of its column) and ``min``, ``mean`` and ``max`` prediction
        (:func:`predict_line` says it).
    """
    if not isinstance(inputs, (str, Path, BidsCohort)):
        inputs = list(inputs)  # read twice (BIDS or not, then predicted): a generator too
    cohort = bids_inputs(inputs, bids_filter, rows, columns)  # its mistakes before the run's
    clf = load_run(run_dir, device=device)
    check_table_name(out, "--out")
    if str(out) != STDOUT:
        check_writable(out, "; choose another --out; nothing predicted")
    if cohort is None:
        table = predict_inputs(clf, inputs, rows=rows, resample=resample, progress=progress,
                               columns=columns)
    else:
        entities = cohort.entity_table()
        table = _join_image_columns(entities, predict_inputs(
            clf, entities["path"], resample=resample, progress=progress))
    summary, predicted = {"out": str(write_table(table, out))}, np.asarray(table["prediction"])
    summary["n"] = len(predicted)
    if not isinstance(clf, FeatureGroupingClassifier):
        return {**summary, "target": RunFolder(run_dir).target(),
                **{f.__name__: float(f(predicted)) for f in (np.min, np.mean, np.max)}}
    labels, counts = np.unique(predicted.astype(str), return_counts=True)
    return {**summary, "counts": dict(zip(labels.tolist(), counts.tolist(), strict=True))}


def _join_image_columns(image_columns: dict, table: dict) -> dict:
    """The predictions ``table`` (a line per volume, its ``path`` as predicted) with each
    image's columns (``path``, then others: a value per image) after its ``path``, repeated
    for each of the image's volumes; a column named as one of the predictions' as
    ``entity_<name>``."""
    index = {str(path): i for i, path in enumerate(image_columns["path"])}
    lines = [index[str(path)] for path in table["path"]]
    joined = {"path": table["path"]}
    for name, values in image_columns.items():
        if name != "path":
            joined[f"entity_{name}" if name in table else name] = [values[i] for i in lines]
    joined.update((k, v) for k, v in table.items() if k != "path")
    return joined


def predict_line(summary: dict) -> str:
    """What ``fgscale predict`` says of :func:`predict_run`'s summary: how many predictions (of
    which target) went where, and the count of each class or the predictions' range."""
    if "counts" in summary:
        return (f"{summary['n']} predictions written to {summary['out']} ("
                + ", ".join(f"{label} {n}" for label, n in summary["counts"].items()) + ")")
    return (f"{summary['n']} predictions of {summary.get('target', 'target')} written to "
            f"{summary['out']} (" + ", ".join(f"{k} {summary[k]:.4g}" for k in ("min", "mean",
                                                                              "max")) + ")")
