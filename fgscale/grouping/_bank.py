"""Banks of feature groupings: b ReNA clusterings, each on r bootstrap rows.

Every grouping is a pure function of ``(seed, i)``: its bootstrap rows and its ReNA
tie-breaking both derive from :func:`grouping_seed`, so a bank does not depend on how many
workers built it, in which order, or whether it was built in one go or extended later.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fgscale._utils.checks import resolve_n_clusters
from fgscale.grouping._rena import rena

__all__ = ["bank_row", "bootstrap_rows", "build_grouping", "check_not_none", "grouping_seed",
           "make_bank", "omega_diagonal", "resolve_n_clusters"]


def grouping_seed(seed: int, index: int) -> int:
    """Integer seed of the ``index``-th grouping of a bank seeded with ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def bootstrap_rows(seed: int, rows, n_bootstrap: int) -> np.ndarray:
    """Draw ``n_bootstrap`` of ``rows`` with replacement, sorted (for sequential reads)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        raise ValueError("cannot bootstrap a grouping from zero training rows")
    return np.sort(np.random.default_rng(seed).choice(rows, size=n_bootstrap, replace=True))


def build_grouping(read_rows: Callable[[np.ndarray], np.ndarray], rows, graph, n_clusters: int,
                   n_bootstrap: int, seed: int) -> np.ndarray:
    """Build one grouping: ReNA on ``n_bootstrap`` rows drawn from ``rows``.

    Parameters
    ----------
    read_rows : callable
        ``read_rows(indices)`` returns the data rows, shape (len(indices), n_features).
    rows : array-like of int
        Rows to draw from (the training rows only).
    graph : ndarray of bool or sparse matrix
        The mask or adjacency passed to :func:`fgscale.grouping.rena`.
    n_clusters, n_bootstrap : int
    seed : int
        From :func:`grouping_seed`.

    Returns
    -------
    labels : ndarray of shape (n_features,), int32
    """
    X = read_rows(bootstrap_rows(seed, rows, n_bootstrap))
    return rena(X, graph, n_clusters, random_state=seed)


def make_bank(X, graph, n_clusters: int, *, n_groupings: int = 100, n_bootstrap: int = 50,
              rows=None, seed: int = 0) -> np.ndarray:
    """Build a bank in memory, one grouping after the other.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    graph : ndarray of bool or sparse matrix
        Mask (features are ``vol[mask]``) or adjacency of the features.
    n_clusters : int
    n_groupings : int
        b, the number of groupings.
    n_bootstrap : int
        r, rows per grouping, drawn with replacement.
    rows : array-like of int, optional
        Rows allowed in the bootstrap (the training rows); default all.
    seed : int

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    """
    rows = np.arange(X.shape[0]) if rows is None else rows
    bank = np.empty((n_groupings, X.shape[1]), dtype=np.int32)
    for i in range(n_groupings):
        bank[i] = build_grouping(X.__getitem__, rows, graph, n_clusters, n_bootstrap,
                                 grouping_seed(seed, i))
    return bank


def check_not_none(bank) -> None:
    """A ValueError saying why an estimator's ``bank_`` may be None, and where a bank is."""
    if bank is None:
        raise ValueError("bank is None: an estimator loaded from a run folder or a saved model "
                         "holds no bank, nor one fitted without feature grouping; use one fitted "
                         "in this process, or the store's bank (fgscale export STORE --omega)")


def omega_diagonal(bank) -> np.ndarray:
    """Diagonal of Omega = E[Phi^T Phi] over a bank: per feature, the mean of 1 / |C(feature)|.

    Parameters
    ----------
    bank : array-like of shape (n_groupings, n_features), int
        Label vectors with values ``0 .. k-1``; a zarr array is read one row at a time.

    Returns
    -------
    omega : ndarray of shape (n_features,), float64
        Between 0 and 1; 1 where a feature is alone in its cluster in every grouping.
    """
    check_not_none(bank)
    if len(bank.shape) != 2 or bank.shape[0] == 0:
        raise ValueError(f"bank must have shape (n_groupings >= 1, n_features), got {bank.shape}")
    omega = np.zeros(bank.shape[1])
    for i in range(bank.shape[0]):
        omega += 1.0 / bank_row(bank, i)[1]
    return omega / bank.shape[0]


def bank_row(bank, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels (int64) of grouping ``g`` of a bank (a zarr array is read that one row) and the
    size of each feature's cluster (float64); a row of negative labels (unbuilt) is refused."""
    labels = np.asarray(bank[g]).astype(np.int64)
    if labels.min() < 0:
        raise ValueError(f"bank row {g} holds negative labels (unbuilt rows are -1); build the "
                         "bank fully or pass only its built rows")
    return labels, np.bincount(labels)[labels].astype(np.float64)
