"""A run's maps as a BIDS derivatives dataset (``fgscale export-bids``), laid out and named as
nilearn's ``save_glm_to_bids`` lays out a group-level model's maps::

    OUT/
      dataset_description.json   "DatasetType": "derivative", "GeneratedBy": fgscale and its
                                 version (added to a description that is there already)
      group/
        [task-<t>_][space-<s>_]desc-<class>_stat-weights_statmap.nii.gz   a 3D map per class
        [task-<t>_][space-<s>_]desc-<class>_stat-weights_statmap.json     what it is
        [task-<t>_][space-<s>_]mask.nii.gz, .json                          the maps' voxels

The maps are those of the run folder (``maps/<class>.nii.gz``, :mod:`fgscale.runs._maps`),
copied byte for byte: a regressor's one map is named by its target (``desc-age``). A class
name becomes a BIDS label by keeping its letters and digits (``"house/home"`` ->
``desc-househome``), names that then clash (``face`` and ``Face``, alike on macOS) getting
``2``, ``3``...; each sidecar gives the class as it is. The ``task``, ``space``, ``res`` and
``den`` entities are those that every row of the run's store shares in its file's BIDS name
(a store converted from a BIDS query): the maps are on that space's grid. ``group/`` holds
one run's maps: another run's are refused, to be exported into another folder.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from fgscale._utils.files import atomic_path, read_json
from fgscale.images._bids_names import bids_label, bids_name, parse_bids_name
from fgscale.runs._maps import numbered_apart, read_maps

__all__ = ["BIDS_VERSION", "export_bids"]

log = logging.getLogger(__name__)

BIDS_VERSION = "1.10.0"
_GROUP = "group"  # nilearn's folder of a second-level (group) model's maps
_SHARED = ("task", "space", "res", "den")  # the entities of the input images the maps keep
_STAT = "weights"


def _shared_entities(store_path: str | None) -> dict:
    """The entities of :data:`_SHARED` that every row's file has, with one value, in a BIDS name;
    none where the store is not there any more or its files have no BIDS names."""
    from fgscale.store import StoreError, open_store

    if not store_path:
        return {}
    try:
        sources = open_store(store_path).source
    except (StoreError, OSError, ValueError) as exc:
        log.info("%s: not read (%s); the maps' names get no task or space", store_path, exc)
        return {}
    values: dict[str, set] = {key: set() for key in _SHARED}
    for name in {Path(str(s)).name for s in sources}:
        try:
            entities = parse_bids_name(name).entities
        except ValueError:
            return {}
        for key in _SHARED:
            values[key].add(entities.get(key))
    return {k: next(iter(v)) for k, v in values.items() if len(v) == 1 and None not in v}


def _desc_labels(names) -> list[str]:
    """A BIDS label per output name, unique whatever the case (see the module's docstring)."""
    # BIDS labels are letters and digits only: the number follows with no separator
    return numbered_apart([bids_label(name) or "class" for name in names], "")


def _generated_by() -> dict:
    from fgscale import __version__

    return {"Name": "fgscale", "Version": __version__,
            "Description": "Decoder weight maps: feature grouping as a stochastic regularizer "
                           "(Aydore, Thirion & Varoquaux, ICML 2019), trained out-of-core"}


def _write_description(out: Path, run: Path) -> Path:
    """``dataset_description.json``: written, or, where one is there already, given fgscale's
    ``GeneratedBy`` entry (as nilearn adds its own)."""
    path = out / "dataset_description.json"
    entry = _generated_by()
    if path.exists():
        description = read_json(path, "dataset description")
        if not isinstance(description, dict) or description.get("DatasetType") != "derivative":
            raise ValueError(f"{path}: not the description of a derivatives dataset "
                             "(\"DatasetType\": \"derivative\"); expected a new folder for "
                             "--out, or a derivatives dataset")
        generated = description.setdefault("GeneratedBy", [])
        if entry not in generated:
            generated.append(entry)
    else:
        description = {"Name": f"fgscale maps of {run.name}", "BIDSVersion": BIDS_VERSION,
                       "DatasetType": "derivative", "GeneratedBy": [entry]}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(description, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _check_same_run(group: Path, run: Path) -> None:
    """Refuse a ``group/`` folder that holds another run's maps."""
    for sidecar in sorted(group.glob("*_statmap.json")):
        try:
            other = json.loads(sidecar.read_text(encoding="utf-8")).get("Run")
        except (OSError, ValueError, AttributeError):
            other = None
        if other != str(run):
            raise ValueError(f"{group}: holds the maps of another run ({other or sidecar}); "
                             "expected another --out for this run's")


def _copy(source: Path, target: Path, about: dict) -> Path:
    """Copy a NIfTI file, and write its JSON sidecar beside it."""
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    sidecar = target.with_name(target.name.removesuffix(".nii.gz") + ".json")
    with atomic_path(sidecar) as tmp:
        tmp.write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")
    return target


def export_bids(run, out) -> dict:
    """Write a finished run's maps as a BIDS derivatives dataset (see the module's docstring).

    Parameters
    ----------
    run : str or Path
        A finished run folder (``fgscale train --out``).
    out : str or Path
        The derivatives dataset: a new folder, or one that holds a derivatives dataset (then
        its description gains fgscale's ``GeneratedBy``), not another run's maps.

    Returns
    -------
    written : dict
        ``"description"``: the dataset description's path; ``"maps"``: output name (class, or
        a regressor's target) -> its map's path, in the order of the run's maps; ``"mask"``:
        the mask's path.

    Raises
    ------
    FileNotFoundError
        If ``run`` holds no finished run's maps.
    ValueError
        If ``out`` holds something else than a derivatives dataset, or another run's maps.
    """
    run, out = Path(run).expanduser().resolve(), Path(out).expanduser()
    sidecar, paths = read_maps(run)
    config = read_json(run / "config.json", "run configuration")
    if out.exists() and any(out.iterdir()) and not (out / "dataset_description.json").exists():
        raise ValueError(f"{out}: a folder that is not a BIDS dataset (no "
                         "dataset_description.json); expected a new folder for --out")
    group = out / _GROUP
    _check_same_run(group, run)
    entities = _shared_entities(config.get("store"))
    regression = config.get("task") == "regression"
    names = list(paths)
    if regression:  # the one output, "target", named by the table's column
        names = [config.get("target") or "target"]
    written = {"description": _write_description(out, run), "maps": {}}
    estimator = "FeatureGroupingRegressor" if regression else "FeatureGroupingClassifier"
    common = {"Run": str(run), "Store": config.get("store"), "Estimator": estimator,
              "Model": sidecar.get("model"), "Method": sidecar.get("method"),
              "Regularizer": config.get("params", {}).get("regularizer")}
    for output, name, label in zip(paths, names, _desc_labels(names), strict=True):
        file = bids_name({**entities, "desc": label, "stat": _STAT}, "statmap", ".nii.gz")
        what = f"the target {name!r}" if regression else f"the class {name!r}"
        about = {"Description": f"fgscale weight map of {what}: {sidecar.get('values')}",
                 ("Target" if regression else "Class"): name, **common}
        written["maps"][output] = _copy(paths[output], group / file, about)
    mask = bids_name(entities, "mask", ".nii.gz")
    written["mask"] = _copy(run / "mask.nii.gz", group / mask, {
        "Description": "the voxels of the maps: the mask of the run's store (1 inside)",
        **common})
    return written
