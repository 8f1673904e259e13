"""Images in, rows out: NIfTI files or images masked into (n_samples, n_voxels) arrays.

The estimators' ``fit``, ``predict`` and ``score`` and ``fgscale predict`` take images as well as
arrays; they all go through :func:`mask_images`, with the reader and the errors of
``fgscale convert``. Nothing here imports torch or scikit-learn.
"""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale.images._nifti import _name, grid_mismatch, load_img, read_data, read_image, same_grid

__all__ = ["as_mask_image", "compute_mask", "is_images", "mask_images"]

_NIFTI_SUFFIXES = (".nii", ".nii.gz", ".img", ".hdr")


def _is_image_path(x) -> bool:
    return isinstance(x, (str, os.PathLike)) and str(x).lower().endswith(_NIFTI_SUFFIXES)


def _is_one_image(x) -> bool:
    return _is_image_path(x) or isinstance(x, nib.spatialimages.SpatialImage)


def is_images(X) -> bool:
    """Whether ``X`` is images (a NIfTI path, an image, or a non-empty list of those), rather
    than an array or a store.

    Parameters
    ----------
    X : object

    Returns
    -------
    bool
    """
    if _is_one_image(X):
        return True
    if isinstance(X, (list, tuple)) and len(X) > 0:
        return all(_is_one_image(x) for x in X)
    return False


def _as_list(imgs) -> list:
    return list(imgs) if isinstance(imgs, (list, tuple)) else [imgs]


def _volumes(imgs):
    """Yield (name, img, data) for each 3D volume of ``imgs``, in order (4D images unrolled)."""
    for item in _as_list(imgs):
        if isinstance(item, (str, os.PathLike)):
            img, data = read_image(Path(item))
        else:
            img = load_img(item)
            data = read_data(img)
        name = _name(img) if not isinstance(item, (str, os.PathLike)) else str(item)
        if data.ndim == 3:
            yield name, img, data
        else:
            for t in range(data.shape[3]):
                yield f"{name} (volume {t})", img, data[..., t]


def _on_grid(name: str, img, data: np.ndarray, shape, affine, resample: bool) -> np.ndarray:
    """``data`` on the mask's grid (shape, affine): as it is if it matches, resampled if
    allowed."""
    if same_grid(data.shape, img.affine, (shape, affine)):
        return data
    if not resample:
        raise ValueError(grid_mismatch(
            name, data.shape, img.affine, (shape, affine), "mask", " (resample=True in Python, "
            "--resample for fgscale predict, resamples the images to the mask's grid)"))
    from nibabel.processing import resample_from_to

    vol = nib.Nifti1Image(np.asarray(data, dtype=np.float32), img.affine)
    return resample_from_to(vol, (tuple(shape), affine), order=1).get_fdata(dtype=np.float32)


def compute_mask(imgs) -> nib.Nifti1Image:
    """The voxels finite and non-zero in every volume of ``imgs`` (``fgscale convert``'s default
    mask), as a uint8 image on their grid.

    Parameters
    ----------
    imgs : str, Path, nibabel image, or a list of them (3D or 4D)

    Returns
    -------
    mask_img : nibabel.Nifti1Image
    """
    mask, grid = None, None
    for name, img, data in _volumes(imgs):
        if grid is None:
            grid = (tuple(data.shape), img.affine)
        if not same_grid(data.shape, img.affine, grid):  # no mask: nothing to resample to
            raise ValueError(grid_mismatch(name, data.shape, img.affine, grid, "first image"))
        keep = np.isfinite(data) & (data != 0)
        mask = keep if mask is None else mask & keep
    if mask is None:
        raise ValueError("no image given to compute a mask from")
    if not mask.any():
        raise ValueError("the images share no voxel that is finite and non-zero in all of them: "
                         "give a mask")
    return nib.Nifti1Image(mask.astype(np.uint8), grid[1])


def mask_images(imgs, mask_img, *, resample: bool = False) -> np.ndarray:
    """The in-mask values of every volume of ``imgs``, one row per volume.

    Parameters
    ----------
    imgs : str, Path, nibabel image, or a list of them
        3D volumes or 4D series (one row per volume), in order.
    mask_img : nibabel image, str or Path
        3D; voxels finite and non-zero are in the mask.
    resample : bool, default=False
        Resample images on another grid to the mask's (linear interpolation); by default
        such an image is refused, naming it.

    Returns
    -------
    X : ndarray of shape (n_volumes, n_voxels), float32
        Rows are ``vol[mask]`` in C order, as the stores' rows and nilearn's maskers.

    Raises
    ------
    ValueError
        Naming the image: unreadable, on another grid, or with non-finite values in the mask.
    """
    mask_img = load_img(mask_img)
    mask = read_data(mask_img)
    if mask.ndim != 3:
        raise ValueError(f"{_name(mask_img)}: a mask must be 3D, got shape {mask.shape}")
    mask = np.isfinite(mask) & (mask != 0)
    rows = []
    for name, img, data in _volumes(imgs):
        vol = _on_grid(name, img, data, mask.shape, mask_img.affine, resample)
        row = np.asarray(vol[mask], dtype=np.float32)
        if not np.isfinite(row).all():
            raise ValueError(f"{name}: {int((~np.isfinite(row)).sum())} non-finite value(s) "
                             "inside the mask")
        rows.append(row)
    if not rows:
        raise ValueError("no image given")
    return np.stack(rows)


def as_mask_image(mask, affine=None) -> nib.Nifti1Image:
    """A boolean grid array (with its affine) or a mask image/path, as a uint8 image."""
    if isinstance(mask, np.ndarray):
        if mask.ndim != 3:
            raise ValueError(f"a mask array must be 3D, got shape {mask.shape}")
        return nib.Nifti1Image(mask.astype(np.uint8),
                               np.eye(4) if affine is None else np.asarray(affine, float))
    return load_img(mask)

