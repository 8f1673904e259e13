"""Benchmark fgscale.grouping._rena against nilearn.regions.ReNA: time and approximation error.

Three problems, each clustered by both libraries on the same r samples in this process, with the
approximation error measured on held-out samples of the same kind (mean over seeds):

- ``smooth``: nilearn's MNI152 2 mm brain mask (shipped with nilearn) with SYNTHETIC data,
  white-noise volumes smoothed with a Gaussian filter, plus white noise;
- ``motor``: nilearn's real motor-task statistical map (``load_sample_motor_activation_image``,
  shipped with nilearn) on the same mask, plus SYNTHETIC white noise of the map's own scale;
- ``fashion``: real Fashion-MNIST images (28 x 28, ``apt-get install dataset-fashion-mnist``).

Run: ``.venv/bin/python scripts/bench_rena.py`` (``--quick`` for one seed and one timing run).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import warnings

import nibabel as nib
import numpy as np
from bench_accuracy import FASHION_DIR, FASHION_FILES, load_fashion, mean_se
from benchlib import markdown_row, markdown_table, parse_args, timings
from nilearn.datasets import load_mni152_brain_mask, load_sample_motor_activation_image
from nilearn.image import resample_to_img
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


@functools.cache
def motor_map() -> np.ndarray:
    """nilearn's real motor map resampled onto the MNI 2 mm grid (once per run)."""
    template = load_mni152_brain_mask(resolution=2)
    motor = resample_to_img(load_sample_motor_activation_image(), template,
                            interpolation="continuous", force_resample=True, copy_header=True)
    return np.asarray(motor.dataobj, dtype=np.float64)


@functools.cache
def fashion_images() -> np.ndarray:
    """Fashion-MNIST's training images as (60000, 784) float32 (read once per run)."""
    return load_fashion()["train_images"].reshape(-1, 784).astype(np.float32)


def motor_samples(mask: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, p') samples: nilearn's real motor map on the MNI mask (where the map is defined),
    scaled to unit variance, plus SYNTHETIC unit white noise; and the mask restricted to the map."""
    values = motor_map()
    mask = mask & np.isfinite(values) & (values != 0)
    signal = values[mask] / values[mask].std()
    noise = np.random.default_rng(seed).standard_normal((n, int(mask.sum())))
    return (signal + noise).astype(np.float32), mask


def problems(seed: int, samples: int) -> dict:
    """name -> (r training samples, held-out samples, mask, k) for one seed."""
    out = {}
    mask = brain_mask()
    out["smooth"] = (smooth_samples(mask, samples, seed), smooth_samples(mask, 20, 1000 + seed),
                     mask)
    X, motor_mask = motor_samples(mask, samples, seed)
    out["motor"] = (X, motor_samples(mask, 20, 1000 + seed)[0], motor_mask)
    if all((FASHION_DIR / name).is_file() for name in FASHION_FILES.values()):
        images = fashion_images()
        order = np.random.default_rng(seed).permutation(len(images))
        out["fashion"] = (images[order[:samples]], images[order[samples:samples + 1000]],
                          np.ones((28, 28, 1), bool))
    return {name: (X, held, mask, int(mask.sum()) // 10) for name, (X, held, mask) in out.items()}


def size_stats(labels: np.ndarray) -> tuple[int, str]:
    sizes = np.bincount(np.unique(labels, return_inverse=True)[1])
    return len(sizes), f"{sizes.min()} / {int(np.median(sizes))} / {sizes.max()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timing runs per method and seed")
    parser.add_argument("--seeds", type=int, default=5, help="draws of the samples")
    parser.add_argument("--samples", type=int, default=50, help="r, samples used for clustering")
    args = parse_args(parser, quick=dict(repeats=1, seeds=1), help="one seed, one timing run")

    results = {}  # (problem, method) -> lists of time, error; and the last size stats
    for seed in range(args.seeds):
        for name, (X, held_out, mask, k) in problems(seed, args.samples).items():
            for method, fn in [("fgscale", run_ours), ("nilearn", run_nilearn)]:
                # after one untimed call: a bank calls ReNA b times in a row on one mask
                times, labels = timings(functools.partial(fn, X, mask, k), args.repeats,
                                        warm_up=True)
                entry = results.setdefault((name, method), dict(time=[], error=[]))
                entry["time"].append(statistics.median(times))
                entry["error"].append(relative_error(held_out, labels))
                entry["p"], entry["k"], entry["sizes"] = int(mask.sum()), k, size_stats(labels)

    print(f"r = {args.samples} samples, k = p // 10, 20 held-out samples (1,000 for fashion), "
          f"{args.seeds} seed(s), time = median of {args.repeats} run(s) per seed after an untimed one, "
          f"then the mean over seeds\n")
    markdown_table("problem", "p", "method", "time (ms)", "held-out rel. error (mean +- se)",
                   "clusters", "size min / median / max", "speed-up", "error ours / nilearn")
    for (name, method), entry in results.items():
        ours, theirs = results[(name, "fgscale")], results[(name, "nilearn")]
        error, se = mean_se(entry["error"])
        ratios = ("", "") if method == "nilearn" else (
            f"{np.mean(theirs['time']) / np.mean(ours['time']):.1f}x",
            f"{np.mean(ours['error']) / np.mean(theirs['error']):.4f}")
        markdown_row(name, entry["p"], method, f"{1e3 * np.mean(entry['time']):.2f}",
                     f"{error:.4f} +- {se:.4f}", entry["sizes"][0], entry["sizes"][1],
                     *ratios)


if __name__ == "__main__":
    main()
