"""The grid and the mask of a store converted from images: the grid the images share (or the
mask's, or a resampled one), and the mask given, computed from the images by Dask tasks as
"finite and non-zero in every image", or both intersected; and, for an append
(:mod:`fgscale.store._append`), whether new images keep a computed mask whole.
"""

from __future__ import annotations

import logging

import nibabel as nib
import numpy as np

from fgscale._dask.client import run_tasks
from fgscale.images._cohort import entry_name
from fgscale.images._nifti import common_grid, grid_mismatch, load_mask, nonzero_voxels, same_grid
from fgscale.images._volumes import iter_volumes
from fgscale.store._inputs import describe
from fgscale.store._shards import StoreError

__all__ = ["check_covered", "final_mask", "target_grid"]

log = logging.getLogger(__name__)


def target_grid(entries, headers, mask_img, resample):
    """Grid (shape, affine) of the store, and whether images must be resampled."""
    # without resampling, the grid most images share: the odd file is the one named
    common, most = common_grid(headers) if resample is None else (0, 0)
    reference = mask_img if mask_img is not None else headers[common]
    if resample is None or resample == "mask":
        if resample == "mask" and mask_img is None:
            raise ValueError("resample='mask' (--resample mask) resamples the images to the "
                             "mask's grid: give the mask (mask=, --mask)")
        grid = (tuple(reference.shape[:3]), reference.affine)
        if resample is None:
            for e, img in zip(entries, headers, strict=True):
                if not same_grid(img.shape, img.affine, grid):
                    raise ValueError(grid_mismatch(
                        entry_name(e), img.shape, img.affine, grid,
                        "mask" if mask_img is not None else "majority",
                        # each value with the API that takes it: the estimators' resample=True
                        # is no value of convert's (there a voxel size of 1 mm)
                        " (resample='mask' for convert(), --resample mask for fgscale convert, "
                        "resamples the images to the mask's grid)" if mask_img is not None else
                        f" ({most} of {len(headers)} images, e.g. {entries[common]['path']}; "
                        "resample=MM for convert(), --resample MM for fgscale convert, "
                        "resamples every image to a voxel size of MM mm)"))
        return grid, resample == "mask"
    # nibabel.processing imports scipy.ndimage, a tenth of a second that a conversion without
    # resampling (most) should not pay: it is imported where resampling happens.
    from nibabel.processing import vox2out_vox

    mm = float(resample)
    if not mm > 0:
        raise ValueError(f"resample must be a positive voxel size in mm or 'mask', got {resample}")
    shape, affine = vox2out_vox((reference.shape[:3], reference.affine), (mm, mm, mm))
    return (tuple(int(s) for s in shape), affine), True


def _parts(sources, client) -> list:
    """``sources`` in about 4 consecutive parts per worker, a task each: a 4D file's volumes
    stay together, and every worker gets a share."""
    step = max(1, len(sources) // (4 * max(1, len(client.nthreads()))))
    return [sources[i:i + step] for i in range(0, len(sources), step)]


def _mask_block(sources, grid, resampled: bool) -> tuple[np.ndarray, list, dict]:
    """Dask task: voxels finite and non-zero in every given volume, shape grid_shape, bool;
    each volume's count of them, as (path, volume, n_volumes, count); and where some volume is
    not finite ("nonfinite") or zero ("zero"), with the first volume not finite ("first", its
    source (path, volume, n_volumes), or None), for :func:`_warn_nonfinite`."""
    mask, counts = np.ones(grid[0], bool), []
    nonfinite, zero, first = np.zeros(grid[0], bool), np.zeros(grid[0], bool), None
    for (path, volume, n), vol in zip(sources, iter_volumes(sources, grid, resampled),
                                      strict=True):
        own = nonzero_voxels(f"{path} (volume {volume})", vol, "give --mask")
        mask &= own
        counts.append((path, volume, n, int(own.sum())))
        bad = ~np.isfinite(vol)
        if first is None and bad.any():
            first = (path, volume, n)
        nonfinite |= bad
        zero |= vol == 0
    return mask, counts, {"nonfinite": nonfinite, "zero": zero, "first": first}


def _warn_nonfinite(parts: list[dict], given, sources) -> None:
    """Say how many voxels the computed mask leaves out only because some image holds NaN or
    inf there (non-zero in every image otherwise), and the first image that does: a voxel or
    two lost from a whole cohort's mask would otherwise go unnoticed (33,852 voxels where the
    grid's mask has 33,854)."""
    # the first in the table's order, whichever task ended first
    order = {tuple(source): i for i, source in enumerate(sources)}
    firsts = sorted((p["first"] for p in parts if p["first"] is not None), key=order.get)
    if not firsts:
        return
    path, volume, n = firsts[0]
    left = np.logical_or.reduce([p["nonfinite"] for p in parts])
    left &= ~np.logical_or.reduce([p["zero"] for p in parts])
    if given is not None:  # intersected with a given mask: only the voxels it holds
        left &= given
    if left.any():
        log.warning("the mask computed from the images leaves out %d voxel(s) where some image "
                    "holds NaN or inf (the first: %s); give --mask (mask=) to keep them, with "
                    "--nan zero (nan='zero') for those values", int(left.sum()),
                    f"{path} (volume {volume})" if n > 1 else path)


def _warn_narrow(counts: list, n_mask: int) -> None:
    """Name the images whose own voxels are far fewer than most images': the mask computed as
    their intersection loses every voxel one lacks (a partial field of view, a brain cut by
    the acquisition), which nothing would say."""
    typical = float(np.median([c for *_, c in counts]))
    narrow = [t for t in counts if t[3] < 0.9 * typical]
    if narrow and len(narrow) <= len(counts) / 10:
        named = ", ".join(f"{p}" + (f" (volume {v})" if n > 1 else "") + f": {c}"
                          for p, v, n, c in narrow[:3])
        log.warning("the mask computed from the images holds %d voxels, where most images are "
                    "non-zero at %d; %d image(s) are non-zero at far fewer and cut it to theirs "
                    "(%s%s): leave them out, or give --mask", n_mask, typical, len(narrow),
                    named, ", ..." if len(narrow) > 3 else "")


def final_mask(client, mask_img, sources, grid, resampled, intersect, progress) -> np.ndarray:
    """The store's mask: given (put on the grid), computed from the data, or both intersected."""
    given = None
    if mask_img is not None:
        given, affine = load_mask(mask_img)
        if not same_grid(given.shape, affine, grid):
            from nibabel.processing import resample_from_to  # see target_grid

            img = nib.Nifti1Image(given.astype(np.float32), affine)
            given = resample_from_to(img, grid, order=0).get_fdata() > 0.5
            if not given.any():
                raise ValueError(f"{describe(mask_img)}: the mask is empty on the target grid")
        if not intersect:
            return given
    partial = run_tasks(client, _mask_block,
                        [(p, grid, resampled) for p in _parts(sources, client)],
                        progress=progress, desc="mask", unit="blocks")
    computed = np.logical_and.reduce([m for m, _, _ in partial])
    _warn_narrow([t for _, counts, _ in partial for t in counts], int(computed.sum()))
    _warn_nonfinite([nonfinite for _, _, nonfinite in partial], given, sources)
    final = computed if given is None else computed & given
    if not final.any():
        raise ValueError("the mask is empty: no voxel is finite and non-zero in every image"
                         + (" and inside the given mask" if given is not None else ""))
    return final


def _uncovered_block(sources, grid, resampled: bool, mask: np.ndarray) -> list:
    """Dask task: the volumes zero or not finite somewhere inside ``mask``, as (path, volume,
    voxels) triples."""
    found = []
    for (path, volume, _), vol in zip(sources, iter_volumes(sources, grid, resampled),
                                      strict=True):
        inside = vol[mask]
        bad = int(np.count_nonzero(~(np.isfinite(inside) & (inside != 0))))
        if bad:
            found.append((path, int(volume), bad))
    return found


def check_covered(client, mask: np.ndarray, sources, grid, resampled, progress, out) -> None:
    """Refuse new images that a mask computed from a store's images does not fit: where one is
    zero or not finite inside it, a conversion of the whole table would compute a smaller mask,
    so the store grown with them would not be the one its table gives."""
    args = [(p, grid, resampled, mask) for p in _parts(sources, client)]
    found = [t for part in run_tasks(client, _uncovered_block, args, progress=progress,
                                     desc="mask check", unit="blocks") for t in part]
    if found:  # the first in the table's order, whichever task ended first
        order = {(path, volume): i for i, (path, volume, _) in enumerate(sources)}
        found.sort(key=lambda t: order[t[:2]])
        path, volume, n = found[0]
        others = f", and {len(found) - 1} other new image(s)" if len(found) > 1 else ""
        raise StoreError(f"{out}: {path} (volume {volume}) is zero or not finite at {n} voxel(s) "
                         f"of the store's mask{others}; that mask was computed from the images, "
                         "and the whole table would give a smaller one: convert the table afresh "
                         "into another --out (with --mask, to keep one mask); nothing was "
                         "changed")
