"""What a bank of groupings does to a linear model: Omega and the variance of Delta.

Each grouping ``g`` of a bank gives the projection ``P_g = Phi_g^T Phi_g`` (p x p), with
``P_g[i, j] = 1 / |C_g(i)|`` when ``i`` and ``j`` share a cluster and 0 otherwise. Over the bank
(uniform over its rows) ``Omega = E[P]`` and ``Delta = P - Omega``. Training with feature
grouping is, to second order, training on the smoothed inputs ``Omega x`` plus a penalty that
grows with the variance of ``Delta`` (Aydore et al., ICML 2019, Section 4): weights of features
whose cluster membership changes from one grouping to the next are shrunk.

These functions compute those quantities from label vectors without ever forming ``P_g``,
except :func:`omega_matrix`, which returns the dense p x p matrices for small examples. They
use numpy and scipy only (no torch), and read a zarr bank one row at a time.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fgscale._utils.checks import check_count
from fgscale.grouping._bank import bank_row, check_not_none, omega_diagonal

__all__ = ["membership_variance", "omega_diagonal", "omega_matrix"]


def _check_bank(bank):
    """The bank as an array-like with a 2D integer shape (numpy, zarr, or a nested list)."""
    check_not_none(bank)
    if not hasattr(bank, "shape") or not hasattr(bank, "dtype"):
        bank = np.asarray(bank)
    if len(bank.shape) != 2 or bank.shape[0] == 0 or bank.shape[1] == 0:
        raise ValueError("bank must have shape (n_groupings >= 1, n_features >= 1), one label vector "
                         f"per row, got shape {tuple(bank.shape)}")
    if not np.issubdtype(np.dtype(bank.dtype), np.integer):
        raise ValueError(f"bank must hold integer cluster labels, got dtype {bank.dtype}")
    return bank


def _shared_counts(labels_g: np.ndarray, labels_h: np.ndarray) -> np.ndarray:
    """``|C_g(i) ∩ C_h(i)|`` for every feature ``i``, shape (n_features,).

    The contingency table of the two label vectors is built sparse: a dense bincount of the
    combined key would need ``k_g * k_h`` entries (3e10 at p = 1.8M, k = 10% of p), a sort of it
    O(p log p); the sparse table costs O(p + k) and is read back per feature.
    """
    k_g, k_h = int(labels_g.max()) + 1, int(labels_h.max()) + 1
    ones = np.ones(labels_g.size, dtype=np.int64)
    table = sp.csr_array((ones, (labels_g, labels_h)), shape=(k_g, k_h))
    return np.asarray(table[labels_g, labels_h], dtype=np.float64).ravel()


def _pair_term(labels_g, sizes_g, labels_h, sizes_h) -> np.ndarray:
    """``||P_g[i] - P_h[i]||^2`` for every feature ``i``: 0 when ``C_g(i) = C_h(i)``.

    Written as ``1/s_g + 1/s_h - 2 n / (s_g s_h)`` so that equal clusters (n = s_g = s_h) give
    exactly 0 in floating point: both ``1/s`` and ``s/(s*s)`` round to the same double.
    """
    shared = _shared_counts(labels_g, labels_h)
    term = 1.0 / sizes_g + 1.0 / sizes_h - 2.0 * shared / (sizes_g * sizes_h)
    # mathematically a squared norm: clip the last-bit rounding of clusters that nearly agree
    return np.maximum(term, 0.0)


def _pair_index_to_rows(t: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(g, h)``, ``g < h``, of the ``t``-th pair in row-major order of the upper triangle.

    Arithmetic rather than ``np.triu_indices(b, 1)[t]``, which would hold all b^2/2 pairs.
    """
    starts = np.concatenate([[0], np.cumsum(np.arange(b - 1, 0, -1, dtype=np.int64))])
    g = np.searchsorted(starts, t, side="right") - 1
    return g, t - starts[g] + g + 1


def membership_variance(bank, *, max_pairs: int | None = None, random_state=None) -> np.ndarray:
    """Per feature, how much its cluster changes across the bank: ``sum_j Var_g[P_g[i, j]]``.

    Equal to ``diag(Omega)_i - sum_j Omega_ij^2`` (since ``sum_j P_g[i, j]^2 = 1 / |C_g(i)|``),
    the diagonal of ``E[Delta^T Delta]``. It is computed as half the mean squared difference over
    pairs of groupings, ``1 / (2 b^2) sum_{g, h} ||P_g[i] - P_h[i]||^2``, where each pair term is
    ``1/|C_g(i)| + 1/|C_h(i)| - 2 |C_g(i) ∩ C_h(i)| / (|C_g(i)| |C_h(i)|)``: the same number, but a
    sum of nonnegative terms that are exactly 0 where two groupings agree, where the difference
    of two close sums would cancel. Diagonal pairs (``g = h``) contribute exactly 0.

    Parameters
    ----------
    bank : array-like of shape (n_groupings, n_features), int
        Label vectors with values ``0 .. k-1`` (any order, gaps allowed); a zarr array is read one
        row at a time, each of the two rows of a pair once per pair.
    max_pairs : int or None, default=None
        Budget of pairs ``(g, h)``, ``g <= h``. None, or a budget of at least ``b (b + 1) / 2``,
        evaluates every pair exactly: O(b^2 p) time. Otherwise the ``b`` diagonal pairs are kept
        (they are exactly 0) and ``max(max_pairs - b, 1)`` of the ``b (b - 1) / 2`` off-diagonal
        pairs are drawn at random without replacement; their sum, scaled by the inverse sampling
        fraction, is an unbiased estimate of the sum over all of them. Time O(max_pairs p),
        memory O(p + k) per pair either way, never a p x p matrix.
    random_state : int, numpy Generator or None, default=None
        Seeds the draw of pairs; used only when pairs are sampled.

    Returns
    -------
    variance : ndarray of shape (n_features,), float64
        Nonnegative (the sampled estimate too); 0 exactly where every grouping puts the feature
        in a cluster with the same members, whatever the label values. At most
        ``diag(Omega)_i``; 0 for a bank of one grouping.

    Raises
    ------
    ValueError
        On a bank that is not 2D with integer labels, a row with negative labels, or a
        ``max_pairs`` that is not a positive integer.
    """
    bank = _check_bank(bank)
    if max_pairs is not None:
        check_count("max_pairs", max_pairs)
    b, p = bank.shape
    n_off = b * (b - 1) // 2
    if max_pairs is None or b * (b + 1) // 2 <= max_pairs:
        pairs, scale = np.arange(n_off, dtype=np.int64), 1.0
    else:
        n_draw = max(int(max_pairs) - b, 1)
        rng = np.random.default_rng(random_state)
        # sorted so that pairs sharing a first row come together and it is read once
        pairs = np.sort(rng.choice(n_off, size=n_draw, replace=False)).astype(np.int64)
        scale = n_off / n_draw
    total = np.zeros(p)
    rows_g, rows_h = _pair_index_to_rows(pairs, b)
    current = None
    for g, h in zip(rows_g.tolist(), rows_h.tolist(), strict=True):
        if current is None or current[0] != g:
            current = (g, *bank_row(bank, g))
        total += _pair_term(current[1], current[2], *bank_row(bank, h))
    # rows left out of every sampled pair (or the single row of b = 1) are still validated
    for g in sorted(set(range(b)) - set(rows_g.tolist()) - set(rows_h.tolist())):
        bank_row(bank, g)
    # each unordered pair stands for (g, h) and (h, g): 2 / (2 b^2)
    return total * (scale / b**2)


def omega_matrix(bank, max_features: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """Dense Omega = E[P] and the elementwise variance of Delta, for small examples.

    Parameters
    ----------
    bank : array-like of shape (n_groupings, n_features), int
        Label vectors with values ``0 .. k-1``; a zarr array is read one row at a time.
    max_features : int, default=5000
        Largest p accepted: the two results take ``16 p^2`` bytes (400 MB at p = 5000).

    Returns
    -------
    omega : ndarray of shape (n_features, n_features), float64
        ``E[Phi^T Phi]``: symmetric, positive semidefinite, eigenvalues in [0, 1] (a mean of
        orthogonal projections); ``omega[i, j]`` is the mean of ``1 / |C(i)|`` over the groupings
        that put ``i`` and ``j`` together.
    delta_variance : ndarray of shape (n_features, n_features), float64
        ``Var[Delta_ij] = E[P_ij^2] - Omega_ij^2``, nonnegative; its row sums are
        :func:`membership_variance`.

    Raises
    ------
    ValueError
        On a bank that is not 2D with integer labels, a row with negative labels, or more than
        ``max_features`` features.
    """
    bank = _check_bank(bank)
    b, p = bank.shape
    if p > max_features:
        raise ValueError(f"omega_matrix builds two dense {p} x {p} matrices; the bank has "
                         f"n_features={p} > max_features={max_features}. Use omega_diagonal and "
                         "membership_variance for large banks, or raise max_features.")
    total = sp.csr_array((p, p))
    total_sq = sp.csr_array((p, p))
    for g in range(b):
        labels, sizes = bank_row(bank, g)
        # sparse Phi (k x p) so that P_g costs sum_q |C_q|^2 entries, not p^2
        phi = sp.csr_array((1.0 / np.sqrt(sizes), (labels, np.arange(p))), shape=(labels.max() + 1, p))
        proj = (phi.T @ phi).tocsr()
        total = total + proj
        total_sq = total_sq + proj.multiply(proj)
    omega = total.toarray() / b
    # a difference of two means: clip the rounding below 0 where every grouping agrees
    delta_variance = np.maximum(total_sq.toarray() / b - omega**2, 0.0)
    return omega, delta_variance
