"""Benchmark: FeatureGroupingRegressor against scikit-learn's RidgeCV (not a test).

Data (SYNTHETIC, generated here): on the 4 mm brain grid (p = 33,854) each sample is
``t * pattern + noise``, ``t`` the target (standard normal), ``pattern`` a smooth map (three
Gaussian blobs, unit RMS), ``noise`` a share ``--smooth-noise`` of spatially smooth noise (Gaussian
filter, sigma 1.5 voxels) and the rest white, scaled to ``--snr-db``. Every method fits the
same training rows and is scored on test rows no fit sees; each chooses its hyper-parameters on
the training rows only: RidgeCV gets them standardized (a StandardScaler fitted on them) and
picks among alphas ``logspace(-2, 6, 17)`` by its efficient leave-one-out; fgscale standardizes
itself and selects on its own validation split (``validation_fraction=0.2``).

Prints a Markdown table of test R² (mean ± standard error over seeds) and fit time.

Usage::

    .venv/bin/python scripts/bench_regression.py --quick      # 1 seed, ~1 min
    .venv/bin/python scripts/bench_regression.py              # 5 seeds
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import ndimage

GRID = "4mm"
SIGMA_NOISE = 1.5


def make_data(seed: int, n_samples: int, snr_db: float, smooth_noise: float):
    """SYNTHETIC regression rows: (X, t, mask), the mask an image on the 4 mm affine (as a
    user's mask comes: its voxels' volume scales the screening percentile)."""
    import nibabel as nib

    from fgscale.images import brain_mask, grid_geometry

    shape, affine, n_voxels = grid_geometry(GRID)
    mask = brain_mask(shape, n_voxels)
    rng = np.random.default_rng(seed)
    spikes = np.zeros(shape)
    for centre in np.argwhere(mask)[rng.choice(int(mask.sum()), 3, replace=False)]:
        spikes[tuple(centre)] = rng.choice([-1.0, 1.0])
    pattern = ndimage.gaussian_filter(spikes, min(shape) / 12)[mask]
    pattern /= np.sqrt(np.mean(pattern ** 2))
    t = rng.standard_normal(n_samples)
    X = np.empty((n_samples, pattern.size), np.float32)
    scale = 10.0 ** (-snr_db / 20.0)
    for i in range(n_samples):
        smooth = ndimage.gaussian_filter(rng.standard_normal(shape), SIGMA_NOISE)[mask]
        smooth /= smooth.std()
        noise = (np.sqrt(smooth_noise) * smooth
                 + np.sqrt(1.0 - smooth_noise) * rng.standard_normal(pattern.size))
        X[i] = t[i] * pattern + scale * noise
    return X, t, nib.Nifti1Image(mask.astype(np.uint8), affine)


def methods():
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from fgscale import FeatureGroupingRegressor

    return {
        "fgscale default (feature grouping)":
            lambda mask, seed: FeatureGroupingRegressor(mask=mask, random_state=seed),
        "fgscale L2 (alpha auto)":
            lambda mask, seed: FeatureGroupingRegressor(mask=mask, regularizer="l2",
                                                        random_state=seed),
        "sklearn RidgeCV + standardization":
            lambda mask, seed: make_pipeline(StandardScaler(),
                                             RidgeCV(alphas=np.logspace(-2, 6, 17))),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--n-train", type=int, default=200)
    p.add_argument("--n-test", type=int, default=200)
    p.add_argument("--snr-db", type=float, default=-27.0)
    p.add_argument("--smooth-noise", type=float, default=0.1)
    p.add_argument("--quick", action="store_true", help="1 seed")
    args = p.parse_args(argv)
    seeds = 1 if args.quick else args.seeds
    scores: dict[str, list] = {}
    for seed in range(seeds):
        X, t, mask = make_data(seed, args.n_train + args.n_test, args.snr_db, args.smooth_noise)
        tr, te = slice(0, args.n_train), slice(args.n_train, None)
        for name, make in methods().items():
            start = time.perf_counter()
            model = make(mask, seed).fit(X[tr], t[tr])
            seconds = time.perf_counter() - start
            r2 = float(model.score(X[te], t[te]))
            scores.setdefault(name, []).append((r2, seconds))
            print(f"seed {seed} {name}: R² {r2:.3f} in {seconds:.1f} s", flush=True)
    print(f"\nSYNTHETIC 4 mm regression cohort (p = {X.shape[1]:,}), {args.n_train} training / "
          f"{args.n_test} test rows, {args.snr_db:g} dB, {args.smooth_noise:.0%} smooth noise, "
          f"{seeds} seed(s)\n")
    print("| method | test R² | fit time (s) |\n|---|---|---|")
    for name, values in scores.items():
        r2 = np.array([v[0] for v in values])
        se = f"{r2.std(ddof=1) / np.sqrt(r2.size):.3f}" if r2.size > 1 else "n/a"
        print(f"| {name} | {r2.mean():.3f} ± {se} | {np.mean([v[1] for v in values]):.1f} |")


if __name__ == "__main__":
    main()
