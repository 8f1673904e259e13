"""fgscale: feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr."""

from fgscale.grouping import back_project, project

__all__ = ["back_project", "project"]
__version__ = "0.1.0"
