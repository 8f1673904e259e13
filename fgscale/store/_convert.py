"""Convert a NIfTI cohort (3D maps or 4D series) into an fgscale store, as Dask tasks.

Steps, each checked before the next so that bad input fails before anything is written:

1. read the cohort table (CSV/TSV with ``path``, ``label`` and/or ``target``, and optional
   ``group``, ``split``; or file globs plus labels) and every file's header: missing or
   unreadable files, bad labels or targets and grids that do not match the mask are reported
   with the file's name;
2. choose the grid (the mask's, the first image's, or a resampled one) and the mask (given,
   computed as "finite and non-zero in every image" by Dask tasks, or both intersected);
3. create the store (``done`` flags all 0, ``complete`` false) and convert it block by block:
   task i reads the files of rows ``[i * block_rows, (i + 1) * block_rows)``, masks them and
   writes shard i of ``X`` (its own object: no two tasks share a chunk), then sets ``done[i]``;
4. mark the store complete and record a summary.

Every row of a file (each volume of a 4D file) gets the file's label and target, unless the
table lists the file's volumes one per row (its ``volume`` column): then each gets its row's. A cohort
without labels gives a store with no classes (``y`` all 0), one without targets a store with no
``target`` array (see :mod:`fgscale.store._layout`).

Resuming: the store records a fingerprint of the inputs and arguments, targets included.
Re-running with the same ones skips the blocks whose ``done`` flag is set and completes the
store; on a complete store it does nothing. Zarr's LocalStore writes every object atomically
(temporary file, then rename) and a flag is set only after its shard, so a killed run leaves
whole shards and true flags only; a block interrupted mid-way has no flag and is rewritten
whole. The empty store itself is written under a temporary name and renamed into place, so a
run killed while creating it leaves no half-made store for the re-run to refuse. A file
changed since the store was created (its size or modification time, :mod:`._inputs`) has the
blocks of its rows written again, or, with a mask computed from the images, the unfinished
store is made afresh. Different inputs (a changed label or target too) on an existing store
are refused rather than overwritten, except a table that lists a complete store's rows first,
then new ones, with ``append=True`` (:mod:`._append`). The NaN policy is not part of the
fingerprint: a block written under either policy had no NaN, so after fixing a file (or
choosing ``nan="zero"``) the re-run resumes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fgscale._dask.client import ThreadTasks, active_client, cpu_count, get_client, run_tasks
from fgscale._utils.checks import check_count
from fgscale._utils.files import check_writable, exclusive_name
from fgscale.images._cohort import (
    class_order,
    entry_headers,
    entry_volumes,
    n_volumes,
    read_cohort,
)
from fgscale.images._nifti import load_img, space_codes
from fgscale.images._smoothing import smooth_volume
from fgscale.images._volumes import iter_volumes
from fgscale.store._append import append_rows, check_append
from fgscale.store._grid import check_covered, final_mask, target_grid
from fgscale.store._inputs import (
    changed,
    check_inputs,
    describe,
    file_stats,
    input_fingerprint,
    is_synthetic,
)
from fgscale.store._layout import (
    block_range,
    create_whole,
    default_block_rows,
    mark_complete,
    remove_aside,
    reopen_damaged,
    write_block_rows,
)
from fgscale.store._reader import Store, open_group_checked, open_store
from fgscale.store._shards import StoreError, resumable_write

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _store_mask(out: str, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mask of the store being written (read once per worker process and store: ``key`` is
    the fingerprint and the mask's digest), and the flat positions of its voxels, in the mask's
    C order, in a C- and an F-ordered volume."""
    import zarr

    mask = zarr.open_group(out, mode="r")["mask"][:]
    voxels = np.nonzero(mask)
    return (mask, np.ravel_multi_index(voxels, mask.shape, order="C"),
            np.ravel_multi_index(voxels, mask.shape, order="F"))


def _masked(vol: np.ndarray, mask, c_index, f_index, out: np.ndarray) -> np.ndarray:
    """``vol[mask]`` written into ``out``: a gather by precomputed flat index into ``vol`` as it
    lies in memory (NIfTI data is F-ordered), which visits only the in-mask voxels, where
    boolean indexing walks the whole grid in C order, across the memory order."""
    if vol.flags.f_contiguous:
        return np.take(vol.ravel(order="F"), f_index, out=out)
    if vol.flags.c_contiguous:
        return np.take(vol.ravel(order="C"), c_index, out=out)
    out[:] = vol[mask]
    return out


def _convert_block(out: str, key: str, block: int, sources, grid, resampled: bool,
                   nan: str, smoothing_fwhm=None) -> dict:
    """Dask task: convert the files of one block into its shard of ``X``, a row at a time,
    each volume smoothed first by ``smoothing_fwhm`` mm where given (on the store's grid)."""
    start_time = time.perf_counter()
    mask, c_index, f_index = _store_mask(out, key)
    row = np.empty(c_index.size, np.float32)  # every row goes through it, hot in the cache
    zero = []  # rows 0 in the whole mask: a failed contrast, or an image off the mask

    def rows():
        for (path, volume, _), vol in zip(sources, iter_volumes(sources, grid, resampled),
                                       strict=True):
            if smoothing_fwhm:
                vol = smooth_volume(vol, np.asarray(grid[1]), smoothing_fwhm)
            _masked(vol, mask, c_index, f_index, out=row)
            if not np.isfinite(row).all():
                bad = ~np.isfinite(row)
                if nan != "zero":
                    raise ValueError(f"{path} (volume {volume}): {int(bad.sum())} NaN/inf "
                                     "values inside the mask; fix the file or convert with "
                                     "--nan zero")
                row[bad] = 0.0
            if not row.any():
                zero.append((path, int(volume)))
            yield row

    with resumable_write(out, f"block {block} of X"):
        write_block_rows(out, block, rows())
    return {"block": block, "rows": len(sources), "bytes": len(sources) * row.nbytes,
            "seconds": time.perf_counter() - start_time, "zero": zero}


# ---------------------------------------------------------------- the conversion

_MIN_SHARD_BYTES = 4 * 2**20
_IN_PROCESS_BYTES = 2**30


def _block_rows(n_rows: int, n_features: int, client) -> int:
    """Rows per task and shard: the store's default (about 64 MiB), but small enough that every
    worker thread gets about 4 tasks, so that a small cohort is shared out; not below 4 MiB,
    where a task's fixed cost (opening the store, renaming the shard) would weigh."""
    threads = max(1, sum(client.nthreads().values()))
    floor = -(-_MIN_SHARD_BYTES // (4 * max(n_features, 1)))
    return int(min(default_block_rows(n_features), max(floor, -(-n_rows // (4 * threads)))))


def convert(cohort, out, *, mask=None, resample=None, nan: str = "error", labels=None,
            classes=None, columns=None, intersect_mask: bool = False, client=None,
            n_workers: int | None = None, block_rows: int | None = None,
            progress: bool = True, append: bool = False, smoothing_fwhm=None) -> Store:
    """Convert a NIfTI cohort into a complete fgscale store (resumable).

    Parameters
    ----------
    cohort : str or Path or list of str
        Cohort table (``.csv``/``.tsv``: path, label and/or target[, group][, split]) or
        files / globs. A 4D file gives one row per volume, each with the file's label and
        target.
    out : str or Path
        Store directory.
    mask : str, Path or nibabel image, optional
        Mask image (resampled to the grid, nearest neighbour, if needed). Default: computed
        from the data (voxels finite and non-zero in every image).
    resample : float or "mask", optional
        Resample every image (linear) to this voxel size in mm, or to the mask's grid.
    nan : {"error", "zero"}
        What to do with NaN/inf inside the mask.
    labels : list of str or path, optional
        Labels for a list of files / globs (one per file, sorted order).
    classes : list of str, optional
        Allowed labels in class-index order (others are an error); default sorted labels.
    columns : dict, optional
        The table's columns to read as ``label``, ``target`` and ``group``, such as
        ``{"target": "age"}`` (:func:`fgscale.images.read_cohort`).
    intersect_mask : bool
        With ``mask``: also compute the data mask and keep the intersection.
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster of worker
        threads (:func:`fgscale._dask.client.get_client`); a cohort of less than 1 GiB of voxels
        to read is converted by threads of this process instead, with no cluster to start
        (:class:`fgscale._dask.client.ThreadTasks`).
    n_workers : int, optional
        Threads of the embedded cluster or of this process; default the usable cores.
    block_rows : int, optional
        Rows per task and per shard of ``X``. Default: about 64 MiB of rows, fewer when that
        would give the client's worker threads fewer than about 4 tasks each (not below 4 MiB).
    progress : bool
    append : bool, default=False
        Whether a complete store whose rows the table lists first, then others (new
        subjects), takes the new rows: only they are read and converted, and the store's rows
        keep their place (:mod:`fgscale.store._append` says what must hold). Default: such a
        store is refused, as any store of other inputs.
    smoothing_fwhm : float, optional
        Smooth every volume, on the store's grid and before masking, by a Gaussian of this full
        width at half maximum in mm, as nilearn's maskers smooth (its non-finite values set to
        0 first); the computed mask is that of the images as read. Recorded in the store: an
        estimator fitted on it predicts images smoothed alike. Default: no smoothing.

    Returns
    -------
    store : Store
    """
    if nan not in ("error", "zero"):
        raise ValueError(f"nan must be 'error' or 'zero', got {nan!r}")
    if block_rows is not None:  # 0 or less: no shard layout (zarr's error names no option)
        check_count("block_rows", block_rows)
    if smoothing_fwhm is not None and (isinstance(smoothing_fwhm, bool) or not isinstance(
            smoothing_fwhm, (int, float)) or not np.isfinite(smoothing_fwhm) or smoothing_fwhm < 0):
        raise ValueError(f"smoothing_fwhm must be a width in mm (a number >= 0) or None, got "
                         f"{smoothing_fwhm!r}")
    smoothing_fwhm = float(smoothing_fwhm) if smoothing_fwhm else None
    if intersect_mask and mask is None:  # else silently the computed mask alone
        raise ValueError("intersect_mask (--intersect-mask) intersects a given mask (--mask) "
                         "with the computed one: give the mask")
    if resample not in (None, "mask"):
        # True is the estimators' "resample to the mask", which float() would read as 1 mm
        if isinstance(resample, bool) or not isinstance(resample, (int, float)) \
                or not resample > 0:
            raise ValueError(f"resample must be a voxel size in mm (a number > 0) or 'mask' "
                             f"(the mask's grid), got {resample!r}")
        resample = float(resample)
    out = Path(out).expanduser()
    if not out.exists():  # before the header pass: nowhere to write the store is said first
        check_writable(out, "; choose another --out; nothing converted")
    # one conversion into a store at a time: another one, of other inputs, would remove the
    # store this one writes into as unfinished; of the same inputs, it would do its work twice
    with exclusive_name(out, waiting=f"{out}: another conversion into it is running; waiting "
                                     "for it to end"):
        return _convert(cohort, out, mask=mask, resample=resample, nan=nan, labels=labels,
                        classes=classes, columns=columns, intersect_mask=intersect_mask,
                        client=client, n_workers=n_workers, block_rows=block_rows,
                        progress=progress, append=append, smoothing_fwhm=smoothing_fwhm)


def _convert(cohort, out: Path, *, mask, resample, nan, labels, classes, columns,
             intersect_mask, client, n_workers, block_rows, progress, append,
             smoothing_fwhm) -> Store:
    """:func:`convert`, its arguments checked, while it holds ``out``."""
    t0 = time.perf_counter()
    plan = _plan(cohort, mask, resample, labels, classes, columns, block_rows, intersect_mask,
                 smoothing_fwhm)
    g, made, n_old = _existing_store(out), None, None
    if g is not None:
        g, made, n_old = _compare(out, g, plan, mask=mask, resample=resample, nan=nan,
                                  classes=classes, intersect_mask=intersect_mask,
                                  block_rows=block_rows, append=append)
        # shards deleted or truncated since they were written are written again; then files
        # changed since: a reopened block would otherwise be read from them beside the others
        complete = g is not None and not reopen_damaged(out) and g.attrs.get("complete")
        if n_old is None and g is not None and not check_inputs(
                out, g, plan.stats, plan.paths, plan.counts, mask is None or intersect_mask,
                complete):
            remove_aside(out)
            g = None
        if n_old is None and g is not None and complete:
            log.info("%s is already complete; nothing to do", out)
            return open_store(out)
        if g is not None:
            log.info("%s into %s", "appending rows" if n_old is not None else
                     "resuming the conversion", out)
    n_to_read = len(plan.rows) - (n_old or 0)
    with _table_lines(plan.per_row, plan.rows), _workers(
            client, n_workers, n_to_read * int(np.prod(plan.grid[0])) * 4) as c:
        params = {"fingerprint": plan.fingerprint, "cohort": str(cohort), "mask": describe(mask),
                  "resample": resample, "intersect_mask": intersect_mask, "nan": nan,
                  "block_rows": block_rows, "n_files": len({e["path"] for e in plan.entries}),
                  "smoothing_fwhm": smoothing_fwhm}
        if g is None:
            g = _create(out, c, plan, params, cohort=cohort, classes=classes, columns=columns,
                        intersect_mask=intersect_mask, block_rows=block_rows, progress=progress)
        elif n_old is not None:
            _extend(out, c, g, plan, params, n_old=n_old, made=made, cohort=cohort, mask=mask,
                    intersect_mask=intersect_mask, progress=progress)
        done, results = _write_blocks(c, out, g, plan, nan, progress)
        n_workers_used = len(c.nthreads())
    return _finish(out, g, t0, len(plan.rows), done, results, n_old, n_workers_used)


@dataclass(frozen=True)
class _Plan:
    """What a conversion is to write, read from the cohort before anything is written.

    Attributes
    ----------
    entries : list of dict
        The cohort's entries (:func:`fgscale.images._cohort.read_cohort`).
    headers : list of ImageHeader
        Each entry's file's header.
    paths : list of str
        Each entry's file.
    stats : ndarray of shape (n_entries, 2)
        Each entry's file's size and time (:func:`fgscale.store._inputs.file_stats`).
    counts : list of int
        Each entry's number of rows.
    per_row : list of tuple
        Each row's entry, volume and the number of volumes of its file.
    rows : list of tuple
        Each row's resolved path, volume, label, group and split.
    sources : list of tuple
        Each row's file, volume and the file's volumes, as the tasks read them.
    has_labels : bool
    targets : list of float or None
    mask_img : nibabel image or None
        The given mask.
    grid : tuple
        The store's shape and affine (as a list).
    resampled : bool
    fingerprint : str
    smoothing_fwhm : float or None
    """

    entries: list
    headers: list
    paths: list
    stats: np.ndarray
    counts: list
    per_row: list
    rows: list
    sources: list
    has_labels: bool
    targets: list | None
    mask_img: object
    grid: tuple
    resampled: bool
    fingerprint: str
    smoothing_fwhm: float | None


def _plan(cohort, mask, resample, labels, classes, columns, block_rows, intersect_mask,
          smoothing_fwhm=None) -> _Plan:
    """Read the cohort and every file's header, choose the grid and fingerprint the inputs
    (steps 1 and 2 of the module's docstring): what is wrong in them is said here."""
    entries = read_cohort(cohort, labels, classes, columns=columns)
    headers = entry_headers(entries)
    paths = [e["path"] for e in entries]
    volumes = entry_volumes(entries, headers)
    # per entry (a file, or one volume of it): a file listed by volume has a record per row
    stats, counts = file_stats(paths), [len(v) for v in volumes]
    per_row = [(e, v, n_volumes(h)) for e, h, vs in zip(entries, headers, volumes, strict=True)
               for v in vs]
    rows = [(str(Path(e["path"]).resolve()), v, e["label"], e["group"], e["split"])
            for e, v, _ in per_row]
    has_labels = any(e["label"] for e in entries)  # a table without a label column has none
    targets = None if entries[0]["target"] is None else [e["target"] for e, _, _ in per_row]
    mask_img = None if mask is None else load_img(mask)
    grid, resampled = target_grid(entries, headers, mask_img, resample)
    grid = (tuple(grid[0]), np.asarray(grid[1]).tolist())
    fingerprint = input_fingerprint(rows, mask, resample, block_rows, intersect_mask, targets,
                                    smoothing_fwhm)
    # each row's file, volume and the file's volumes (read_volumes reads whole files at once)
    sources = [(r[0], r[1], n) for r, (_, _, n) in zip(rows, per_row, strict=True)]
    return _Plan(entries=entries, headers=headers, paths=paths, stats=stats, counts=counts,
                 per_row=per_row, rows=rows, sources=sources, has_labels=has_labels,
                 targets=targets, mask_img=mask_img, grid=grid, resampled=resampled,
                 fingerprint=fingerprint, smoothing_fwhm=smoothing_fwhm)


def _existing_store(out: Path):
    """The store at ``out``, opened to write, or None where there is none; a folder there that
    is not a store is refused."""
    if out.is_dir() and not any(out.iterdir()):  # made empty beforehand (a job script's mkdir)
        out.rmdir()
    if out.is_dir() and not (out / "zarr.json").is_file():  # never written into, nor removed
        raise StoreError(f"{out}: a folder that is not a store; choose another --out (a new "
                         "path, or an empty folder)")
    return open_group_checked(out, "r+") if out.exists() else None


def _compare(out: Path, g, plan: _Plan, *, mask, resample, nan, classes, intersect_mask,
             block_rows, append):
    """The existing store ``g`` against the plan's inputs: ``(g, made, n_old)``, ``g`` None
    where it was an unfinished conversion of other inputs (set aside), ``made`` the fingerprint
    it was made with, ``n_old`` the rows it held where the plan appends to it, else None.
    Other inputs are refused."""
    rows, targets, fingerprint = plan.rows, plan.targets, plan.fingerprint
    n_old = None
    made = g.attrs.get("params", {}).get("fingerprint")
    pending = g.attrs.get("appending")
    differs = functools.partial(changed, g, rows, targets, describe(mask), resample, intersect_mask,
                                block_rows, plan.smoothing_fwhm)  # in words, for the messages below
    smoothed = g.attrs.get("params", {}).get("smoothing_fwhm")
    if append and smoothed != plan.smoothing_fwhm:  # rows smoothed unlike the store's
        raise StoreError(f"{out}: its rows were converted with --smoothing-fwhm "
                         f"{smoothed or 'none'}, and --append asks for "
                         f"{plan.smoothing_fwhm or 'none'}; append with the store's")
    if pending and pending["to"] != fingerprint:  # its old rows must not be removed
        raise StoreError(f"{out}: an append to it was interrupted; finish it first: re-run "
                         "that command (the same table, with --append)")
    if append and (made != fingerprint or pending):
        n_old = check_append(out, g, rows=rows, targets=targets, counts=plan.counts,
                             stats=plan.stats, mask=mask, resample=resample,
                             block_rows=block_rows, intersect_mask=intersect_mask, nan=nan,
                             classes=classes, grid=plan.grid)
    elif made != fingerprint and made is not None and not g.attrs.get("complete"):
        # an unfinished conversion of other inputs (the command failed, the cohort was then
        # corrected): its blocks can serve nothing, and keeping it would block the command
        log.warning("%s: an unfinished conversion of other inputs%s is there; starting "
                    "afresh", out, differs())
        remove_aside(out)
        g = None
    elif made != fingerprint:
        more = len(rows) > g["X"].shape[0]
        raise StoreError(f"{out}: exists and was made from other inputs or arguments"
                         f"{differs()}; remove it or choose another --out" + (
                             ", or add --append (append=True) to convert only the rows "
                             "listed after the store's" if more else ""))
    return g, made, n_old


def _create(out: Path, c, plan: _Plan, params: dict, *, cohort, classes, columns, intersect_mask,
            block_rows, progress):
    """Create the empty store of the plan (its mask computed by ``c``'s tasks unless given)."""
    rows, targets = plan.rows, plan.targets
    store_mask = final_mask(c, plan.mask_img, plan.sources, plan.grid, plan.resampled,
                            intersect_mask, progress)
    if block_rows is None:
        block_rows = _block_rows(len(rows), int(store_mask.sum()), c)
    names, y = None, None
    if plan.has_labels:
        names = list(classes) if classes is not None else class_order(r[2] for r in rows)
        y = np.array([names.index(r[2]) for r in rows])
    return create_whole(
        out, n_samples=len(rows), mask=store_mask, affine=np.asarray(plan.grid[1]),
        y=y, classes=names, target=targets, source=[r[0] for r in rows],
        volume=[r[1] for r in rows], groups=[r[3] for r in rows],
        split=[r[4] for r in rows], block_rows=block_rows, extra={"inputs": plan.stats},
        # the table's column of the target (--target-column), which scores name
        attrs={"synthetic": is_synthetic(cohort), "target_name": None if targets is None
               else ((columns or {}).get("target") or "target"), "params": params,
               "space_codes": space_codes(load_img(plan.headers[0].path))})  # its first's


def _extend(out: Path, c, g, plan: _Plan, params: dict, *, n_old: int, made, cohort, mask,
            intersect_mask, progress) -> None:
    """Add the plan's rows after the ``n_old`` of the complete store ``g`` (:mod:`._append`), or
    resume that append: its blocks are then written as any unfinished ones."""
    if mask is None or intersect_mask:  # before the store changes
        check_covered(c, g["mask"][:], plan.sources[n_old:], plan.grid, plan.resampled, progress,
                      out)
    if made != plan.fingerprint:
        append_rows(g, n_old=n_old, rows=plan.rows, targets=plan.targets, stats=plan.stats,
                    fingerprint=plan.fingerprint, params=params, synthetic=is_synthetic(cohort))
    # files changed since the append began: their blocks are written again
    check_inputs(out, g, plan.stats, plan.paths, plan.counts, False, False)


def _write_blocks(c, out: Path, g, plan: _Plan, nan: str, progress: bool):
    """Convert the blocks of ``g`` whose ``done`` flag is not set, as tasks of ``c``: the flags
    before, and each task's result."""
    sources, n_rows, step = plan.sources, len(plan.rows), g.attrs["block_rows"]
    done = g["done"][:]
    # by the place of a block's first row in its run, then in the store: while one thread
    # goes on inflating a 4D run where its block before stopped (read_volumes), the others
    # take other runs rather than inflate the same one again; a 3D cohort keeps its order
    todo = sorted(np.flatnonzero(done == 0), key=lambda b: (sources[b * step][1], b))
    # the mask in the key: a store made afresh under the same fingerprint may have another
    key = f"{plan.fingerprint}:{hashlib.sha256(g['mask'][:].tobytes()).hexdigest()}"
    # absolute, as the sources: workers of a cluster joined by address run elsewhere
    args = [(str(out.resolve()), key, int(b),
             sources[slice(*block_range(b, step, n_rows))],
             plan.grid, plan.resampled, nan, plan.smoothing_fwhm) for b in todo]
    already = n_rows - sum(len(a[3]) for a in args)
    results = run_tasks(c, _convert_block, args, progress=progress, desc="converting",
                        total=n_rows, unit="rows",
                        initial=already, weight=lambda result: result["rows"])
    return done, results


def _finish(out: Path, g, t0: float, n_rows: int, done, results, n_old,
            n_workers_used: int) -> Store:
    """Mark the store complete with the run's summary (step 4), and open it."""
    zero = sorted(z for r in results for z in r["zero"])
    if zero:  # a computed mask refuses such an image; a given one took it without a word
        log.warning("%s: %d row(s) are 0 at every voxel of the mask (a failed contrast, or an "
                    "image off the mask), e.g. %s (volume %d)", out, len(zero), *zero[0])
    seconds = time.perf_counter() - t0
    n_features = int(g["X"].shape[1])
    written = sum(r["bytes"] for r in results)
    summary = {"n_samples": n_rows, "n_features": n_features, "bytes": n_rows * n_features * 4,
               "bytes_written_this_run": written, "blocks_skipped": int(done.sum()),
               "seconds": round(seconds, 3), "n_workers": n_workers_used,
               "task_seconds": round(sum(r["seconds"] for r in results), 3),
               "mb_per_s": round(written / 1e6 / max(seconds, 1e-9), 2),
               "rows_per_s": round(sum(r["rows"] for r in results) / max(seconds, 1e-9), 2)}
    if n_old is not None:
        summary["rows_appended"] = n_rows - n_old
    # the append's record goes in the same write as the flag: complete, nothing is pending
    mark_complete(out, summary=summary, **({} if n_old is None else {"appending": None}))
    log.info("converted %d rows x %d voxels (%.1f MB) in %.1f s", n_rows, n_features,
             summary["bytes"] / 1e6, seconds)
    return open_store(out)


@contextlib.contextmanager
def _table_lines(per_row, rows):
    """Errors of the files read (in tasks, which know only their paths) begin with the table's
    file and line that lists the file, or the volume, as the checks before conversion do."""
    try:
        yield
    except ValueError as exc:
        text, where = str(exc), None
        for (e, volume, _), row in zip(per_row, rows, strict=True):
            if e["where"] == e["path"]:  # a file given without a table
                continue
            if text.startswith(f"{row[0]} (volume {volume})"):
                where = e["where"]
                break
            if where is None and text.startswith(f"{row[0]}:"):
                where = e["where"]  # the file's first row: a volume of it may name another
        if where is None:
            raise
        raise ValueError(f"{where}: {text}") from None


def summary_line(store: Store) -> str:
    """What ``fgscale convert`` says of the store it wrote: its size, what it holds to learn,
    and the conversion's speed."""
    s = store.attrs.get("summary", {})
    n = len(store.classes) if store.has_labels else 0
    what = f"{n} class{'es' * (n != 1)}" if store.has_labels else "a target (regression)"
    if store.has_labels and store.target is not None:  # train picks the labels unless told
        what += " and a target (train --task regression)"
    appended = f", {s['rows_appended']} rows appended" if "rows_appended" in s else ""
    return (f"{store.path}: {store.n_samples} rows x {store.n_features} voxels, {what}, "
            f"{s.get('bytes', 0) / 1e6:.1f} MB; {s.get('seconds', 0):.1f} s, "
            f"{s.get('rows_per_s', 0):.1f} rows/s, {s.get('mb_per_s', 0):.1f} MB/s "
            f"({s.get('blocks_skipped', 0)} blocks already done{appended})")


def _workers(client, n_workers: int | None, voxel_bytes: int):
    """Where the blocks run: the given or active client; else, for less than 1 GiB of voxels to
    read, threads of this process; else an embedded cluster of worker threads.

    Threads either way: a conversion's work (inflating, gathering, writing) releases the GIL,
    where worker processes cost a start, imports in each worker and a shutdown that a cohort of
    a few hundred files does not repay. Below 1 GiB (a few seconds of work on 2 cores) even
    importing ``distributed`` costs a sizeable share (scripts/bench_convert.py --end-to-end).
    """
    if n_workers is not None:
        check_count("n_workers", n_workers)
    if client is None and active_client() is None and voxel_bytes < _IN_PROCESS_BYTES:
        n = cpu_count() if n_workers is None else n_workers
        log.info("converting with %d thread(s) of this process (%.0f MB of voxels: no Dask "
                 "cluster started)", n, voxel_bytes / 1e6)
        return ThreadTasks(n)
    return get_client(client, n_workers=n_workers, processes=False)
