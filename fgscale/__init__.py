"""fgscale: feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr.

The subpackages follow the data flow::

    images      NIfTI files and cohort tables in, voxel maps out
    store       the Zarr store (samples x in-mask voxels) and the conversion into it
    grouping    ReNA, projections with a grouping, banks of groupings (in memory, on Dask),
               and what a bank does as a regularizer (Omega, membership variance)
    training    minibatch plans, torch models, the training loop, the streamed source
    estimators  the scikit-learn estimators, their parameter table and regularizers
    runs        run folders: training, scoring, predicting and cross-validating on a store;
               checkpoints, metrics, weight maps, the HTML report
    cli         the ``fgscale`` command (the library never imports it)

Beside them, two private packages: ``_dask`` (the client and cluster plumbing) and ``_utils``
(atomic files, progress bars, lazily imported package names, the checkers that several layers share).

Public names are imported lazily, so that a Dask worker that only converts NIfTI files or
builds groupings does not pay for importing torch.
"""

import importlib

_EXPORTS = {
    "FeatureGroupingClassifier": "fgscale.estimators",
    "FeatureGroupingRegressor": "fgscale.estimators",
    "save_model": "fgscale.estimators",
    "load_model": "fgscale.estimators",
    "back_project": "fgscale.grouping",
    "project": "fgscale.grouping",
    "grid_edges": "fgscale.grouping",
    "rena": "fgscale.grouping",
    "make_bank": "fgscale.grouping",
    "build_bank": "fgscale.grouping",
    "load_bank": "fgscale.grouping",
    "export_map": "fgscale.grouping",
    "Store": "fgscale.store",
    "StoreError": "fgscale.store",
    "open_store": "fgscale.store",
    "write_store": "fgscale.store",
    "convert": "fgscale.store",
    "make_cohort": "fgscale.images",
    "make_classification_volumes": "fgscale.images",
    "unmask": "fgscale.images",
    "load_img": "fgscale.images",
    "mask_images": "fgscale.images",
    "read_bids": "fgscale.images",
    "get_client": "fgscale._dask.client",
    "train_run": "fgscale.runs",
    "evaluate_run": "fgscale.runs",
    "load_run": "fgscale.runs",
    "export_bids": "fgscale.runs",
    "omega_diagonal": "fgscale.grouping",
    "omega_matrix": "fgscale.grouping",
    "membership_variance": "fgscale.grouping",
}
__all__ = sorted(_EXPORTS)


def _version() -> str:
    # looked up when asked for: importlib.metadata costs a command such as convert 50 ms
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fgscale")
    except PackageNotFoundError:  # a source tree that was not installed
        return "0+unknown"


def __getattr__(name):
    if name == "__version__":
        globals()["__version__"] = value = _version()
        return value
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fgscale' has no attribute {name!r}")


def __dir__():
    return [*__all__, "__version__"]
