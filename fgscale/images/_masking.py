"""Images in, rows out: NIfTI files or images masked into (n_samples, n_voxels) arrays.

The estimators' ``fit``, ``predict`` and ``score`` and ``fgscale predict`` take images as well as
arrays; they all go through :func:`mask_images`, with the reader and the errors of
``fgscale convert``. Nothing here imports torch or scikit-learn.
"""

from __future__ import annotations

import glob
import os
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale.images._bids_names import parse_bids_name
from fgscale.images._nifti import (
    common_grid,
    grid_mismatch,
    load_img,
    load_mask,
    nonzero_voxels,
    read_data,
    read_header,
    read_image,
    same_grid,
    space_codes,
    with_space_codes,
)
from fgscale.images._smoothing import smooth_volume

__all__ = ["as_mask_image", "bool_mask_array", "compute_mask", "image_list", "image_subjects",
           "is_images", "mask_images", "refuse_odd_item"]

_NIFTI_SUFFIXES = (".nii", ".nii.gz", ".img", ".hdr")


def _is_pattern(x) -> bool:
    """A path with shell wildcards that names no file itself (nilearn expands those too)."""
    return (isinstance(x, (str, os.PathLike)) and any(c in str(x) for c in "*?[")
            and not os.path.exists(x))


def _is_image_path(x) -> bool:
    return isinstance(x, (str, os.PathLike)) and (
        str(x).lower().endswith(_NIFTI_SUFFIXES) or _is_pattern(x))


def _is_sequence(X) -> bool:
    """A list or tuple, or a 1D array or pandas Series of strings or objects (a table's column
    of paths)."""
    if isinstance(X, (list, tuple)):
        return True
    dtype = getattr(X, "dtype", None)
    return getattr(dtype, "kind", "") in ("O", "S", "U") and getattr(X, "ndim", 0) == 1


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
    if _is_sequence(X) and len(X) > 0:
        return all(_is_one_image(x) for x in X)
    return False


def refuse_odd_item(X) -> None:
    """Refuse a list of images with an item that is none (a mistyped suffix, an .mgz file, an
    array among paths), or a list of strings none of which names a NIfTI file, naming the first
    such item: numpy would fail on the first string, a good file, as a float to convert."""
    if isinstance(X, (str, os.PathLike)) or not _is_sequence(X) or not len(X):
        return
    items = list(X)
    images = [_is_one_image(x) for x in items]
    if all(images) or not (any(images) or all(isinstance(x, (str, os.PathLike)) for x in items)):
        return
    i = images.index(False)
    what = (f"'{items[i]}' is not a NIfTI path ({', '.join(_NIFTI_SUFFIXES)}, or a pattern of "
            "them)" if isinstance(items[i], (str, os.PathLike))
            else f"an object of type {type(items[i]).__name__} among NIfTI images")
    raise ValueError(f"X[{i}]: {what}; give a list of NIfTI paths or nibabel images, or an "
                     "array of rows")


def image_list(imgs) -> list:
    """The images ``imgs`` stands for, as a list: one image, a list, tuple, array or Series of
    them; a path with wildcards (``"sub-*/beta.nii.gz"``) stands for the files it matches,
    in sorted order; a path from ``~`` for the user's file.

    Raises
    ------
    FileNotFoundError
        Naming a pattern that matches no file.
    """
    out = []
    for item in (list(imgs) if _is_sequence(imgs) else [imgs]):
        if _is_pattern(item):
            matches = sorted(glob.glob(os.path.expanduser(str(item))))
            if not matches:
                raise FileNotFoundError(f"{item}: no file matches this pattern")
            out.extend(matches)
        elif isinstance(item, str) and item.startswith("~"):
            out.append(os.path.expanduser(item))
        elif isinstance(item, Path) and str(item).startswith("~"):
            out.append(item.expanduser())
        else:
            out.append(item)
    return out


def image_subjects(imgs) -> np.ndarray | None:
    """The subject of each volume of ``imgs`` from their files' BIDS names
    (``sub-<label>_..._<suffix>.nii.gz``; each volume of a 4D file its file's subject), as
    ``"sub-<label>"``; None where an item is no file, or a file name carries no subject.
    Reads the files' headers only (the volumes of 4D files)."""
    subjects = []
    for item in image_list(imgs):
        if not isinstance(item, (str, os.PathLike)):
            return None
        try:
            subject = parse_bids_name(Path(item).name).subject
        except ValueError:  # no BIDS name
            return None
        shape = read_header(item).shape
        subjects += [f"sub-{subject}"] * (shape[3] if len(shape) > 3 else 1)
    return np.asarray(subjects)


def _volumes(imgs):
    """Yield (name, img, data) for each 3D volume of ``imgs``, in order (4D images unrolled)."""
    items = image_list(imgs)
    for i, item in enumerate(items):
        if isinstance(item, (str, os.PathLike)):
            img, data = read_image(Path(item))
            name = str(item)
        else:
            img = load_img(item)
            data = read_data(img)
            name = img.get_filename() or (f"<in-memory image {i} of the list>" if len(items) > 1
                                          else "<in-memory image>")
        if data.ndim == 3:
            yield name, img, data
        else:
            for t in range(data.shape[3]):
                yield f"{name} (volume {t})", img, data[..., t]


# each value with the API that takes it: convert's resample='mask' is no value of these
_MASK_HINT = (" (resample=True for the estimators and predict_run(), --resample for fgscale "
              "predict, resamples the images to the mask's grid)")


def _on_grid(name: str, img, data: np.ndarray, grid, resample: bool, reference: str = "mask",
             hint: str = _MASK_HINT) -> np.ndarray:
    """``data`` on the ``reference``'s grid (shape, affine): as it is if it matches, resampled
    if allowed, else refused naming ``name``, with ``hint``."""
    if same_grid(data.shape, img.affine, grid):
        return data
    if not resample:
        raise ValueError(grid_mismatch(name, data.shape, img.affine, grid, reference, hint))
    return _resampled(data, img.affine, grid)


def _resampled(data: np.ndarray, affine, grid) -> np.ndarray:
    """``data`` (on ``affine``) resampled to ``grid``, (shape, affine), linearly."""
    from nibabel.processing import resample_from_to

    vol = nib.Nifti1Image(np.asarray(data, dtype=np.float32), affine)
    return resample_from_to(vol, (tuple(grid[0]), grid[1]), order=1).get_fdata(dtype=np.float32)


def compute_mask(imgs, *, resample: bool = False) -> nib.Nifti1Image:
    """The voxels finite and non-zero in every volume of ``imgs`` (``fgscale convert``'s default
    mask), as a uint8 image on the first image's grid.

    Parameters
    ----------
    imgs : str, Path, nibabel image, or a list of them (3D or 4D)
    resample : bool, default=False
        Resample images on another grid than the first image's to it (linear interpolation);
        by default such an image is refused, naming it.

    Returns
    -------
    mask_img : nibabel.Nifti1Image
    """
    mask, grid = None, None
    nonfinite, zero, first = None, None, None  # for the voxels left out for NaN or inf
    reference, hint = "first image", ""
    if not resample:  # the grid most images share: the odd image is named, not the one after it
        grid, hint = _common_grid(imgs)
        reference = "majority" if hint else reference
    for name, img, data in _volumes(imgs):
        if grid is None:
            grid = (tuple(data.shape), img.affine)
        data = _on_grid(name, img, data, grid, resample, reference,
                        f" ({hint}resample=True for the estimators and compute_mask() "
                        "resamples the images to the first one's grid, or to the mask's with "
                        "the estimators' mask=)")
        keep = nonzero_voxels(name, data, "give a mask")
        mask = keep if mask is None else mask & keep
        bad = ~np.isfinite(data)
        first = name if first is None and bad.any() else first
        nonfinite = bad if nonfinite is None else nonfinite | bad
        zero = (data == 0) if zero is None else zero | (data == 0)
    if mask is None:
        raise ValueError("no image given to compute a mask from")
    left = int((nonfinite & ~zero).sum())
    if left:  # a voxel or two lost from a cohort's mask would otherwise go unnoticed
        warnings.warn(f"the mask computed from the images leaves out {left} voxel(s) where some "
                      f"image holds NaN or inf (the first: {first}); give a mask (mask=) to "
                      "keep them", UserWarning, stacklevel=2)
    if not mask.any():
        raise ValueError("the images share no voxel that is finite and non-zero in all of them: "
                         "give a mask")
    return nib.Nifti1Image(mask.astype(np.uint8), grid[1])


def _common_grid(imgs) -> tuple[tuple | None, str]:
    """The first image's grid (shape, affine), read from the headers, unless more images share
    another (:func:`~fgscale.images._nifti.common_grid`): then that one, and how many do, for
    the error that names an odd image."""
    items = image_list(imgs)
    if not items:
        return None, ""
    headers = [read_header(Path(i)) if isinstance(i, (str, os.PathLike)) else load_img(i)
               for i in items]
    common, most = common_grid(headers)
    grid = (tuple(headers[common].shape[:3]), headers[common].affine)
    if common == 0:
        return grid, ""
    name = (items[common] if isinstance(items[common], (str, os.PathLike))
            else f"<in-memory image {common} of the list>")
    return grid, f"{most} of {len(items)} images, e.g. {name}; "


_SPARSE = 0.1  # the share of a mask's voxels at 0 that an image is warned of


def mask_images(imgs, mask_img, *, resample: bool = False, smoothing_fwhm=None) -> np.ndarray:
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
    smoothing_fwhm : float or None, default=None
        Smooth each volume, on the mask's grid and before masking, by a Gaussian of this full
        width at half maximum in mm (:func:`~fgscale.images._smoothing.smooth_volume`, as
        nilearn's maskers); its non-finite values are then set to 0, as nilearn's.

    Returns
    -------
    X : ndarray of shape (n_volumes, n_voxels), float32
        Rows are ``vol[mask]`` in C order, as the stores' rows and nilearn's maskers.

    Raises
    ------
    ValueError
        Naming the image: unreadable, on another grid, or with non-finite values in the mask.
    """
    mask, affine = load_mask(mask_img)
    rows, sparse = [], []
    for name, img, data in _volumes(imgs):
        vol = _on_grid(name, img, data, (mask.shape, affine), resample)
        if smoothing_fwhm:
            vol = smooth_volume(vol, affine, smoothing_fwhm)
        row = np.asarray(vol[mask], dtype=np.float32)
        if not np.isfinite(row).all():
            raise ValueError(f"{name}: {int((~np.isfinite(row)).sum())} non-finite value(s) "
                             "inside the mask")
        zeros = int(np.count_nonzero(row == 0))
        if zeros > _SPARSE * row.size:
            sparse.append(f"{name}: {zeros / row.size:.0%}")
        rows.append(row)
    if not rows:
        raise ValueError("no image given")
    if sparse:  # a partial field of view: standardized, its zeros are far from any training row
        warnings.warn(f"{len(sparse)} of {len(rows)} image(s) are 0 at more than "
                      f"{_SPARSE:.0%} of the mask's {rows[0].size} voxels ({'; '.join(sparse[:3])}"
                      f"{'; ...' if len(sparse) > 3 else ''}): outside their field of view? "
                      "What is predicted there is extrapolated; give images that cover the mask",
                      UserWarning, stacklevel=2)
    return np.stack(rows)


def bool_mask_array(mask: np.ndarray) -> np.ndarray:
    """A mask given as an array, as booleans: boolean, or of 0s and 1s (any other values, a
    probability map or atlas labels, are refused rather than guessed at)."""
    if mask.dtype == bool:
        return mask
    if mask.dtype.kind not in "iuf" or not np.isin(mask, (0, 1)).all():
        raise ValueError(f"mask must be a boolean array (or one of 0s and 1s), got dtype "
                         f"{mask.dtype}" + ("" if mask.dtype.kind not in "iuf" else
                                            f" with values {np.unique(mask)[:5].tolist()}"))
    return mask != 0


def as_mask_image(mask, affine=None) -> nib.Nifti1Image:
    """A boolean grid array (with its affine) or a mask image/path, as a uint8 image of 0 and 1
    (an image's voxels finite and non-zero, as :func:`~fgscale.images.load_mask` reads it)."""
    if isinstance(mask, np.ndarray):
        if mask.ndim != 3:
            raise ValueError(f"a mask array must be 3D, got shape {mask.shape}")
        return nib.Nifti1Image(bool_mask_array(mask).astype(np.uint8),
                               np.eye(4) if affine is None else np.asarray(affine, float))
    source = load_img(mask)  # its header's space (MNI...) goes with it
    mask, affine = load_mask(source)
    return with_space_codes(nib.Nifti1Image(mask.astype(np.uint8), affine), space_codes(source))

