"""What a conversion records of its inputs: how the mask was given, whether the cohort is
synthetic, and the files it reads, by size and modification time (as make and rsync tell a
changed file), recorded in the store when it is created: a file rewritten between an
interrupted conversion and its resumption (a subject preprocessed again) would otherwise keep
its former rows in the store beside rows read from the other files as they are now, with no
word of it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_PAIRS = {".hdr": ".img", ".img": ".hdr"}  # an Analyze/NIfTI pair: the data is in the .img


def file_stats(paths) -> np.ndarray:
    """``[size, mtime_ns]`` of each file (symbolic links followed; of both files of a
    ``.hdr``/``.img`` pair: their total size and the later time), an int64 array of shape
    (n_files, 2): the store's ``inputs`` array, not an attribute, which every task that opens
    the store would parse (megabytes of JSON for a cohort of 100,000 files)."""
    stats = []
    for path in map(Path, paths):
        stem, gz = (path.with_suffix(""), ".gz") if path.suffix == ".gz" else (path, "")
        files = [path]
        if stem.suffix in _PAIRS:
            other = stem.with_suffix(_PAIRS[stem.suffix] + gz)
            files += [other] if other.exists() else []
        st = [os.stat(f) for f in files]
        stats.append([sum(s.st_size for s in st), max(s.st_mtime_ns for s in st)])
    return np.array(stats, np.int64).reshape(-1, 2)


def check_inputs(out: Path, g, stats: list, paths: list, n_rows: list, computed_mask: bool,
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
    stats : ndarray of shape (n_files, 2)
        :func:`file_stats` of ``paths`` now.
    paths : list of str
        The cohort's files, in its order.
    n_rows : list of int
        The rows of each file (volumes of a 4D file), in the same order.
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
    changed = np.flatnonzero((g["inputs"][:] != stats).any(axis=1)).tolist()
    if not changed:
        return True
    which = f"{paths[changed[0]]}" + (f" and {len(changed) - 1} other file(s)" if changed[1:] else "")
    if complete:
        log.warning("%s: %s changed since the store was converted: it holds their former data; "
                    "remove it and convert again to take the new", out, which)
        return True
    if computed_mask:
        log.warning("%s: %s changed since this conversion began, and the mask was computed from "
                    "the images: starting afresh", out, which)
        return False
    starts = np.concatenate([[0], np.cumsum(n_rows)])
    step = int(g.attrs["block_rows"])
    blocks = sorted({b for i in changed
                     for b in range(starts[i] // step, (starts[i + 1] - 1) // step + 1)})
    done = g["done"]
    redo = [b for b in blocks if done[b]]
    for b in redo:
        done[b] = 0
    g["inputs"][:] = stats
    if redo:
        log.warning("%s: %s changed since this conversion began: converting again the %d "
                    "block(s) that hold their rows", out, which, len(redo))
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
