"""BIDS datasets in: the images a query on a dataset's entities selects, each with its label or
target and its subject as the group, as a cohort that ``fgscale convert`` and the estimators
take.

:func:`read_bids` reads a BIDS dataset, raw or derivatives (a folder with
``dataset_description.json``; ``"DatasetType": "derivative"`` for the latter):

1. the NIfTI files under its ``sub-<label>/`` folders, each name parsed by the specification's
   rules (:mod:`fgscale.images._bids_names`); a name that breaks them is skipped, and the
   skipped files are counted in a warning that names one; files and folders that
   ``.bidsignore`` lists are skipped without a word, as the BIDS validator skips them;
2. the filters: entity -> value (``space=MNI152NLin2009cAsym``, ``run=1,2`` for either,
   ``suffix``, ``extension`` and ``datatype`` too), as ``--bids-filter`` or a JSON file of
   them as fMRIPrep's ``--bids-filter-file`` takes (``null``: the entity absent, ``"*"``: any
   value); the files selected must agree on ``suffix``, ``space``, ``res``, ``den``, ``desc``,
   ``stat`` and ``hemi``, so that one kind of image makes a cohort;
3. each file's label and target, from an entity of its name (``task``), a column of
   ``participants.tsv`` (``participants:diagnosis``: a value per subject), of the subject's
   ``sub-<label>_sessions.tsv`` (``sessions:condition``: per session, by ``session_id``), of
   the ``sub-<label>[_ses-<label>]_scans.tsv`` that lists the file (``scans:condition``: per
   file, by ``filename``), or, for a 4D series, a column of its ``events.tsv``
   (``events:trial_type``), one sample per volume in an event, optionally shifted by a
   hemodynamic delay (:mod:`fgscale.images._bids_tables` says which volumes); a derivatives
   dataset without these tables reads them from its raw dataset (``raw``, by default the
   dataset two folders up when it sits in ``<raw>/derivatives/<name>``, as the specification
   lays it out), where a derivative file's row in ``scans.tsv`` is that of the raw file it was
   made of;
4. the subject (``sub-<label>``) as each row's group, so that validation splits and
   cross-validation folds never straddle a subject; the session and run as columns.

The result, :class:`BidsCohort`, writes the cohort table ``fgscale convert`` reads, with a
JSON sidecar recording the query (:meth:`BidsCohort.write_table`), and gives an estimator's
``fit`` its images, targets and groups (:meth:`BidsCohort.fit_inputs`).

Why a reader of its own rather than pybids: pybids is the ecosystem's library for this, but it
brings SQLAlchemy, formulaic, pandas and the BIDS validator's schema to a package whose image
modules Dask workers import, and it indexes the whole tree into a database before the first
query, minutes on a cohort of tens of thousands of files (ABCD, UK Biobank in BIDS form). What
fgscale needs of a dataset is one query: names parsed and filtered by their entities, two
tables and the sidecars of the inheritance principle. That is this module and its two
siblings, with no dependency beyond nibabel and numpy and with errors that name the file, line
and column to fix. What it leaves out: pybids' variables and BIDS-StatsModels, regular
expressions in filters, and the validation of anything but names.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import io
import itertools
import json
import logging
import math
import numbers
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale._utils.files import atomic_path
from fgscale.images._bids_names import (
    ENTITIES,
    TEMPLATE,
    BidsName,
    entity_key,
    parse_bids_name,
)
from fgscale.images._bids_tables import (
    KeyedTable,
    events_of,
    folder_files,
    label_volumes,
    read_events,
    repetition_time,
    scan_key,
    sidecar,
)
from fgscale.images._cohort import n_volumes
from fgscale.images._nifti import load_img, read_header

__all__ = ["DESCRIPTION", "BidsCohort", "is_bids_root", "parse_filters", "parse_source",
           "read_bids"]

log = logging.getLogger(__name__)

DESCRIPTION = "dataset_description.json"
_IMAGES = (".nii", ".nii.gz")
# what tells images of one kind from another: a cohort mixing them (bold with its mask, two
# spaces) would not share a grid, or would count an image twice
_ONE_KIND = ("suffix", "space", "res", "den", "desc", "stat", "hemi")
_ORDER = {key: i for i, (key, _, _) in enumerate(ENTITIES)}
_LONG = {key: name for key, name, _ in ENTITIES}
_SOURCES = ("participants", "sessions", "scans", "events")
_SOURCE_HELP = "ENTITY, participants:COLUMN, sessions:COLUMN, scans:COLUMN or events:COLUMN"


def is_bids_root(path) -> bool:
    """Whether ``path`` is a folder with a ``dataset_description.json``: a BIDS dataset."""
    return Path(path).expanduser().is_dir() and (Path(path).expanduser() / DESCRIPTION).is_file()


# ------------------------------------------------------------------ filters and sources


def _filter_values(key: str, value, where: str):
    """A filter's value: a tuple of the texts it accepts, None (the entity absent) or "*"."""
    if value is None or value == "*":
        return value
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: filter {key} = {value!r}; expected a value, a list of "
                         "values, null (the entity absent) or \"*\" (any value)")
    # "01,02" is either (a BIDS label has no comma), as --bids-filter sub=01,02 types it
    texts = tuple(t.strip() for v in values for t in str(v).split(",") if t.strip())
    if key == "extension":
        texts = tuple(t if t.startswith(".") else f".{t}" for t in texts)
    return texts


def _filter_file(path: Path) -> dict:
    """The filters of a JSON file: entity -> value, or fMRIPrep's ``{"bold": {...}}`` with one
    query."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such filter file") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON filter file ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object of entity -> value")
    queries = [k for k, v in value.items() if isinstance(v, dict)]
    if queries and len(queries) == len(value) == 1:
        return value[queries[0]]
    if queries:
        raise ValueError(f"{path}: filters of several queries ({', '.join(queries)}); expected "
                         "one query: entity -> value at the top, or a single {\"bold\": {...}}")
    return value


def parse_filters(filters) -> dict:
    """Filters on a dataset's entities, from the forms they come in.

    Parameters
    ----------
    filters : dict, str, Path or list of str, optional
        Entity -> value (a text, a number, a list of alternatives, None for the entity absent,
        ``"*"`` for any value); or the path of a JSON file of them (fMRIPrep's
        ``--bids-filter-file``); or ``"key=value"`` texts (``"run=1,2"``: either) and JSON
        paths, as ``--bids-filter`` takes them, the later overriding the earlier. Entities by
        key (``ses``) or long name (``session``); ``suffix``, ``extension`` and ``datatype``
        too.

    Returns
    -------
    dict
        Entity key -> a tuple of accepted texts, None or ``"*"``.
    """
    if filters is None:
        return {}
    if isinstance(filters, dict):
        items = [(k, v, "filters") for k, v in filters.items()]
    else:
        items = []
        for item in [filters] if isinstance(filters, (str, Path)) else list(filters):
            text = str(item)
            if text.lower().endswith(".json"):
                path = Path(text).expanduser()
                items += [(k, v, str(path)) for k, v in _filter_file(path).items()]
            elif "=" in text and text.partition("=")[0].strip() and text.partition("=")[2].strip():
                key, _, value = text.partition("=")
                items.append((key.strip(), value, "--bids-filter"))
            else:
                raise ValueError(f"--bids-filter: {text!r}; expected KEY=VALUE (such as "
                                 "space=MNI152NLin2009cAsym, run=1,2 for either) or a JSON file")
    return {entity_key(str(k)): _filter_values(entity_key(str(k)), v, where)
            for k, v, where in items}


@dataclass(frozen=True)
class Source:
    """Where a label or target comes from: an entity of the file's name, or a column of
    ``participants.tsv``, of the subject's ``sessions.tsv``, of the ``scans.tsv`` that lists
    the file, or of its ``events.tsv``.

    Attributes
    ----------
    kind : {"entity", "participants", "sessions", "scans", "events"}
    name : str
        The entity's key or the column.
    option : str
        How it was asked for (``"--label participants:diagnosis"``), for messages.
    """

    kind: str
    name: str
    option: str


def parse_source(text: str | None, option: str) -> Source | None:
    """``"task"``, ``"participants:diagnosis"``, ``"sessions:condition"``,
    ``"scans:condition"`` or ``"events:trial_type"`` as a :class:`Source` (``option``:
    ``"--label"`` or ``"--target"``, for messages); None stays None."""
    if text is None:
        return None
    kind, colon, name = str(text).strip().partition(":")
    if not colon:
        kind, name = "entity", entity_key(kind)
    if kind not in (*_SOURCES, "entity") or not name.strip():
        raise ValueError(f"{option} {text!r}; expected {_SOURCE_HELP} (such as task, "
                         "participants:diagnosis, scans:condition, events:trial_type)")
    return Source(kind, name.strip(), f"{option} {text}")


# ------------------------------------------------------------------ the dataset's images


@dataclass(frozen=True)
class _Image:
    """A NIfTI file of the dataset: its path, folder relative to the root, parsed name and
    datatype (the folder it is in, such as ``func``; "" for one directly in a subject's or
    session's folder)."""

    path: Path
    relative: Path
    name: BidsName
    datatype: str

    def value(self, key: str) -> str | None:
        if key == "suffix":
            return self.name.suffix
        if key == "extension":
            return self.name.extension
        if key == "datatype":
            return self.datatype
        return self.name.entities.get(key)


def _description(root: Path) -> bool:
    """Whether the dataset at ``root`` is a derivatives dataset, by its description."""
    path = root / DESCRIPTION
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc}); expected BIDS's dataset "
                         "description") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object (Name, BIDSVersion, DatasetType)")
    return value.get("DatasetType") == "derivative"


def _bidsignore(root: Path):
    """Whether a path relative to ``root`` (with ``/``) is listed in ``.bidsignore``: patterns
    as ``.gitignore`` writes them, one a line; one without a ``/`` matches a file or folder
    name at any depth, one with a ``/`` the path from the root."""
    try:
        lines = (root / ".bidsignore").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    patterns = [p.strip().rstrip("/") for p in lines if p.strip() and not p.startswith("#")]

    def ignored(relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        for pattern in patterns:
            if "/" in pattern:
                if any(fnmatch.fnmatchcase(p, pattern.lstrip("/")) for p in prefixes):
                    return True
            elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
                return True
        return False

    return ignored


def _check_folders(name: BidsName, relative: Path) -> None:
    """A name's subject and session must be those of the folders it is in."""
    for key in ("sub", "ses"):
        folder = next((p for p in relative.parts if p.startswith(f"{key}-")), None)
        value = name.entities.get(key)
        if folder is not None and value != folder[len(key) + 1:]:
            raise ValueError(f"it is in the folder {folder} but its name has "
                             + (f"{key}-{value}" if value else f"no {key} entity"))


def _images(root: Path, derivative: bool) -> tuple[list[_Image], list[str]]:
    """The NIfTI files under the dataset's subject folders, sorted, and why each file whose
    name breaks the rules was skipped."""
    ignored = _bidsignore(root)
    images, skipped = [], []
    subjects = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("sub-"))
    for folder in subjects:
        for here, dirs, files in os.walk(folder):
            relative = Path(here).relative_to(root)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                             and not ignored((relative / d).as_posix()))
            for file in sorted(files):
                if not file.endswith(_IMAGES) or ignored((relative / file).as_posix()):
                    continue
                try:
                    name = parse_bids_name(file, derivative=derivative)
                    _check_folders(name, relative)
                except ValueError as exc:
                    why = str(exc).removeprefix(f"{file}: ").removesuffix(f"; expected {TEMPLATE}")
                    skipped.append(f"{relative / file} ({why})")
                    continue
                datatype = "" if relative.name.startswith(("sub-", "ses-")) else relative.name
                images.append(_Image(Path(here) / file, relative, name, datatype))
    if skipped:
        log.warning("%s: %d NIfTI file(s) skipped, their names breaking BIDS's rules, such as "
                    "%s", root, len(skipped), skipped[0])
        log.debug("skipped: %s", skipped)
    return images, skipped


def _matches(image: _Image, filters: dict) -> bool:
    for key, accepted in filters.items():
        value = image.value(key)
        if accepted is None or accepted == "*":
            if (value is None) != (accepted is None):
                return False
        elif value is None:
            return False
        elif key in ("run", "echo", "flip", "inv", "split", "chunk"):  # run-01 is run 1
            if not any(a.isdigit() and int(a) == int(value) for a in accepted):
                return False
        elif value not in accepted:
            return False
    return True


def _no_match(root: Path, images: list[_Image], filters: dict, skipped: list[str]) -> str:
    """Why no file matched: the values each filtered entity takes in the dataset."""
    text = " ".join(f"{k}={'null' if v is None else ','.join(v) if isinstance(v, tuple) else v}"
                    for k, v in filters.items())
    found = []
    for key in filters:
        values = sorted({v for v in (i.value(key) for i in images) if v is not None})
        found.append(f"{key} is one of {values[:8]}" + (" ..." if len(values) > 8 else "")
                     if values else f"none has a {key!r} entity")
    where = (f"among its {len(images)} NIfTI files, " + "; ".join(found)) if images else (
        "it has no NIfTI file under sub-<label>/ folders")
    more = f" ({len(skipped)} skipped for their names, such as {skipped[0]})" if skipped else ""
    return f"{root}: no NIfTI file matches the filters {text or '(none)'}; {where}{more}"


def _check_one_kind(root: Path, selected: list[_Image], sources) -> None:
    """Refuse files of several kinds (:data:`_ONE_KIND`), unless the label or target is read
    from the entity that tells them apart."""
    used = {s.name for s in sources if s is not None and s.kind == "entity"}
    for key in _ONE_KIND:
        if key in used:
            continue
        counts = Counter(i.value(key) or "(none)" for i in selected)
        if len(counts) > 1:
            said = ", ".join(f"{v}: {n} files" for v, n in sorted(counts.items()))
            raise ValueError(f"{root}: the files selected differ in {key} ({said}); a cohort "
                             f"holds one kind of image: choose one with --bids-filter "
                             f"{key}=VALUE")


def _select(root: Path, derivative: bool, filters: dict, sources) -> list[_Image]:
    images, skipped = _images(root, derivative)
    selected = [i for i in images if _matches(i, filters)]
    if not selected:
        raise ValueError(_no_match(root, images, filters, skipped))
    _check_one_kind(root, selected, sources)
    missing = [i.path for i in selected if not i.path.exists()]
    if missing:  # a DataLad dataset whose files were not fetched: links to nothing
        raise FileNotFoundError(f"{missing[0]}: a link to no file ({len(missing)} of the files "
                                "selected); expected the image's data (datalad get, for a "
                                "DataLad dataset)")
    return selected


# ------------------------------------------------------------------ labels and rows


def _raw_roots(root: Path, raw) -> list[Path]:
    """Where the tables are looked for: the dataset, then its raw dataset (``raw``, else the
    dataset two folders up of one in ``<raw>/derivatives/<name>``)."""
    if raw is not None:
        raw = Path(raw).expanduser()
        if not is_bids_root(raw):
            raise ValueError(f"{raw}: not a BIDS dataset (no {DESCRIPTION}); expected the raw "
                             f"dataset of {root} (--bids-raw)")
        return [root, raw]
    up = root.parent.parent
    return [root, up] if root.parent.name == "derivatives" and is_bids_root(up) else [root]


@dataclass
class _Reader:
    """What labelling the selected files needs, read once: the tables' roots, the folders'
    listings, the tables' columns, the hemodynamic delay of the events' labels."""

    root: Path
    roots: list[Path]
    selected: list[_Image]
    hrf_delay: float = 0.0
    listing: object = field(default_factory=lambda: functools.cache(folder_files))
    tables: dict = field(default_factory=dict)

    def _table(self, relative: Path, source: Source, key: str, prefix: str, what: str,
               expected: str) -> KeyedTable:
        """The table at ``relative`` in the first of the roots that has it, read once."""
        paths = [r / relative for r in self.roots]
        path = next((p for p in paths if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"{' nor '.join(map(str, paths))}: no such file ({source.option}); expected "
                f"{expected} (for a derivatives dataset, --bids-raw RAW names the raw dataset "
                "that holds it)")
        if (path, source.name) not in self.tables:
            self.tables[path, source.name] = KeyedTable.read(path, key, source.name,
                                                             source.option, prefix=prefix,
                                                             what=what)
        return self.tables[path, source.name]

    def table_values(self, source: Source) -> dict[Path, tuple[str, str]]:
        """Each selected file's value in a column of ``participants.tsv``, ``sessions.tsv`` or
        ``scans.tsv``, with the file and line it is on."""
        if source.kind == "participants":
            table = self._table(Path("participants.tsv"), source, "participant_id", "sub-",
                                "subject", "the dataset's table of participants")
            hint = "leave a subject out with --bids-filter sub=..."
            return {i.path: table.value(i.name.subject, i.path, hint) for i in self.selected}
        return {i.path: getattr(self, source.kind)(i, source) for i in self.selected}

    def sessions(self, image: _Image, source: Source) -> tuple[str, str]:
        subject, session = image.name.subject, image.name.entities.get("ses")
        if session is None:
            raise ValueError(f"{image.path}: no session in its name ({source.option}); "
                             "sessions.tsv gives a value per session of a subject: for files "
                             "without sessions, read participants:COLUMN or scans:COLUMN")
        table = self._table(Path(f"sub-{subject}", f"sub-{subject}_sessions.tsv"), source,
                            "session_id", "ses-", "session",
                            f"the table of sub-{subject}'s sessions")
        return table.value(session, image.path, "leave a session out with --bids-filter "
                                                 "ses=...")

    def scans(self, image: _Image, source: Source) -> tuple[str, str]:
        # the table of the subject's folder, or of the session's where the file is in one
        parts = image.relative.parts
        folder = Path(*parts[:2]) if len(parts) > 1 and parts[1].startswith("ses-") else (
            Path(parts[0]))
        name = "_".join(folder.parts) + "_scans.tsv"
        table = self._table(folder / name, source, "filename", "", "file",
                            f"the table of the files of {folder.as_posix()}")
        filename = (image.relative.relative_to(folder) / image.path.name).as_posix()
        key = scan_key(table, filename, image.name)
        if key is None:
            raise ValueError(f"{table.path}: no row for filename {filename} ({source.option}); "
                             f"expected a row per file, with its {source.name!r} (for a "
                             "derivative file, the row of the raw file it was made of: one of "
                             "its suffix whose entities are all its own)")
        return table.value(key, image.path, "leave the file out with --bids-filter")

    def entity(self, image: _Image, source: Source) -> tuple[str, str]:
        value = image.value(source.name)
        if value is None:
            raise ValueError(f"{image.path}: no {source.name!r} entity in its name "
                             f"({source.option}); expected every file selected to have one, or "
                             f"{' or '.join(f'{k}:{source.name}' for k in _SOURCES)} for a column "
                             "of that table")
        return value, str(image.path)

    def events(self, image: _Image, sources: list[Source]) -> tuple[dict, int]:
        """Each volume's values (with the file they come from) from the series' events, for
        the volumes every source labels, and the number of volumes left out."""
        header = read_header(image.path)
        if header.ndim != 4:
            raise ValueError(f"{image.path}: a 3D image ({sources[0].option}); events.tsv "
                             "labels the volumes of 4D series: read a 3D image's label from an "
                             "entity or participants.tsv")
        n = n_volumes(header)
        metadata = sidecar(image.relative, image.name, self.roots, self.listing)
        tr = repetition_time(image.path, metadata)
        path = events_of(image.path, image.relative, image.name, self.roots, self.listing)
        per_source = []
        for source in sources:
            values, _ = label_volumes(read_events(path, source.name, source.option), n, tr,
                                      self.hrf_delay)
            per_source.append({i: (v, str(path)) for i, v in values.items()})
        kept = sorted(set.intersection(*(set(v) for v in per_source)))
        return {i: [v[i] for v in per_source] for i in kept}, n - len(kept)


def _number(value: str, where: str, option: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{where}: {value!r} ({option}); expected a finite number for a "
                         "regression target")
    return number


def _rows(reader: _Reader, label: Source | None, target: Source | None) -> list[dict]:
    """A row per file (a 4D file's volumes all with its values), or per volume in an event of
    a series whose label or target comes from its events."""
    sources = {role: s for role, s in (("label", label), ("target", target)) if s is not None}
    by_events = [s for s in sources.values() if s.kind == "events"]
    tables = {s: reader.table_values(s) for s in sources.values()
              if s.kind not in ("entity", "events")}
    rows, left_out = [], 0
    for image in reader.selected:
        volumes: dict = {None: []}  # the whole file, unless its events label its volumes
        if by_events:
            volumes, dropped = reader.events(image, by_events)
            left_out += dropped
        for volume, values in volumes.items():
            found = dict(zip(by_events, values, strict=True)) | {
                s: tables[s][image.path] for s in tables}
            read = {role: found.get(s) or reader.entity(image, s) for role, s in sources.items()}
            value = read["label"][0] if label is not None else None
            number = _number(*read["target"], target.option) if target is not None else None
            rows.append({"path": str(image.path), "volume": volume, "label": value,
                         "target": number, "group": f"sub-{image.name.subject}",
                         "session": image.name.entities.get("ses", ""),
                         "run": image.name.entities.get("run", ""), "split": ""})
    n_series = len(reader.selected)
    if by_events and left_out:
        log.warning("%s: %d volume(s) of its %d series are in no event of one value (rest, "
                    "gaps, n/a, or events of different values at once) and are left out; "
                    "volume i is taken at i x RepetitionTime%s", reader.root, left_out,
                    n_series, f" - {reader.hrf_delay:g} s (hrf_delay)" if reader.hrf_delay
                    else "")
    if not rows:
        delay = f" - {reader.hrf_delay:g} s (hrf_delay)" if reader.hrf_delay else ""
        raise ValueError(f"{reader.root}: no volume of the {n_series} series selected falls in "
                         "an event; expected events whose [onset, onset + duration) holds "
                         f"volumes (a block design), volume i taken at i x RepetitionTime{delay}")
    return rows


def _test_split(rows: list[dict], test_subjects, root: Path) -> None:
    """Each row's split: test for the subjects listed, train for the others; "" (the rows all
    for training) when none are listed."""
    if test_subjects is None:
        return
    listed = [test_subjects] if isinstance(test_subjects, str) else list(test_subjects)
    wanted = {f"sub-{str(s).strip().removeprefix('sub-')}" for t in listed
              for s in str(t).split(",") if s.strip()}
    found = {r["group"] for r in rows}
    unknown = sorted(wanted - found)
    if unknown:
        raise ValueError(f"--test-subjects {','.join(unknown)}: no file selected in {root} is "
                         f"theirs; expected some of {sorted(found)}")
    if wanted == found:
        raise ValueError(f"--test-subjects lists every subject selected in {root}; expected "
                         "some left for training")
    for r in rows:
        r["split"] = "test" if r["group"] in wanted else "train"


# ------------------------------------------------------------------ the cohort


@dataclass(frozen=True)
class BidsCohort:
    """The images a query on a BIDS dataset selected, with their labels, targets and subjects.

    Attributes
    ----------
    root : Path
        The dataset.
    rows : list of dict
        A row per file, or per volume of a series labelled by its events: ``path``, ``volume``
        (int, or None for all the file's volumes), ``label`` (str or None), ``target`` (float
        or None), ``group`` (``"sub-<label>"``), ``session``, ``run`` (their labels, "" where
        the name has none) and ``split`` (``"train"``, ``"test"`` or "").
    label, target : str or None
        Where the labels and the targets come from (as given to :func:`read_bids`).
    query : dict
        The query that selected the rows, as :meth:`write_table` records it beside the table:
        ``root``, ``filters`` (entity -> the values accepted, null for the entity absent,
        ``"*"`` for any), ``label``, ``target``, ``raw`` (the raw dataset whose tables were
        looked in, or null), ``test_subjects`` (sorted, or null) and ``hrf_delay`` (seconds).
        Default: empty (a cohort not made by :func:`read_bids`).
    """

    root: Path
    rows: list
    label: str | None = None
    target: str | None = None
    query: dict = field(default_factory=dict)

    @property
    def subjects(self) -> list[str]:
        """The subjects, ``sub-<label>``, sorted."""
        return sorted({r["group"] for r in self.rows})

    def fit_inputs(self, y: str | None = None) -> tuple[list, list | None, list[str]]:
        """What an estimator's ``fit`` takes: ``fit(X, y, groups=groups)``.

        Parameters
        ----------
        y : {"label", "target"}, optional
            Default the labels where the cohort has them, else the targets.

        Returns
        -------
        X : list of str or nibabel images
            Each file's path, or for a series labelled by its events, an image of the volumes
            kept (read now).
        y : list of str or float, or None
            A value per sample (each volume of a 4D file is a sample); None for a cohort with
            neither labels nor targets.
        groups : list of str
            Each sample's subject.
        """
        if y not in (None, "label", "target"):
            raise ValueError(f"y={y!r}; expected 'label', 'target' or None")
        if y is not None and getattr(self, y) is None:
            raise ValueError(f"y={y!r}, but the cohort was read without a {y}")
        column = y or next((c for c in ("label", "target") if getattr(self, c) is not None), None)
        X, values, groups = [], [], []
        for path, rows in itertools.groupby(self.rows, key=lambda r: r["path"]):
            rows = list(rows)
            if rows[0]["volume"] is None:
                X.append(path)
                per_row = [rows[0]] * n_volumes(read_header(path))
            else:
                img = load_img(path)
                data = np.asanyarray(img.dataobj)[..., [r["volume"] for r in rows]]
                X.append(nib.Nifti1Image(data, img.affine, img.header))
                per_row = rows
            values += [r[column] for r in per_row] if column else []
            groups += [r["group"] for r in per_row]
        return X, (values if column else None), groups

    def entity_table(self) -> dict[str, list[str]]:
        """Each file's path and BIDS entities, a row per file in the rows' order: ``path``,
        then a column per entity that any file has, named as the specification names it
        (``subject``, ``session``, ``task``, ``run``, ``space``, ``description``...; an entity
        of a derivatives dataset's own, such as ``stat``, by its key), in the specification's
        order; a value as the name writes it (``run`` ``"01"``), "" where a file has none."""
        paths = list(dict.fromkeys(r["path"] for r in self.rows))
        names = {p: parse_bids_name(Path(p).name).entities for p in paths}
        keys = sorted({k for entities in names.values() for k in entities},
                      key=lambda k: (_ORDER.get(k, len(_ORDER)), k))
        return {"path": paths, **{_LONG.get(k, k): [names[p].get(k, "") for p in paths]
                                  for k in keys}}

    def table(self) -> str:
        """The cohort table as CSV text, in the columns ``fgscale convert`` reads: ``path``,
        ``label`` and/or ``target``, ``group``, ``split``, ``volume``, and ``session`` and
        ``run`` where the names have them (kept for the reader; convert does not use them)."""
        columns = ["path", *(c for c in ("label", "target") if getattr(self, c) is not None),
                   "group", *(c for c in ("session", "run", "split") if any(r[c] for r in self.rows)),
                   *(["volume"] if any(r["volume"] is not None for r in self.rows) else [])]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for r in self.rows:
            writer.writerow(["" if r[c] is None else repr(r[c]) if c == "target" else r[c]
                             for c in columns])
        return out.getvalue()

    def write_table(self, path, overwrite: bool = False) -> Path:
        """Write :meth:`table` to ``path``, to read, edit and give back to ``fgscale convert``,
        and beside it, under its name with ``.json`` for its suffix (``haxby.zarr.json`` for
        ``haxby.zarr.csv``, as a BIDS sidecar is named), the query that selected its rows
        (:attr:`query`, under ``"bids_query"``). A table there already with these rows is kept
        as it is, and its sidecar records the latest query that gives them.

        Parameters
        ----------
        path : str or Path
        overwrite : bool, default=False
            Whether a file there with other rows is replaced (``convert --append``: the query
            of a dataset that has grown).

        Returns
        -------
        Path

        Raises
        ------
        FileExistsError
            Where ``path`` holds other rows (another query's table, or one edited since) and
            ``overwrite`` is False, saying how the recorded query differs; or where the
            sidecar's name holds a file that is not the record of a query.
        """
        path = Path(path).expanduser()
        about = path.with_suffix(".json")
        text = self.table()
        record = json.dumps({"bids_query": self.query}, indent=2) + "\n"
        before = _recorded_query(about)
        if path.exists():
            try:
                same = path.read_text(encoding="utf-8") == text
            except (OSError, UnicodeDecodeError):
                same = False
            if not same and not overwrite:
                raise FileExistsError(
                    f"{path}: exists with other rows ({_query_change(before, self.query)}); "
                    "remove it, or write the table elsewhere (fgscale convert writes it beside "
                    "--out)")
        else:
            same = False
        if before is None and about.exists():
            raise FileExistsError(f"{about}: exists and is not the record of a BIDS query "
                                  "(no \"bids_query\" in it); expected none there, or the "
                                  f"sidecar of {path.name}: remove it, or write the table "
                                  "elsewhere")
        if not same:
            with atomic_path(path) as tmp:
                tmp.write_text(text, encoding="utf-8")
        if before != self.query:
            with atomic_path(about) as tmp:
                tmp.write_text(record, encoding="utf-8")
        return path


def _recorded_query(path: Path) -> dict | None:
    """The query a table's JSON sidecar records; None where there is none, or it is not
    one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    query = value.get("bids_query") if isinstance(value, dict) else None
    return query if isinstance(query, dict) else None


def _query_change(before: dict | None, now: dict) -> str:
    """How the query recorded beside a table differs from ``now``, in words."""
    if before is None:
        return "the table of another query of the dataset, or edited since"
    for key, value in now.items():
        if before.get(key) != value:
            option = {"hrf_delay": "--hrf-delay", "filters": "--bids-filter", "raw": "--bids-raw",
                      "test_subjects": "--test-subjects"}.get(key, f"--{key}")
            return (f"the table of another query: {option} {json.dumps(before.get(key))} "
                    f"there, {json.dumps(value)} now")
    return "the same query recorded, the table edited since or the dataset changed"


def _check_delay(hrf_delay, sources) -> float:
    """The hemodynamic delay in seconds, a finite number >= 0, given only with labels or
    targets read from events.tsv."""
    if isinstance(hrf_delay, bool) or not isinstance(hrf_delay, numbers.Real) or not (
            math.isfinite(hrf_delay) and hrf_delay >= 0):
        raise ValueError(f"hrf_delay {hrf_delay!r} (--hrf-delay); expected a finite number of "
                         "seconds, 0 or more (the BOLD response peaks some 4-6 s after the "
                         "stimulus)")
    if hrf_delay and not any(s is not None and s.kind == "events" for s in sources):
        given = " and ".join(s.option for s in sources if s is not None) or "no --label nor --target"
        raise ValueError(f"hrf_delay {hrf_delay:g} (--hrf-delay) shifts the labels that a "
                         "series' events.tsv gives its volumes; expected --label or --target "
                         f"events:COLUMN with it, got {given}")
    return float(hrf_delay)


def _jsonable(filters: dict) -> dict:
    """Parsed filters as JSON writes them: each tuple of values a list."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in filters.items()}


def read_bids(root, filters=None, *, label: str | None = None, target: str | None = None,
              raw=None, test_subjects=None, hrf_delay: float = 0.0) -> BidsCohort:
    """Select images of a BIDS dataset by their entities, with labels, targets and subjects.

    Parameters
    ----------
    root : str or Path
        A BIDS dataset, raw or derivatives: a folder with ``dataset_description.json``.
    filters : dict, str, Path or list of str, optional
        Entity -> value (:func:`parse_filters`), such as ``{"space": "MNI152NLin2009cAsym",
        "desc": "preproc", "suffix": "bold"}``, or a JSON file of them. Default: every NIfTI
        file, which must then be of one kind (one suffix, space, desc...).
    label : str, optional
        Where each sample's class comes from: an entity (``"task"``); a column of
        ``participants.tsv`` (``"participants:diagnosis"``), of the subject's
        ``sub-<label>_sessions.tsv`` (``"sessions:condition"``, the row of the file's
        session), of the ``sub-<label>[_ses-<label>]_scans.tsv`` that lists the file
        (``"scans:condition"``, the row of its ``filename``; for a derivative file, of the raw
        file it was made of); or of a series' ``events.tsv`` (``"events:trial_type"``: a
        sample per volume in an event). Default: no labels.
    target : str, optional
        Where each sample's regression target comes from, as ``label``; a number. Default:
        no targets.
    raw : str or Path, optional
        The raw dataset of a derivatives dataset, whose ``participants.tsv``,
        ``sessions.tsv``, ``scans.tsv`` and ``events.tsv`` are read where the derivatives lack
        them. Default: the dataset two folders up when ``root`` is
        ``<raw>/derivatives/<name>``.
    test_subjects : list of str or str, optional
        Subjects (``"01"`` or ``"sub-01"``; comma-separated in a string) whose rows make the
        test split, the others' the training split. Default: no split (every row trains).
    hrf_delay : float, default=0.0
        The hemodynamic delay in seconds, for labels and targets read from ``events.tsv``:
        volume ``i`` takes the value of the event that holds ``i * RepetitionTime -
        hrf_delay`` (:mod:`fgscale.images._bids_tables`), such as 5.0 for the BOLD response's
        peak some 4-6 s after the stimulus. A finite number, 0 or more; other than 0 only with
        an ``events:`` label or target. Default: none.

    Returns
    -------
    BidsCohort

    Raises
    ------
    ValueError, FileNotFoundError
        Naming the file, and its line and column for a table, of what is wrong or missing.
    """
    root = Path(root).expanduser().absolute()  # the table's paths hold wherever it is read
    if not is_bids_root(root):
        raise FileNotFoundError(f"{root}: no {DESCRIPTION} there; expected the root of a BIDS "
                                "dataset")
    sources = (parse_source(label, "--label"), parse_source(target, "--target"))
    hrf_delay = _check_delay(hrf_delay, sources)
    derivative = _description(root)
    filters = parse_filters(filters)
    selected = _select(root, derivative, filters, sources)
    roots = _raw_roots(root, raw)
    rows = _rows(_Reader(root, roots, selected, hrf_delay), *sources)
    _test_split(rows, test_subjects, root)
    tested = sorted({r["group"] for r in rows if r["split"] == "test"})
    query = {"root": str(root), "filters": _jsonable(filters), "label": label, "target": target,
             "raw": str(roots[1]) if len(roots) > 1 else None,
             "test_subjects": tested or None, "hrf_delay": hrf_delay}
    return BidsCohort(root=root, rows=rows, label=label, target=target, query=query)
