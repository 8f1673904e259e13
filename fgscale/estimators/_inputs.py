"""What the estimators take in: arrays with a mask (or a graph), NIfTI images, or a store's
path; and the masks that come with them."""

from __future__ import annotations

import os
import warnings

import numpy as np
from sklearn.base import is_classifier

__all__ = ["check_not_empty", "check_targets_present", "cnn_grid", "coef_images", "images_to_rows",
           "is_store", "mask_image_of", "missing", "refuse_multioutput", "refuse_smoothing",
           "check_store_smoothing",
           "refuse_table_of_images",
           "resolve_graph", "rows_of", "warn_unused_mask"]


def resolve_graph(mask, n_features: int):
    """The feature graph: a boolean mask array (from an array, image or path) or a 1D chain."""
    if mask is None:
        return np.ones(n_features, dtype=bool)
    if hasattr(mask, "tocsr"):  # an explicit sparse adjacency
        return mask
    if not isinstance(mask, np.ndarray):  # an image or a path: errors name the file
        from fgscale.images._nifti import load_mask

        mask = load_mask(mask)[0]
    from fgscale.images._masking import bool_mask_array

    mask = bool_mask_array(mask)
    if int(mask.sum()) != n_features:
        raise ValueError(f"mask has {int(mask.sum())} voxels set but X has {n_features} features")
    return mask


def check_not_empty(X, to: str) -> None:
    """Refuse an empty list or tuple (what ``sorted(glob(...))`` of a wrong folder gives),
    naming it, rather than let scikit-learn call it a 1D array."""
    if isinstance(X, (list, tuple)) and len(X) == 0:
        raise ValueError(f"X is an empty {type(X).__name__}: no image or row to {to} (a glob "
                         "of a wrong folder or pattern matches no file)")


def missing(values) -> np.ndarray:
    """Which of ``values`` (1D) are missing: NaN, None, pandas' NA or NaT."""
    values = np.asarray(values, dtype=object)

    def gap(v):
        try:  # NaN and NaT differ from themselves; pandas' NA has no truth value
            return v is None or bool(v != v)
        except TypeError:
            return True

    return np.fromiter(map(gap, values.ravel()), bool, values.size).reshape(values.shape)


def check_targets_present(y, kind: str) -> None:
    """Refuse a ``y`` (one column) with missing values, naming the first sample without its
    ``kind`` ("label", "target"): a table's column with a gap, which numpy's sort would meet as
    a TypeError, or the regressor's check as a class label."""
    try:  # through __array__: np.ndim of an array-like may call what it does not define
        y = np.asarray(y)
    except ValueError:  # ragged: validate_data names it
        return
    if y.ndim != 1:
        return
    gaps = np.isnan(y.astype(np.float64)) if y.dtype.kind in "biuf" else missing(y)
    if gaps.any():
        n, first = int(gaps.sum()), int(np.argmax(gaps))
        raise ValueError(f"y has {n} missing value{'s' if n > 1 else ''} (NaN, None or NA), "
                         f"{'the first ' if n > 1 else ''}at sample {first}: give every sample "
                         f"its {kind}, or leave out the samples without one")


def refuse_table_of_images(X) -> None:
    """Refuse a pandas DataFrame with a column of NIfTI paths (a cohort table given whole),
    naming the column to give: numpy would fail to read one of its strings as a float."""
    from fgscale.images._masking import is_images

    if not (hasattr(X, "columns") and hasattr(X, "iloc")) or not len(X):
        return
    for name, dtype in X.dtypes.items():  # a wide table of numbers: no column indexed
        if dtype.kind == "O" and is_images(X[name].iloc[:1].tolist()):
            raise ValueError(f"X is a table whose column {name!r} holds NIfTI paths: give that "
                             f"column, X[{name!r}], for the images it names")


def refuse_multioutput(estimator, y) -> None:
    """Refuse a ``y`` of several columns, naming scikit-learn's wrapper that fits one
    estimator per column."""
    # object dtype: lists of lists of any length, as validate_data takes them
    shape = y.shape if hasattr(y, "shape") else np.asarray(y, dtype=object).shape
    if y is not None and len(shape) == 2 and shape[1] > 1:
        wrapper = "Classifier" if is_classifier(estimator) else "Regressor"
        raise ValueError(f"{type(estimator).__name__} fits one column of y, got y of shape "
                         f"{tuple(shape)}: wrap it in sklearn.multioutput.MultiOutput"
                         f"{wrapper} to fit one per column")


def warn_unused_client(client, stacklevel: int, device=None) -> None:
    """Warn that ``client`` has no effect on a fit on arrays or images that trains in this
    process: one with a single phase to train (no ``cv`` folds, one candidate), or one on a GPU.
    A store's rows are read by the cluster's workers; the phases of an in-memory search (the
    folds of ``cv``, several candidates) train on them, on the CPU. ``device``: the fit's, when
    it is not the CPU."""
    if client is None:
        return
    trains = "one phase" if device is None else f"on device={device!r}"
    warnings.warn("client is used by a fit on a store, and by a fit on arrays or images with "
                  "several phases to train on the CPU (the folds of cv=, several candidate "
                  f"values), which its workers train; this fit trains {trains}, in this process",
                  UserWarning, stacklevel=stacklevel)


def warn_unused_mask(mask, store, stacklevel: int) -> None:
    """Warn that ``mask`` (the parameter) has no effect on a fit on ``store``, whose features
    are its own mask's voxels; silent when it is that mask (as given to fgscale convert)."""
    if mask is None:
        return
    same = False
    if isinstance(mask, np.ndarray):
        same = mask.shape == store.mask.shape and np.array_equal(mask != 0, store.mask)
    elif not hasattr(mask, "tocsr"):
        from fgscale.images._nifti import load_mask, same_grid

        try:
            given, affine = load_mask(mask)
        except (OSError, ValueError):  # a mask that cannot be read cannot be the store's
            given, affine = None, None
        same = given is not None and same_grid(given.shape, affine, (store.mask.shape,
                                                                     store.affine)) and (
            np.array_equal(given, store.mask))
    if not same:
        warnings.warn(f"mask= is not used with a store: the features are the store's "
                      f"{int(store.mask.sum())} voxels (its mask, from fgscale convert); to "
                      "train on another mask, convert with --mask", UserWarning,
                      stacklevel=stacklevel)


def is_store(X) -> bool:
    """An open Store, or a store's path (a folder), not a NIfTI file's."""
    from fgscale.images._masking import is_images
    from fgscale.store import Store

    return isinstance(X, Store) or (isinstance(X, (str, os.PathLike)) and not is_images(X))


def _array_mask_image(mask: np.ndarray, first):
    """A boolean grid array as a mask image on the grid of ``first``, the first image: an
    array has no affine of its own, so it must have the image's shape (resampling the images
    to it would crop them to its corner, not align them)."""
    from fgscale.images._masking import as_mask_image
    from fgscale.images._nifti import load_img

    img = load_img(first)
    if mask.ndim == 3 and tuple(mask.shape) != tuple(img.shape[:3]):
        name = os.fspath(first) if isinstance(first, (str, os.PathLike)) else (
            img.get_filename() or "the first image")
        raise ValueError(f"mask is a boolean array of shape {tuple(mask.shape)} but {name} has "
                         f"the grid {tuple(img.shape[:3])}: an array takes the images' affine, "
                         "so it must have their shape; to mask images on another grid, give "
                         "the mask as an image (its affine places it) with resample=True")
    return as_mask_image(mask, img.affine)


def mask_image_of(mask):
    """The ``mask`` parameter as an image when it is one (or a path), else None: a boolean
    array has no affine to place maps or new images on."""
    if mask is None or isinstance(mask, np.ndarray) or hasattr(mask, "tocsr"):
        return None
    from fgscale.images._masking import as_mask_image

    return as_mask_image(mask)


def images_to_rows(X, mask, resample: bool = False, smoothing_fwhm=None):
    """Images as rows, masked with ``mask`` (an image or a path; a boolean array takes the
    images' affine), else with the voxels finite and non-zero in every image (computed before
    any smoothing, as nilearn's maskers compute theirs), smoothed by ``smoothing_fwhm`` mm.

    Returns
    -------
    rows : ndarray of shape (n_volumes, n_voxels), float32
    mask_img : nibabel.Nifti1Image
    """
    from fgscale.images._masking import as_mask_image, compute_mask, image_list, mask_images

    X = image_list(X)  # patterns expanded once
    if mask is None:
        mask_img = compute_mask(X, resample=resample)
    elif isinstance(mask, np.ndarray):
        mask_img = _array_mask_image(mask, X[0])
    else:
        mask_img = as_mask_image(mask)
    return mask_images(X, mask_img, resample=resample, smoothing_fwhm=smoothing_fwhm), mask_img


def _refuse_path(X) -> None:
    """Refuse a path that predict or score cannot read (a string would otherwise reach numpy
    as a float to convert), saying what to give instead: a folder of images, a cohort table,
    a store, or another file."""
    from pathlib import Path

    from fgscale.images._cohort import TABLE_SUFFIXES
    from fgscale.store._reader import holds_images

    path = Path(X)
    if path.is_dir() and holds_images(path):
        raise ValueError(f"{path}: a folder of NIfTI images; give them to predict as paths or "
                         f"a pattern such as '{path / '*.nii.gz'}'")
    if path.suffix.lower() in TABLE_SUFFIXES:
        raise ValueError(f"{path}: a cohort table, not images; give its path column (the "
                         "table's folder prefixed to relative paths), or predict its files "
                         "with fgscale.runs._reports.predict_inputs(estimator, path)")
    where = "a folder" if path.is_dir() else "not a NIfTI file (.nii, .nii.gz, .img, .hdr)"
    raise ValueError(f"{path}: {where}; predict and score take arrays or NIfTI images, not a "
                     "store: read its rows with open_store(path).read_rows(rows) (rows from "
                     "its test_rows() or train_rows()), or predict them a shard at a time "
                     "with fgscale.runs._reports.predict_inputs(estimator, path)")


def refuse_smoothing(smoothing_fwhm, X) -> None:
    """Refuse ``smoothing_fwhm`` for arrays: rows already masked, with no volume left to
    smooth (a store's smoothing is checked against its record: :func:`check_store_smoothing`)."""
    from fgscale.images._masking import is_images

    if not smoothing_fwhm or is_images(X) or is_store(X):
        return
    raise ValueError(f"smoothing_fwhm={smoothing_fwhm!r} smooths images as they are read, but X "
                     "holds rows already masked, with no volume to smooth: give the images "
                     "(paths or nibabel images), or rows smoothed before masking "
                     "(nilearn.image.smooth_img)")


def check_store_smoothing(smoothing_fwhm, store) -> None:
    """Refuse a ``smoothing_fwhm`` other than the one ``store``'s images were smoothed by when
    converted: its rows cannot be smoothed again, nor unsmoothed."""
    if smoothing_fwhm and smoothing_fwhm != store.smoothing_fwhm:
        done = (f"smoothed by {store.smoothing_fwhm:g} mm (convert --smoothing-fwhm)"
                if store.smoothing_fwhm else "not smoothed")
        raise ValueError(f"{store.path}: its images were {done} when converted, and rows cannot "
                         f"be smoothed after masking, so smoothing_fwhm={smoothing_fwhm!r} cannot "
                         "apply; give smoothing_fwhm=None (a fit on a store takes its rows as "
                         "converted) or convert the images with --smoothing-fwhm "
                         f"{smoothing_fwhm:g}")


def rows_of(X, mask_img, owner: str, resample: bool = False, smoothing_fwhm=None):
    """``X`` as it is, or images masked with ``mask_img`` (the fitted estimator's) and
    smoothed by ``smoothing_fwhm`` mm, as the images it was fitted on."""
    from fgscale.images._masking import is_images, mask_images, refuse_odd_item

    check_not_empty(X, "predict")
    refuse_table_of_images(X)
    refuse_odd_item(X)
    if isinstance(X, (str, os.PathLike)) and not is_images(X):
        _refuse_path(X)
    if not is_images(X):
        return X
    if mask_img is None:
        raise ValueError(f"{owner} was fitted on arrays without a mask image: give arrays, or "
                         "fit on images, a store or with mask= an image")
    return mask_images(X, mask_img, resample=resample, smoothing_fwhm=smoothing_fwhm)


def cnn_grid(estimator):
    """The mask as a boolean array, for the CNN (None for the dense models)."""
    if estimator.model != "cnn":
        return None
    if getattr(estimator, "mask_img_", None) is not None:
        return np.asarray(estimator.mask_img_.dataobj) != 0
    n_features = estimator.n_features_in_
    if estimator.mask is None and n_features < 4:
        raise ValueError(f"model='cnn' without a mask lays the n_features={n_features} features "
                         "on a line, which it pools twice by 2: it needs at least 4 features, or "
                         "a mask of their grid")
    grid = resolve_graph(estimator.mask, n_features)
    if hasattr(grid, "tocsr"):
        raise ValueError("model='cnn' needs a mask on a grid (an image, a path or a boolean "
                         "array), not a sparse adjacency")
    return grid


def coef_images(estimator, weights=None) -> list:
    """``weights`` (default the fitted ``estimator``'s ``coef_``) as 3D images on its
    ``mask_img_``'s grid, one per row (a regressor's one vector: one image): logistic models
    fitted on images, a store, or with ``mask=`` an image."""
    from sklearn.utils.validation import check_is_fitted

    from fgscale.images._nifti import space_codes, unmask

    check_is_fitted(estimator)
    mask_img = getattr(estimator, "mask_img_", None)
    if not hasattr(estimator, "coef_") or mask_img is None:  # as fitted
        raise AttributeError("coef_img_ needs model='logreg' and a fit on images, a store, "
                             "or with mask= an image")
    mask = np.asarray(mask_img.dataobj) != 0
    codes = space_codes(mask_img)  # the images' space (MNI...), as the mask's
    weights = estimator.coef_ if weights is None else weights
    return [unmask(w, mask, mask_img.affine, codes) for w in np.atleast_2d(weights)]
