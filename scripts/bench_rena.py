"""Benchmark fgscale.grouping._rena against nilearn.regions.ReNA on a brain-sized synthetic problem.

The mask is nilearn's MNI152 2 mm brain mask (shipped with nilearn, no download). The data are
synthetic: white-noise volumes smoothed with a Gaussian filter, plus white noise. Both clusterings
run in this process with the same thread settings on the same r samples; the approximation error is
measured on held-out samples from the same generator.

Run: ``.venv/bin/python scripts/bench_rena.py`` (``--quick`` for one timing run per method;
``--quick --samples 10`` is the smallest run).
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import nibabel as nib
import numpy as np
from benchlib import markdown_row, markdown_table, parse_args, timings
from nilearn.datasets import load_mni152_brain_mask
from nilearn.regions import ReNA
from scipy.ndimage import gaussian_filter

from fgscale.grouping._rena import rena


def brain_mask() -> np.ndarray:
    """nilearn's MNI152 brain mask at 2 mm, as a boolean array."""
    return np.asarray(load_mni152_brain_mask(resolution=2).dataobj).astype(bool)


def smooth_samples(mask: np.ndarray, n: int, seed: int, sigma: float = 2.0,
                   noise: float = 0.5) -> np.ndarray:
    """(n, p) float32 masked samples: smoothed white noise (unit variance) + white noise."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, int(mask.sum())), dtype=np.float32)
    for i in range(n):
        vol = gaussian_filter(rng.standard_normal(mask.shape), sigma)
        vol /= vol.std()
        out[i] = vol[mask] + noise * rng.standard_normal(out.shape[1])
    return out


def relative_error(X: np.ndarray, labels: np.ndarray) -> float:
    """Mean over samples of ||x - Phi^T Phi x|| / ||x|| (Phi^T Phi x: features -> cluster means)."""
    labels = np.unique(labels, return_inverse=True)[1]
    k = labels.max() + 1
    counts = np.bincount(labels, minlength=k)
    errors = []
    for x in X.astype(np.float64):
        means = np.bincount(labels, weights=x, minlength=k) / counts
        errors.append(np.linalg.norm(x - means[labels]) / np.linalg.norm(x))
    return float(np.mean(errors))


def run_ours(X, mask, k):
    return rena(X, mask, k, random_state=0)


def run_nilearn(X, mask, k):
    mask_img = nib.Nifti1Image(mask.astype("uint8"), np.eye(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReNA(mask_img=mask_img, n_clusters=k, scaling=False, n_iter=10).fit(X).labels_


def size_stats(labels: np.ndarray) -> tuple[int, str, float]:
    sizes = np.bincount(np.unique(labels, return_inverse=True)[1])
    spread = f"{sizes.min()} / {int(np.median(sizes))} / {sizes.max()}"
    return len(sizes), spread, float(sizes.std())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timing runs per method (median)")
    parser.add_argument("--samples", type=int, default=50, help="r, samples used for clustering")
    args = parse_args(parser, quick=dict(repeats=1), help="one timing run per method")

    mask = brain_mask()
    p = int(mask.sum())
    k = p // 10
    X = smooth_samples(mask, args.samples, seed=0)
    held_out = smooth_samples(mask, 20, seed=1)
    print(f"mask: nilearn MNI152 brain mask, 2 mm, shape {mask.shape}, p = {p}; "
          f"data: synthetic (smoothed white noise, sigma 2 voxels, + 0.5 white noise); "
          f"r = {args.samples}, k = {k}, held-out samples = 20, timing = median of {args.repeats}\n")

    rows = {}
    for name, fn in [("fgscale.grouping._rena", run_ours), ("nilearn ReNA (n_iter=10)", run_nilearn)]:
        times, labels = timings(lambda fn=fn: fn(X, mask, k), args.repeats)
        rows[name] = (statistics.median(times), relative_error(held_out, labels), *size_stats(labels))

    markdown_table("method", "time (s)", "held-out rel. error", "clusters", "size min / median / max",
                   "size std")
    for name, (seconds, error, n, spread, std) in rows.items():
        markdown_row(name, f"{seconds:.3f}", f"{error:.4f}", n, spread, f"{std:.2f}")
    (t_ours, e_ours, *_), (t_nil, e_nil, *_) = rows.values()
    print(f"\nspeed-up (nilearn time / ours): {t_nil / t_ours:.2f}x; "
          f"error ratio (ours / nilearn): {e_ours / e_nil:.4f}")


if __name__ == "__main__":
    main()
