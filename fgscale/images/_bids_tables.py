"""The tables and sidecars of a BIDS dataset that label its images: ``participants.tsv`` (a
value per subject), ``sessions.tsv`` (a value per session of a subject), ``scans.tsv`` (a value
per file), ``events.tsv`` (a value per volume of a series) and the JSON sidecars (a series'
``RepetitionTime``), each read with the file and line of every bad value.

How a series' volumes get the value of an event (the one rule for 4D images, kept simple on
purpose): volume ``i`` is acquired at ``t_i = i * RepetitionTime`` seconds, counted, as BIDS
counts an event's ``onset``, from the start of the series' first volume. A volume whose
``t_i - delay`` falls in ``[onset, onset + duration)`` of one event gets that event's value; a
volume in no event (rest, fixation, the gaps of an event-related design), in events of ``n/a``
only, or in events of different values is left out, and the number left out is said. The
``delay`` is the hemodynamic delay, in seconds: none by default (0), and given as
``read_bids(..., hrf_delay=5.0)`` or ``fgscale convert --hrf-delay 5``, since the BOLD response
peaks some 4-6 s after the stimulus (nilearn's Haxby examples shift the labels likewise): a
volume then takes the label of the event that was on ``delay`` seconds before it.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fgscale.images._bids_names import BidsName, parse_bids_name
from fgscale.images._nifti import load_img

__all__ = ["Event", "KeyedTable", "applicable_files", "events_of", "folder_files",
           "label_volumes", "read_events", "read_tsv", "repetition_time",
           "scan_key", "sidecar"]

NA = "n/a"  # BIDS's missing value
_EPSILON = 1e-6  # seconds: i * TR computed in floats meets an onset written in decimals
# the entities of a raw series' events.tsv (a derivative's space or desc are not in it)
_EVENT_ENTITIES = ("sub", "ses", "task", "acq", "ce", "rec", "dir", "run", "echo", "part")


def read_tsv(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """The header and the rows (each with its line number) of a BIDS ``.tsv`` file.

    Raises
    ------
    ValueError
        Naming the file and line of a row of another number of cells than the header's.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter="\t")
            header = [name.strip() for name in next(reader, [])]
            rows = []
            for cells in reader:
                if not any(c.strip() for c in cells):
                    continue
                if len(cells) != len(header):
                    raise ValueError(f"{path}:{reader.line_num}: {len(cells)} cells for "
                                     f"{len(header)} columns; expected cells separated by tabs")
                rows.append((reader.line_num, dict(zip(header, (c.strip() for c in cells),
                                                       strict=True))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: not a readable TSV file ({exc}); expected UTF-8 text, cells "
                         "separated by tabs") from None
    return header, rows


@dataclass(frozen=True)
class KeyedTable:
    """A column of a BIDS table whose rows are keyed by a subject, session or file
    (``participants.tsv`` by ``participant_id``, ``sub-<label>_sessions.tsv`` by
    ``session_id``, ``..._scans.tsv`` by ``filename``), read with each row's line.

    Attributes
    ----------
    path : Path
        The table.
    key : str
        The column that names each row (``participant_id``).
    column : str
        The column read.
    option : str
        What asked for the column (``"--label participants:diagnosis"``), for messages.
    prefix : str
        Removed from each key (``"sub-"``: ``participant_id`` sub-01 is subject 01).
    what : str
        What a row stands for (``"subject"``), for messages.
    rows : dict of str to (int, str)
        Key (its prefix removed) -> the row's line and its value in ``column``.
    """

    path: Path
    key: str
    column: str
    option: str
    prefix: str
    what: str
    rows: dict

    @classmethod
    def read(cls, path: Path, key: str, column: str, option: str, *, prefix: str = "",
             what: str = "row") -> KeyedTable:
        """Read ``column`` of the table at ``path`` by its ``key`` column (the attributes
        say what each argument is; ``prefix`` default "", ``what`` default "row").

        Raises
        ------
        ValueError
            A column missing, or a key on two rows, naming the file (and line).
        """
        header, rows = read_tsv(path)
        for name in (key, column):
            if name not in header:
                raise ValueError(f"{path}: no column {name!r} ({option}); its columns are "
                                 f"{header}")
        by_key: dict[str, tuple[int, str]] = {}
        for line, row in rows:
            value = row[key].removeprefix(prefix)
            if value in by_key:
                raise ValueError(f"{path}:{line}: {key} {prefix}{value} again (first at line "
                                 f"{by_key[value][0]}); expected a row per {what}")
            by_key[value] = (line, row[column])
        return cls(path, key, column, option, prefix, what, by_key)

    def value(self, key: str, file, hint: str = "") -> tuple[str, str]:
        """The value of the row of ``key`` (its prefix removed), for the image ``file``.

        Parameters
        ----------
        key : str
        file : str or Path
            The image the value is for, which messages name.
        hint : str, default=""
            How to leave the image out, said where its value is missing.

        Returns
        -------
        (str, str)
            The value and ``"<path>:<line>"``.

        Raises
        ------
        ValueError
            No row for ``key``, or ``n/a`` or an empty cell there.
        """
        if key not in self.rows:
            raise ValueError(f"{self.path}: no row for {self.key} {self.prefix}{key} (the "
                             f"{self.what} of {file}); expected a row per {self.what}, with its "
                             f"{self.column!r} ({self.option})")
        line, value = self.rows[key]
        if value in ("", NA):
            raise ValueError(f"{self.path}:{line}: {self.column!r} is {value or 'empty'!r} for "
                             f"{self.prefix}{key} ({self.option}); expected a value for every "
                             f"{self.what} selected" + (f" ({hint})" if hint else ""))
        return value, f"{self.path}:{line}"


def scan_key(table: KeyedTable, filename: str, name: BidsName) -> str | None:
    """The key of the row of ``scans.tsv`` that lists a file: its own ``filename`` (relative to
    the table's folder, such as ``func/sub-01_task-x_bold.nii.gz``), else, for a derivative
    file read against its raw dataset's table, the row of the raw file it was made of: in its
    folder, of its suffix, a NIfTI file whose entities are all the derivative's own (a
    ``space`` or ``desc`` added), the most specific; None where no row is either.

    Raises
    ------
    ValueError
        Where two raw files are equally the derivative's, naming both rows.
    """
    rows = table.rows
    if filename in rows:
        return filename
    folder, _, _ = filename.rpartition("/")
    found = []
    for key in rows:
        there, _, file = key.rpartition("/")
        if there != folder:
            continue
        try:
            other = parse_bids_name(file, derivative=False)
        except ValueError:
            continue
        if other.suffix == name.suffix and other.extension in (".nii", ".nii.gz") and all(
                name.entities.get(k) == v for k, v in other.entities.items()):
            found.append((len(other.entities), key))
    found.sort()
    if len(found) > 1 and found[-1][0] == found[-2][0]:
        (a, first), (b, second) = sorted((rows[k][0], k) for _, k in found[-2:])
        raise ValueError(f"{table.path}: lines {a} and {b} ({first}, {second}) both list a "
                         f"file {filename} may be made of; expected one")
    return found[-1][1] if found else None


@dataclass(frozen=True)
class Event:
    """One row of an ``events.tsv``: its time span in seconds and its value in the column read
    (None for ``n/a``)."""

    onset: float
    duration: float
    value: str | None


def _seconds(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (what == "onset" or value >= 0)):
        raise ValueError(f"{where}: {what} {text!r}; expected a number of seconds"
                         + (" (0 or more)" if what == "duration" else ""))
    return value


def read_events(path: Path, column: str, option: str) -> list[Event]:
    """The events of an ``events.tsv``, with their value in ``column``.

    Raises
    ------
    ValueError
        A column missing (``onset``, ``duration`` or ``column``), or an onset or duration that
        is not a number of seconds, naming the file and line.
    """
    header, rows = read_tsv(path)
    for name in ("onset", "duration", column):
        if name not in header:
            raise ValueError(f"{path}: no column {name!r}" + (f" ({option})" if name == column
                                                               else "") + f"; its columns are {header}")
    return [Event(onset=_seconds(row["onset"], "onset", f"{path}:{line}"),
                  duration=_seconds(row["duration"], "duration", f"{path}:{line}"),
                  value=None if row[column] in ("", NA) else row[column])
            for line, row in rows]


def label_volumes(events: list[Event], n_volumes: int, tr: float,
                  delay: float = 0.0) -> tuple[dict[int, str], int]:
    """The value of each volume of a series that falls in an event (the module's rule).

    Parameters
    ----------
    events : list of Event
    n_volumes : int
    tr : float
        Seconds between volumes.
    delay : float, default=0.0
        The hemodynamic delay in seconds: volume ``i`` takes the value of the event that holds
        ``i * tr - delay``.

    Returns
    -------
    values : dict of int to str
        Volume (from 0) -> the value of the event it falls in, in the volumes' order.
    left_out : int
        The volumes in no event, in events of ``n/a`` only, or in events of different values.
    """
    times = np.arange(n_volumes) * tr - delay
    found: list[set] = [set() for _ in range(n_volumes)]
    for event in events:
        if event.value is None:
            continue
        inside = (times >= event.onset - _EPSILON) & (times < event.onset + event.duration - _EPSILON)
        for i in np.flatnonzero(inside):
            found[i].add(event.value)
    values = {i: next(iter(v)) for i, v in enumerate(found) if len(v) == 1}
    return values, n_volumes - len(values)


def folder_files(folder: Path) -> tuple[str, ...]:
    """The file names of a folder, sorted; none for a folder that is not there. A reader of a
    dataset caches it for the time of one query (:func:`functools.cache`), since each image
    looks in the same folders for its sidecars and events."""
    try:
        return tuple(sorted(e.name for e in folder.iterdir() if e.is_file()))
    except OSError:
        return ()


def applicable_files(relative: Path, name: BidsName, roots, suffix: str, extension: str,
                     listing=folder_files) -> list[tuple[int, Path]]:
    """The files of the inheritance principle that apply to a file: in its folder or one
    above it, in any of ``roots`` (the same relative folders), with this ``suffix`` and
    ``extension`` and entities that are all the file's own (a ``space`` or ``desc`` of a
    derivative file is not needed); each with the number of its entities, the most specific
    last.

    Parameters
    ----------
    relative : Path
        The file's folder, relative to its dataset's root.
    name : BidsName
        The file's name.
    roots : sequence of Path
        The datasets to look in, in order.
    suffix, extension : str
    listing : callable, default=folder_files
        A folder's file names (:func:`folder_files`, cached by the caller).

    Returns
    -------
    list of (int, Path)
        By number of entities, then by root and depth.
    """
    found = []
    for r, root in enumerate(roots):
        for depth in range(len(relative.parts) + 1):
            folder = root.joinpath(*relative.parts[:depth])
            for file in listing(folder):
                if not file.endswith(f"_{suffix}{extension}") and file != f"{suffix}{extension}":
                    continue
                try:
                    other = parse_bids_name(file, subject=False)
                except ValueError:
                    continue
                if other.extension == extension and all(
                        name.entities.get(k) == v for k, v in other.entities.items()):
                    found.append((len(other.entities), -r, depth, folder / file))
    found.sort(key=lambda f: f[:3])
    return [(n, path) for n, _, _, path in found]


def sidecar(relative: Path, name: BidsName, roots, listing=folder_files) -> dict:
    """The metadata of a file: its JSON sidecars by the inheritance principle, the nearer and
    more specific overriding the others (``listing``: as :func:`applicable_files`)."""
    metadata: dict = {}
    for _, path in applicable_files(relative, name, roots, name.suffix, ".json", listing):
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable JSON sidecar ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}: a JSON sidecar holds an object ({{\"key\": value}})")
        metadata.update(value)
    return metadata


def events_of(file: Path, relative: Path, name: BidsName, roots, listing=folder_files) -> Path:
    """The ``events.tsv`` of a series: the most specific that applies (its own, or one of the
    inheritance principle), looked for in ``roots`` (the dataset, then its raw dataset;
    ``listing``: as :func:`applicable_files`).

    Raises
    ------
    FileNotFoundError
        Where none applies, naming the datasets looked in.
    ValueError
        Where two apply equally.
    """
    found = applicable_files(relative, name, roots, "events", ".tsv", listing)
    if not found:
        own = "_".join(f"{k}-{v}" for k, v in name.entities.items() if k in _EVENT_ENTITIES)
        raise FileNotFoundError(
            f"{file}: no events.tsv applies to it in {' nor '.join(map(str, roots))}; expected "
            f"{own}_events.tsv beside its raw series (for a derivatives dataset, --bids-raw RAW "
            "names the raw dataset that holds them)")
    if len(found) > 1 and found[-1][0] == found[-2][0] and found[-1][1].parent == found[-2][1].parent:
        raise ValueError(f"{file}: two events.tsv apply to it equally, {found[-2][1]} and "
                         f"{found[-1][1]}; expected one")
    return found[-1][1]


def repetition_time(file: Path, metadata: dict) -> float:
    """Seconds between a series' volumes: its sidecar's ``RepetitionTime``, else its header's
    time step (pixdim[4], in its time unit; seconds where none is set)."""
    tr = metadata.get("RepetitionTime")
    if tr is not None:
        if isinstance(tr, bool) or not isinstance(tr, (int, float)) or not tr > 0:
            raise ValueError(f"{file}: RepetitionTime {tr!r} in its JSON sidecar; expected a "
                             "number of seconds > 0")
        return float(tr)
    header = load_img(file).header
    zooms = header.get_zooms()
    step = float(zooms[3]) if len(zooms) > 3 else 0.0
    if not step > 0:
        raise ValueError(f"{file}: no RepetitionTime in its JSON sidecar nor a time step in its "
                         "header; expected the seconds between volumes (RepetitionTime)")
    unit = header.get_xyzt_units()[1]
    return step / {"msec": 1e3, "usec": 1e6}.get(unit, 1.0)
