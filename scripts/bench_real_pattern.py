"""Benchmark: the estimators' defaults on a REAL activation map under structured variability
between maps (the noise is SYNTHETIC), against scikit-learn's RidgeCV and LogisticRegressionCV
on standardized voxels (not a test).

Why this data. On the brain-smooth grid the noise is stationary: a share of it smooth at one
scale, the rest white. Real maps differ from study to study, and from subject to subject, by
structure that is neither: activations of their own in grey matter, at several sizes, overall
scales and offsets, smoothness of their own. Here:

- the mask is the MNI152 brain mask and the pattern nilearn's sample motor activation map (a
  real statistical map), both resampled to 4 mm (p = 29,398); the grey-matter template weights
  where the variability lies;
- each map's variability (``study_map``): 3-11 Gaussian blobs in grey matter (sigma 3-12 mm,
  log-normal amplitudes, either sign), weighted by grey matter; a grey-matter-shaped
  component; a smooth field (sigma 4-12 mm); the whole smoothed again (sigma 1.2-4.8 mm),
  then white noise, an overall scale (log-normal) and an offset of its own. All SYNTHETIC.

Two tasks, test rows from maps (studies, subjects) no training row comes from:

``regression``
    One map per study: ``target * pattern + scale * study_map``, the target standard normal;
    100 training and 100 test maps; the scale from ``--snr-db`` (default -14 dB, chosen on
    dev seeds 100-102 by RidgeCV's R² alone, about 0.86: a task that is neither trivial nor
    hopeless). fgscale's ``FeatureGroupingRegressor`` against a pipeline of StandardScaler and
    RidgeCV over alphas ``logspace(-2, 8, 21)``.
``classification``
    Two "tasks" per subject: the motor map and its left-right mirror, each with a gain of its
    own, plus the subject's variability (one ``study_map`` shared by both of its maps, and half
    a map's worth of its own each), times ``--share``, plus white noise at ``--white-db``
    (defaults 20 and -15 dB, chosen by LogisticRegressionCV's accuracy alone, about 65%). 50
    training subjects (100 maps), 25 test subjects. fgscale's ``FeatureGroupingClassifier``
    (given the subjects as groups) against a pipeline of StandardScaler and
    LogisticRegressionCV (as ``bench_accuracy.py`` runs it: L2, ``max_iter=1000``).

``--n-clusters`` adds fgscale's defaults with that ``n_clusters`` grid (a comma list of
fractions) as a second fgscale method, paired with the defaults by seed.

Usage::

    .venv/bin/python scripts/bench_real_pattern.py --quick          # 1 seed of each task
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_real_pattern.py \\
        --seeds 10 --first-seed 100 --n-clusters 0.05,0.1,0.2,0.4

Needs nilearn (its bundled MNI templates and motor map; nothing is downloaded).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import mean_se, versions  # noqa: E402
from benchlib import comma_list  # noqa: E402

N_TRAIN, N_TEST = 100, 100  # regression: maps (one per study)
N_SUBJECTS_TRAIN, N_SUBJECTS_TEST = 50, 25  # classification: subjects, two maps each
RIDGE_ALPHAS = np.logspace(-2, 8, 21)


def templates(voxel_mm: int = 4):
    """(mask, affine, motor map, grey-matter template) on a grid of ``voxel_mm`` from nilearn's
    bundled MNI152 templates (2 mm) and sample motor map."""
    from nilearn import datasets, image

    mni = datasets.load_mni152_brain_mask(resolution=2)
    affine = np.diag([float(voxel_mm)] * 3 + [1.0])
    affine[:3, 3] = mni.affine[:3, 3]
    shape = tuple(int(np.ceil(s * 2 / voxel_mm)) for s in mni.shape)

    def resampled(img, interpolation="continuous"):
        return image.resample_img(img, target_affine=affine, target_shape=shape,
                                  interpolation=interpolation, force_resample=True,
                                  copy_header=True).get_fdata()

    mask = resampled(mni, "nearest") > 0.5
    motor = np.nan_to_num(resampled(datasets.load_sample_motor_activation_image()))
    grey = resampled(datasets.load_mni152_gm_template(resolution=2))
    return mask, affine, motor, grey


def study_map(rng, mask: np.ndarray, grey: np.ndarray, voxel_mm: int = 4) -> np.ndarray:
    """One map's SYNTHETIC variability, masked, unit standard deviation before its own white
    noise, scale and offset (see the module's docstring; its sizes are in 4 mm voxels, the
    same in mm on another grid)."""
    shape = mask.shape
    mm = 4.0 / voxel_mm  # 4 mm voxels in this grid's
    vol = np.zeros(shape)
    centres = np.argwhere(mask & (grey > 0.3))
    for _ in range(rng.integers(3, 12)):
        blob = np.zeros(shape)
        blob[tuple(centres[rng.integers(len(centres))])] = 1.0
        blob = ndimage.gaussian_filter(blob, mm * rng.uniform(0.8, 3.0))
        vol += rng.lognormal(0, 0.5) * rng.choice([-1, 1]) * blob / blob.max()
    vol *= 0.3 + grey
    vol += rng.normal(0, 0.3) * grey / grey[mask].std() * vol[mask].std()
    smooth = ndimage.gaussian_filter(rng.standard_normal(shape), mm * rng.uniform(1, 3))
    vol += 0.5 * smooth / smooth[mask].std() * vol[mask].std()
    out = ndimage.gaussian_filter(vol, mm * rng.uniform(0.3, 1.2))[mask]
    out /= out.std()
    out += 0.3 * rng.standard_normal(out.size)
    return out * rng.lognormal(0, 0.3) + rng.normal(0, 0.2)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt(np.mean(v ** 2))


def regression_data(seed, snr_db, t):
    """(X_train, y_train, None, X_test, y_test): one map per study."""
    mask, affine, motor, grey = t
    voxel_mm = round(abs(affine[0, 0]))
    rng = np.random.default_rng(seed)
    pattern = _unit(motor[mask])
    target = rng.standard_normal(N_TRAIN + N_TEST)
    scale = 10.0 ** (-snr_db / 20.0)
    X = np.stack([y * pattern + scale * study_map(rng, mask, grey, voxel_mm)
                  for y in target])
    X = X.astype(np.float32)
    return X[:N_TRAIN], target[:N_TRAIN], None, X[N_TRAIN:], target[N_TRAIN:]


def classification_data(seed, share, white_db, t):
    """(X_train, y_train, subjects_train, X_test, y_test): two maps per subject."""
    mask, affine, motor, grey = t
    voxel_mm = round(abs(affine[0, 0]))
    rng = np.random.default_rng(seed)
    patterns = (_unit(motor[mask]), _unit(motor[::-1][mask]))
    white = 10.0 ** (-white_db / 20.0)
    X, y, subjects = [], [], []
    for subject in range(N_SUBJECTS_TRAIN + N_SUBJECTS_TEST):
        own = study_map(rng, mask, grey, voxel_mm)
        for label, pattern in enumerate(patterns):
            row = (pattern * rng.lognormal(0, 0.3)
                   + share * (own + 0.5 * study_map(rng, mask, grey, voxel_mm))
                   + white * rng.standard_normal(pattern.size))
            X.append(row)
            y.append(label)
            subjects.append(subject)
    X, y, subjects = np.asarray(X, np.float32), np.asarray(y), np.asarray(subjects)
    train = subjects < N_SUBJECTS_TRAIN
    return X[train], y[train], subjects[train], X[~train], y[~train]


def baseline(task: str):
    from sklearn.linear_model import LogisticRegressionCV, RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if task == "regression":
        return "RidgeCV + standardization", make_pipeline(StandardScaler(),
                                                          RidgeCV(alphas=RIDGE_ALPHAS))
    # bench_accuracy.py's: today's defaults made explicit (scikit-learn 1.9 warns that they
    # change), L2 only, C chosen by accuracy over 5 stratified folds
    return "LogisticRegressionCV + standardization", make_pipeline(
        StandardScaler(), LogisticRegressionCV(max_iter=1000, l1_ratios=(0.0,), scoring="accuracy",
                                               use_legacy_attributes=False))


def fgscale_model(task: str, mask_img, seed: int, **params):
    from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor

    cls = FeatureGroupingRegressor if task == "regression" else FeatureGroupingClassifier
    return cls(mask=mask_img, random_state=seed, **params)


def run(args) -> str:
    import nibabel as nib

    t = templates(args.voxel_mm)
    mask_img = nib.Nifti1Image(t[0].astype(np.uint8), t[1])
    variant = {}
    if args.n_clusters:
        variant["n_clusters"] = [float(k) for k in comma_list(args.n_clusters)]
    if hasattr(args, "cv"):
        variant["cv"] = args.cv
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    scores: dict[tuple[str, str], list[float]] = {}
    times: dict[tuple[str, str], list[float]] = {}
    chosen: dict[tuple[str, str], list[int]] = {}
    names: dict[str, list[str]] = {}
    for task in args.tasks:
        base_name, _ = baseline(task)
        label = ", ".join(f"{k} {args.n_clusters if k == 'n_clusters' else v}"
                          for k, v in variant.items())
        fg_names = ["fgscale default"] + ([f"fgscale, {label}"] if variant else [])
        names[task] = fg_names + [base_name]
        for seed in seeds:
            if task == "regression":
                data = regression_data(seed, args.snr_db, t)
            else:
                data = classification_data(seed, args.share, args.white_db, t)
            X_tr, y_tr, groups, X_te, y_te = data
            fits = [(fg_names[0], fgscale_model(task, mask_img, seed))]
            if variant:
                fits.append((fg_names[1], fgscale_model(task, mask_img, seed, **variant)))
            fits.append((base_name, baseline(task)[1]))
            for name, model in fits:
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", category=UserWarning)
                    if name.startswith("fgscale"):
                        model.fit(X_tr, y_tr, groups=groups)
                        chosen.setdefault((task, name), []).append(model.n_clusters_)
                    else:
                        model.fit(X_tr, y_tr)
                score = float(model.score(X_te, y_te))
                times.setdefault((task, name), []).append(time.perf_counter() - start)
                scores.setdefault((task, name), []).append(score)
                print(f"{task} seed={seed} {name}: {score:.4f}", file=sys.stderr, flush=True)
    return report(args, int(t[0].sum()), names, scores, times, chosen, list(seeds))


def report(args, n_features: int, names, scores, times, chosen, seeds) -> str:
    lines = [f"SYNTHETIC variability around a real map (nilearn's motor map, MNI152 mask, "
             f"{args.voxel_mm} mm, p = {n_features:,}); seeds {seeds[0]}-{seeds[-1]}; "
             f"{versions()}", ""]
    for task, methods in names.items():
        unit = "R²" if task == "regression" else "accuracy (%)"
        factor = 1.0 if task == "regression" else 100.0
        setting = (f"{args.snr_db:g} dB" if task == "regression"
                   else f"share {args.share:g}, white {args.white_db:g} dB")
        lines += [f"**{task}** ({setting}):", "",
                  f"| method | test {unit} | fgscale default − it (paired) | fit time (s) | "
                  "k chosen (clusters: fits) |", "|---|---|---|---|---|"]
        anchor = np.asarray(scores[(task, methods[0])])
        for name in methods:
            values = np.asarray(scores[(task, name)])
            mean, se = mean_se(values * factor)
            diff = ("" if name == methods[0]
                    else "{:+.3f} ± {:.3f}".format(*mean_se((anchor - values) * factor)))
            ks = chosen.get((task, name))
            counts = "" if ks is None else ", ".join(
                f"{k}: {n}" for k, n in zip(*np.unique(ks, return_counts=True), strict=True))
            lines.append(f"| {name} | {mean:.3f} ± {se:.3f} | {diff} | "
                         f"{np.mean(times[(task, name)]):.1f} | {counts} |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=comma_list, default=["regression", "classification"],
                        help="comma list of regression, classification (default both)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1 seed")
    parser.add_argument("--snr-db", type=float, default=-14.0, help="regression's SNR")
    parser.add_argument("--share", type=float, default=20.0,
                        help="classification: the subjects' variability, times a map's RMS")
    parser.add_argument("--white-db", type=float, default=-15.0,
                        help="classification: the white noise's SNR")
    parser.add_argument("--n-clusters", default=None,
                        help="a second fgscale method with this n_clusters grid (comma list)")
    parser.add_argument("--cv", default=argparse.SUPPRESS, type=lambda v: None if v == "none" else int(v),
                        help="a second fgscale method with this cv (an int, or none: one "
                             "validation split, the defaults before cv='auto')")
    parser.add_argument("--voxel-mm", type=int, default=4,
                        help="the grid's voxel size (default 4; 8 for a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = 1
    bad = [task for task in args.tasks if task not in ("regression", "classification")]
    if bad:
        parser.error(f"--tasks: {bad[0]!r} is not regression or classification")
    if args.voxel_mm not in (2, 4, 8):
        parser.error(f"--voxel-mm: {args.voxel_mm} is not 2, 4 or 8 (multiples of the "
                     "templates' 2 mm)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    text = run(args)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
