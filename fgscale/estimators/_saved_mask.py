"""The files of a saved model (:mod:`fgscale.estimators._persist`), and its mask: ``mask.nii.gz``,
the image the features come from, and a ``mask`` parameter given as an array or a sparse
adjacency, kept as arrays of ``model.npz``."""

from __future__ import annotations

import json
import logging
import os
import warnings
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale.images._masking import as_mask_image
from fgscale.images._nifti import space_codes, with_space_codes

log = logging.getLogger(__name__)

__all__ = ["MASK", "MASK_PARAM", "MODEL_FORMAT", "MODEL_JSON", "MODEL_NPZ", "NPZ_MASK_PARAM",
           "NPZ_PREFIX", "mask_arrays_of", "mask_param", "mask_to_save", "not_saved_by_fgscale",
           "placed_mask", "read_mask", "saved_mask_param"]

MODEL_JSON, MODEL_NPZ, MASK = "model.json", "model.npz", "mask.nii.gz"
MODEL_FORMAT = "fgscale-model"  # model.json's "format"
NPZ_PREFIX = "model."  # state_dict arrays in model.npz, apart from mean_ and scale_
MASK_PARAM = {"saved": MASK}  # an image ``mask`` parameter: the saved mask
NPZ_MASK_PARAM = {"saved": MODEL_NPZ}  # an array, or a sparse adjacency: its arrays
_COO = ("mask.row", "mask.col", "mask.data")


def not_saved_by_fgscale(folder: Path) -> list[str]:
    """The files of a save in ``folder`` (model.json, model.npz, mask.nii.gz) that no fgscale
    save wrote: none where model.json is fgscale's or, missing (a first save killed before
    it), where model.npz holds a model."""
    names = [n for n in (MODEL_JSON, MODEL_NPZ, MASK) if (folder / n).exists()]
    try:
        if MODEL_JSON in names:
            doc = json.loads((folder / MODEL_JSON).read_text())
            return [] if doc.get("format") == MODEL_FORMAT else names
        with np.load(folder / MODEL_NPZ, allow_pickle=False) as npz:
            return [] if any(k.startswith(NPZ_PREFIX) for k in npz.files) else names
    except (OSError, ValueError, AttributeError, zipfile.BadZipFile):
        return names


def mask_to_save(estimator, mask_img, in_npz: bool):
    """The fitted ``mask_img_``, else ``mask_img``, else an image ``mask`` parameter (a path
    parameter is kept as a path in the parameters; arrays go to model.npz, ``in_npz``:
    :func:`mask_arrays_of`, and give no image: a grid array has no affine to place it), as
    uint8 with the image's affine and space codes; None when there is none."""
    mask = next((m for m in (getattr(estimator, "mask_img_", None), mask_img) if m is not None),
                None)
    if mask is None:
        if estimator.mask is None or isinstance(estimator.mask, (str, os.PathLike)) or in_npz:
            return None
        mask = estimator.mask
    mask = as_mask_image(mask)
    data = np.asarray(mask.dataobj)
    mask = with_space_codes(nib.Nifti1Image((np.isfinite(data) & (data != 0)).astype(
        np.uint8), mask.affine), space_codes(mask))
    if int(mask.get_fdata().sum()) != estimator.n_features_in_:
        raise ValueError(f"the mask has {int(mask.get_fdata().sum())} voxels, the "
                         f"estimator {estimator.n_features_in_} features")
    return mask


def mask_arrays_of(mask) -> dict:
    """A ``mask`` parameter given as an array, as arrays of model.npz: a boolean grid (3D,
    the CNN's 2D grid, a 1D chain) as it was, or a sparse adjacency as COO."""
    if hasattr(mask, "tocsr"):
        coo = mask.tocoo()
        return dict(zip(_COO, (coo.row.astype(np.int64), coo.col.astype(np.int64),
                               coo.data.astype(np.float64)), strict=True))
    if isinstance(mask, np.ndarray):
        return {"mask": mask != 0}
    return {}


def mask_param(saved, mask_img, arrays: dict, n_features: int, folder: Path):
    """The ``mask`` parameter of a loaded model, from its saved value ``saved``: the saved mask
    image, the arrays of model.npz (popped from ``arrays``), or a path. A path that is gone (the
    model moved to another machine) gives way to the saved ``mask_img``, the mask as the fit
    used it, so that a clone of the model fits again; None for anything else."""
    if saved == MASK_PARAM:
        return mask_img
    if saved == NPZ_MASK_PARAM:
        return saved_mask_param(arrays, n_features, folder / MODEL_NPZ)
    if not isinstance(saved, str):
        return None
    if mask_img is not None and not os.path.exists(saved):
        log.info("%s: the mask %s is gone; its copy %s stands for it", folder, saved, MASK)
        return mask_img
    return saved


def saved_mask_param(arrays: dict, n_features: int, path: Path):
    """The ``mask`` parameter that :func:`mask_arrays_of` saved, its arrays popped from
    ``arrays``."""
    if "mask" in arrays:
        mask = arrays.pop("mask")
        if mask.dtype != bool or int(mask.sum()) != n_features:
            raise ValueError(f"{path}: array 'mask' must be a boolean grid with "
                             f"{n_features} cells set, got {mask.dtype} {mask.shape}")
        return mask
    row, col, data = (arrays.pop(name, None) for name in _COO)
    if any(a is None or a.ndim != 1 for a in (row, col, data)) or not (
            row.dtype.kind == col.dtype.kind == "i" and data.dtype.kind == "f"
            and len(row) == len(col) == len(data)
            and (len(row) == 0 or 0 <= min(row.min(), col.min())
                 and max(row.max(), col.max()) < n_features)):
        raise ValueError(f"{path}: the mask parameter must be saved as a boolean array 'mask' "
                         f"or as a sparse adjacency of {n_features} features ({', '.join(_COO)})")
    from scipy.sparse import csr_matrix

    return csr_matrix((data, (row, col)), shape=(n_features, n_features))


def read_mask(path: Path, n_features: int) -> nib.Nifti1Image:
    """The saved mask image, checked: 3D, with ``n_features`` voxels."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (model.json says the model has a mask)")
    try:
        img = nib.load(path)
        data = np.asarray(img.dataobj)
    except Exception as exc:  # nibabel raises several types for a damaged file
        raise ValueError(f"{path}: not a readable NIfTI mask ({exc})") from None
    if data.ndim != 3 or int((data != 0).sum()) != n_features:
        raise ValueError(f"{path}: expected a 3D mask of {n_features} voxels, got shape "
                         f"{data.shape} with {int((data != 0).sum())}")
    return with_space_codes(nib.Nifti1Image((data != 0).astype(np.uint8), img.affine),
                            space_codes(img))


def placed_mask(mask_img, affine, path: Path, doc: dict):
    """The saved mask image ``mask_img`` (of ``path``), on ``affine`` when one is given.

    An older fgscale saved a ``mask`` parameter given as a 3D boolean array (which has no
    affine) as an image with the identity affine, 1 mm voxels from the origin, where
    ``coef_img_`` then put the maps: such a save (an identity affine, the mask parameter that
    file) is warned of, naming the file and ``affine``, which places it on the images' grid.
    """
    if affine is not None:
        affine = np.asarray(affine, dtype=float)
        if affine.shape != (4, 4):
            raise ValueError(f"affine must be a 4x4 array (the images' affine), got shape "
                             f"{affine.shape}")
        return nib.Nifti1Image(np.asarray(mask_img.dataobj), affine)
    if doc.get("params", {}).get("mask") == MASK_PARAM and np.array_equal(mask_img.affine,
                                                                          np.eye(4)):
        version = doc.get("versions", {}).get("fgscale", "?")
        warnings.warn(f"{path}: an identity affine (1 mm voxels from the origin), as fgscale "
                      f"{version} saved a mask given as a boolean array, which has none: "
                      "coef_img_ puts the maps there; if the images were on another grid, pass "
                      "load_model(folder, affine=<the images' affine>)", UserWarning,
                      stacklevel=3)
    return mask_img
