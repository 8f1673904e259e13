"""Cohort tables: which NIfTI file holds which sample, its label, subject and split.

A cohort is a ``.csv``/``.tsv`` table with columns ``path``, ``label`` and optionally
``group`` (subject) and ``split`` (``train``/``test``), or a list of files / glob patterns with
one label per file. Reading a cohort opens no image: it checks the table and names the file
and line of every problem.
"""

from __future__ import annotations

import csv
import glob
from pathlib import Path

__all__ = ["read_cohort"]

_SPLITS = {"train", "test", ""}


def _read_table(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such cohort table")
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        missing = {"path", "label"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: cohort table lacks column(s) {sorted(missing)}; expected "
                             f"path,label[,group][,split], got {reader.fieldnames}")
        rows = []
        for line, rec in enumerate(reader, start=2):
            file = Path(rec["path"].strip())
            rows.append({"path": str(file if file.is_absolute() else path.parent / file),
                         "label": (rec.get("label") or "").strip(),
                         "group": (rec.get("group") or "").strip(),
                         "split": (rec.get("split") or "").strip().lower(),
                         "where": f"{path}:{line}"})
    return rows


def _read_globs(patterns, labels) -> list[dict]:
    patterns = [patterns] if isinstance(patterns, (str, Path)) else list(patterns)
    files = []
    for pattern in map(str, patterns):
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matched:
            raise FileNotFoundError(f"{pattern}: the pattern matches no file")
        files += matched
    if labels is None:
        raise ValueError("a list of files or globs needs labels (one per file, in sorted order)")
    if isinstance(labels, (str, Path)):
        label_file = Path(labels)
        if not label_file.is_file():
            raise FileNotFoundError(f"{label_file}: no such label file")
        labels = [s.strip() for s in label_file.read_text().splitlines() if s.strip()]
    if len(labels) != len(files):
        raise ValueError(f"got {len(labels)} labels for {len(files)} files; expected one label "
                         "per file, in the files' sorted order")
    return [{"path": f, "label": str(lab).strip(), "group": "", "split": "", "where": f}
            for f, lab in zip(files, labels, strict=True)]


def read_cohort(cohort, labels=None, classes=None) -> list[dict]:
    """Parse and check a cohort: one entry per file (no file is opened).

    Parameters
    ----------
    cohort : str or Path or list of str
        A ``.csv``/``.tsv`` table, or file paths / glob patterns (then ``labels`` is needed).
    labels : list of str or path to a text file (one label per line), optional
    classes : list of str, optional
        Allowed labels, in class-index order; default: the sorted labels found.

    Returns
    -------
    entries : list of dict
        Keys path, label, group, split, where (file and line, for messages).
    """
    is_table = isinstance(cohort, (str, Path)) and Path(cohort).suffix.lower() in (
        ".csv", ".tsv", ".tab")
    entries = _read_table(Path(cohort)) if is_table else _read_globs(cohort, labels)
    if not entries:
        raise ValueError(f"{cohort}: the cohort is empty")
    for e in entries:
        if not e["label"]:
            raise ValueError(f"{e['where']}: missing label for {e['path']}")
        if classes is not None and e["label"] not in classes:
            raise ValueError(f"{e['where']}: unknown label {e['label']!r} for {e['path']}; "
                             f"expected one of {list(classes)}")
        if e["split"] not in _SPLITS:
            raise ValueError(f"{e['where']}: split {e['split']!r} for {e['path']}; expected "
                             "'train', 'test' or empty")
    return entries
