"""Maps a person can look at: one 3D NIfTI per class, and the 4D stack with a sidecar.

A run folder gets (:func:`write_maps`)::

    maps/<class>.nii.gz   one 3D map per class (file names made safe, see maps.json);
                          nilearn.plotting.plot_stat_map takes each as it is
    maps.nii.gz           the same maps as one 4D image, a volume per class
    maps.json             the order of the volumes, the file of each class, what the values are

Voxels outside the mask are 0 (not NaN: viewers and nilearn's thresholds read 0 as
nothing). What the values are depends on the model (:func:`output_weights`):

- logistic regression: its weights, ``coef_``: how much a class's logit rises per standard
  deviation of the voxel (the features are standardized), as nilearn's decoders report theirs;
- the MLP: the network linearised, the product of its weight matrices
  ``W_out ... W_2 W_1`` with every ReLU and dropout taken as the identity.

Why that product for the MLP: it is exactly the Jacobian of the logits with respect to the
standardized input at every input where all hidden units are active, so it reads like the
logistic regression's map, and it reduces to it for a network without hidden layer. It costs
one small matrix product and no pass over the data: the alternative, the input gradient
averaged over rows, would mean streaming rows from the store again (and one backward pass per
class on each), and would change with the rows chosen. Its limit: hidden units that are off
for most inputs still count fully; read it as the direction the network's linear part looks
in, not as a saliency map of particular images.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from torch import nn

from fgscale._utils.files import atomic_path, read_json
from fgscale.images._nifti import unmask

__all__ = ["MAPS_IMAGE", "MAPS_JSON", "file_stems", "has_maps", "linearized_weights",
           "numbered_apart", "output_weights", "read_maps", "write_maps"]

MAPS_IMAGE, MAPS_JSON, MAPS_DIR = "maps.nii.gz", "maps.json", "maps"
_FORMAT = "fgscale-maps"
_MAX_STEM = 80  # NIfTI-sized names; long labels keep their start


_COLUMNS = 65536  # columns of the first layer per block of the product


def linearized_weights(model: nn.Module) -> np.ndarray:
    """The product of a model's weight matrices, ReLU and dropout taken as the identity.

    For :class:`~fgscale.training._models.LogisticRegression` it is the weight matrix itself;
    for the :class:`~fgscale.training._models.MLP` it is ``W_out ... W_2 W_1``, the Jacobian of
    the logits with respect to the input wherever every hidden unit is active.

    Parameters
    ----------
    model : torch.nn.Module
        A model of :func:`fgscale.training._models.build_model`: a ``first`` layer and, for
        the MLP, a ``rest`` of ReLU, Dropout and Linear layers.

    Returns
    -------
    weights : ndarray of shape (n_outputs, n_features), float64
    """
    head = None  # W_out ... W_2, float64: small (n_outputs x hidden)
    for layer in getattr(model, "rest", ()):
        if isinstance(layer, nn.Linear):
            weight = layer.weight.detach().cpu().double()
            head = weight if head is None else weight @ head
        elif not isinstance(layer, (nn.ReLU, nn.Dropout)):
            # another kind of layer would make the product a wrong map: refuse, loudly
            raise TypeError(f"cannot linearise a {type(layer).__name__} layer; the maps "
                            "handle Linear, ReLU and Dropout layers")
    first = model.first.weight.detach().cpu()
    if head is None:
        return first.double().numpy()
    # W_1 (hidden x p) is taken to float64 a block of columns at a time: on a 1 mm grid a
    # float64 copy of it whole would be twice the model
    out = np.empty((head.shape[0], first.shape[1]))
    for start in range(0, first.shape[1], _COLUMNS):
        block = slice(start, start + _COLUMNS)
        out[:, block] = (head @ first[:, block].double()).numpy()
    return out


def has_maps(estimator) -> bool:
    """Whether the estimator's model has a map in voxel space: the linear models and the MLP
    (linearised) do; the CNN's convolutions do not."""
    return estimator.model != "cnn"


def output_weights(estimator) -> tuple[list[str], np.ndarray, dict]:
    """The map of each output of a fitted estimator, in feature space.

    Parameters
    ----------
    estimator : FeatureGroupingClassifier or FeatureGroupingRegressor
        Fitted.

    Returns
    -------
    names : list of str
        The classes in order; a regressor's one output is ``"target"``.
    weights : ndarray of shape (n_outputs, n_features), float64
        :func:`linearized_weights` of ``model_``; a regressor's in the target's units.
    about : dict
        ``model``, ``method`` and ``values``: how the maps were computed and what a value
        means, in words (written to maps.json).
    """
    if not has_maps(estimator):
        raise ValueError("weight maps are defined for model='logreg' and 'mlp', not for the CNN "
                         "(its convolutions have no map in voxel space)")
    weights = linearized_weights(estimator.model_)
    if getattr(estimator, "mean_", None) is not None:
        features, step = "standardized features", "by one standard deviation"
    else:
        features, step = "the raw features (standardize=False)", "by one"
    classes = getattr(estimator, "classes_", None)
    if classes is not None:
        names, output = [str(c) for c in classes], "the class's logit"
    else:
        names, output = ["target"], "the prediction (in the target's units)"
        weights = weights * getattr(estimator, "y_scale_", 1.0)
    if estimator.model == "logreg":
        method = "weights"
        what = "logistic regression" if classes is not None else "linear regression"
        values = f"{what} weights on {features}: how much {output} rises when the voxel rises {step}"
    else:
        method = "product of weight matrices"
        values = (f"the MLP linearised on {features}: W_out ... W_2 W_1, ReLU and dropout taken "
                  f"as the identity; the gradient of {output} with respect to the voxel wherever "
                  "every hidden unit is active (see fgscale.runs._maps)")
    return names, weights, {"model": estimator.model, "method": method, "values": values}


def file_stems(names) -> list[str]:
    """File names (without suffix) for class names: letters, digits, ``.``, ``_`` and ``-``
    only, every other run of characters made ``_``; names that clash (case aside, for macOS
    and Windows) get ``_2``, ``_3``..."""
    return numbered_apart(
        [re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._")[:_MAX_STEM] or "class"
         for name in names], "_")


def numbered_apart(stems, sep: str) -> list[str]:
    """``stems`` made unique whatever the case (for macOS and Windows file systems): the
    second of a name becomes ``<stem><sep>2``, the third ``<stem><sep>3``..."""
    out, seen = [], set()
    for stem in stems:
        candidate, i = stem, 2
        while candidate.lower() in seen:
            candidate, i = f"{stem}{sep}{i}", i + 1
        seen.add(candidate.lower())
        out.append(candidate)
    return out


def write_maps(folder, estimator, mask: np.ndarray, affine: np.ndarray, codes=None) -> dict:
    """Write a fitted estimator's maps into ``folder`` (see the module docstring).

    Each file is written under a temporary name and renamed; ``maps.json`` comes last.

    Parameters
    ----------
    folder : str or Path
    estimator : FeatureGroupingClassifier or FeatureGroupingRegressor
        Fitted.
    mask : ndarray of shape grid_shape, bool
        The features' voxels (C order), ``mask.sum() == n_features_in_``.
    affine : ndarray of shape (4, 4)
    codes : [qform_code, sform_code], optional
        The space of the images (:func:`fgscale.images.unmask`).

    Returns
    -------
    sidecar : dict
        What maps.json holds: ``outputs`` (the order of the volumes of maps.nii.gz),
        ``files`` (output -> path relative to ``folder``), ``image``, ``model``, ``method``
        and ``values``.
    """
    folder = Path(folder)
    names, weights, about = output_weights(estimator)
    files = {}
    for name, stem, w in zip(names, file_stems(names), weights, strict=True):
        files[name] = f"{MAPS_DIR}/{stem}.nii.gz"
        _save(unmask(w, mask, affine, codes), folder / files[name], f"fgscale map {name}")
    _save(unmask(weights, mask, affine, codes), folder / MAPS_IMAGE, "fgscale maps, see maps.json")
    about["values"] += "; 0 outside the mask, where there is no feature"  # as unmask writes
    sidecar = {"format": _FORMAT, "outputs": names, "files": files, "image": MAPS_IMAGE,
               **about}
    with atomic_path(folder / MAPS_JSON) as tmp:
        tmp.write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def _save(img, path: Path, description: str) -> None:
    img.header["descrip"] = description[:79].encode("ascii", "replace")  # 80 bytes in NIfTI-1
    with atomic_path(path) as tmp:
        img.to_filename(tmp)


def read_maps(folder) -> tuple[dict, dict[str, Path]]:
    """The maps of a finished run folder: its maps.json and each output's 3D map file.

    Parameters
    ----------
    folder : str or Path

    Returns
    -------
    sidecar : dict
        maps.json.
    paths : dict of str to Path
        Output name -> its 3D NIfTI file, in the order of the volumes.

    Raises
    ------
    FileNotFoundError
        If the folder has no maps.json (a run that has not finished, or one trained by an
        fgscale older than the maps).
    ValueError
        If maps.json is not a maps sidecar, or names a map file outside the folder.
    """
    folder = Path(folder)
    path = folder / MAPS_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; the run has not finished, or an older "
                                "fgscale trained it (its maps are in weights.nii.gz)")
    sidecar = read_json(path, "maps sidecar")
    if sidecar.get("format") != _FORMAT:
        raise ValueError(f"{path}: not an fgscale maps sidecar (expected \"format\": "
                         f"\"{_FORMAT}\")")
    outputs, files = sidecar.get("outputs"), sidecar.get("files")
    if not (isinstance(outputs, list) and isinstance(files, dict)
            and all(isinstance(files.get(n) if isinstance(n, str) else None, str) and
                    _inside(files[n]) for n in outputs)):
        raise ValueError(f"{path}: damaged maps sidecar (expected \"outputs\", a list of "
                         "names, and \"files\", each one's map as a path inside the run folder)")
    return sidecar, {name: folder / files[name] for name in outputs}


def _inside(relative: str) -> bool:
    """Whether a path of maps.json stays in its run folder (relative, no ``..``)."""
    parts = Path(relative).parts
    return bool(parts) and not Path(relative).is_absolute() and ".." not in parts
