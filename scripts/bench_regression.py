"""Benchmark: FeatureGroupingRegressor against scikit-learn's RidgeCV, and on the brain-smooth
grid against nilearn's DecoderRegressor too (not a test).

Two modes, both on SYNTHETIC data generated here. In each, every method fits the same training
rows and is scored (R²) on test rows no fit sees; each chooses its hyper-parameters on the
training rows only, and nothing is chosen on the test rows.

One pattern (the default mode, without ``--datasets``)
    On the 4 mm brain grid (p = 33,854) each sample is ``t * pattern + noise``, ``t`` the
    target (standard normal), ``pattern`` a smooth map (three Gaussian blobs, unit RMS),
    ``noise`` a share ``--smooth-noise`` of spatially smooth noise (Gaussian filter, sigma 1.5
    voxels) and the rest white, scaled to ``--snr-db``. RidgeCV gets the rows standardized (a
    StandardScaler fitted on them) and picks among alphas ``logspace(-2, 6, 17)`` by its
    efficient leave-one-out; fgscale standardizes itself and selects on its own validation
    split (``validation_fraction=0.2``). Prints a Markdown table of test R² (mean ± standard
    error over seeds) and fit time.

brain-smooth (``--datasets brain-smooth[:SMOOTH[:VOLUMES]]``)
    The regression variant of ``bench_accuracy.py``'s brain-smooth grid, with its cells and
    their syntax: ``brain-smooth`` the six cells (share of the noise power that is spatially
    smooth 0.1, 0.5, 0.9 × 100 or 400 volumes), ``brain-smooth:0.5:100`` one,
    ``brain-smooth::100`` the three at 100 volumes, ``brain-smooth:0.9`` both sizes at 0.9.
    Data: ``make_cohort(target=True)``'s generator in memory (``_volumes``: the volumes that
    make_cohort writes, masked, before any file), a new cohort per seed on the 4 mm grid,
    4 classes, one map per class per subject (25 or 100 subjects). The target is standard
    normal; each volume adds the target times a smooth pattern of its own, and its class's
    pattern (as in the classification cells, unrelated to the target) stays in the images.
    Test: the generator's test subjects (25%: 6 or 25 subjects, 24 or 100 rows); training: the
    other 19 or 75 subjects (76 or 300 rows), all of them for every method.

    SNR: -24 dB in every cell, chosen on dev seeds 100-102 before any reported seed ran (the
    dev seeds' test rows, never a reported seed's). The candidates, -15, -20, -24, -27 (the
    classification cells' SNR) and -30 dB, were judged by the baseline RidgeCV alone, so that
    the choice does not lean towards fgscale: the aim, its test R² between 0.2 and 0.8 in every
    cell, a task neither trivial nor hopeless. RidgeCV's mean R² over the dev seeds at 100 /
    400 volumes, shares 0.1, 0.5, 0.9: -20 dB 0.57, 0.56, 0.58 / 0.90, 0.82, 0.70; -24 dB
    0.31, 0.31, 0.30 / 0.75, 0.64, 0.46; -27 dB 0.16, 0.15, 0.06 / 0.57, 0.45, 0.27. Only
    -24 dB keeps every cell in range: at -27 dB the 100-volume cells sit near zero, where a
    difference would be mostly noise, and at -20 dB the 400-volume cells near their ceiling.

    Methods (``--methods``): ``fgscale-default``, FeatureGroupingRegressor with its defaults,
    the mask as an image on the 4 mm affine and the subjects as ``groups`` (its validation split
    then holds whole subjects out); ``sklearn-ridgecv``, a pipeline of StandardScaler and
    RidgeCV over alphas ``logspace(-2, 8, 21)`` (its efficient leave-one-out over rows: it takes
    no groups). On the dev seeds it chose the grid's smallest alpha in most fits: with 33,854
    standardized voxels, most of them noise, each row's squared norm puts about p = 33,854 on
    the diagonal of X Xᵀ, so alphas below about 1e3 give nearly the same model, and a smaller
    one would change nothing; the largest, 1e8, was never reached. ``nilearn-decoder``,
    nilearn's ``DecoderRegressor()`` with its defaults (a linear-kernel SVR with C in 1, 10,
    100, ``screening_percentile=20``, ``scoring="r2"``, ``standardize=True``), the mask as an
    image and the rows as a 4D image, given the subjects as ``groups``: it then chooses C leaving
    one subject out and averages the folds' models.

    The report: test R² (mean ± standard error over seeds), the paired differences "fgscale
    default − each baseline" (± the standard error of the per-seed differences), wall and CPU
    time of each method's fit and prediction, and its peak memory (``bench_accuracy.py``'s
    measure: the kernel's peak resident memory during the method, minus the resident memory
    just before it), then every seed's R².

Usage::

    .venv/bin/python scripts/bench_regression.py --quick      # one pattern, 1 seed, ~1 min
    .venv/bin/python scripts/bench_regression.py              # one pattern, 5 seeds

    # the brain-smooth grid as scripts/results/regression_brain_smooth.md holds it, one thread
    # per library as bench_accuracy.py's figures (on 2 cores: about 2, 8 and 2 minutes), then
    # one report of the three runs:
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_regression.py \\
        --datasets brain-smooth::100 --seeds 5 --csv r100.csv
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_regression.py \\
        --datasets brain-smooth::400 --seeds 5 --csv r400.csv
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_regression.py \\
        --datasets brain-smooth::100 --seeds 5 --first-seed 5 --csv r100b.csv
    .venv/bin/python scripts/bench_regression.py --datasets brain-smooth \\
        --from-csv r100.csv,r100b.csv,r400.csv --out regression_brain_smooth.md
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import (  # noqa: E402
    SMOOTH,
    PeakRSS,
    cohort_params,
    expand_datasets,
    mean_se,
    smooth_cells,
    versions,
)
from benchlib import comma_list, csv_writer, path_list, read_csv_rows  # noqa: E402

GRID = "4mm"
SIGMA_NOISE = 1.5
SNR_DB = -27.0  # the one-pattern mode's default
# brain-smooth's regression variant (see the module's docstring for why this SNR)
SMOOTH_SNR_DB = -24.0
SMOOTH_ALPHAS = np.logspace(-2, 8, 21)


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


def one_pattern(args) -> None:
    """The default mode: one smooth pattern scaled by the target, fgscale against RidgeCV."""
    seeds = 1 if args.quick else args.seeds
    n_train = 200 if args.n_train is None else args.n_train
    n_test = 200 if args.n_test is None else args.n_test
    snr_db = SNR_DB if args.snr_db is None else args.snr_db
    smooth_noise = 0.1 if args.smooth_noise is None else args.smooth_noise
    scores: dict[str, list] = {}
    for seed in range(seeds):
        X, t, mask = make_data(seed, n_train + n_test, snr_db, smooth_noise)
        tr, te = slice(0, n_train), slice(n_train, None)
        for name, make in methods().items():
            start = time.perf_counter()
            model = make(mask, seed).fit(X[tr], t[tr])
            seconds = time.perf_counter() - start
            r2 = float(model.score(X[te], t[te]))
            scores.setdefault(name, []).append((r2, seconds))
            print(f"seed {seed} {name}: R² {r2:.3f} in {seconds:.1f} s", flush=True)
    print(f"\nSYNTHETIC 4 mm regression cohort (p = {X.shape[1]:,}), {n_train} training / "
          f"{n_test} test rows, {snr_db:g} dB, {smooth_noise:.0%} smooth noise, "
          f"{seeds} seed(s)\n")
    print("| method | test R² | fit time (s) |\n|---|---|---|")
    for name, values in scores.items():
        r2 = np.array([v[0] for v in values])
        se = f"{r2.std(ddof=1) / np.sqrt(r2.size):.3f}" if r2.size > 1 else "n/a"
        print(f"| {name} | {r2.mean():.3f} ± {se} | {np.mean([v[1] for v in values]):.1f} |")


# ---------------------------------------------------------------------------------------------
# brain-smooth: the regression variant of bench_accuracy.py's grid
# ---------------------------------------------------------------------------------------------

@dataclass
class Cohort:
    """One seed's SYNTHETIC cohort of a cell, split by the generator's subjects."""
    cell: str  # brain-smooth:SMOOTH:VOLUMES
    seed: int
    snr_db: float
    X_tr: np.ndarray
    t_tr: np.ndarray
    groups_tr: np.ndarray
    X_te: np.ndarray
    t_te: np.ndarray
    mask_img: object  # nibabel.Nifti1Image on the grid's affine


def smooth_cohort(cell: str, seed: int, snr_db: float = SMOOTH_SNR_DB, grid=GRID) -> Cohort:
    """The cell's cohort of ``make_cohort(target=True)`` (in memory, the same volumes): its
    design is bench_accuracy's (4 classes, one map per class per subject), its SNR ours; the
    test rows are the generator's test subjects, the training rows all the others."""
    import nibabel as nib

    from fgscale.images._synthetic import _volumes

    noise, design = cohort_params(cell)
    generated, volumes = _volumes(design["n_samples"], design["n_classes"], grid, snr_db,
                                  design["n_subjects"], design["test_fraction"], seed,
                                  noise["smooth_noise"], target=True)
    mask = generated["mask"]
    X = np.stack([vol[mask] for vol in volumes])
    test = generated["split"] == "test"
    t, groups = generated["target"], generated["groups"]
    return Cohort(cell, seed, snr_db, X[~test], t[~test], groups[~test], X[test], t[test],
                  nib.Nifti1Image(mask.astype(np.uint8), generated["affine"]))


# Methods: fit_predict(cohort) -> (predictions on the test rows, what it chose)

def _fgscale(**params):
    """The regressor's defaults with ``params``, given the subjects as groups."""
    def fit_predict(c: Cohort):
        from fgscale import FeatureGroupingRegressor

        model = FeatureGroupingRegressor(mask=c.mask_img, random_state=c.seed, **params)
        model.fit(c.X_tr, c.t_tr, groups=c.groups_tr)
        return model.predict(c.X_te), f"k={model.n_clusters_}"
    return fit_predict


fgscale_default = _fgscale()


def _fgscale_cv(**params):
    return _fgscale(cv=5, **params)


def sklearn_ridgecv(c: Cohort):
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), RidgeCV(alphas=SMOOTH_ALPHAS)).fit(c.X_tr, c.t_tr)
    return model.predict(c.X_te), f"alpha={model[-1].alpha_:.6g}"


def nilearn_decoder(c: Cohort):
    from nilearn.decoding import DecoderRegressor
    from nilearn.masking import unmask

    with warnings.catch_warnings():
        # given groups and an int cv, nilearn says it leaves one group out: what is meant here;
        # and the SYNTHETIC 4 mm mask (2.17 l) is larger than nilearn's reference brain
        warnings.filterwarnings("ignore", message="groups parameter is specified")
        warnings.filterwarnings("ignore", message="Brain mask .* is bigger than")
        model = DecoderRegressor(mask=c.mask_img)
        model.fit(unmask(c.X_tr, c.mask_img), c.t_tr, groups=c.groups_tr)
    folds = [f"{C:g}" for C in model.cv_params_["beta"]["C"]]
    values, counts = np.unique(folds, return_counts=True)
    chosen = "C=" + "/".join(f"{v}×{n}" for v, n in zip(values, counts, strict=True))
    return np.ravel(model.predict(unmask(c.X_te, c.mask_img))), chosen


SMOOTH_METHODS: dict[str, tuple[str, Callable]] = {
    "fgscale-default": ("fgscale defaults (FeatureGroupingRegressor, subjects as groups)",
                        fgscale_default),
    # "auto"'s grid in regression before 40% and 80% joined it (results/accuracy_k_grid_dev.md)
    "fgscale-k5": ("fgscale defaults, n_clusters 5, 10 or 20% (no 40 or 80%)",
                   _fgscale(n_clusters=[0.05, 0.1, 0.2])),
    # before 80% joined it
    "fgscale-k40": ("fgscale defaults, n_clusters 5, 10, 20 or 40% (no 80%)",
                    _fgscale(n_clusters=[0.05, 0.1, 0.2, 0.4])),
    "fgscale-cv5": ("fgscale defaults, cv=5 by subject, refit", _fgscale_cv()),
    "fgscale-cv5-mean": ("fgscale defaults, cv=5 by subject, fold models averaged",
                         _fgscale_cv(refit=False)),
    "fgscale-cv3": ("fgscale defaults, cv=3 by subject, refit", _fgscale(cv=3)),
    # the defaults before cv="auto": one validation split whatever the rows
    "fgscale-one-split": ("fgscale defaults, cv=None (one validation split, by subject)",
                          _fgscale(cv=None)),
    "sklearn-ridgecv": ("RidgeCV + standardization", sklearn_ridgecv),
    "nilearn-decoder": ("nilearn DecoderRegressor() (SVR, 20% screening, subjects as groups)",
                        nilearn_decoder),
}
ANCHOR = "fgscale-default"
# what --methods runs when not given: the defaults and the two baselines (the cv variants are
# explorations, run when named)
DEFAULT_METHODS = ("fgscale-default", "sklearn-ridgecv", "nilearn-decoder")


@dataclass
class Fit:
    cell: str
    seed: int
    method: str
    snr_db: float
    p: int
    n_train: int
    n_test: int
    r2: float
    time_s: float
    cpu_s: float
    peak_mb: float
    chosen: str = ""


def run_fit(method: str, c: Cohort) -> Fit:
    from sklearn.metrics import r2_score

    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        predictions, chosen = SMOOTH_METHODS[method][1](c)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Fit(c.cell, c.seed, method, c.snr_db, c.X_tr.shape[1], len(c.t_tr), len(c.t_te),
               float(r2_score(c.t_te, predictions)), elapsed, cpu, mem.peak / 2**20, chosen)


def _r2(values) -> str:
    m, se = mean_se(values)
    return f"{m:.3f} ± {'n/a' if math.isnan(se) else f'{se:.3f}'}"


def _paired(fits: list[Fit], a: str, b: str) -> str:
    """``a − b`` in R², ± the standard error of the per-seed differences (same cohorts), and
    on how many seeds ``a`` scored higher."""
    by_seed: dict[int, dict[str, float]] = {}
    for f in fits:
        by_seed.setdefault(f.seed, {})[f.method] = f.r2
    d = [v[a] - v[b] for v in by_seed.values() if a in v and b in v]
    if not d:
        return "n/a"
    m, se = mean_se(d)
    return (f"{m:+.3f} ± {'n/a' if math.isnan(se) else f'{se:.3f}'} "
            f"({sum(x > 0 for x in d)}/{len(d)})")


def _cell_key(cell: str) -> tuple[int, float]:
    _, smooth, volumes = cell.split(":")
    return int(volumes), float(smooth)


def _notes(fits: list[Fit], methods: list[str]) -> list[str]:
    """What each method chose, counted over its fits (the Decoder's: over its folds)."""
    notes = []
    for name in methods:
        counts: dict[str, int] = {}
        for f in fits:
            if f.method == name and f.chosen:
                param, _, values = f.chosen.partition("=")
                for value in values.split("/"):  # "C=100×3/10×2": the folds' choices
                    v, _, n = value.partition("×")
                    counts[v] = counts.get(v, 0) + int(n or 1)
        if not counts:
            continue
        listed = ", ".join(f"{v} ×{n}" for v, n in sorted(counts.items(), key=lambda c: float(c[0])))
        note = f"{SMOOTH_METHODS[name][0]}: {param} chosen {listed}"
        if name == "sklearn-ridgecv":
            edges = sum(n for v, n in counts.items()
                        if float(v) in (SMOOTH_ALPHAS[0], SMOOTH_ALPHAS[-1]))
            note += f" (at an edge of its grid in {edges} of {sum(counts.values())} fits)"
        elif name == "nilearn-decoder":
            note += " (per fold, over all fits)"
        notes.append(note)
    return notes


def smooth_report(fits: list[Fit], methods: list[str]) -> str:
    snrs = ", ".join(f"{s:g}" for s in sorted({f.snr_db for f in fits}))
    ps = ", ".join(f"{p:,}" for p in sorted({f.p for f in fits}))
    cells = sorted({f.cell for f in fits}, key=_cell_key)
    out = [f"### brain-smooth, regression (SYNTHETIC): make_cohort(target=True)'s generator at "
           f"{snrs} dB, p = {ps}, one cohort per cell and seed (volumes × share of the noise "
           f"power spatially smooth; 4 classes, one map per class per subject, test = the "
           f"generator's 25% of subjects); not real data", "",
           "| volumes | smooth noise | training / test rows | method | test R² | wall time (s) | "
           "CPU time (s) | peak memory (MB) | seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        volumes, smooth = _cell_key(cell)
        for name in methods:
            fs = [f for f in fits if (f.cell, f.method) == (cell, name)]
            if fs:
                out.append(
                    f"| {volumes} | {smooth:g} | {fs[0].n_train} / {fs[0].n_test} | "
                    f"{SMOOTH_METHODS[name][0]} | {_r2([f.r2 for f in fs])} | "
                    f"{np.mean([f.time_s for f in fs]):.1f} | {np.mean([f.cpu_s for f in fs]):.1f} | "
                    f"{np.mean([f.peak_mb for f in fs]):.0f} (max {max(f.peak_mb for f in fs):.0f}) "
                    f"| {len(fs)} |")
    baselines = [m for m in methods if m != ANCHOR]
    if ANCHOR in methods and baselines:
        out += ["", "Paired differences in test R², fgscale defaults − each baseline (± the "
                    "standard error of the per-seed differences; in brackets, the seeds on which "
                    "the defaults scored higher):", "",
                "| volumes | smooth noise | " + " | ".join(
                    f"defaults − {SMOOTH_METHODS[b][0].split(' (')[0]}" for b in baselines) + " |",
                "|---|---|" + "---|" * len(baselines)]
        for cell in cells:
            volumes, smooth = _cell_key(cell)
            cell_fits = [f for f in fits if f.cell == cell]
            out.append(f"| {volumes} | {smooth:g} | " + " | ".join(
                _paired(cell_fits, ANCHOR, b) for b in baselines) + " |")
    out += ["", "Notes:", ""] + [f"- {n}" for n in _notes(fits, methods)]
    out += ["", "Test R² seed by seed (seed: R²):", "",
            "| volumes | smooth noise | method | per seed |", "|---|---|---|---|"]
    for cell in cells:
        volumes, smooth = _cell_key(cell)
        for name in methods:
            seeds = ", ".join(f"{f.seed}: {f.r2:.3f}" for f in sorted(
                (f for f in fits if (f.cell, f.method) == (cell, name)), key=lambda f: f.seed))
            if seeds:
                out.append(f"| {volumes} | {smooth:g} | {SMOOTH_METHODS[name][0]} | {seeds} |")
    out += ["", CAPTION, ""]
    return "\n".join(out)


CAPTION = (
    "Test R²: mean ± standard error over seeds (n/a with one seed), on the held-out subjects' "
    "rows. Every method fits all the training subjects' rows and chooses its hyper-parameters "
    "there (fgscale on its validation subjects, RidgeCV by leave-one-out, DecoderRegressor "
    "leaving one subject out), never on the test rows. Time: wall time of the whole method (every "
    "fit, selection included, plus predicting the test rows; nilearn's includes wrapping the rows "
    "as images), and the process's CPU time over the same span (all threads). Peak memory: the "
    "kernel's record of the process's peak resident memory during the method (VmHWM, reset "
    "before it) minus the RSS just before it, mean over seeds (and max); all methods in one "
    "process, so memory an earlier fit freed and the allocator kept is not counted: a lower "
    f"bound of a fresh process's need. Machine: {os.cpu_count()} CPU(s).")


def brain_smooth(args) -> None:
    """The brain-smooth mode: fit every cell × seed × method (or read them from --from-csv),
    then print (and write to --out) the report."""
    cells = expand_datasets(args.datasets)
    if args.from_csv:
        fits = [f for f in read_csv_rows(args.from_csv, Fit, ("cell", "seed", "method"))
                if f.cell in cells and f.method in args.methods]
        if not fits:
            raise SystemExit(f"{', '.join(map(str, args.from_csv))}: no fits of the cells and "
                             f"methods asked for")
        footer = f"\nRendered from {', '.join(f'`{p}`' for p in args.from_csv)} (no fit run now)."
    else:
        start = time.perf_counter()
        fits = fit_cells(args, cells)
        footer = f"\nTotal run time: {time.perf_counter() - start:.0f} s."
    text = smooth_report(fits, args.methods) + footer + (
        f" Command: {' '.join(sys.argv)}\nVersions: {versions()}\n")
    print(text)
    if args.out:
        args.out.write_text(text)


def fit_cells(args, cells: list[str]) -> list[Fit]:
    seeds = range(args.first_seed, args.first_seed + (1 if args.quick else args.seeds))
    versions()  # the commit measured: read now, not when the run ends
    fits: list[Fit] = []
    start = time.perf_counter()
    with csv_writer(args.csv, Fit) as write_row:
        for cell in cells:
            for seed in seeds:
                cohort = smooth_cohort(cell, seed, args.snr_db, args.grid)
                for method in args.methods:
                    fit = run_fit(method, cohort)
                    fits.append(fit)
                    write_row(fit)
                    print(f"[{time.perf_counter() - start:7.1f} s] {cell} seed={seed} {method}: "
                          f"R² {fit.r2:.3f} in {fit.time_s:.1f} s (CPU {fit.cpu_s:.1f} s), "
                          f"+{fit.peak_mb:.0f} MB, {fit.chosen}", file=sys.stderr, flush=True)
    return fits


def _grid(text: str):
    """--grid: a named grid, or a shape such as 16x18x16 (a smoke run)."""
    return text if "x" not in text else tuple(int(s) for s in text.split("x"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets",
                   help=f"run the brain-smooth mode: {SMOOTH} (its six cells), or some of them: "
                        f"{SMOOTH}:0.5:100 (one), {SMOOTH}::100 (every share at 100 volumes), "
                        f"{SMOOTH}:0.9 (both sizes); a comma list. Without it: the one-pattern mode")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1 seed")
    p.add_argument("--snr-db", type=float,
                   help=f"SNR in dB (default {SNR_DB:g}; brain-smooth: {SMOOTH_SNR_DB:g})")
    one = p.add_argument_group("the one-pattern mode only")
    one.add_argument("--n-train", type=int, help="training rows (default 200)")
    one.add_argument("--n-test", type=int, help="test rows (default 200)")
    one.add_argument("--smooth-noise", type=float, help="share of smooth noise (default 0.1)")
    cells = p.add_argument_group("the brain-smooth mode only")
    cells.add_argument("--first-seed", type=int, default=0,
                       help="seeds FIRST..FIRST+N-1 (default 0): a run in parts, merged with "
                            "--from-csv")
    cells.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                       help="comma list of " + ", ".join(SMOOTH_METHODS) + " (default: "
                            + ", ".join(DEFAULT_METHODS) + ")")
    cells.add_argument("--grid", type=_grid, default=GRID,
                       help=f"the generator's grid (default {GRID}); a shape such as 16x18x16 "
                            "for a smoke run")
    cells.add_argument("--out", type=Path, help="also write the Markdown report to this file")
    cells.add_argument("--csv", type=Path, help="write one row per fit here, as they come")
    cells.add_argument("--from-csv", type=path_list,
                       help="fit nothing: the report of earlier runs' --csv files (comma list)")
    args = p.parse_args(argv)
    if args.datasets is None:
        return args
    if any(getattr(args, k) is not None for k in ("n_train", "n_test", "smooth_noise")):
        p.error("--n-train, --n-test and --smooth-noise are the one-pattern mode's; "
                "brain-smooth's cells set their own")
    args.datasets = comma_list(args.datasets)
    try:
        for d in args.datasets:
            smooth_cells(d)
    except ValueError as e:
        p.error(str(e))
    args.methods = comma_list(args.methods)
    unknown = [m for m in args.methods if m not in SMOOTH_METHODS]
    if unknown:
        p.error(f"unknown method(s): {', '.join(unknown)}; choose among "
                f"{', '.join(SMOOTH_METHODS)}")
    if args.seeds < 1 or args.first_seed < 0:
        p.error("--seeds must be at least 1 and --first-seed at least 0")
    if args.snr_db is None:
        args.snr_db = SMOOTH_SNR_DB
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.datasets is None:
        one_pattern(args)
    else:
        brain_smooth(args)


if __name__ == "__main__":
    main()
