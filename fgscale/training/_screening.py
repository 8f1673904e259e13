"""Univariate screening of each grouping's clusters, as nilearn's FREM screens its clusters.

FREM reduces the voxels with one ReNA clustering, then keeps the clusters whose mean is most
related to the target (an ANOVA F-test, scikit-learn's ``SelectPercentile``). With a bank,
the same is done for every grouping: its k cluster values on the training rows are tested
against the target and the best ``percentile`` percent kept; a minibatch reduced by that
grouping trains with the other clusters set to zero. The weights stay in voxel space: predict
uses them on full rows, as it does without screening.

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

__all__ = ["BRAIN_VOLUME_MM3", "adjusted_percentile", "f_scores", "screen_bank"]

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


def _sums(blocks: Iterable[tuple[np.ndarray, np.ndarray]], bank: torch.Tensor, n_clusters: int,
          n_outputs: int, regression: bool) -> dict[str, torch.Tensor]:
    """Sums over the rows of ``blocks`` of every grouping's cluster values, in float64."""
    b = len(bank)
    width = 1 if regression else n_outputs
    sums = {"n": torch.zeros(width, dtype=torch.float64),
            "zy": torch.zeros(b, width, n_clusters, dtype=torch.float64),
            "zz": torch.zeros(b, n_clusters, dtype=torch.float64),
            "z": torch.zeros(b, n_clusters, dtype=torch.float64),
            "y": torch.zeros(2, dtype=torch.float64)}
    for x, y in blocks:
        x = torch.as_tensor(np.asarray(x), device=bank.device)
        y = torch.as_tensor(np.asarray(y), device=bank.device)
        if regression:
            target = y.to(torch.float64)
            sums["y"] += torch.stack([target.sum(), (target ** 2).sum()]).cpu()
            weights = target[:, None]  # (m, 1): the sums of z * y
            sums["n"] += len(y)
        else:
            weights = torch.nn.functional.one_hot(y.long(), n_outputs).to(torch.float64)
            sums["n"] += weights.sum(0).cpu()
        weights = weights.to(x.dtype)
        for g in range(b):
            # a block's sums in float32 (a block is a few hundred rows), the blocks' in float64
            z = project(x, bank[g], n_clusters)
            sums["zy"][g] += (weights.T @ z).cpu()
            sums["zz"][g] += (z * z).sum(0).cpu()
            sums["z"][g] += z.sum(0).cpu()
    return sums


def f_scores(sums: dict[str, torch.Tensor], regression: bool) -> np.ndarray:
    """F statistic of each grouping's clusters, shape (b, k): scikit-learn's ``f_classif``
    (one-way ANOVA over the classes) or ``f_regression`` (centered), from :func:`_sums`.
    Clusters of no variance score 0."""
    zz, z = sums["zz"], sums["z"]
    if regression:
        n = sums["n"][0]
        sy, syy = sums["y"]
        cov = sums["zy"][:, 0] - z * sy / n
        var_z = zz - z * z / n
        var_y = syy - sy * sy / n
        r2 = cov * cov / (var_z * var_y)
        f = r2 / (1 - r2) * (n - 2)
    else:
        counts = sums["n"]
        present = counts > 0
        n, n_classes = counts.sum(), int(present.sum())
        class_sums = sums["zy"][:, present]  # (b, C, k)
        between = (class_sums ** 2 / counts[present][:, None]).sum(1) - z * z / n
        within = zz - (class_sums ** 2 / counts[present][:, None]).sum(1)
        f = (between / max(n_classes - 1, 1)) / (within / max(n - n_classes, 1))
    f = f.numpy()
    return np.where(np.isfinite(f) & (f > 0), f, 0.0)


def screen_bank(blocks: Iterable[tuple[np.ndarray, np.ndarray]], bank: torch.Tensor,
                n_clusters: int, percentile: float, *, n_outputs: int,
                regression: bool = False) -> torch.Tensor:
    """Which clusters of each grouping a minibatch keeps: the ``percentile`` percent of best F.

    Parameters
    ----------
    blocks : iterable of (ndarray (m, p) float32, ndarray (m,))
        The training rows, standardized as training sees them, and their class indices (or
        targets, in regression).
    bank : Tensor of shape (b, p), int
    n_clusters : int
        k.
    percentile : float
        In (0, 100), already adjusted (:func:`adjusted_percentile`).
    n_outputs : int
        The number of classes (unused in regression).
    regression : bool, default=False

    Returns
    -------
    keep : Tensor of shape (b, k), float32, on ``bank``'s device
        1 for a kept cluster, 0 otherwise; ``int(k * percentile / 100)`` ones a row (at least
        one), as ``SelectPercentile`` keeps them, ties going to the first clusters.
    """
    scores = f_scores(_sums(blocks, bank, n_clusters, n_outputs, regression), regression)
    n_keep = max(1, int(n_clusters * percentile / 100))
    best = np.argsort(-scores, axis=1, kind="stable")[:, :n_keep]
    keep = np.zeros(scores.shape, np.float32)
    np.put_along_axis(keep, best, 1.0, axis=1)
    return torch.from_numpy(keep).to(bank.device)
