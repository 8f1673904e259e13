"""Cohort tables: which NIfTI file holds which sample, its label or target, subject and split.

A cohort is a ``.csv``/``.tsv`` table with columns ``path``, ``label`` (a class name, for
classification) and/or ``target`` (a finite number, for regression), and optionally ``group``
(subject), ``split`` (``train``/``test``) and ``volume``; or a list of files / glob patterns
with one label per file. A table needs ``label`` or ``target`` (or both); when it has a column,
every row must fill it; a table of images to predict needs neither (``known=False``). A row
stands for all the volumes of its file (one of a 3D file), each with the row's label, or, with
a ``volume`` (0-based, as nibabel and FSL count them), for that volume alone: the volumes of
one 4D run labelled apart, as in nilearn's Haxby example. Reading a cohort opens no image: it
checks the table and names the file and line of every problem; :func:`entry_volumes` checks
the volumes against the files' headers.
"""

from __future__ import annotations

import csv
import glob
import logging
import math
import os
from collections import Counter
from pathlib import Path

__all__ = ["TABLE_SUFFIXES", "class_order", "entry_headers", "entry_name", "entry_volumes",
           "n_volumes", "named_columns", "read_cohort"]

log = logging.getLogger(__name__)

_SPLITS = {"train", "test", ""}
_COLUMNS = ("path", "label", "target", "group", "split", "volume")
# other names of the columns in common use (BIDS participants.tsv; nilearn's Haxby labels,
# whose chunks are its runs; pandas)
_ALIASES = {"label": ("labels",),
            "group": ("subject", "subject_id", "participant_id", "participant", "sub", "chunks"),
            "split": ("set", "subset")}
_NAMED = ("label", "target", "group")  # the columns that may be given another name
# columns that describe a row to the table's reader and that conversion does not need: a BIDS
# query's table has them (fgscale.images._bids), and no warning should call them unused
_DESCRIPTIVE = ("session", "run")
_EXPECTED = ("path,label[,target][,group][,split][,volume] or "
             "path,target[,group][,split][,volume]")
TABLE_SUFFIXES = (".csv", ".tsv", ".tab")  # a cohort table's; the last two tab-separated


def _parse_target(text: str, where: str, file: str, decimal_comma: bool = False) -> float:
    """A row's target as a float (``decimal_comma``: "1,5" is 1.5); an empty, non-numeric or
    non-finite value is an error."""
    text = text.strip().replace(",", ".") if decimal_comma else text.strip()
    if not text:
        raise ValueError(f"{where}: missing target for {file}; expected a finite number")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: target {text!r} for {file} is not a number; expected a "
                         "finite number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: target {text!r} for {file} is not finite; expected a "
                         "finite number")
    return value


def _parse_volume(text: str, where: str, file: str) -> int | None:
    """A row's volume (0-based), or None for an empty cell: all of the file's volumes."""
    text = text.strip()
    if not text:
        return None
    whole = text[:-2] if text.endswith(".0") else text  # pandas' floats, in a column with gaps
    if not (whole.isascii() and whole.isdigit()):  # "-1" (a count from the end) or "2.5"
        raise ValueError(f"{where}: volume {text!r} for {file}; expected the volume's index in "
                         "the file (an integer from 0), or an empty cell for all its volumes")
    return int(whole)


def _read_table(path: Path, known: bool = True, columns=None) -> tuple[list[dict], bool]:
    """The rows of a cohort table, and whether it has a ``label`` column (``known``: each row's
    label or target must be given, else either may be left out; ``columns``: as
    :func:`read_cohort`)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such cohort table")
    try:
        return _parse_table(path, known, columns or {})
    except (UnicodeDecodeError, csv.Error) as exc:  # bytes that are not a UTF-8 text table
        raise ValueError(f"{path}: not a readable text table ({type(exc).__name__}: {exc}); "
                         f"expected UTF-8 text with columns {_EXPECTED}") from None


def _delimiter(path: Path, f) -> str:
    """Tabs for a ``.tsv``/``.tab`` table; else commas, or semicolons where the header has them
    and no comma (a spreadsheet saved as CSV where the decimal mark is a comma, which its
    targets then have)."""
    if path.suffix.lower() in TABLE_SUFFIXES[1:]:
        return "\t"
    header = f.readline()
    f.seek(0)
    return ";" if ";" in header and "," not in header else ","


def _field_name(name: str) -> str:
    """A header's name as fgscale reads it: without the spaces typed around it ("path, label"),
    and a known column's in lower case ("Path", "Label", "Subject")."""
    name = name.strip()
    known = {*_COLUMNS, *(a for aliases in _ALIASES.values() for a in aliases)}
    return name.lower() if name.lower() in known else name


def _parse_table(path: Path, known: bool, given: dict) -> tuple[list[dict], bool]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        delimiter = _delimiter(path, f)
        reader = csv.DictReader(f, delimiter=delimiter)
        if reader.fieldnames:
            raw = [name.strip() for name in reader.fieldnames]
            reader.fieldnames = [_field_name(name) for name in raw]
            # a column given by the header's own name ("Subject"), found under the name read
            read_as = dict(zip(raw, reader.fieldnames, strict=True))
            given = {k: read_as.get(v, v) for k, v in given.items()}
        columns = set(reader.fieldnames or [])
        names = _column_names(path, list(reader.fieldnames or []), given)
        label, target = names["label"], names["target"]
        read = [c for c in reader.fieldnames or [] if c in {"path", *names.values()}]
        twice = sorted({c for c in read if read.count(c) > 1})
        if twice:  # csv keeps the last of them, without a word
            raise ValueError(f"{path}: column(s) {twice} named twice in the header; expected "
                             "each column once")
        if "path" not in columns:
            spaced = any("path" in name.lower().split() for name in reader.fieldnames or [])
            raise ValueError(f"{path}: cohort table lacks column(s) ['path']; expected "
                             f"{_EXPECTED}, got {reader.fieldnames}" + (
                                 "; its cells are separated by spaces: separate them by commas "
                                 "(.csv) or tabs (.tsv)" if spaced else ""))
        if known and not columns & {label, target}:
            raise ValueError(f"{path}: cohort table has neither a 'label' nor a 'target' "
                             f"column; expected {_EXPECTED}, got {reader.fieldnames}; read "
                             "another with --label-column NAME (columns={'label': NAME})")
        rows = []
        for rec in reader:
            line = reader.line_num  # the file's line: csv skips blank lines, not counted here
            if any("\n" in v or "\r" in v for v in rec.values() if isinstance(v, str)):
                raise ValueError(f"{path}:{line}: a cell runs over several lines, up to this one "
                                 "(a '\"' not closed?); expected one row per line")
            if not (rec["path"] or "").strip():  # else the table's folder, "missing label"
                raise ValueError(f"{path}:{line}: missing path; expected the NIfTI file of the "
                                 "row (a row of empty cells: remove it)")
            file = Path((rec["path"] or "").strip()).expanduser()  # as load_img reads a path
            file = str(file if file.is_absolute() else path.parent / file)
            where = f"{path}:{line}"
            extra = [c for c in rec.get(None) or [] if c.strip()]  # beyond the header's columns
            if extra:  # a comma inside an unquoted cell: every later cell is in the wrong column
                raise ValueError(f"{where}: {len(reader.fieldnames) + len(rec[None])} cells for "
                                 f"{len(reader.fieldnames)} columns (extra {extra}); quote a "
                                 "cell that holds the delimiter")
            rows.append({"path": file,
                         "label": (rec.get(label) or "").strip(),
                         "target": (_parse_target(rec.get(target) or "", where, file, delimiter == ";")
                                    if target in columns and (known or rec.get(target))
                                    else None),
                         "group": (rec.get(names["group"]) or "").strip(),
                         "split": (rec.get(names["split"]) or "").strip().lower(),
                         "volume": _parse_volume(rec.get("volume") or "", where, file),
                         "where": where})
    return rows, label in columns


def _column_names(path: Path, fieldnames: list[str], given: dict) -> dict:
    """Which column of the table holds ``label``, ``target`` and ``group`` (theirs, the one
    ``given``, or a common alias) and ``split`` (its name or an alias); an alias read is said
    at INFO (-v), and the columns fgscale does not read are listed once, as a warning."""
    unknown = sorted(set(given) - set(_NAMED))
    if unknown:
        raise ValueError(f"columns: {unknown} cannot be given another name; expected "
                         f"{', '.join(map(repr, _NAMED))}")
    names = {}
    for name in (*_NAMED, "split"):
        column = given.get(name)
        if column is not None and column not in fieldnames:
            raise ValueError(f"{path}: no column {column!r} to read as the {name} "
                             f"(--{name}-column); the table's columns are {fieldnames}")
        if column is None:
            found = [a for a in _ALIASES.get(name, ()) if a in fieldnames]
            column = name if name in fieldnames or not found else found[0]
            if column != name:  # a documented alias: said at -v, not on every command
                log.info("%s: reading column %r as %r", path, column, name)
        names[name] = column
    unused = [c for c in fieldnames if c not in ("path", "volume", *_DESCRIPTIVE, *names.values())]
    if unused:  # a label column of another name, unread: a target alone makes it regression
        hint = "" if names["label"] in fieldnames else "; --label-column NAME reads one as the labels"
        log.warning("%s: column(s) %s not used (fgscale reads %s)%s", path, unused,
                    ", ".join(_COLUMNS), hint)
    return names


def _refuse_folders(paths) -> None:
    """A folder among the images: named for what it is (a run folder, a store, images)."""
    for folder in (Path(p) for p in paths if Path(p).is_dir()):
        what = ("a run folder of fgscale train" if (folder / "config.json").is_file() else
                "already a store" if (folder / "zarr.json").is_file() else "a folder")
        glob_hint = f" such as '{folder / '*.nii.gz'}'" if what == "a folder" else ""
        raise ValueError(f"{folder}: {what}, not an image; give a cohort table, or NIfTI files "
                         f"or globs{glob_hint} with --labels")


def _read_globs(patterns, labels) -> list[dict]:
    patterns = [patterns] if isinstance(patterns, (str, Path)) else list(patterns)
    tables = [p for p in map(str, patterns) if Path(p).suffix.lower() in TABLE_SUFFIXES]
    if tables:  # else read as an image, with labels counted against it: a puzzling message
        raise ValueError(f"{tables[0]}: a cohort table is given alone, its labels in its own "
                         "column; labels (--labels) go with a list of NIfTI files or globs")
    text = next((p for p in map(str, patterns) if Path(p).suffix.lower() == ".txt"), None)
    if text is not None:  # nilearn's labels.txt, given as the cohort
        raise ValueError(f"{text}: a text file, not a NIfTI image nor a cohort table; a table "
                         f"(.csv, .tsv) has columns {_EXPECTED}: for labels of each volume of "
                         "4D runs (nilearn's labels.txt), a row per volume with its path, volume "
                         "(from 0) and label, its run as group")
    files = []
    for pattern in map(str, patterns):
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matched:
            raise FileNotFoundError(f"{pattern}: the pattern matches no file")
        _refuse_folders(matched)
        files += matched
    if labels is None:
        raise ValueError("a list of files or globs needs labels (--labels FILE: one per line, a "
                         "line per file in sorted order), or give a cohort table instead")
    if isinstance(labels, (str, Path)):
        label_file = Path(labels)
        if not label_file.is_file():
            raise FileNotFoundError(f"{label_file}: no such label file")
        try:  # utf-8-sig: a byte-order mark (Windows Notepad's) would be the first label's
            text = label_file.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{label_file}: not a readable label file ({exc}); expected UTF-8 "
                             "text, one label per line") from None
        labels = [s.strip() for s in text.splitlines() if s.strip()]
    if len(labels) != len(files):
        raise ValueError(f"got {len(labels)} labels for {len(files)} files; expected one label "
                         "per file, in the files' sorted order (a label per volume of 4D files: "
                         "a cohort table with a 'volume' column)")
    return [{"path": f, "label": str(lab).strip(), "target": None, "group": "", "split": "",
             "volume": None, "where": f} for f, lab in zip(files, labels, strict=True)]


def named_columns(columns: dict | None, is_table: bool) -> dict:
    """The columns given another name (``read_cohort``'s ``columns``, None values dropped);
    refused unless the inputs are a cohort table, the only inputs with columns."""
    columns = {k: v for k, v in (columns or {}).items() if v is not None}
    if columns and not is_table:
        raise ValueError("columns (--label-column, --target-column, --group-column) name "
                         "columns of a cohort table; give one (.csv or .tsv)")
    return columns


def read_cohort(cohort, labels=None, classes=None, *, known: bool = True,
                columns: dict | None = None) -> list[dict]:
    """Parse and check a cohort: one entry per file (no file is opened).

    Parameters
    ----------
    cohort : str or Path or list of str
        A ``.csv``/``.tsv`` table, or file paths / glob patterns (then ``labels`` is needed).
    labels : list of str or path to a text file (one label per line), optional
    classes : list of str, optional
        Allowed labels, in class-index order; default: the sorted labels found. Only for a
        cohort with labels.
    known : bool, default=True
        Whether every file's label or target must be given (a cohort to train or score on);
        False for images to predict, whose table may have neither column or leave them blank.
    columns : dict, optional
        The table's columns to read as ``label``, ``target`` and ``group``, such as
        ``{"target": "age"}`` (a BIDS participants.tsv); default the columns of those names,
        else a common alias (``labels``; ``subject``, ``participant_id``, ``chunks``, ...).

    Returns
    -------
    entries : list of dict
        Keys path, label ("" for a table without a ``label`` column), target (float, or None
        without a ``target`` column), group, split, volume (int, or None: all the file's
        volumes), where (file and line, for messages).
    """
    is_table = isinstance(cohort, (str, Path)) and Path(cohort).suffix.lower() in TABLE_SUFFIXES
    columns = named_columns(columns, is_table)
    entries, has_labels = _read_table(Path(cohort).expanduser(), known, columns) if is_table else (
        _read_globs(cohort, labels), True)
    if not entries:
        raise ValueError(f"{cohort}: the cohort is empty")
    if classes is not None and not has_labels:
        raise ValueError(f"{cohort}: classes were given but the cohort table has no 'label' "
                         "column")
    seen, by_volume = {}, {}
    for e in entries:
        # the file itself: a symlink to a listed file, or "sub/../x", is the same image (in
        # the training and the test rows, perhaps under another label)
        if "\0" in e["path"]:
            raise ValueError(f"{e['where']}: path {e['path']!r} holds a NUL byte; expected a "
                             "file name")
        real = os.path.realpath(e["path"])
        # a file is listed whole (volume None) once, or by distinct volumes, never both
        key = (real, e["volume"])
        if key in seen:
            _listed_again(e, *seen[key], again=True)
        clash = by_volume.get(real) if e["volume"] is None else seen.get((real, None))
        if clash:
            _listed_again(e, *clash, again=False)
        seen[key] = e["path"], e["where"]
        if e["volume"] is not None:
            by_volume.setdefault(real, seen[key])
        if known and has_labels and not e["label"]:
            raise ValueError(f"{e['where']}: missing label for {e['path']}")
        if classes is not None and e["label"] not in classes:
            raise ValueError(f"{e['where']}: unknown label {e['label']!r} for {e['path']}; "
                             f"expected one of {list(classes)}")
        if e["split"] not in _SPLITS:
            raise ValueError(f"{e['where']}: split {e['split']!r} for {e['path']}; expected "
                             "'train', 'test' or empty")
    _check_labels(entries, lone=known and has_labels)
    if classes is not None and known:
        found = {e["label"] for e in entries}
        empty = [c for c in classes if c not in found]
        if empty:
            log.warning("%s: class(es) %s (of the classes given) have no row: a model trained "
                        "on it has outputs it never learns", cohort, empty)
    return entries


def _listed_again(e: dict, first_path: str, first_where: str, again: bool):
    """Refuse a file (or one of its volumes) listed a second time (``again``), or listed whole
    and by volume, naming both rows."""
    whole = e["volume"] is None
    same = "" if first_path == e["path"] else f" (the same file as {first_path})"
    if again and e["volume"] is not None:
        raise ValueError(f"{e['where']}: volume {e['volume']} of {e['path']} is listed again"
                         f"{same} (first at {first_where}); expected each volume once")
    if again:
        raise ValueError(f"{e['where']}: {e['path']} is listed again{same} (first at "
                         f"{first_where}); each file must appear once (a 4D file gives one "
                         "row per volume by itself, each with the file's label: to label its "
                         "volumes apart, give a row per volume with a 'volume' column, its "
                         "index from 0)")
    raise ValueError(f"{e['where']}: {e['path']} is listed {'whole' if whole else 'by volume'}"
                     f"{same}, and {'by volume' if whole else 'whole'} at {first_where}; "
                     "expected either a row for the whole file (an empty volume) or a row per "
                     "volume")


def class_order(labels) -> list[str]:
    """The classes of ``labels`` (text) in the order of their indices: by value where every
    label is a number ("2" before "10", as scikit-learn orders numeric labels), else sorted as
    text."""
    names = set(labels)
    try:
        return sorted(names, key=float)
    except ValueError:
        return sorted(names)


def _check_labels(entries: list[dict], lone: bool) -> None:
    """Refuse labels written as different texts of one number ("1" and "1.0", "01": a column
    that a spreadsheet or pandas wrote as floats in part): labels are compared as text, so
    each would be a class of its own. With ``lone``, name in a warning a label of one row where
    every other has five or more: a typo ("Face" for "face") makes a class of one sample, too
    few for a validation split, found before any work."""
    counts = Counter(e["label"] for e in entries)
    single, most = [e for e in entries if counts[e["label"]] == 1], [n for n in counts.values() if n > 1]
    if lone and single and most and min(most) >= 5:
        log.warning("label(s) %s of one row each (%s), where the other classes have %d rows or "
                    "more: a typo? A class needs 2 rows for a validation split",
                    [e["label"] for e in single], ", ".join(e["where"] for e in single), min(most))
    seen = {}
    for e in entries:
        try:
            value = float(e["label"])
        except ValueError:
            continue
        first = seen.setdefault(value, e)
        if first["label"] != e["label"]:
            raise ValueError(f"{e['where']}: label {e['label']!r} and label {first['label']!r} "
                             f"(at {first['where']}) are one number written two ways; labels "
                             "are compared as text, so they would be two classes: write each "
                             "class alike")


def entry_name(entry: dict) -> str:
    """A cohort entry's file as messages name it: after its table's file and line, when it
    came from a table (a cohort of hundreds of rows: which line to fix)."""
    return entry["path"] if entry["where"] == entry["path"] else f"{entry['where']}: {entry['path']}"


def entry_headers(entries: list[dict]) -> list:
    """The NIfTI header of each entry's file (:func:`fgscale.images.read_header`), read once
    per file (a row per volume of a run lists it hundreds of times); a file that is missing or
    unreadable is named by :func:`entry_name`."""
    from fgscale.images._nifti import read_header

    headers, read = [], {}
    for e in entries:
        try:
            if e["path"] not in read:
                read[e["path"]] = read_header(e["path"])
            headers.append(read[e["path"]])
        except (FileNotFoundError, ValueError) as exc:
            if e["where"] == e["path"]:
                raise
            raise type(exc)(f"{e['where']}: {exc}") from None
    return headers


def n_volumes(header) -> int:
    """The volumes of a NIfTI file, by its header: 1 for a 3D file."""
    return header.shape[3] if len(header.shape) == 4 else 1


def entry_volumes(entries: list[dict], headers: list) -> list[range]:
    """The volumes of its file each entry stands for: all of them (one of a 3D file), or the
    one of its ``volume``, which must be in the file (named with the table's line)."""
    volumes = []
    for e, header in zip(entries, headers, strict=True):
        n = n_volumes(header)
        v = e.get("volume")
        if v is not None and v >= n:
            raise ValueError(f"{entry_name(e)}: volume {v}, but the file has {n} volume"
                             f"{'s' * (n != 1)} (0 to {n - 1}); expected a volume of the file, "
                             "counted from 0")
        volumes.append(range(n) if v is None else range(v, v + 1))
    return volumes
