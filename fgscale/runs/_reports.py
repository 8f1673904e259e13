"""What a fitted estimator says about data: a prediction per row, and its scores.

Every prediction comes from the estimator's own ``predict_proba`` on full rows: NIfTI images
are masked with the model's saved mask (:func:`fgscale.images.mask_images`), a store's rows
are read in blocks, here or streamed from Dask workers. A table is a dict of equal-length
columns (``row``/``path``, ``volume``, ``label``, then ``prediction`` and ``proba_<class>``),
written as CSV by :func:`write_table`; :mod:`fgscale.runs._scores` scores one that has labels or
targets.
"""

from __future__ import annotations

import csv
import itertools
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from fgscale._utils.files import atomic_path
from fgscale._utils.progress import tqdm
from fgscale.images._cohort import (
    TABLE_SUFFIXES,
    entry_headers,
    entry_volumes,
    named_columns,
    read_cohort,
)
from fgscale.images._masking import image_list, mask_images
from fgscale.images._nifti import same_grid
from fgscale.runs._scores import classification_report, regression_report
from fgscale.store._reader import Store, open_store

__all__ = ["ROWS", "STDOUT", "check_store", "check_table_name", "predict_inputs", "proba_matrix",
           "score_store", "target_name", "write_table"]

ROWS = ("all", "train", "test")
STDOUT = "-"  # a table's name for the standard output, as Unix tools read it
# names a table of predictions is not written as: the CSV would sit under a spreadsheet's,
# an array's or an image's name and be read (or refused) as one
_NOT_TEXT = (".xlsx", ".xls", ".ods", ".parquet", ".feather", ".json", ".npy", ".npz", ".h5",
             ".hdf5", ".pkl", ".pickle", ".nii", ".gz", ".zarr", ".html")


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
                         "rows are other voxels; convert the images again with fgscale "
                         "convert --mask RUN/mask.nii.gz (the model's mask), or predict the "
                         "NIfTI images themselves (--resample on another grid)")


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
    source = StoreSource(client, store, prefetch=clf.prefetch, targets=targets)

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


def target_name(store: Store) -> str:
    """The name of a store's target: the cohort table's column it was converted from
    (``--target-column``), else "target" (a store written from arrays, or by an fgscale that
    did not keep it)."""
    return store.attrs.get("target_name") or "target"


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
