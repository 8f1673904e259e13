"""What a conversion records of its inputs: how the mask was given, whether the cohort is
synthetic, and the files it reads, by size and modification time (as make and rsync tell a
changed file), recorded in the store when it is created: a file rewritten between an
interrupted conversion and its resumption (a subject preprocessed again) would otherwise keep
its former rows in the store beside rows read from the other files as they are now, with no
word of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from fgscale.store._shards import sync_node, sync_rows

log = logging.getLogger(__name__)

_FIELDS = ("file", "volume", "label", "group", "split")  # of a row, as convert lists them
_PAIRS = {".hdr": ".img", ".img": ".hdr"}  # an Analyze/NIfTI pair: the data is in the .img


def file_stats(paths) -> np.ndarray:
    """``[size, mtime_ns]`` of each file (symbolic links followed; of both files of a
    ``.hdr``/``.img`` pair: their total size and the later time), an int64 array of shape
    (len(paths), 2): the store's ``inputs`` array, not an attribute, which every task that opens
    the store would parse (megabytes of JSON for a cohort of 100,000 files). A file listed
    again (a row per volume of a run) is asked of the file system once."""
    stats = {}
    for key in dict.fromkeys(map(str, paths)):
        path = Path(key)
        stem, gz = (path.with_suffix(""), ".gz") if path.suffix == ".gz" else (path, "")
        files = [path]
        if stem.suffix in _PAIRS:
            other = stem.with_suffix(_PAIRS[stem.suffix] + gz)
            files += [other] if other.exists() else []
        st = [os.stat(f) for f in files]
        stats[key] = [sum(s.st_size for s in st), max(s.st_mtime_ns for s in st)]
    return np.array([stats[str(p)] for p in paths], np.int64).reshape(-1, 2)


def check_inputs(out: Path, g, stats: np.ndarray, paths: list, n_rows: list, computed_mask: bool,
                 complete: bool) -> bool:
    """Compare the files of a resumed conversion with those recorded in its store ``g``.

    A file changed since: in an unfinished store, the blocks holding its rows are converted
    again (their ``done`` flags cleared before the new record is written: killed in between,
    the next run finds the change again), or, where the mask was computed from the images
    (which changed), nothing is kept; a complete store is left as it is, with a warning.

    Parameters
    ----------
    out : Path
        The store.
    g : zarr.Group
        The store, opened read-write.
    stats : ndarray of shape (n_entries, 2)
        :func:`file_stats` of ``paths`` now.
    paths : list of str
        The file of each of the cohort's entries, in its order (a file listed by volume, once
        per volume).
    n_rows : list of int
        The rows of each entry (the volumes of a 4D file listed whole, else 1), in the same
        order.
    computed_mask : bool
        Whether the store's mask was computed from the images.
    complete : bool
        Whether the store is complete (no block reopened).

    Returns
    -------
    keep : bool
        False when the store must be converted afresh.
    """
    if "inputs" not in g or g["inputs"].shape != stats.shape:  # a store of an earlier fgscale
        return True
    files = np.flatnonzero((g["inputs"][:] != stats).any(axis=1)).tolist()
    if not files:
        return True
    named = list(dict.fromkeys(paths[i] for i in files))  # a file listed by volume: once
    which = named[0] + (f" and {len(named) - 1} other file(s)" if named[1:] else "")
    if complete:
        log.warning("%s: %s changed (size or modification time) since the store was converted:"
                    " it holds their former data; remove it and convert again to take the new",
                    out, which)
        return True
    if computed_mask:
        log.warning("%s: %s changed (size or modification time) since this conversion began, "
                    "and the mask was computed from the images: starting afresh", out, which)
        return False
    starts = np.concatenate([[0], np.cumsum(n_rows)])
    step = int(g.attrs["block_rows"])
    blocks = sorted({b for i in files
                     for b in range(starts[i] // step, (starts[i + 1] - 1) // step + 1)})
    done = g["done"][:]
    redo = [b for b in blocks if done[b]]
    for b in redo:
        g["done"][b] = 0
        sync_rows(g["done"], b)
    # on the disk after the flags it reopens: a crash between them must not leave the new
    # record over blocks still flagged done with the files' former rows
    g["inputs"][:] = stats
    sync_node(g["inputs"], whole=True)
    if redo:
        log.warning("%s: %s changed (size or modification time) since this conversion began: "
                    "converting again the %d block(s) that hold their rows", out, which,
                    len(redo))
    return True


def describe(mask) -> str | None:
    """How the mask was given, for the store's ``params``: its path, the file of a nibabel
    image, or None (computed from the images)."""
    if mask is None:
        return None
    if isinstance(mask, (str, Path)):
        return str(mask)
    return str(mask.get_filename() or "<in-memory mask image>")


def is_synthetic(cohort) -> bool:
    """True when the cohort table comes from :func:`fgscale.images.make_cohort`."""
    if not isinstance(cohort, (str, Path)):
        return False
    sidecar = Path(cohort).with_suffix(".json")
    try:
        return bool(json.loads(sidecar.read_text()).get("synthetic", False))
    except (OSError, ValueError, AttributeError):
        return False


def input_fingerprint(rows, mask, resample, block_rows, intersect_mask, targets=None,
                      smoothing_fwhm=None) -> str:
    """The digest of what a conversion makes its store of: the rows (file, volume, label,
    group, split), the mask's bytes, the arguments and the targets."""
    mask_digest = None if mask is None else (
        hashlib.sha256(Path(mask).read_bytes()).hexdigest() if isinstance(mask, (str, Path))
        else hashlib.sha256(np.asarray(mask.dataobj).tobytes()).hexdigest())
    key = [rows, mask_digest, resample, block_rows, intersect_mask]
    # Targets only when there are some: a label-only cohort keeps the fingerprint it had before
    # targets existed, so that its partial stores still resume. json writes floats exactly.
    key = key if targets is None else [*key, targets]
    if smoothing_fwhm:  # likewise: an unsmoothed conversion keeps its fingerprint
        key = [*key, {"smoothing_fwhm": smoothing_fwhm}]
    key = json.dumps(key)
    return hashlib.sha256(key.encode()).hexdigest()


def changed(g, rows, targets, mask, resample, intersect_mask=None, block_rows=None,
            smoothing_fwhm=None) -> str:
    """What differs between the store ``g`` and the conversion asked for now, in words (the
    first difference found), or what the records cannot tell apart (the mask file's contents,
    and --block-rows in a store that did not record the one asked for): a refusal after hours
    of conversion should say which change it is about."""
    def word(name, value):  # block_rows None: the default chosen from the rows' size
        if value is None:
            return "default" if name == "block_rows" else "none"
        if isinstance(value, bool):  # not a lookup: --resample 1 (mm) == True would read "on"
            return "on" if value else "off"
        return value

    # a store converted before smoothing existed was not smoothed; the other arguments, where
    # a store did not record them, are not known
    params = {"smoothing_fwhm": None, **g.attrs.get("params", {})}
    for name, now in (("mask", mask), ("resample", resample), ("intersect_mask", intersect_mask),
                      ("block_rows", block_rows), ("smoothing_fwhm", smoothing_fwhm)):
        if name in params and params[name] != now:
            return (f" (--{name.replace('_', '-')} {word(name, params[name])} there, "
                    f"{word(name, now)} now)")
    if "block_rows" not in params and block_rows not in (None, g.attrs.get("block_rows")):
        return f" (blocks of {g.attrs.get('block_rows')} rows there, --block-rows {block_rows} now)"
    if g["source"].shape[0] != len(rows):
        return f" ({g['source'].shape[0]} rows there, {len(rows)} now: files added or removed)"
    classes = g["classes"][:]
    there = zip(g["source"][:], g["volume"][:], classes[g["y"][:]] if classes.size else
                [""] * len(rows), g["group"][:], g["split"][:], strict=True)
    for i, (old, new) in enumerate(zip(there, rows, strict=True)):
        for field, a, b in zip(_FIELDS, old, new, strict=True):
            if str(a) != str(b):
                return f" (row {i}: {field} {str(a)!r} there, {str(b)!r} now)"
    old = g["target"][:].tolist() if "target" in g else None
    if old != targets:
        return " (the targets)"
    if mask is not None:
        return " (the mask file's contents, or --block-rows)" if "block_rows" not in params \
            else " (the mask file's contents)"
    return " (--block-rows)" if "block_rows" not in params else ""
