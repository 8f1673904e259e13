"""What a fitted classifier says about data: a prediction per row, and a classification report.

Every prediction comes from the estimator's own ``predict_proba`` on full rows: NIfTI images
are masked with the model's saved mask (:func:`fgscale.images.mask_images`), a store's rows
are read in blocks, here or streamed from Dask workers. A table is a dict of equal-length
columns (``row``/``path``, ``volume``, ``label``, then ``prediction`` and ``proba_<class>``),
written as CSV by :func:`write_table`; :func:`classification_report` scores one that has
labels, with :mod:`sklearn.metrics`.
"""

from __future__ import annotations

import csv
import itertools
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from fgscale._files import atomic_path
from fgscale._progress import tqdm
from fgscale.images._cohort import (
    TABLE_SUFFIXES,
    entry_headers,
    entry_volumes,
    named_columns,
    read_cohort,
)
from fgscale.images._masking import image_list, mask_images
from fgscale.images._nifti import same_grid
from fgscale.store._reader import Store, open_store

__all__ = ["ROWS", "STDOUT", "check_store", "check_table_name", "classification_report",
           "format_report", "predict_inputs", "proba_matrix", "regression_report", "score_store",
           "target_name", "write_table"]

ROWS = ("all", "train", "test")


def _proba_columns(clf, blocks: Iterable[tuple[dict, np.ndarray]], *, progress: bool = False,
                   total: int | None = None) -> dict:
    """The columns of ``(info, x)`` blocks: ``info``'s, then the prediction and probabilities
    of the rows ``x`` (n_rows, n_features), float32; ``progress`` shows a bar over the rows."""
    columns, probas = {}, []
    regression = not hasattr(clf, "classes_")  # a regressor: its prediction, no probability
    with tqdm(total=total, desc="predicting", unit="row", disable=not progress) as bar:
        for info, x in blocks:
            for name, values in info.items():
                columns.setdefault(name, []).extend(np.asarray(values).tolist())
            if len(x):
                probas.append(clf.predict(x) if regression else clf.predict_proba(x))
            bar.update(len(x))
    if regression:
        columns["prediction"] = np.concatenate(probas) if probas else np.empty(0)
        return columns
    proba = np.concatenate(probas) if probas else np.empty((0, len(clf.classes_)))
    columns["prediction"] = clf.classes_[proba.argmax(axis=1)] if len(proba) else []
    for j, c in enumerate(clf.classes_):
        columns[f"proba_{c}"] = proba[:, j]
    return columns


def proba_matrix(table: dict, classes) -> np.ndarray:
    """The ``proba_<class>`` columns of a table, shape (n_rows, n_classes)."""
    return np.column_stack([np.asarray(table[f"proba_{c}"], float) for c in classes])


# ---------------------------------------------------------------------------------- stores

def check_store(clf, store: Store) -> None:
    """``store``'s rows are the features ``clf`` was trained on: the same count and, when the
    model has a mask, the same mask on the same grid."""
    if store.n_features != clf.n_features_in_:
        raise ValueError(f"{store.path}: {store.n_features} features, the model was trained on "
                         f"{clf.n_features_in_}")
    mask = getattr(clf, "mask_img_", None)
    if mask is not None and (not same_grid(store.mask.shape, store.affine,
                                           (mask.shape, mask.affine))
                             or not np.array_equal(store.mask, np.asarray(mask.dataobj) != 0)):
        raise ValueError(f"{store.path}: its mask or grid differs from the model's mask: its "
                         "rows are other voxels (convert the images with the model's mask.nii.gz)")


def _store_rows(store: Store, rows) -> np.ndarray:
    if isinstance(rows, str):
        if rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
        return {"all": np.arange(store.n_samples, dtype=np.int64),
                "train": store.train_rows(), "test": store.test_rows()}[rows]
    return np.asarray(rows, dtype=np.int64)


def _store_info(store: Store, rows: np.ndarray) -> dict:
    info = {"row": rows, "path": store.source[rows], "volume": store.volume[rows]}
    if store.has_labels:
        info["label"] = store.classes[store.y[rows]]
    if store.target is not None:
        info["target"] = store.target[rows]
    return info


def _check_labels(clf, store: Store, rows: np.ndarray) -> None:
    if not hasattr(clf, "classes_"):
        if store.target is None:
            raise ValueError(f"{store.path}: no target to score a regression on")
        return
    if not store.has_labels:
        raise ValueError(f"{store.path}: no class labels to score a classifier on")
    known = set(map(str, clf.classes_))
    unknown = sorted(set(map(str, store.classes[np.unique(store.y[rows])])) - known)
    if unknown:
        raise ValueError(f"{store.path}: label(s) {unknown} the model does not know; its classes "
                         f"are {sorted(known)}")


def score_store(clf, store: Store, client, rows, *, progress: bool = False) -> tuple[dict, dict]:
    """Predict ``rows`` of a store, streamed from Dask workers, and score them.

    Parameters
    ----------
    clf : FeatureGroupingClassifier
        Fitted; standardizes the rows with its own ``mean_`` and ``scale_``.
    store : Store
    client : distributed.Client
    rows : ndarray of int or {"all", "train", "test"}
    progress : bool, default=False
        Show a progress bar over the rows (tqdm, on stderr).

    Returns
    -------
    report : dict
        :func:`classification_report`.
    table : dict
        One row per store row: ``row``, ``path``, ``volume``, ``label``, ``prediction``,
        ``proba_<class>``.
    """
    from fgscale.training._stream import StoreSource  # torch: not for image-only callers

    check_store(clf, store)
    rows = _store_rows(store, rows)
    _check_labels(clf, store, rows)
    targets = "labels" if hasattr(clf, "classes_") else "target"  # the y of each block
    source = StoreSource(client, store.path, prefetch=clf.prefetch, targets=targets)

    def blocks():
        start = 0
        for x, y in source.blocks(rows):
            yield _store_info(store, rows[start : start + len(y)]), x
            start += len(y)
        if not rows.size:  # the columns, empty
            yield _store_info(store, rows), np.empty((0, store.n_features), np.float32)

    table = _proba_columns(clf, blocks(), progress=progress, total=int(rows.size))
    if not hasattr(clf, "classes_"):
        return regression_report(table["target"], table["prediction"],
                                 target_name(store)), table
    return classification_report(table["label"], proba_matrix(table, clf.classes_),
                                 clf.classes_), table


def _store_blocks(store: Store, rows: np.ndarray) -> Iterator[tuple[dict, np.ndarray]]:
    for part, x in store.iter_blocks(rows):  # whole shards, in storage order
        yield _store_info(store, part), x


# ---------------------------------------------------------------------------------- images

def _image_blocks(clf, entries: list[dict], headers: list, volumes: list[range],
                  resample: bool, with_volume: bool):
    mask = getattr(clf, "mask_img_", None)
    # a cohort table's label and target, when any file has one: blank for the others
    copied = [c for c in ("label", "target") if any(e.get(c) not in (None, "") for e in entries)]
    # the rows of one 4D run listed by volume, one after another in the table: masked at once
    for path, run in itertools.groupby(zip(entries, headers, volumes, strict=True),
                                       key=lambda ehv: ehv[0]["path"]):
        x = mask_images(path, mask, resample=resample)
        for e, header, vs in run:
            info = {"path": [path] * len(vs)}
            if with_volume:
                info["volume"] = list(vs) if len(header.shape) == 4 else [""]
            for column in copied:
                info[column] = [e[column] if e.get(column) is not None else ""] * len(vs)
            yield info, x[vs.start:vs.stop]


def predict_inputs(clf, inputs, *, rows: str = "all", resample: bool = False,
                   progress: bool = False, columns: dict | None = None) -> dict:
    """A prediction per volume of NIfTI files, of a cohort table's files, or per store row.

    Parameters
    ----------
    clf : FeatureGroupingClassifier
        Fitted; images need its ``mask_img_``.
    inputs : list of str or Path
        NIfTI files (3D or 4D: one row per volume; a pattern such as ``"new/*.nii.gz"``
        stands for the files it matches, sorted); or one ``.csv``/``.tsv`` cohort table
        (:func:`fgscale.images.read_cohort`; its ``label`` or ``target`` column, when it has
        one, is copied, and may be empty); or one store (a directory).
    rows : {"all", "train", "test"}, default="all"
        The rows of a store, or the files of a cohort table, by their split.
    resample : bool, default=False
        Resample images on another grid to the mask's; by default they are refused.
    progress : bool, default=False
        Show a progress bar over the rows (tqdm, on stderr).
    columns : dict, optional
        A cohort table's columns to copy as ``label`` and ``target``, such as
        ``{"target": "age"}``; default the columns of those names.

    Returns
    -------
    table : dict
        Columns ``path`` (a store's: ``row``, ``path``, ``volume``), ``volume`` when a file is
        4D, ``label`` for a table or a store, ``prediction``, ``proba_<class>``.
    """
    inputs = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if not inputs:
        raise ValueError("no input given: NIfTI files, a cohort table or a store")
    if rows not in ROWS:
        raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
    is_table = len(inputs) == 1 and inputs[0].suffix.lower() in TABLE_SUFFIXES
    named_columns(columns, is_table)  # a store or NIfTI files have none
    if len(inputs) == 1 and (inputs[0].is_dir() or inputs[0].suffix == ".zarr"):  # or missing
        if resample:  # else ignored: a store's rows are already the mask's voxels
            raise ValueError(f"{inputs[0]}: resample applies to images; a store's rows are "
                             "read as they are (its voxels must be the run's)")
        store = open_store(inputs[0])
        check_store(clf, store)
        rows = _store_rows(store, rows)
        return _proba_columns(clf, _store_blocks(store, rows), progress=progress,
                              total=int(rows.size))
    if getattr(clf, "mask_img_", None) is None:
        raise ValueError("the model has no mask (fitted on arrays without one): it predicts "
                         "from a store or from arrays, not from images")
    if is_table:
        entries = [e for e in read_cohort(inputs[0], known=False, columns=columns)
                   if rows == "all" or (e["split"] == "test") == (rows == "test")]
        if not entries:
            raise ValueError(f"{inputs[0]}: no file with split {rows!r}")
    else:
        for p in inputs:
            if p.is_dir() or p.suffix.lower() in TABLE_SUFFIXES:
                raise ValueError(f"{p}: a store or a cohort table is given alone, not with "
                                 "other inputs")
        if rows != "all":
            raise ValueError("rows selects a store's rows or a cohort table's files by split; "
                             "NIfTI files have none")
        # a pattern the shell left alone (quoted, or no shell) names the files it matches
        entries = [{"path": str(p), "where": str(p), "volume": None}
                   for p in image_list([str(p) for p in inputs])]
    headers = entry_headers(entries)
    volumes = entry_volumes(entries, headers)
    with_volume = any(len(h.shape) == 4 for h in headers)
    return _proba_columns(clf, _image_blocks(clf, entries, headers, volumes, resample,
                                             with_volume),
                          progress=progress, total=sum(map(len, volumes)))


# ---------------------------------------------------------------------------------- reports

def classification_report(labels, proba: np.ndarray, classes) -> dict:
    """Scores of predictions against true labels.

    Parameters
    ----------
    labels : array-like of shape (n_rows,)
        True labels (compared to ``classes`` as strings).
    proba : ndarray of shape (n_rows, n_classes)
        Predicted probabilities, columns in the order of ``classes``.
    classes : array-like of shape (n_classes,)

    Returns
    -------
    report : dict
        ``n``, ``loss`` (mean cross-entropy), ``accuracy``, ``balanced_accuracy``,
        ``classes`` (as strings), ``per_class`` (class -> precision, recall, f1, support)
        and ``confusion_matrix`` (rows: true class, columns: predicted, in class order);
        the scores are None without rows. A class's recall is None when it has no true row,
        its precision when it is never predicted, its F1 (2 TP / (2 TP + FP + FN)) when
        neither: undefined, where scikit-learn's ``zero_division=0`` would say 0.
    """
    from sklearn import metrics

    names = [str(c) for c in classes]
    y_true = np.asarray(labels).astype(str)
    if y_true.size == 0:
        return {"n": 0, "loss": None, "accuracy": None, "balanced_accuracy": None,
                "classes": names, "per_class": None, "confusion_matrix": None}
    index = {c: i for i, c in enumerate(names)}
    unknown = sorted(set(y_true) - set(index))
    if unknown:
        raise ValueError(f"label(s) {unknown} are not among the classes {names}")
    true_idx = np.array([index[c] for c in y_true])
    pred = np.asarray(names)[proba.argmax(axis=1)]
    # the probability of the true class, floored where float64 rounds it to 0
    picked = np.maximum(proba[np.arange(len(true_idx)), true_idx], np.finfo(float).tiny)
    confusion = metrics.confusion_matrix(y_true, pred, labels=names)
    hits, support, predicted = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
    with warnings.catch_warnings():  # a class predicted but absent from the labels
        warnings.simplefilter("ignore", UserWarning)
        balanced = metrics.balanced_accuracy_score(y_true, pred)
    return {"n": int(y_true.size), "loss": float(-np.log(picked).mean()),
            "accuracy": float(metrics.accuracy_score(y_true, pred)),
            "balanced_accuracy": float(balanced), "classes": names,
            # F1 = 2 TP / (2 TP + FP + FN) = 2 TP / (support + predicted)
            "per_class": {c: {"precision": _ratio(hits[i], predicted[i]),
                              "recall": _ratio(hits[i], support[i]),
                              "f1": _ratio(2 * hits[i], support[i] + predicted[i]),
                              "support": int(support[i])}
                          for i, c in enumerate(names)},
            "confusion_matrix": confusion.tolist()}


def _ratio(part, whole) -> float | None:
    """``part / whole``, None when there is nothing to divide by: a recall without true rows,
    a precision without predicted rows is undefined, not 0 (a model failing on the class)."""
    return float(part / whole) if whole else None


def target_name(store: Store) -> str:
    """The name of a store's target: the cohort table's column it was converted from
    (``--target-column``), else "target" (a store written from arrays, or by an fgscale that
    did not keep it)."""
    return store.attrs.get("target_name") or "target"


def regression_report(targets, predictions, target: str = "target") -> dict:
    """Scores of predicted against true targets: ``n``, ``r2`` (as scikit-learn's
    ``r2_score``), ``mae``, ``rmse`` and Pearson's ``correlation`` (None without rows, or
    where undefined: R² on targets that do not vary, where ``r2_score`` would say 1 or 0),
    and ``target``, the name of what is scored (:func:`target_name`)."""
    from sklearn import metrics

    y, pred = np.asarray(targets, float), np.asarray(predictions, float)
    if y.size == 0:
        return {"target": target, "n": 0, "r2": None, "mae": None, "rmse": None,
                "correlation": None}
    varies = y.size > 1 and y.std() > 0
    defined = varies and pred.std() > 0
    return {"target": target, "n": int(y.size),
            "r2": float(metrics.r2_score(y, pred)) if varies else None,
            "mae": float(metrics.mean_absolute_error(y, pred)),
            "rmse": float(np.sqrt(metrics.mean_squared_error(y, pred))),
            "correlation": float(np.corrcoef(y, pred)[0, 1]) if defined else None}


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                      enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def _shown(value, spec: str) -> str:
    """A score as printed: ``n/a`` where it is undefined (None)."""
    return "n/a" if value is None else format(value, spec)


def format_report(report: dict) -> str:
    """A :func:`classification_report` as lines of text: the scores, a table per class and the
    confusion matrix."""
    if not report["n"]:
        return "no rows to score"
    if "r2" in report:  # as the accuracy's line below, naming the target scored
        return f"{report.get('target', 'target')} on {report['n']} rows: " + ", ".join(
            f"{k} {_shown(report[k], '.4f')}"
            for k in ("r2", "mae", "rmse", "correlation"))
    lines = [f"{report['n']} rows: accuracy {report['accuracy']:.4f}, balanced accuracy "
             f"{report['balanced_accuracy']:.4f}, loss {report['loss']:.4f}", ""]
    classes = report["classes"]
    lines += _columns([["class", "precision", "recall", "f1", "support"]] + [
        [c, *(_shown(report["per_class"][c][k], ".3f") for k in ("precision", "recall", "f1")),
         str(report["per_class"][c]["support"])] for c in classes])
    if any(v is None for scores in report["per_class"].values() for v in scores.values()):
        lines.append("n/a: undefined, the class has no true row (recall) or no prediction "
                     "(precision)")
    lines += ["", "confusion matrix (rows: true class, columns: predicted)"]
    lines += _columns([["", *classes]] + [[c, *map(str, counts)] for c, counts in
                                          zip(classes, report["confusion_matrix"], strict=True)])
    return "\n".join(lines)


STDOUT = "-"  # a table's name for the standard output, as Unix tools read it
# names a table of predictions is not written as: the CSV would sit under a spreadsheet's,
# an array's or an image's name and be read (or refused) as one
_NOT_TEXT = (".xlsx", ".xls", ".ods", ".parquet", ".feather", ".json", ".npy", ".npz", ".h5",
             ".hdf5", ".pkl", ".pickle", ".nii", ".gz", ".zarr", ".html")


def check_table_name(path, option: str) -> None:
    """Refuse, before any work, a name for a table of predictions that says another format
    than the CSV (or TSV) it would get: ``option`` names the argument in the message."""
    suffix = "" if str(path) == STDOUT else Path(path).suffix.lower()
    if suffix in _NOT_TEXT:
        raise ValueError(f"{path}: a {suffix} name, but {option} is written as CSV; give a "
                         ".csv name (.tsv: tab-separated), or - for the standard output")


def write_table(table: dict, path) -> Path:
    """Write a table (dict of equal-length columns) as CSV, tab-separated for a ``.tsv`` name
    (as BIDS tables are), under a temporary name then renamed, or on the standard output for
    ``"-"``; floats keep every digit."""
    path = Path(path)
    names = list(table)
    columns = [np.asarray(table[n]).tolist() for n in names]
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","

    def write(f):
        # not csv's \r\n: grep, cut, awk
        writer = csv.writer(f, delimiter=delimiter, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(zip(*columns, strict=True))

    if str(path) == STDOUT:
        write(sys.stdout)
        sys.stdout.flush()
        return path
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        write(f)
    return path
