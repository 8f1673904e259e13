"""fgscale: feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr."""

from fgscale.estimator import FeatureGroupingClassifier
from fgscale.grouping import back_project, project
from fgscale.rena import grid_edges, rena

__all__ = ["FeatureGroupingClassifier", "back_project", "grid_edges", "project", "rena"]
__version__ = "0.1.0"
