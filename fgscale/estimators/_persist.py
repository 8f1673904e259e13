"""Fitted estimators saved as data, never as code: a folder with ``model.json``, ``model.npz``
and ``mask.nii.gz``.

::

    model.json    format version, fgscale/torch/numpy versions, the estimator's class and
                  parameters (tuples and 1-D arrays as lists, their types in "sequences",
                  so that they load as given), its fitted attributes (a classifier's classes_
                  and their dtype and class_weight_, n_features_in_, the selected alpha_,
                  dropout_, n_clusters_, n_iter_, batch_size_, a regressor's y_mean_ and
                  y_scale_, cv_results_, history_) and the SHA-256 of model.npz; written
                  last, so that it marks a complete save
    model.npz     the torch model's state_dict (arrays ``model.<name>``), the
                  standardization vectors ``mean_`` and ``scale_`` (absent without it), and
                  a ``mask`` parameter given as an array or a sparse adjacency, as it was:
                  an array (a 3D boolean grid, a CNN's 2D grid) as ``mask``, an adjacency
                  as ``mask.row``, ``mask.col`` and ``mask.data``
    mask.nii.gz   the mask the features come from, uint8 on the images' grid, when the
                  estimator has one (``mask_img_``); never made up for a boolean array,
                  which has no affine

Loading reads JSON, ``np.load(allow_pickle=False)`` and a NIfTI header and array: a crafted
folder can fail to load, never run code, where a pickle (or ``torch.load`` without
``weights_only``) executes whatever it names. The class is looked up among the public
estimators of :mod:`fgscale.estimators`, never imported by a name read from the file. The
bank of groupings is not saved: the model alone predicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import torch
from sklearn.base import is_classifier
from sklearn.utils.validation import check_is_fitted

from fgscale._utils.files import atomic_path, exclusive_name, replaced_folder
from fgscale.estimators._params import PARAMS, params_to_json, plain_json, validate_params
from fgscale.estimators._regularizers import model_dropout
from fgscale.estimators._saved_mask import (
    MASK,
    MASK_PARAM,
    MODEL_FORMAT,
    MODEL_JSON,
    MODEL_NPZ,
    NPZ_MASK_PARAM,
    NPZ_PREFIX,
    mask_arrays_of,
    mask_param,
    mask_to_save,
    not_saved_by_fgscale,
    placed_mask,
    read_mask,
)
from fgscale.training._models import build_model

__all__ = ["FORMAT_VERSION", "MASK", "MODEL_JSON", "MODEL_NPZ", "load_model", "save_model", "write_model"]

FORMAT_VERSION = 1
_SCALARS = ("alpha_", "dropout_", "n_clusters_", "n_iter_", "batch_size_", "y_mean_", "y_scale_",
            "screening_percentile_", "smoothing_fwhm_")
_CLASS_KINDS = "Uiubf"  # the dtypes of labels that JSON gives back as they were (and "O")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _estimators() -> dict:
    """The classes that load: the public estimators, by name (a fixed table, never an import
    of a name read from a file)."""
    from fgscale.estimators._classifier import FeatureGroupingClassifier
    from fgscale.estimators._regressor import FeatureGroupingRegressor

    return {cls.__name__: cls for cls in (FeatureGroupingClassifier, FeatureGroupingRegressor)}


def _versions() -> dict:
    from fgscale import __version__

    return {"fgscale": __version__, "torch": torch.__version__, "numpy": np.__version__}


def _check_params_build_the_model(est) -> None:
    """Refuse parameters that no longer build the fitted model (set since the fit): load_model
    rebuilds it from them, and could never read the save. Built on the meta device: no memory."""
    fitted = {k: tuple(v.shape) for k, v in est.model_.state_dict().items()}
    grid = getattr(est.model_, "grid", None)  # a CNN's, as a buffer of its model
    try:
        with torch.device("meta"):
            model = build_model(est.model, est.n_features_in_, est._n_outputs(),
                                grid=None if grid is None else grid.cpu().numpy(),
                                hidden_layer_sizes=est.hidden_layer_sizes)
        same = {k: tuple(v.shape) for k, v in model.state_dict().items()} == fitted
    except ValueError:  # model="cnn" set for a dense model: no grid
        same = False
    if not same or bool(est.standardize) != (getattr(est, "mean_", None) is not None):
        raise ValueError(f"{type(est).__name__}'s parameters changed since its fit: model="
                         f"{est.model!r}, hidden_layer_sizes={est.hidden_layer_sizes!r} and "
                         f"standardize={est.standardize!r} do not build its fitted model; fit it "
                         "again, or set them back, before saving")


def save_model(estimator, folder, *, mask_img=None, overwrite: bool = False) -> Path:
    """Save a fitted estimator into ``folder`` as data (see the module docstring).

    Parameters
    ----------
    estimator : FeatureGroupingClassifier or FeatureGroupingRegressor
        Fitted.
    folder : str or Path
        Created if needed. A previous save there is replaced file by file, each under a
        temporary name then renamed; ``model.json`` comes last with the checksum of
        ``model.npz``, so a save killed midway is refused at load, never mixed; saves into one
        folder at once run one after the other. A run folder of ``fgscale train`` (it has a
        ``config.json``) is refused: its configuration, maps and scores are of its own model.
    mask_img : nibabel image, optional
        The mask to save when the estimator has no ``mask_img_`` (a run folder passes its
        store's).
    overwrite : bool, default=False
        Replace a run folder whole: the model is saved into a new folder, which then takes
        the run folder's place, every file of the run removed; a save that fails leaves the
        run folder as it was. Without it, a ``model.json``, ``model.npz`` or ``mask.nii.gz``
        that no fgscale save wrote (a user's mask, another library's model) is refused.

    Returns
    -------
    path : Path
        The ``model.json`` written.
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder}: a file, not a folder; save_model writes a folder "
                              f"({MODEL_JSON}, {MODEL_NPZ}, {MASK}): choose another path")
    with exclusive_name(folder, waiting=f"{folder}: another save into it is running; waiting "
                                        "for it to end"):
        theirs = [] if overwrite else not_saved_by_fgscale(folder)
        if theirs:  # a user's own mask.nii.gz, another library's model.json: never replaced
            raise FileExistsError(f"{folder}: {', '.join(theirs)} there, not of an fgscale save: "
                                  "save into another folder, or pass overwrite=True to replace them")
        if not (folder / "config.json").is_file():
            return write_model(estimator, folder, mask_img=mask_img)
        if not overwrite:
            raise FileExistsError(f"{folder}: a run folder of fgscale train (config.json), whose "
                                  "configuration, maps and scores are of its own model: save "
                                  "into another folder, or pass overwrite=True to replace it whole")
        with replaced_folder(folder) as new:
            write_model(estimator, new, mask_img=mask_img)
    return folder / MODEL_JSON


def write_model(estimator, folder, *, mask_img=None) -> Path:
    """:func:`save_model` into any folder, a run folder's own model included."""
    name = type(estimator).__name__
    if _estimators().get(name) is not type(estimator):  # before asking whether it is fitted
        raise TypeError(f"save_model saves {', '.join(sorted(_estimators()))}, got {name} (a "
                        "Pipeline or another library's estimator: joblib saves it, as a pickle, "
                        "which runs code when loaded: load only files you trust)")
    check_is_fitted(estimator, "model_")
    _check_params_build_the_model(estimator)
    folder = Path(folder).expanduser()
    doc = {"format": MODEL_FORMAT, "format_version": FORMAT_VERSION, "versions": _versions(),
           "estimator": name}
    if hasattr(estimator, "classes_"):
        classes = np.asarray(estimator.classes_)
        kind = classes.dtype.kind
        if kind not in _CLASS_KINDS + "O" or (kind == "O" and not all(
                isinstance(c, (str, int, np.integer)) for c in classes)):
            raise ValueError(f"classes_ of dtype {classes.dtype} cannot be saved: labels must "
                             "be strings, integers, floats or booleans")
        doc.update(classes_=classes.tolist(),
                   classes_dtype="object" if kind == "O" else classes.dtype.str)
    mask_arrays = mask_arrays_of(estimator.mask)
    mask = mask_to_save(estimator, mask_img, bool(mask_arrays))

    arrays = {NPZ_PREFIX + k: v.detach().cpu().numpy()
              for k, v in estimator.model_.state_dict().items()}
    arrays.update(mask_arrays)
    arrays.update({attr: np.asarray(getattr(estimator, attr)) for attr in ("mean_", "scale_")
                   if getattr(estimator, attr, None) is not None})
    with atomic_path(folder / MODEL_NPZ) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    if mask is not None:
        with atomic_path(folder / MASK) as tmp:
            mask.to_filename(tmp)
    else:  # a previous save's mask must not outlive it
        (folder / MASK).unlink(missing_ok=True)

    params = params_to_json(estimator.get_params())
    if isinstance(estimator.mask, (str, os.PathLike)):  # found again from any working folder
        params["mask"] = os.path.abspath(os.path.expanduser(estimator.mask))
    if mask_arrays:
        params["mask"] = NPZ_MASK_PARAM
    elif mask is not None and not isinstance(estimator.mask, (type(None), str, os.PathLike)):
        params["mask"] = MASK_PARAM
    doc.update({"params": params, "sequences": _sequences(estimator.get_params()),
                "n_features_in_": estimator.n_features_in_,
                "mask": mask is not None,
                **{attr: getattr(estimator, attr) for attr in (*_SCALARS, "class_weight_")
                   if hasattr(estimator, attr)},  # a regressor weighs no class
                "cv_results_": getattr(estimator, "cv_results_", []),
                # labels as str, as JSON's keys are: read back by the classes' order
                "cv_scores_": list(getattr(estimator, "cv_scores_", {}).values()),
                "cv_params_": list(getattr(estimator, "cv_params_", {}).values()),
                "history_": getattr(estimator, "history_", []),
                "sha256": {MODEL_NPZ: _sha256(folder / MODEL_NPZ)}})
    if hasattr(estimator, "feature_names_in_"):
        doc["feature_names_in_"] = list(map(str, estimator.feature_names_in_))
    with atomic_path(folder / MODEL_JSON) as tmp:
        tmp.write_text(json.dumps(plain_json(doc), indent=2) + "\n")
    return folder / MODEL_JSON


def _set_cv_attributes(est, doc: dict) -> None:
    """``cv_scores_`` and ``cv_params_``, saved as lists in the classes' order (JSON's keys
    would be str), keyed again by class (a regressor: ``"beta"``); none in older saves."""
    keys = est.classes_.tolist() if hasattr(est, "classes_") else ["beta"]
    for attr in ("cv_scores_", "cv_params_"):
        saved = doc.get(attr, [])
        if saved:
            setattr(est, attr, dict(zip(keys, saved, strict=True)))


def _sequences(params: dict) -> dict:
    """The type of each parameter that JSON keeps as a list: "tuple", or an array's dtype (a
    1-D array of candidates, such as ``np.logspace(-4, 0, 5)``), so that it loads as given."""
    return {k: "tuple" if isinstance(v, tuple) else v.dtype.str for k, v in params.items()
            if k != "mask" and (isinstance(v, tuple) or isinstance(v, np.ndarray)
                                and v.ndim == 1 and v.dtype.kind in "biuf")}


def _as_given(params: dict, sequences, path: Path) -> None:
    """Lists of ``params`` back to the tuples and arrays :func:`_sequences` says they were."""
    for name, kind in (sequences.items() if isinstance(sequences, dict) else ()):
        if not isinstance(params.get(name), list):
            continue
        if kind == "tuple":
            params[name] = tuple(params[name])
            continue
        try:
            dtype = np.dtype(kind)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biuf":
            raise ValueError(f"{path}: 'sequences' says {name} is an array of {kind!r}, not of "
                             "a plain numeric dtype")
        params[name] = np.asarray(params[name], dtype=dtype)


# ---------------------------------------------------------------------------------- loading

def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {path.parent} holds no saved model "
                                "(a run folder gets one when fgscale train finishes)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: not an fgscale model (expected \"format\": \"{MODEL_FORMAT}\")")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:  # a newer fgscale's: no save again here can read it
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ValueError(f"{path}: model format version {version!r}, this fgscale reads version "
                         f"{FORMAT_VERSION}; {'upgrade fgscale' if newer else 'save the model again'}")
    return doc


def _get(doc: dict, key: str, types, path: Path, what: str):
    if key not in doc:
        raise ValueError(f"{path}: missing key {key!r} ({what})")
    value = doc[key]
    if not isinstance(value, types) or isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{path}: {key!r} must be {what}, got {value!r}")
    return value


def _read_npz(path: Path, expected_sha: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (the model's weights)")
    if _sha256(path) != expected_sha:
        raise ValueError(f"{path}: does not match {MODEL_JSON} (another checksum): the two "
                         "files come from different saves; save the model again")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a plain numeric .npz ({exc})") from None


def _params(doc: dict, mask_img, path: Path, arrays: dict) -> dict:
    params = dict(_get(doc, "params", dict, path, "a dict of the estimator's parameters"))
    unknown = sorted(set(params) - {p.name for p in PARAMS})
    if unknown:
        raise ValueError(f"{path}: unknown parameter(s) {unknown} (a newer fgscale's model?)")
    params["mask"] = mask_param(params.get("mask"), mask_img, arrays, doc["n_features_in_"],
                                path.parent)
    if not (params.get("random_state") is None or isinstance(params["random_state"], int)):
        params["random_state"] = None  # a RandomState was saved as its repr: not restorable
    if isinstance(params.get("cv"), str) and params["cv"] != "auto":
        params["cv"] = None  # a splitter was saved as its repr: not restorable, not used to predict
    _as_given(params, doc.get("sequences", {}), path)
    if isinstance(params.get("hidden_layer_sizes"), list):  # a save without "sequences"
        params["hidden_layer_sizes"] = tuple(params["hidden_layer_sizes"])
    try:  # the device is checked where the model is used: a GPU run loads on a CPU node
        validate_params({k: v for k, v in params.items() if k not in ("device", "mask")})
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return params


def _classes(doc: dict, path: Path) -> np.ndarray:
    values = _get(doc, "classes_", list, path, "a list of labels")
    spec = _get(doc, "classes_dtype", str, path, "a numpy dtype string")
    try:
        dtype = np.dtype(object if spec == "object" else spec)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _CLASS_KINDS + "O" or not values or not all(
            isinstance(v, (str, int, float, bool)) for v in values):
        raise ValueError(f"{path}: 'classes_' must be a non-empty list of labels of a plain "
                         f"dtype, got {values!r} as {spec!r}")
    return np.asarray(values, dtype=dtype)


def _check_arrays(arrays: dict, expected: dict, path: Path) -> None:
    """``arrays`` have exactly the names and shapes of ``expected`` (name -> shape), float but
    for the CNN's boolean grid."""
    missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ValueError(f"{path}: expected arrays {sorted(expected)}; missing {missing}, "
                         f"unexpected {extra}")
    for name, shape in expected.items():
        kind = "b" if name == NPZ_PREFIX + "grid" else "f"
        if tuple(arrays[name].shape) != tuple(shape) or arrays[name].dtype.kind != kind:
            what = {"b": "bool", "f": "float"}[kind]
            raise ValueError(f"{path}: array {name!r} must be {what} of shape {tuple(shape)}, "
                             f"got {arrays[name].dtype} {arrays[name].shape}")


def load_model(folder, *, affine=None):
    """Load an estimator saved by :func:`save_model`, ready to predict.

    Parameters
    ----------
    folder : str or Path
    affine : array-like of shape (4, 4), optional
        The affine of the saved mask image, in place of the one in ``mask.nii.gz``: for a
        model that an older fgscale saved with a 3D boolean array as mask, written with the
        identity affine (a warning says so), the images' affine places its maps
        (``coef_img_``) on their grid. Default the file's.

    Returns
    -------
    estimator : FeatureGroupingClassifier or FeatureGroupingRegressor
        Its parameters, fitted attributes and model as saved, the model on the CPU (moved to
        ``device`` to predict); ``bank_`` is None. An image ``mask`` parameter comes back
        as the saved mask image, a path as it was (the saved image where the path is gone: a
        model moved to another machine), an array (a 3D boolean grid, a CNN's 2D grid) or a sparse
        adjacency as it was, and ``mask_img_`` is None where it was None (an array has no
        affine); a ``RandomState`` as None.

    Raises
    ------
    FileNotFoundError, ValueError
        Naming the file and what is wrong with it: missing, not JSON, a missing key, an array
        of another shape, a checksum that does not match.
    """
    folder = Path(folder).expanduser()
    path = folder / MODEL_JSON
    doc = _read_json(path)
    name = _get(doc, "estimator", str, path, "the estimator's class name")
    known = _estimators()
    if name not in known:
        raise ValueError(f"{path}: unknown estimator {name!r}; expected one of {sorted(known)}")
    n_features = _get(doc, "n_features_in_", int, path, "an int")
    has_mask = _get(doc, "mask", bool, path, "true or false")
    mask_img = read_mask(folder / MASK, n_features) if has_mask else None
    if mask_img is not None or affine is not None:
        if mask_img is None:
            raise ValueError(f"{folder}: affine places the saved {MASK}; this model has none "
                             "(a mask given as an array is kept as it was, with no affine)")
        mask_img = placed_mask(mask_img, affine, folder / MASK, doc)
    sha = _get(doc, "sha256", dict, path, "the checksums of the other files").get(MODEL_NPZ)
    arrays = _read_npz(folder / MODEL_NPZ, sha)
    est = known[name](**_params(doc, mask_img, path, arrays))
    if "classes_" in doc or is_classifier(est):
        est.classes_ = _classes(doc, path)
        if isinstance(est.class_weight, dict):  # JSON's keys are str: the labels themselves
            labels = {str(c): c for c in est.classes_.tolist()}
            est.class_weight = {labels.get(k, k): w for k, w in est.class_weight.items()}
        weights = doc.get("class_weight_")
        est.class_weight_ = None if weights is None else np.asarray(weights, np.float64)
    est.n_features_in_ = n_features
    if "feature_names_in_" in doc:
        est.feature_names_in_ = np.asarray(doc["feature_names_in_"], dtype=object)
    for attr in _SCALARS:
        if attr in doc:
            setattr(est, attr, doc[attr])
    dropout = _get(doc, "dropout_", (int, float), path, "the selected dropout rate")
    if not 0 <= dropout < 1:
        raise ValueError(f"{path}: 'dropout_' must be a float in [0, 1), got {dropout!r}")
    est.cv_results_ = doc.get("cv_results_", [])
    _set_cv_attributes(est, doc)
    est.history_ = doc.get("history_", [])
    est.bank_, est.mask_img_ = None, mask_img

    grid = arrays.get(NPZ_PREFIX + "grid") if est.model == "cnn" else None
    if est.model == "cnn" and (grid is None or grid.dtype != bool or grid.sum() != n_features):
        raise ValueError(f"{folder / MODEL_NPZ}: array {NPZ_PREFIX}grid must be the CNN's boolean "
                         f"grid with {n_features} cells set")
    model = build_model(est.model, n_features, est._n_outputs(),
                        **model_dropout(est.regularizer, est.dropout_),
                        hidden_layer_sizes=est.hidden_layer_sizes, grid=grid)
    expected = {NPZ_PREFIX + k: v.shape for k, v in model.state_dict().items()}
    if est.standardize:
        expected.update(mean_=(n_features,), scale_=(n_features,))
    _check_arrays(arrays, expected, folder / MODEL_NPZ)
    model.load_state_dict({k: torch.from_numpy(arrays[NPZ_PREFIX + k])
                           for k in model.state_dict()})
    est.model_ = model.eval()
    est.mean_, est.scale_ = arrays.get("mean_"), arrays.get("scale_")
    est._set_outputs()
    return est
