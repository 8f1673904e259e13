"""fgscale: feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr.

Public names are imported lazily, so that a Dask worker that only converts NIfTI files or
builds groupings does not pay for importing torch.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "FeatureGroupingClassifier": "fgscale.estimator",
    "back_project": "fgscale.grouping",
    "project": "fgscale.grouping",
    "grid_edges": "fgscale.rena",
    "rena": "fgscale.rena",
    "make_bank": "fgscale.bank",
    "Store": "fgscale.store",
    "StoreError": "fgscale.store",
    "open_store": "fgscale.store",
    "write_store": "fgscale.store",
    "convert": "fgscale.convert",
    "make_cohort": "fgscale.datasets",
    "make_classification_volumes": "fgscale.datasets",
    "unmask": "fgscale.nifti",
    "load_img": "fgscale.nifti",
    "build_bank": "fgscale.dask_bank",
    "load_bank": "fgscale.dask_bank",
    "get_client": "fgscale.cluster",
    "train_run": "fgscale.run",
    "evaluate_run": "fgscale.run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fgscale' has no attribute {name!r}")


def __dir__():
    return __all__
