"""Univariate screening of each grouping's clusters, as nilearn's FREM screens its clusters.

FREM reduces the voxels with one ReNA clustering, then keeps the clusters whose mean is most
related to the target (an ANOVA F-test, scikit-learn's ``SelectPercentile``; in
classification, for each class against the others, each class's model on its own clusters).
With a bank, the same is done for every grouping: its k cluster values on the training rows
are tested against the target and the best ``percentile`` percent kept; a minibatch reduced by
that grouping trains with the other clusters' weights (of a class, or of the whole first
layer) set to zero. The weights stay in voxel space: predict uses them on full rows, as it does
without screening.

The statistics are sums over rows, merged exactly block by block: one pass over the training
rows (in memory, or streamed from a store) serves every grouping. The percentile is relative
to a human brain, as nilearn's ``screening_percentile``: :func:`adjusted_percentile` scales it
by the mask's volume.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from fgscale.grouping._projection import project

__all__ = ["BRAIN_VOLUME_MM3", "adjusted_percentile", "block_sums", "f_scores", "keep_best",
           "kept_clusters", "merge_sums", "screen_bank"]

# The MNI152 brain's volume, nilearn's reference for screening_percentile
BRAIN_VOLUME_MM3 = 1882989.0


def adjusted_percentile(percentile: float, mask_img, n_features: int) -> float:
    """``percentile`` of a human brain, as a percentile of the mask's features (nilearn's
    ``adjust_screening_percentile``): ``percentile * brain volume / mask volume``, at most 100.

    Parameters
    ----------
    percentile : float
        In (0, 100]; 100 keeps everything.
    mask_img : Nifti1Image or None
        The mask the features come from; its voxels' volume comes from its affine. None (rows
        given without a mask image): each feature counts as 1 mm³.
    n_features : int
    """
    if percentile >= 100:
        return 100.0
    # the affine as a NIfTI header holds it (float32): an image and a store of it agree
    linear = None if mask_img is None else np.asarray(mask_img.affine, np.float32)[:3, :3]
    voxel = 1.0 if linear is None else abs(float(np.linalg.det(linear.astype(np.float64))))
    volume = max(n_features * voxel, np.finfo(float).tiny)
    return float(min(100.0, percentile * BRAIN_VOLUME_MM3 / volume))


def block_sums(x: np.ndarray, y: np.ndarray, bank, n_clusters: int, n_outputs: int,
               regression: bool = False) -> dict[str, np.ndarray]:
    """The sums over one block of rows of every grouping's cluster values, merged over the
    blocks by :func:`merge_sums`: what the F-tests need.

    Parameters
    ----------
    x : ndarray of shape (m, p), float32
        Rows, standardized as training sees them.
    y : ndarray of shape (m,)
        Their class indices, or their targets in regression.
    bank : ndarray or Tensor of shape (b, p), int
        The groupings (a slice of a bank, for a task on a share of it); a Tensor's device
        computes.
    n_clusters, n_outputs : int
        k, and the number of classes (1 in regression).

    Returns
    -------
    dict of ndarray
        ``n`` (rows per class, or the rows), ``y`` (the targets' sum and sum of squares),
        ``zy`` (b, n_outputs, k: each class's sum, or the sum of z * y), ``zz`` and ``z``
        (b, k); a block's sums in float32, the counts and targets' in float64.
    """
    bank = torch.as_tensor(bank)
    x = torch.as_tensor(np.asarray(x), device=bank.device)
    y = torch.as_tensor(np.asarray(y), device=bank.device)
    out = {"n": np.zeros(n_outputs), "y": np.zeros(2)}
    if regression:
        target = y.to(torch.float64)
        out["n"][0] = len(y)
        out["y"][:] = [float(target.sum()), float((target ** 2).sum())]
        weights = target[:, None].to(x.dtype)  # (m, 1): the sums of z * y
    else:
        weights = torch.nn.functional.one_hot(y.long(), n_outputs).to(x.dtype)
        out["n"][:] = weights.sum(0).double().cpu().numpy()
    # a block's sums in float32 (a block is a few hundred rows), the blocks' in float64; the
    # outputs allocated before the loop: small arrays kept between the (m x k) temporaries of
    # every grouping would keep the heap from reusing their space, growing it each grouping
    b = len(bank)
    zy = x.new_empty((b, weights.shape[1], n_clusters))
    zz, z_sum = x.new_empty((b, n_clusters)), x.new_empty((b, n_clusters))
    for g, labels in enumerate(bank):
        z = project(x, labels, n_clusters)
        torch.mm(weights.T, z, out=zy[g])
        torch.sum(z, 0, out=z_sum[g])
        torch.sum(z.square_(), 0, out=zz[g])
    out["zy"], out["zz"], out["z"] = zy.cpu().numpy(), zz.cpu().numpy(), z_sum.cpu().numpy()
    return out


def merge_sums(parts: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The float64 sums of :func:`block_sums` of blocks of rows, for the same groupings (a
    store's, computed on shares of its bank, are merged by
    :meth:`~fgscale.training._stream.StoreSource.screen_sums`)."""
    total = None
    for part in parts:
        if total is None:
            total = {name: np.asarray(a, np.float64).copy() for name, a in part.items()}
        else:
            for name, a in part.items():
                total[name] += a
    if total is None:
        raise ValueError("no rows to screen on")
    return total


def _f_of_grouping(sums: dict[str, np.ndarray], g: int, regression: bool,
                   one_vs_rest: bool) -> np.ndarray:
    """:func:`f_scores` of grouping ``g``, in float64."""
    zz, z, zy = sums["zz"][g], sums["z"][g], sums["zy"][g]
    if regression:
        n = sums["n"][0]
        sy, syy = sums["y"]
        cov = zy[0] - z * sy / n
        r2 = cov * cov / ((zz - z * z / n) * (syy - sy * sy / n))
        return r2 / (1 - r2) * (n - 2)
    if one_vs_rest:  # two groups: the class (its sums) and the rest (the others')
        counts, n = sums["n"][:, None], sums["n"].sum()
        explained = zy ** 2 / counts + (z - zy) ** 2 / (n - counts)
        return (explained - z * z / n) / ((zz - explained) / (n - 2))
    counts = sums["n"]
    present = counts > 0
    n, n_classes = counts.sum(), int(present.sum())
    explained = (zy[present] ** 2 / counts[present][:, None]).sum(0)
    between = (explained - z * z / n) / max(n_classes - 1, 1)
    return between / ((zz - explained) / max(n - n_classes, 1))


def f_scores(sums: dict[str, np.ndarray], regression: bool,
             one_vs_rest: bool = False) -> np.ndarray:
    """F statistic of each grouping's clusters from :func:`merge_sums`: scikit-learn's
    ``f_regression`` (centered), shape (b, k); ``f_classif`` (one-way ANOVA over the classes),
    (b, k); or, with ``one_vs_rest``, ``f_classif`` of each class against the others, as
    nilearn's FREM screens for each class, (b, n_classes, k). Clusters of no variance, and
    classes without rows, score 0. Float32 (computed in float64 one grouping at a time: the
    temporaries of all of them at once would weigh several times the sums)."""
    b, n_outputs, k = sums["zy"].shape
    scores = np.empty((b, n_outputs, k) if one_vs_rest and not regression else (b, k),
                      np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        for g in range(b):
            f = _f_of_grouping(sums, g, regression, one_vs_rest)
            scores[g] = np.where(np.isfinite(f) & (f > 0), f, 0.0)
    return scores


def keep_best(scores: np.ndarray, percentile: float) -> np.ndarray:
    """True for the clusters of each row of ``scores`` (..., k) in the best ``percentile``
    percent: ``int(k * percentile / 100)`` a row (at least one), as ``SelectPercentile``
    keeps them, ties going to the first clusters (bool: a model multiplies its weights by
    it, where it keeps a fourth of float32's memory for every candidate's bank)."""
    n_keep = max(1, int(scores.shape[-1] * percentile / 100))
    keep = np.zeros(scores.shape, bool)
    for row, out in zip(scores, keep, strict=True):  # one grouping's sort at a time
        best = np.argsort(-row, axis=-1, kind="stable")[..., :n_keep]
        np.put_along_axis(out, best, True, axis=-1)
    return keep


def kept_clusters(sums: dict[str, np.ndarray], percentile: float, *, regression: bool,
                  one_vs_rest: bool) -> np.ndarray:
    """:func:`keep_best` of the :func:`f_scores` of ``sums`` (:func:`merge_sums`, or a store's
    :meth:`~fgscale.training._stream.StoreSource.screen_sums`): the clusters each grouping
    keeps, (b, k), or (b, n_outputs, k) with ``one_vs_rest``."""
    return keep_best(f_scores(sums, regression, one_vs_rest), percentile)


def screen_bank(blocks: Iterable[tuple[np.ndarray, np.ndarray]], bank, n_clusters: int,
                percentile: float, *, n_outputs: int, regression: bool = False,
                one_vs_rest: bool = False) -> np.ndarray:
    """Which clusters of each grouping a minibatch keeps: the ``percentile`` percent of best F
    on the rows of ``blocks`` (in memory; a store's sums are computed on its workers,
    :meth:`~fgscale.training._stream.StoreSource.screen_sums`).

    Parameters
    ----------
    blocks : iterable of (ndarray (m, p) float32, ndarray (m,))
        The training rows, standardized as training sees them, and their class indices (or
        targets, in regression).
    bank : ndarray or Tensor of shape (b, p), int
    n_clusters : int
        k.
    percentile : float
        In (0, 100), already adjusted (:func:`adjusted_percentile`).
    n_outputs : int
        The number of classes (1 in regression).
    regression : bool, default=False
    one_vs_rest : bool, default=False
        Screen for each class apart (:func:`f_scores`).

    Returns
    -------
    keep : ndarray of shape (b, k), or (b, n_outputs, k) with ``one_vs_rest``, bool
        :func:`kept_clusters`.
    """
    sums = merge_sums(block_sums(x, y, bank, n_clusters, n_outputs, regression)
                      for x, y in blocks)
    return kept_clusters(sums, percentile, regression=regression, one_vs_rest=one_vs_rest)
