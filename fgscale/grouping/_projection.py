"""Feature groupings: label vectors, their projections, and banks of them.

A grouping of ``p`` features into ``k`` clusters is stored as an int32 label vector of
length ``p`` (values ``0..k-1``), never as a dense matrix. Its matrix ``Phi`` (k x p) has
``Phi[q, j] = 1 / sqrt(|C_q|)`` for ``j`` in cluster ``C_q``; its rows are orthonormal, so
``Phi x`` is a segment sum scaled by ``1/sqrt(count)`` and ``Phi^T z`` a gather scaled the
same way. Both cost O(p) per sample.

The functions accept numpy arrays or torch tensors and return the same kind; numpy inputs
go through torch's ``scatter_add_`` and ``gather`` too, sharing their memory, so both kinds
run the same segment-sum and gather kernels and give the same numbers
(``scripts/bench_step.py`` times them in a training step).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["back_project", "cluster_scale", "cluster_sizes", "project", "project_rows"]


def cluster_sizes(labels, n_clusters: int | None = None):
    """Number of features in each cluster, shape (n_clusters,), same kind as ``labels``."""
    if isinstance(labels, torch.Tensor):
        k = int(labels.max()) + 1 if n_clusters is None else n_clusters
        return torch.bincount(labels.long(), minlength=k)
    labels = np.asarray(labels)
    k = int(labels.max()) + 1 if n_clusters is None else n_clusters
    return np.bincount(labels, minlength=k)


def cluster_scale(labels: torch.Tensor, n_clusters: int, dtype) -> torch.Tensor:
    """1 / sqrt(|C_q|) per cluster q: the scale :func:`project` puts on each cluster's sum."""
    return cluster_sizes(labels, n_clusters).to(dtype).rsqrt()


def _as_tensor(a):
    if isinstance(a, torch.Tensor):
        return a, False
    return torch.from_numpy(np.ascontiguousarray(a)), True


def project(X, labels, n_clusters: int | None = None):
    """Reduce features with a grouping: ``Z = X Phi^T``.

    Parameters
    ----------
    X : ndarray or Tensor of shape (n_samples, n_features) or (n_features,)
    labels : ndarray or Tensor of shape (n_features,)
        The grouping, cluster index per feature.
    n_clusters : int, optional
        Number of clusters k; defaults to ``labels.max() + 1``.

    Returns
    -------
    Z : ndarray or Tensor of shape (n_samples, n_clusters) or (n_clusters,)
        Each value is the sum of a cluster's features divided by ``sqrt(|C_q|)``.
    """
    X_t, was_numpy = _as_tensor(X)
    lab = _as_tensor(labels)[0].to(device=X_t.device, dtype=torch.long)
    k = int(lab.max()) + 1 if n_clusters is None else n_clusters
    # scatter_add_ rather than index_add_ (the same kernel forward): for a (h, p) weight its
    # gradient is a row-wise gather from the (h, k) gradient, where index_add_'s is an
    # index_select of that gradient's columns, torch's slower path on the CPU
    Z = X_t.new_zeros(X_t.shape[:-1] + (k,)).scatter_add_(-1, lab.expand_as(X_t), X_t)
    Z *= cluster_scale(lab, k, X_t.dtype)
    return Z.numpy() if was_numpy else Z


def project_rows(rows, labels, n_rows: int, n_clusters: int | None = None, *,
                 out: np.ndarray | None = None, mean: np.ndarray | None = None,
                 scale: np.ndarray | None = None) -> np.ndarray:
    """Reduce rows handed over one at a time, with the same numbers as :func:`project`.

    Meant for rows read straight from storage (:meth:`fgscale.store.Store.iter_rows`):
    each row is reduced as it comes, so a batch is never copied whole into memory.

    Parameters
    ----------
    rows : iterable of (int, ndarray of shape (n_features,))
        Position of the row in the output, and the row (float32).
    labels : ndarray of shape (n_features,)
    n_rows : int
    n_clusters : int, optional
    out : ndarray of shape (n_rows, n_clusters), float32, optional
        A C-contiguous array of zeros to write into; default a new one.
    mean, scale : ndarray of shape (n_features,), float32, optional
        Standardize each row before reducing it: ``(row - mean) * scale`` (``scale`` is
        ``1 / std``), given together. The numbers are those of :func:`project` on the
        standardized rows.

    Returns
    -------
    Z : ndarray of shape (n_rows, n_clusters), float32
        ``out`` when given.
    """
    if (mean is None) != (scale is None):
        raise ValueError("give mean and scale together, or neither")
    lab = torch.from_numpy(np.asarray(labels)).long()
    k = int(lab.max()) + 1 if n_clusters is None else n_clusters
    if out is None:
        out = np.zeros((n_rows, k), np.float32)
    if out.shape != (n_rows, k) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(n_rows, k)}, "
                         f"got {out.dtype} {out.shape}")
    Z = torch.from_numpy(out)
    if mean is not None:
        # Each row is standardized into one buffer, then scattered: the scatter costs most of
        # a row's time either way, and the algebraically equal Phi(x * scale) -
        # Phi(mean * scale) (one product a row, one k-vector a call) loses digits to
        # cancellation, since on raw scanner units (mean/std ~ 10) a cluster's float32 sum
        # is mostly the mean that is then subtracted.
        mean = np.asarray(mean, np.float32)
        scale = np.asarray(scale, np.float32)
        buffer = np.empty(lab.shape, np.float32)
        standardized = torch.from_numpy(buffer)
        for i, row in rows:
            np.subtract(row, mean, out=buffer)
            np.multiply(buffer, scale, out=buffer)
            Z[i].scatter_add_(0, lab, standardized)
    else:
        for i, row in rows:  # 1D scatter_add_, not index_add_: the same sums, the faster kernel
            Z[i].scatter_add_(0, lab, torch.from_numpy(row))
    # in numpy, on this thread: many thread workers each opening torch's intra-op pool for
    # this product oversubscribe the cores (the 1D scatter above runs on one thread already)
    np.multiply(out, cluster_scale(lab, k, Z.dtype).numpy(), out=out)
    return out


def back_project(Z, labels):
    """Expand reduced values back to features: ``X = Z Phi``.

    Parameters
    ----------
    Z : ndarray or Tensor of shape (n_samples, n_clusters) or (n_clusters,)
    labels : ndarray or Tensor of shape (n_features,)

    Returns
    -------
    X : ndarray or Tensor of shape (n_samples, n_features) or (n_features,)
        Piecewise constant: feature ``j`` gets ``Z[..., labels[j]] / sqrt(|C_labels[j]|)``.
    """
    Z_t, was_numpy = _as_tensor(Z)
    lab = _as_tensor(labels)[0].to(device=Z_t.device, dtype=torch.long)
    scaled = Z_t * cluster_scale(lab, Z_t.shape[-1], Z_t.dtype)
    X = scaled.gather(-1, lab.expand(scaled.shape[:-1] + lab.shape))
    return X.numpy() if was_numpy else X
