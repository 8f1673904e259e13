"""Feature groupings: ReNA clustering, projections with a grouping, and banks of groupings
built in memory or as Dask tasks into a store, exported as NIfTI maps; and what a bank does as
a regularizer (Omega = E[Phi^T Phi], membership variance).

ReNA and the banks never import torch (bank workers import them); the projections, which the
training side uses, run in torch and are imported on first use.
"""

import importlib

from fgscale.grouping._bank import (
    bootstrap_rows,
    build_grouping,
    grouping_seed,
    make_bank,
    omega_diagonal,
    resolve_n_clusters,
)
from fgscale.grouping._dask_bank import (
    BankSpec,
    bank_ready,
    bank_spec,
    build_bank,
    ensure_bank,
    load_bank,
)
from fgscale.grouping._export import export_map
from fgscale.grouping._omega import membership_variance, omega_matrix
from fgscale.grouping._rena import grid_edges, rena

_PROJECTIONS = ("back_project", "cluster_sizes", "project", "project_rows")

__all__ = ["BankSpec", "back_project", "bank_ready", "bank_spec", "bootstrap_rows", "build_bank",
           "build_grouping", "cluster_sizes", "ensure_bank", "export_map", "grid_edges",
           "grouping_seed", "load_bank", "make_bank", "membership_variance", "omega_diagonal",
           "omega_matrix", "project", "project_rows", "rena", "resolve_n_clusters"]


def __getattr__(name):
    if name in _PROJECTIONS:
        return getattr(importlib.import_module("fgscale.grouping._projection"), name)
    raise AttributeError(f"module 'fgscale.grouping' has no attribute {name!r}")
