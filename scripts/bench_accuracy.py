"""Benchmark: test accuracy of fgscale against scikit-learn and nilearn baselines (not a test).

Prints one Markdown table per dataset: test accuracy (mean ± standard error over seeds), time
and peak memory of each method, then, per setting, the differences "fgscale default −
LogisticRegressionCV" and "FG − best(L2 auto, dropout auto)" with their combined standard
error sqrt(se1² + se2²). Nothing is tuned on the test set; read the numbers as they come.

Datasets
--------
fashion
    Fashion-MNIST (real images, 28×28, 10 classes), from the Debian package
    ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``). Per seed: n_train
    images per class drawn from the train file for training, another n_train per class
    (disjoint) for validation, and 2,000 test images from t10k (200 per class, the same for
    every method, n_train and noise level of a seed). Pixels in [0, 1]. Noise: zero-mean
    Gaussian added to train, validation and test images, of variance P / 10^(SNR/10) where P
    is the mean of the squared pixel values of the clean training images (SNR in dB: none, 3,
    0.6, as in the paper's Olivetti experiment). Mask ``np.ones((28, 28), bool)``.
brain, brain-white
    A SYNTHETIC 4 mm cohort from ``fgscale.images.make_classification_volumes`` (480 volumes,
    8 classes, 60 subjects; p = 33,854), generated anew with each seed: ``brain`` at
    snr_db=-20 with half of the noise power spatially smooth (the generator's default),
    ``brain-white`` at snr_db=-27 with 10% smooth and 90% white noise (``fgscale demo``'s
    cohort). Test: the generator's 25% of subjects (15 subjects, 120 rows); validation: 15
    of the 45 remaining subjects (120 rows), drawn with the seed; training: the other 30
    subjects (240 rows). ``--n-train`` and ``--noise`` do not apply to it.
brain-small
    A smaller SYNTHETIC cohort of the same generator at ``brain-white``'s noise (a user
    trial's kind): 240 volumes, 4 classes, 24 subjects; test 6 subjects (about 60 rows; a
    subject holds 10 maps on average), validation 6 of the other 18, training 12.
brain-smooth
    SYNTHETIC 4 mm cohorts of the same generator on a grid of cells: a share of the noise power
    spatially smooth (make-cohort's ``smooth_noise``: 0.1, 0.5, 0.9) × 100 or 400 volumes;
    4 classes, one map per class per subject (as ``brain``: 25 or 100 subjects), a new cohort
    per seed. Test: the generator's 25% of subjects (6 or 25; 24 or 100 rows); validation a
    third of the others (6 or 25), drawn with the seed; training the rest (13 or 50 subjects,
    52 or 200 rows). SNR: -27 dB in every cell, ``brain-white``'s, not make-cohort's default
    of 0 dB, at which every cell is separable (LogisticRegression(C=1) on standardized voxels,
    3 seeds: 100% in every cell at 0 dB and at 0.1 smooth at -20 dB; at -27 dB 67, 36 and 35%
    at 100 volumes, 77, 51 and 38% at 400, shares 0.1, 0.5, 0.9; chance 25%). ``--datasets
    brain-smooth`` runs the six cells (each cell's seeds before the next), ``brain-smooth:0.5:100``
    one, ``brain-smooth::100`` the three at 100 volumes, ``brain-smooth:0.9`` both sizes at 0.9.
    Its default methods: fgscale default, LogisticRegressionCV on standardized voxels,
    nilearn's ``Decoder`` and ``FREMClassifier`` with their defaults (nilearn-frem-screening);
    the report adds "fgscale default − the best of those baselines" (the best by mean test
    accuracy: a choice in the baselines' favour), paired by seed.

Data given to each method (the same rule everywhere): every final model is fitted on
train+validation. Methods with a hyper-parameter to choose do so on those rows without
looking at the test set: LogisticRegressionCV and FREM by their internal cross-validation;
the "auto" values of fgscale by the estimator's own procedure; when the estimator does not
accept "auto" yet, this script fits each candidate on train, scores it on validation and
refits the best on train+validation (the row then says "selected by the script on
validation"). Methods without a hyper-parameter to choose (fgscale default and paper settings,
LogisticRegression()) are fitted on train+validation.

Time: wall time of a method's ``fit_predict`` (every fit it makes, selection included, plus
predicting the test rows; FREM's includes wrapping arrays as NIfTI images), and the CPU time
of the process over the same span (all threads; less sensitive to other jobs on a shared
machine). Memory: the peak resident memory of the process during ``fit_predict`` (the
kernel's VmHWM, reset just before through /proc/self/clear_refs; VmRSS sampled every 10 ms where
that is not allowed), minus the RSS just before it: what the method adds to the process. In one
process, memory freed by earlier fits and reused by the allocator is not counted, so it is a
lower bound; ``--fresh-process`` runs each method in a new process (after importing the
libraries) and measures what a fresh process needs, at ~3 s more a fit.

    .venv/bin/python scripts/bench_accuracy.py --quick --datasets fashion  # smoke test, ~30 s
    .venv/bin/python scripts/bench_accuracy.py --quick                     # 1 seed, ~15 min
    .venv/bin/python scripts/bench_accuracy.py --out acc.md --csv acc.csv  # full, ~7 h
    .venv/bin/python scripts/bench_accuracy.py --datasets fashion --n-train 10 --noise none,0.6 \\
        --seeds 3 --methods fgscale-default,sklearn-lrcv --no-frem

    .venv/bin/python scripts/bench_accuracy.py --datasets brain-smooth --seeds 5 --csv smooth.csv

Durations measured on 2 cores (git 84f2330): the brain cohort costs ~23 min per seed, most of
it fgscale's alpha="auto" and dropout="auto" searches (~5 and ~8 min) and FREM (~10 min);
Fashion-MNIST ~20 min per seed over its 9 settings (LogisticRegressionCV: up to 2.5 min a
fit). FREM with its own standardization (71514a0, one thread): 6-7 min a fit on a brain
cohort, 18-67 s on Fashion-MNIST at 10 and 30 images per class. Most fits run on about one
core, so ``--datasets fashion`` and ``--datasets brain`` in two processes take ~4 h of wall
time.

Method names for ``--methods``: fgscale-default, fgscale-l2-auto, fgscale-dropout-auto,
fgscale-fg-paper, sklearn-lrcv, sklearn-lr, nilearn-frem, and, only when named or by
brain-smooth's defaults, nilearn-frem-screening (FREM with its default screening) and
nilearn-decoder (``Decoder()``, its defaults, given the subjects of its rows as ``groups``: its C
then chosen by leave-one-subject-out), and fgscale-groups, fgscale-cv5 and fgscale-cv5-mean
(the defaults given the subjects as ``groups``; with ``cv=5`` by subject, then a refit or the
fold models averaged), fgscale-cv3 and fgscale-cv3-mean (the defaults with ``cv=3`` on the
rows alone, as fgscale-default fits: a refit, or the fold models averaged), fgscale-one-split
(``cv=None``: the defaults before ``cv="auto"``), fgscale-k5
("auto"'s grid before 2% joined it), fgscale-k20 (before 40% did) and fgscale-k80 ("auto" and
80%, regression's finest, tried in classification).
Add a method by writing a ``fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed)`` function
(with ``groups=`` too when its ``Method`` says ``takes_groups``) and a ``Method`` entry in
``METHODS``.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import comma_list, csv_writer, path_list, proc_status_kib, read_csv_rows

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_PACKAGE = "dataset-fashion-mnist"
FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
FASHION_TEST_PER_CLASS = 200  # 2,000 test images (10 classes)
BRAIN = dict(n_samples=480, n_classes=8, grid="4mm", n_subjects=60, test_fraction=0.25)
# a smaller study's cohort, of the kind a user trial compared against FREM
BRAIN_SMALL = dict(BRAIN, n_samples=240, n_classes=4, n_subjects=24)
BRAIN_NOISE = {"brain": dict(snr_db=-20.0, smooth_noise=0.5),
               "brain-white": dict(snr_db=-27.0, smooth_noise=0.1),
               "brain-small": dict(snr_db=-27.0, smooth_noise=0.1)}
BRAIN_DESIGN = {"brain": BRAIN, "brain-white": BRAIN, "brain-small": BRAIN_SMALL}
BRAIN_VAL_FRACTION = 1 / 3  # of the training subjects (15 of 45)
# brain-smooth: a grid of cohorts, one per cell "brain-smooth:SMOOTH:VOLUMES"
SMOOTH = "brain-smooth"
SMOOTH_FRACTIONS = (0.1, 0.5, 0.9)  # make-cohort's smooth_noise
SMOOTH_VOLUMES = (100, 400)
SMOOTH_SNR_DB = -27.0  # brain-white's; make-cohort's default 0 dB puts every method at 100%
SMOOTH_CLASSES = 4
# the methods a brain-smooth cell runs when --methods is not given (others: in_default below)
DATASET_METHODS = {SMOOTH: ("fgscale-default", "sklearn-lrcv", "nilearn-decoder",
                            "nilearn-frem-screening")}
ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
DROPOUTS = (0.1, 0.3, 0.5, 0.7)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def read_idx(path: Path, header: int) -> np.ndarray:
    """The uint8 payload of a gzipped IDX file after its ``header`` bytes (16 for images,
    8 for labels); images come back as (n, 28, 28)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes)")
    n = int.from_bytes(raw[4:8], "big")
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    if header == 16:
        rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
        return data.reshape(n, rows, cols)
    return data.reshape(n)


def check_fashion(root: Path = FASHION_DIR) -> None:
    """Exit with the package to install when a Fashion-MNIST file is missing."""
    missing = [name for name in FASHION_FILES.values() if not (root / name).is_file()]
    if missing:
        sys.exit(f"Fashion-MNIST files missing from {root}: {', '.join(missing)}.\n"
                 f"Install them with: apt-get install -y {FASHION_PACKAGE}\n"
                 f"(or run with --datasets brain)")


def load_fashion(root: Path = FASHION_DIR) -> dict[str, np.ndarray]:
    """Fashion-MNIST as uint8 arrays: train/test images (n, 28, 28) and labels (n,)."""
    check_fashion(root)
    out = {}
    for key, name in FASHION_FILES.items():
        out[key] = read_idx(root / name, 16 if key.endswith("images") else 8)
        if key.endswith("labels") and len(out[key]) != len(out[key.replace("labels", "images")]):
            raise ValueError(f"{root / name}: {len(out[key])} labels for "
                             f"{len(out[key.replace('labels', 'images')])} images")
    return out


@dataclass
class Split:
    """One seed's train / validation / test rows of one setting; features are ``img[mask]``."""

    dataset: str
    n_train: str
    noise: str
    seed: int
    X_tr: np.ndarray
    y_tr: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_te: np.ndarray
    y_te: np.ndarray
    mask: np.ndarray
    # subjects of the training and validation rows (brain cohorts; None for Fashion-MNIST)
    groups_tr: np.ndarray | None = None
    groups_val: np.ndarray | None = None


def _per_class(rng, y: np.ndarray, n: int) -> list[np.ndarray]:
    """For each class (sorted), a random permutation of its rows; checks there are n."""
    out = []
    for k in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == k))
        if rows.size < n:
            raise ValueError(f"class {k} has {rows.size} rows, {n} needed")
        out.append(rows)
    return out


def noise_label(noise_db: float | None) -> str:
    return "none" if noise_db is None else f"{noise_db:g} dB"


def fashion_split(data: dict, n_train: int, noise_db: float | None, seed: int,
                  n_val: int | None = None) -> Split:
    """Draw one seed's rows (train/validation nested in n_train: the first n_train of each
    class's permutation train, the next n_val (default n_train) validate; the test rows depend
    on the seed only) and add noise of the given SNR (None: no noise)."""
    mask = np.ones((28, 28), bool)
    n_val = n_train if n_val is None else n_val
    rng_train = np.random.default_rng([seed, 0])
    perms = _per_class(rng_train, data["train_labels"], n_train + n_val)
    tr = np.concatenate([p[:n_train] for p in perms])
    val = np.concatenate([p[n_train : n_train + n_val] for p in perms])
    rng_test = np.random.default_rng([seed, 1])
    te = np.concatenate([p[:FASHION_TEST_PER_CLASS]
                         for p in _per_class(rng_test, data["test_labels"], FASHION_TEST_PER_CLASS)])

    def features(images, rows):
        return (images[rows][:, mask] / np.float32(255)).astype(np.float32)

    X_tr = features(data["train_images"], tr)
    X_val = features(data["train_images"], val)
    X_te = features(data["test_images"], te)
    if noise_db is not None:
        power = float(np.mean(X_tr.astype(np.float64) ** 2))  # clean training images
        sigma = math.sqrt(power / 10.0 ** (noise_db / 10.0))
        # one stream per part, so that a seed's test noise does not depend on n_train
        for part, X in enumerate((X_tr, X_val, X_te)):
            rng = np.random.default_rng([seed, 2, part])
            X += (sigma * rng.standard_normal(X.shape)).astype(np.float32)
    return Split("fashion", str(n_train), noise_label(noise_db), seed, X_tr,
                 data["train_labels"][tr].astype(np.int64), X_val,
                 data["train_labels"][val].astype(np.int64), X_te,
                 data["test_labels"][te].astype(np.int64), mask)


def smooth_cells(spec: str) -> list[str]:
    """The cells ``brain-smooth:SMOOTH:VOLUMES`` of a ``--datasets`` item: ``brain-smooth``
    alone is the whole grid (smooth-noise share major, then volumes), ``brain-smooth:0.5``
    both sizes at 0.5, ``brain-smooth::100`` every share at 100 volumes; a value off the grid
    is allowed (a share in [0, 1], volumes a multiple of the 4 classes, at least 16)."""
    name, *parts = spec.split(":")
    if name != SMOOTH or len(parts) > 2:
        raise ValueError(f"{spec!r}: not of the form {SMOOTH}[:SMOOTH[:VOLUMES]]")
    parts += [""] * (2 - len(parts))
    try:
        fractions = [float(parts[0])] if parts[0] else list(SMOOTH_FRACTIONS)
        volumes = [int(parts[1])] if parts[1] else list(SMOOTH_VOLUMES)
    except ValueError:
        raise ValueError(f"{spec!r}: SMOOTH is a number, VOLUMES an integer") from None
    if not all(0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(f"{spec!r}: the smooth-noise share must be in [0, 1]")
    if not all(n % SMOOTH_CLASSES == 0 and n >= 4 * SMOOTH_CLASSES for n in volumes):
        raise ValueError(f"{spec!r}: volumes must be a multiple of {SMOOTH_CLASSES}, "
                         f"at least {4 * SMOOTH_CLASSES}")
    return [f"{SMOOTH}:{f:g}:{n}" for f in fractions for n in volumes]


def cohort_params(cohort: str) -> tuple[dict, dict]:
    """The generator's noise (snr_db, smooth_noise) and design of a brain cohort: ``brain``,
    ``brain-white``, ``brain-small`` or a cell ``brain-smooth:SMOOTH:VOLUMES`` (one map per
    class per subject, as ``brain``: VOLUMES / 4 subjects)."""
    if cohort in BRAIN_NOISE:
        return BRAIN_NOISE[cohort], BRAIN_DESIGN[cohort]
    (cell,) = smooth_cells(cohort)
    _, smooth, volumes = cell.split(":")
    design = dict(BRAIN, n_samples=int(volumes), n_classes=SMOOTH_CLASSES,
                  n_subjects=int(volumes) // SMOOTH_CLASSES)
    return dict(snr_db=SMOOTH_SNR_DB, smooth_noise=float(smooth)), design


def brain_subjects(seed: int, cohort: str = "brain"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Subject, split and label of each row of the cohort's ``make_classification_volumes``.

    The in-memory generator returns no subjects; its design (the same rows, drawn first from
    the same seed) comes from the module's private ``_volumes``, whose volumes are never
    generated here.
    """
    from fgscale.images._synthetic import _volumes

    noise, shape = cohort_params(cohort)
    design, _ = _volumes(shape["n_samples"], shape["n_classes"], shape["grid"], noise["snr_db"],
                         shape["n_subjects"], shape["test_fraction"], seed, noise["smooth_noise"])
    return design["groups"], design["split"], design["y"]


def brain_split(seed: int, cohort: str = "brain") -> Split:
    """SYNTHETIC cohort of this seed: test = the generator's test subjects, validation = a
    third of the other subjects (drawn with the seed), train = the rest; subject-disjoint."""
    from fgscale.images import make_classification_volumes

    noise, design = cohort_params(cohort)
    X, y, mask, _ = make_classification_volumes(**design, **noise, seed=seed)
    groups, split, y_design = brain_subjects(seed, cohort)
    if not np.array_equal(y, y_design):
        raise RuntimeError("make_classification_volumes and its design disagree on the labels")
    train_subjects = np.unique(groups[split == "train"])
    rng = np.random.default_rng([seed, 3])
    n_val = round(BRAIN_VAL_FRACTION * train_subjects.size)
    val_subjects = rng.permutation(train_subjects)[:n_val]
    is_test = split == "test"
    is_val = np.isin(groups, val_subjects) & ~is_test
    is_tr = ~is_test & ~is_val
    n_tr_subjects = train_subjects.size - n_val
    setting = f"{noise['snr_db']:g} dB, {noise['smooth_noise']:.0%} smooth (generator)"
    # subjects hold unequal numbers of maps in the smaller cohort: its rows vary with the seed
    rows = "" if cohort == "brain-small" else f" ({int(is_tr.sum())} rows)"
    n_train, name = f"{n_tr_subjects} subj.{rows}", cohort
    if cohort.startswith(SMOOTH):  # one table of all cells: the setting names the cell
        n_train, name = f"{design['n_samples']} vol.: {n_train}", SMOOTH
    return Split(f"{name} (SYNTHETIC)", n_train, setting, seed, X[is_tr], y[is_tr], X[is_val],
                 y[is_val], X[is_test], y[is_test], mask, groups[is_tr], groups[is_val])


# ---------------------------------------------------------------------------------------------
# Methods: fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed) -> predictions
# (or (predictions, info dict)); every final model sees train+validation.
# ---------------------------------------------------------------------------------------------

def _train_val(X_tr, y_tr, X_val, y_val):
    return np.concatenate([X_tr, X_val]), np.concatenate([y_tr, y_val])


def brain_mask_image(mask: np.ndarray):
    """``mask`` as a user holds it: the brain cohort's 3D mask as an image on its 4 mm affine
    (whose voxels' volume scales fgscale's screening percentile, as nilearn's), any other mask
    (Fashion-MNIST's 2D grid: features of no volume, nothing screened) as the array it is."""
    import nibabel as nib

    from fgscale.images._synthetic import grid_geometry

    shape, affine, _ = grid_geometry(BRAIN["grid"])
    if mask is None or mask.shape != tuple(shape):
        return mask
    return nib.Nifti1Image(mask.astype(np.uint8), affine)


def _fgscale(mask, seed, **params):
    from fgscale import FeatureGroupingClassifier

    return FeatureGroupingClassifier(mask=brain_mask_image(mask), random_state=seed, **params)


def _fgscale_fixed(**params):
    """The defaults with ``params``, fitted on train+validation: the rows the CV baselines see
    (the estimator holds out its own validation rows from these, for early stopping and
    "auto")."""
    def fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
        return _fgscale(mask, seed, **params).fit(*_train_val(X_tr, y_tr, X_val, y_val)).predict(X_te)
    return fit_predict


fgscale_default = _fgscale_fixed()

FG_PAPER = dict(regularizer="feature_grouping", n_clusters=0.1, n_groupings=100, n_bootstrap=50,
                screening_percentile=100)  # the paper screens no cluster

# Paper settings (k = 10% of p, b = 100, r = 50); no selection
fgscale_fg_paper = _fgscale_fixed(**FG_PAPER)


def _auto_or_select(regularizer: str, param: str, grid: tuple):
    """fit_predict for ``regularizer`` with ``param="auto"``: the estimator's own choice when it
    accepts "auto" (fitted on train+validation), else the script's: each value of ``grid``
    fitted on train and scored on validation, the best (first on ties) refitted on
    train+validation."""

    def fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
        X_all, y_all = _train_val(X_tr, y_tr, X_val, y_val)
        try:
            clf = _fgscale(mask, seed, regularizer=regularizer, **{param: "auto"}).fit(X_all, y_all)
        except ValueError as e:  # sklearn's InvalidParameterError is a ValueError
            if "auto" not in str(e):
                raise
        else:
            chosen = getattr(clf, f"{param}_", None)
            return clf.predict(X_te), {"selection": "estimator", "chosen": chosen}
        scores = []
        for value in grid:
            clf = _fgscale(mask, seed, regularizer=regularizer, **{param: value}).fit(X_tr, y_tr)
            scores.append(float(np.mean(clf.predict(X_val) == y_val)))
        best = grid[int(np.argmax(scores))]
        clf = _fgscale(mask, seed, regularizer=regularizer, **{param: best}).fit(X_all, y_all)
        return clf.predict(X_te), {"selection": "script", "chosen": best}

    return fit_predict


def sklearn_lrcv(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # LogisticRegressionCV(max_iter=1000) with today's defaults made explicit (sklearn 1.9
    # warns that they change): L2 only, C chosen by accuracy over 5 stratified folds of
    # train+validation, 10 values of C.
    clf = make_pipeline(StandardScaler(),
                        LogisticRegressionCV(max_iter=1000, l1_ratios=(0.0,), scoring="accuracy",
                                             use_legacy_attributes=False))
    return clf.fit(*_train_val(X_tr, y_tr, X_val, y_val)).predict(X_te)


def sklearn_lr(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
    from sklearn.linear_model import LogisticRegression

    # Plain LogisticRegression() (C=1, max_iter=100) on raw features, train+validation.
    return LogisticRegression().fit(*_train_val(X_tr, y_tr, X_val, y_val)).predict(X_te)


def _nifti(mask: np.ndarray):
    """nilearn's inputs: the mask as an image and a function wrapping rows as a 4D image. A 2D
    mask becomes (28, 28, 1) volumes with an identity affine; the brain cohort keeps its 4 mm
    affine, from which nilearn scales its screening percentile to the MNI brain's volume (on
    the 784 mm3 of Fashion-MNIST it scales past 100: no screening). The mask goes in as an
    image: a NiftiMasker given as ``mask`` would impose its own standardize=False."""
    import nibabel as nib

    from fgscale.images._synthetic import grid_geometry

    mask3 = mask if mask.ndim == 3 else mask[..., None]
    shape, brain_affine, _ = grid_geometry(BRAIN["grid"])
    affine = brain_affine if mask3.shape == tuple(shape) else np.eye(4)

    def images(X):
        vol = np.zeros((*mask3.shape, len(X)), np.float32)
        vol[mask3] = X.T
        return nib.Nifti1Image(vol, affine)

    return nib.Nifti1Image(mask3.astype(np.uint8), affine), images


def _frem(screening_percentile):
    def fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
        from nilearn.decoding import FREMClassifier

        # FREM's defaults (estimator="svc", cv=30, clustering_percentile=10, standardize=True)
        # but screening_percentile, and with internal CV on train+validation (its default
        # StratifiedShuffleSplit, which takes no groups).
        mask_img, images = _nifti(mask)
        X_all, y_all = _train_val(X_tr, y_tr, X_val, y_val)
        clf = FREMClassifier(mask=mask_img, screening_percentile=screening_percentile, n_jobs=1)
        clf.fit(images(X_all), y_all)
        # the percentile nilearn screened at once scaled: its note says "chosen value"
        return np.asarray(clf.predict(images(X_te))), {"chosen": float(clf.screening_percentile_)}
    return fit_predict


def _fgscale_subjects(**params):
    def fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed, groups=None):
        # the defaults (with ``params``) given the subjects, as a user with subjects fits:
        # validation rows, or folds, then hold whole subjects out
        X_all, y_all = _train_val(X_tr, y_tr, X_val, y_val)
        g_all = None if groups is None or groups[0] is None else np.concatenate(groups)
        return _fgscale(mask, seed, **params).fit(X_all, y_all, groups=g_all).predict(X_te)
    return fit_predict


def nilearn_decoder(X_tr, y_tr, X_val, y_val, X_te, mask, seed, groups=None):
    from nilearn.decoding import Decoder

    # Decoder() with its defaults (estimator="svc": L2 LinearSVC one-vs-rest, C from its grid,
    # screening_percentile=20, scoring="roc_auc", standardize=True, cv=10), the mask as an image,
    # fitted on train+validation with their subjects as ``groups``: nilearn then chooses C by
    # LeaveOneGroupOut (its rule when groups are given and cv is an int) and averages the
    # folds' models. Fashion-MNIST has no subjects: its cv=10 is stratified 10-fold.
    mask_img, images = _nifti(mask)
    X_all, y_all = _train_val(X_tr, y_tr, X_val, y_val)
    g_all = None if groups is None or groups[0] is None else np.concatenate(groups)
    clf = Decoder(mask=mask_img).fit(images(X_all), y_all, groups=g_all)
    return np.asarray(clf.predict(images(X_te)))


@dataclass
class Method:
    name: str  # for --methods
    label: str
    fit_predict: Callable
    # fgscale parameters (random_state aside) when the method is a single fixed estimator on
    # train+validation: two methods with equal parameters are fitted once per split.
    fixed_params: Callable[[], dict] | None = None
    in_default: bool = True  # run when --methods is not given (but see DATASET_METHODS)
    # fit_predict takes groups=(subjects of the training rows, of the validation rows)
    takes_groups: bool = False


def _fgscale_auto_k(edit):
    """The defaults with ``n_clusters`` the grid that "auto" gives these rows (its 2% where it
    leaves enough clusters) changed by ``edit``, a function of that list."""
    def fit_predict(X_tr, y_tr, X_val, y_val, X_te, mask, seed):
        from fgscale.estimators._auto import searched_values

        grid = edit(list(searched_values("n_clusters", "auto", n_features=X_tr.shape[1])))
        return _fgscale(mask, seed, n_clusters=grid).fit(
            *_train_val(X_tr, y_tr, X_val, y_val)).predict(X_te)
    return fit_predict


def _default_params() -> dict:
    return {k: v for k, v in _fgscale(None, 0).get_params().items()
            if k not in ("mask", "random_state")}


def _paper_params() -> dict:
    return {k: v for k, v in _fgscale(None, 0, **FG_PAPER).get_params().items()
            if k not in ("mask", "random_state")}


METHODS = [
    Method("fgscale-default", "fgscale default", fgscale_default, _default_params),
    Method("fgscale-l2-auto", "fgscale L2 (alpha auto)",
           _auto_or_select("l2", "alpha", ALPHAS)),
    Method("fgscale-dropout-auto", "fgscale dropout (dropout auto)",
           _auto_or_select("dropout", "dropout", DROPOUTS)),
    Method("fgscale-fg-paper", "fgscale feature grouping, paper settings", fgscale_fg_paper,
           _paper_params),
    Method("fgscale-groups", "fgscale default, subjects as groups", _fgscale_subjects(),
           in_default=False, takes_groups=True),
    Method("fgscale-cv5", "fgscale default, cv=5 by subject, refit", _fgscale_subjects(cv=5),
           in_default=False, takes_groups=True),
    Method("fgscale-cv5-mean", "fgscale default, cv=5 by subject, fold models averaged",
           _fgscale_subjects(cv=5, refit=False), in_default=False, takes_groups=True),
    # the fold ensemble as the defaults would take it, on the rows alone (no subjects), as
    # fgscale-default fits: stratified folds (results/accuracy_k_grid_dev.md)
    Method("fgscale-cv3", "fgscale default, cv=3, refit", _fgscale_fixed(cv=3),
           in_default=False),
    # the defaults before cv="auto": one validation split whatever the rows
    Method("fgscale-one-split", "fgscale default, cv=None (one validation split)",
           _fgscale_fixed(cv=None), in_default=False),
    Method("fgscale-cv3-mean", "fgscale default, cv=3, fold models averaged",
           _fgscale_fixed(cv=3, refit=False), in_default=False),
    # "auto"'s grid before 2% joined it (results/accuracy_k_grid_dev.md)
    Method("fgscale-k5", "fgscale default, n_clusters 5, 10 or 20% (no 2%)",
           _fgscale_subjects(n_clusters=[0.05, 0.1, 0.2]), in_default=False),
    # "auto"'s grid before 40% joined it (results/accuracy_k_grid_dev.md)
    Method("fgscale-k20", "fgscale default, n_clusters up to 20% (no 40%)",
           _fgscale_auto_k(lambda grid: [k for k in grid if k != 0.4]), in_default=False),
    # the dev trial that kept 80% out of classification's "auto" (results/accuracy_k_grid_dev.md)
    Method("fgscale-k80", "fgscale default, n_clusters up to 80%",
           _fgscale_auto_k(lambda grid: [*grid, 0.8]), in_default=False),
    Method("sklearn-lrcv", "sklearn LogisticRegressionCV + standardization", sklearn_lrcv),
    Method("sklearn-lr", "sklearn LogisticRegression()", sklearn_lr),
    Method("nilearn-decoder", "nilearn Decoder (its defaults: SVC, 20% screening)",
           nilearn_decoder, in_default=False, takes_groups=True),
    Method("nilearn-frem", "nilearn FREMClassifier (screening_percentile=100)", _frem(100)),
    Method("nilearn-frem-screening", "nilearn FREMClassifier (its default screening, 20%)",
           _frem(20), in_default=False),
]
BY_NAME = {m.name: m for m in METHODS}
GRIDS = {"fgscale-l2-auto": ALPHAS, "fgscale-dropout-auto": DROPOUTS}  # the script's fallback


def _estimator_grid(name: str) -> tuple | None:
    """The candidates of the estimator's own "auto" (a private table: None if it moved)."""
    try:
        from fgscale.estimators._auto import AUTO_GRIDS
    except ImportError:
        return None
    return AUTO_GRIDS.get({"fgscale-l2-auto": "alpha", "fgscale-dropout-auto": "dropout"}.get(name))


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------

def rss_bytes() -> int:
    """The process's resident set size now (VmRSS of /proc/self/status)."""
    return (proc_status_kib("VmRSS") or 0) * 1024


def _reset_kernel_peak() -> bool:
    """Set the kernel's record of this process's peak RSS (VmHWM) to its RSS now, through
    /proc/self/clear_refs (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """Context manager: ``peak`` = the process's peak resident memory during the block minus its
    RSS at entry, in bytes. The peak is the kernel's own record (VmHWM, reset at entry), so a
    spike shorter than any sampling interval counts; where VmHWM cannot be reset, a thread
    samples VmRSS every ``interval`` s instead."""

    def __init__(self, interval: float = 0.01):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        while not self._stop.wait(self.interval):
            self._max = max(self._max, rss_bytes())

    def __enter__(self):
        self._base = self._max = rss_bytes()
        self.kernel = _reset_kernel_peak()
        if not self.kernel:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self._max = max(self._max, rss_bytes())
        if self.kernel:
            self._max = max(self._max, (proc_status_kib("VmHWM") or 0) * 1024)
        self.peak = self._max - self._base


@dataclass
class Record:
    dataset: str
    n_train: str
    noise: str
    seed: int
    method: str
    accuracy: float
    time_s: float
    cpu_s: float
    peak_mb: float
    selection: str = ""
    chosen: str = ""
    warnings: int = 0
    note: str = ""


def run_method(method: Method, split: Split) -> Record:
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        with PeakRSS() as mem:
            t0, c0 = time.perf_counter(), time.process_time()
            groups = {"groups": (split.groups_tr, split.groups_val)} if method.takes_groups else {}
            out = method.fit_predict(split.X_tr, split.y_tr, split.X_val, split.y_val,
                                     split.X_te, split.mask, split.seed, **groups)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    info = {}
    if isinstance(out, tuple):
        out, info = out
    n_conv = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    acc = float(np.mean(np.asarray(out) == split.y_te))
    chosen = info.get("chosen")
    return Record(split.dataset, split.n_train, split.noise, split.seed, method.name, acc,
                  elapsed, cpu, mem.peak / 2**20, info.get("selection", ""),
                  _fmt_value(chosen), n_conv)


def _import_libraries() -> None:
    """Import the classes the methods use, as a user's script would before fitting, so that a
    fresh process's measured peak counts what fitting allocates (modules a fit imports on its
    own count) and not the libraries' import."""
    import importlib

    for module, name in (("fgscale", "FeatureGroupingClassifier"),
                         ("sklearn.linear_model", "LogisticRegressionCV"),
                         ("sklearn.preprocessing", "StandardScaler"),
                         ("nilearn.decoding", "FREMClassifier"),
                         ("nilearn.decoding", "Decoder")):
        try:
            getattr(importlib.import_module(module), name)
        except ImportError:
            pass


def _fresh_run(name: str, split: Split) -> Record:
    _import_libraries()
    return run_method(BY_NAME[name], split)


def run_method_fresh(method: Method, split: Split) -> Record:
    """``run_method`` in a process of its own (spawned, so nothing is inherited from this one):
    its peak memory is not lowered by memory that earlier fits freed and the allocator kept.
    The split travels through a pipe; the process imports the libraries before measuring."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_fresh_run, method.name, split).result()


def _fmt_value(value) -> str:
    if value is None:
        return ""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def mean_se(values) -> tuple[float, float]:
    v = np.asarray(values, float)
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se


def _pm(mean, se, scale=100.0, digits=2) -> str:
    if math.isnan(se):
        return f"{scale * mean:.{digits}f} ± n/a"
    return f"{scale * mean:.{digits}f} ± {scale * se:.{digits}f}"


def method_label(name: str, recs: list[Record]) -> str:
    label = BY_NAME[name].label
    selections = {r.selection for r in recs}
    param = "alpha" if "l2" in name else "dropout"
    if selections == {"estimator"}:
        label = label.replace(f"({param} auto)", f"({param}='auto', chosen by the estimator)")
    elif "script" in selections:
        label = label.replace(f"({param} auto)",
                              f"({param} selected by the script on validation)")
        if "estimator" in selections:
            label += " [mixed: the estimator's 'auto' in some seeds]"
    return label


def report(records: list[Record], methods: list[str], fresh: bool = False) -> str:
    out = []
    datasets = list(dict.fromkeys(r.dataset for r in records))
    for dataset in datasets:
        recs = [r for r in records if r.dataset == dataset]
        settings = list(dict.fromkeys((r.n_train, r.noise) for r in recs))
        title, ntr = _title(dataset)
        out += [title, ""]
        out += [f"| {ntr} | noise (SNR) | method | test accuracy (%) | wall time (s) | "
                f"CPU time (s) | peak memory (MB) | seeds |",
                "|---|---|---|---|---|---|---|---|"]
        lines = []
        for n_train, noise in settings:
            stats = {}
            for name in methods:
                rs = [r for r in recs if (r.n_train, r.noise, r.method) == (n_train, noise, name)]
                if not rs:
                    continue
                m, se = mean_se([r.accuracy for r in rs])
                stats[name] = (m, se)
                t, cpu = np.mean([r.time_s for r in rs]), np.mean([r.cpu_s for r in rs])
                mem_mean, mem_max = np.mean([r.peak_mb for r in rs]), max(r.peak_mb for r in rs)
                out.append(f"| {n_train} | {noise} | {method_label(name, rs)} | {_pm(m, se)} | "
                           f"{t:.1f} | {cpu:.1f} | {mem_mean:.0f} (max {mem_max:.0f}) | {len(rs)} |")
            lines.append(_differences(n_train, noise, stats,
                                      [r for r in recs if (r.n_train, r.noise) == (n_train, noise)]))
        out += ["", f"Differences in test accuracy (percentage points, ± sqrt(se1² + se2²); "
                    f"paired: ± the standard error of the per-seed differences), "
                    f"{dataset}:", ""]
        out += [f"- {line}" for line in lines]
        notes = _notes(recs, methods)
        if notes:
            out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
        out += [""]
    out += [CAPTION_FRESH if fresh else CAPTION, ""]
    return "\n".join(out)


def _title(dataset: str) -> tuple[str, str]:
    """A dataset's table title and the name of its first column."""
    family = dataset.split(" ")[0]
    if "SYNTHETIC" not in dataset:
        return f"### {dataset}: Fashion-MNIST (real images, 28×28, 10 classes)", "n_train / class"
    if family == SMOOTH:
        return (f"### {dataset}: SYNTHETIC 4 mm cohorts (make_classification_volumes at "
                f"{SMOOTH_SNR_DB:g} dB, one cohort per cell: volumes × share of the noise power "
                f"spatially smooth; {SMOOTH_CLASSES} classes, one map per class per subject, "
                f"test = the generator's 25% of subjects; p = 33,854); not real data",
                "volumes: training subjects")
    design = BRAIN_DESIGN.get(family, BRAIN)
    return (f"### {dataset}: SYNTHETIC 4 mm cohort (make_classification_volumes, "
            f"{design['n_samples']} volumes, {design['n_classes']} classes, "
            f"{design['n_subjects']} subjects, p = 33,854); not real data", "training subjects")


BASELINES = (("sklearn-lrcv", "LogisticRegressionCV"), ("nilearn-decoder", "Decoder"),
             ("nilearn-frem", "FREM"), ("nilearn-frem-screening", "FREM with its screening"))


def _differences(n_train, noise, stats, recs) -> str:
    parts = []
    ran = [(anchor, label) for anchor, label in BASELINES if anchor in stats]
    if "fgscale-default" in stats:
        for anchor, label in ran:
            parts.append(f"fgscale default − {label}: "
                         f"{_diff(stats, recs, 'fgscale-default', anchor)}")
        if len(ran) > 1:
            # the best baseline by its mean test accuracy: a choice made on the test set, in the
            # baselines' favour
            best, label = max(ran, key=lambda a: stats[a[0]][0])
            names = ", ".join(lab for _, lab in ran)
            parts.append(f"fgscale default − best({names}) = − {label}: "
                         f"{_diff(stats, recs, 'fgscale-default', best)}")
    others = [k for k in ("fgscale-l2-auto", "fgscale-dropout-auto") if k in stats]
    if others:
        # the goal: feature grouping against the better of L2 and dropout (by mean)
        best = max(others, key=lambda k: stats[k][0])
        short = "L2" if "l2" in best else "dropout"
        for fg, label in (("fgscale-default", "fgscale default (FG)"),
                          ("fgscale-fg-paper", "FG (paper settings)")):
            if fg in stats:
                parts.append(f"{label} − best(L2 auto, dropout auto) = − {short}: "
                             f"{_diff(stats, recs, fg, best)}")
    return f"{n_train}, {noise}: " + ("; ".join(parts) if parts else "n/a (methods not run)")


def _diff(stats, recs, a, b) -> str:
    """``a − b`` in points, ± the combined standard error, and ± the standard error of the
    per-seed differences (paired: both methods ran on each seed's same split)."""
    (m1, s1), (m2, s2) = stats[a], stats[b]
    d = 100 * (m1 - m2)
    se = 100 * math.sqrt(s1**2 + s2**2) if not (math.isnan(s1) or math.isnan(s2)) else float("nan")
    text = f"{d:+.2f} ± {'n/a' if math.isnan(se) else f'{se:.2f}'}"
    by_seed = {}
    for r in recs:
        if r.method in (a, b):
            by_seed.setdefault(r.seed, {})[r.method] = r.accuracy
    paired = [100 * (v[a] - v[b]) for v in by_seed.values() if len(v) == 2]
    if len(paired) > 1:
        text += f" (paired: ± {float(np.std(paired, ddof=1) / np.sqrt(len(paired))):.2f})"
    return text


def _notes(recs: list[Record], methods: list[str]) -> list[str]:
    notes = []
    for name in methods:
        rs = [r for r in recs if r.method == name]
        if not rs:
            continue
        chosen = [r.chosen for r in rs if r.chosen]
        if chosen:
            values, counts = np.unique(chosen, return_counts=True)
            note = f"{BY_NAME[name].label}: chosen value per fit " + ", ".join(
                f"{v} ×{c}" for v, c in zip(values, counts, strict=True))
            edges = 0
            for r in rs:
                grid = GRIDS.get(name) if r.selection == "script" else _estimator_grid(name)
                edges += bool(grid) and r.chosen in (f"{grid[0]:g}", f"{grid[-1]:g}")
            if edges:
                note += (f" (at an edge of the candidates in {edges} of {len(rs)} fits: the best "
                         f"value may lie outside them)")
            notes.append(note)
        n_warn = sum(r.warnings > 0 for r in rs)
        if n_warn:
            notes.append(f"{BY_NAME[name].label}: ConvergenceWarning in {n_warn} of {len(rs)} fits")
        reused = {r.note for r in rs if r.note}
        notes += [f"{BY_NAME[name].label}: {n}" for n in sorted(reused)]
    return notes


_CAPTION = (
    "Test accuracy: mean ± standard error over seeds (std/sqrt(n), n/a with one seed). Every "
    "final model is fitted on train+validation; hyper-parameters are chosen by internal CV "
    "(LogisticRegressionCV, FREM), by the fgscale estimator's \"auto\", or, where the estimator "
    "does not accept \"auto\" yet, by this script on the validation set (fit on train, score on "
    "validation, refit the best on train+validation); never on the test set. Time: wall time of "
    "the whole method (every fit, selection included, plus predicting the test rows), mean "
    "over seeds; CPU time: the process's user+system time over the same span, all threads "
    "(less sensitive than wall time to other jobs sharing the machine). Peak memory: the "
    "kernel's record of the process's peak resident memory (VmHWM, reset before the method) "
    "during the method, minus the RSS just before it (mean over seeds, and max); ")
CAPTION = _CAPTION + (
    "memory freed by earlier fits and reused by the allocator is not counted, so it is a lower "
    f"bound of a fresh process's need. Machine: {os.cpu_count()} CPU(s), all methods "
    "single-process in one Python process.")
CAPTION_FRESH = _CAPTION + (
    "each method ran in a fresh process (--fresh-process) after importing the libraries, so "
    "nothing it allocates is served from memory an earlier fit freed; time includes that "
    "process's first calls (a first fit). Machine: "
    f"{os.cpu_count()} CPU(s), one single-process method at a time.")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="fashion,brain,brain-white",
                   help="comma list: fashion, " + ", ".join(BRAIN_NOISE) + f", {SMOOTH} (its "
                        f"six cells), or some of its cells: {SMOOTH}:0.5:100 (one), "
                        f"{SMOOTH}::100 (every share at 100 volumes), {SMOOTH}:0.9 (both sizes)")
    p.add_argument("--n-train", help="Fashion-MNIST images per class (default 10,30,100)")
    p.add_argument("--noise", help="Fashion-MNIST SNR in dB, or none (default none,3,0.6)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 (default 10)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="start the seeds there, FIRST..FIRST+N-1 (default 0): a long run in "
                        "parts, merged with --from-csv")
    p.add_argument("--methods",
                   help="comma list of: " + ", ".join(m.name for m in METHODS) + " (default: "
                        + ", ".join(m.name for m in METHODS if m.in_default) + f"; for {SMOOTH}: "
                        + ", ".join(DATASET_METHODS[SMOOTH]) + ")")
    p.add_argument("--no-frem", action="store_true", help="skip nilearn's FREMClassifier (slow)")
    p.add_argument("--quick", action="store_true",
                   help="defaults of 1 seed, n_train 10, noise 0.6 dB, and no FREM: a check "
                        "that everything runs (explicit --seeds etc. still apply)")
    p.add_argument("--fresh-process", action="store_true",
                   help="run each method in a new process (imports first, ~3 s more a fit), so "
                        "its peak memory is what a fresh process needs, not a lower bound")
    p.add_argument("--out", type=Path, help="also write the Markdown report to this file")
    p.add_argument("--csv", type=Path, help="write one row per (setting, seed, method) here, "
                                            "as the results come")
    p.add_argument("--from-csv", type=path_list,
                   help="fit nothing: write the report of earlier runs' --csv files (a comma "
                        "list: parts of one run, e.g. by --first-seed), their rows in the order "
                        "given; --datasets, --methods and --fresh-process say what they hold")
    args = p.parse_args(argv)
    args.datasets = comma_list(args.datasets)
    quick = dict(seeds=1, n_train="10", noise="0.6")
    full = dict(seeds=10, n_train="10,30,100", noise="none,3,0.6")
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.no_frem = True
    bad = [d for d in args.datasets if d.split(":")[0] not in ("fashion", SMOOTH, *BRAIN_NOISE)]
    for d in (d for d in args.datasets if d.split(":")[0] == SMOOTH):
        try:
            smooth_cells(d)
        except ValueError as e:
            p.error(str(e))
    _methods_by_dataset(args)
    bad += [m for m in args.methods if m not in BY_NAME]
    if bad:
        p.error(f"unknown dataset(s) or method(s): {', '.join(bad)}")
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if args.first_seed < 0:
        p.error("--first-seed must be at least 0")
    args.n_train = [int(n) for n in comma_list(args.n_train)]
    args.noise = [None if n.lower() == "none" else float(n) for n in comma_list(args.noise)]
    return args


def _methods_by_dataset(args) -> None:
    """``args.by_dataset``: each dataset family's methods to run (--methods, else the family's
    defaults: DATASET_METHODS or the methods ``in_default``; FREM dropped by --no-frem), and
    ``args.methods``: --methods as given, else the union of the defaults in METHODS order."""
    given = comma_list(args.methods) if args.methods else None
    args.by_dataset = {}
    for family in dict.fromkeys(d.split(":")[0] for d in args.datasets):
        names = given or list(DATASET_METHODS.get(family, (m.name for m in METHODS
                                                           if m.in_default)))
        args.by_dataset[family] = [m for m in names if not (args.no_frem
                                                            and m.startswith("nilearn-frem"))]
    union = {m for names in args.by_dataset.values() for m in names}
    args.methods = ([m for m in given if m in union] if given
                    else [m.name for m in METHODS if m.name in union])


def expand_datasets(datasets: list[str]) -> list[str]:
    """The --datasets items with brain-smooth's expanded into cells, each cell once."""
    out = [smooth_cells(d) if d.split(":")[0] == SMOOTH else [d] for d in datasets]
    return list(dict.fromkeys(item for items in out for item in items))


def splits(args, fashion):
    """The (dataset, setting, seed) splits in run order, generated lazily; a brain-smooth cell
    runs all its seeds before the next cell."""
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for dataset in expand_datasets(args.datasets):
        if dataset.startswith(f"{SMOOTH}:"):
            yield from (brain_split(seed, dataset) for seed in seeds)
            continue
        for seed in seeds:
            if dataset in BRAIN_NOISE:
                yield brain_split(seed, dataset)
                continue
            for n_train in args.n_train:
                for noise_db in args.noise:
                    yield fashion_split(fashion, n_train, noise_db, seed)


@functools.cache
def versions() -> str:
    """fgscale's commit (``-dirty``: uncommitted changes were measured) and the libraries', read
    once per process: a script calls it when its run starts, so a commit made while it runs is
    not taken for the one measured."""
    import subprocess

    import sklearn
    import torch

    import fgscale

    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10, cwd=Path(__file__).resolve().parent,
                                check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    out = (f"fgscale {getattr(fgscale, '__version__', '?')} (git {commit}), torch "
           f"{torch.__version__}, scikit-learn {sklearn.__version__}, numpy {np.__version__}")
    try:
        import nilearn

        out += f", nilearn {nilearn.__version__}"
    except ImportError:
        pass
    return out + f"; threads: {thread_counts()}"


def thread_counts() -> str:
    """The thread pools the methods run with: torch's and each BLAS/OpenMP library's. On 2 cores,
    LogisticRegressionCV with OpenBLAS on 2 threads took 8 times as long as on 1
    (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), so the figures say which they had."""
    import torch
    from threadpoolctl import threadpool_info

    pools = sorted({f"{p['internal_api']} {p['num_threads']}" for p in threadpool_info()})
    return ", ".join([f"torch {torch.get_num_threads()}", *pools])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.from_csv:
        return _from_csv(args)
    fashion = load_fashion() if "fashion" in args.datasets else None  # exits if missing
    by_dataset = {family: [m for m in METHODS if m.name in names]
                  for family, names in args.by_dataset.items()}
    records: list[Record] = []
    versions()  # the commit measured: read now, not when the run ends
    t_start = time.perf_counter()
    with csv_writer(args.csv, Record) as write_row:
        for split in splits(args, fashion):
            done: dict[str, Record] = {}  # fixed fgscale parameters -> this split's record
            for method in by_dataset[split.dataset.split(" ")[0]]:
                key = repr(sorted(method.fixed_params().items())) if method.fixed_params else None
                if key is not None and key in done:
                    first = done[key]
                    rec = Record(**{**first.__dict__, "method": method.name,
                                    "note": f"same parameters as {BY_NAME[first.method].label} "
                                            f"today: its fit is reused (same accuracy and time)"})
                else:
                    rec = (run_method_fresh if args.fresh_process else run_method)(method, split)
                    if key is not None:
                        done[key] = rec
                records.append(rec)
                write_row(rec)
                print(f"[{time.perf_counter() - t_start:7.1f} s] {split.dataset} n_train="
                      f"{split.n_train} noise={split.noise} seed={split.seed} {method.name}: "
                      f"acc {100 * rec.accuracy:.2f}% in {rec.time_s:.1f} s (CPU {rec.cpu_s:.1f} s), "
                      f"+{rec.peak_mb:.0f} MB{' (reused)' if rec.note else ''}",
                      file=sys.stderr, flush=True)
    text = report(records, [m.name for m in METHODS if m.name in args.methods],
                  fresh=args.fresh_process)
    total = time.perf_counter() - t_start
    text += (f"\nTotal run time: {total:.0f} s. Command: {' '.join(sys.argv)}\n"
             f"Versions: {versions()}\n")
    print(text)
    if args.out:
        args.out.write_text(text)


def _from_csv(args) -> list[Record]:
    """The report of earlier runs' CSV rows, of the datasets and methods asked for."""
    records = [r for r in read_csv_rows(args.from_csv, Record,
                                        ("dataset", "n_train", "noise", "seed", "method"))
               if r.method in args.methods and r.dataset.split(" (")[0] in args.by_dataset]
    if not records:
        raise SystemExit(f"{', '.join(map(str, args.from_csv))}: no rows of the datasets "
                         f"{', '.join(args.datasets)} and methods {', '.join(args.methods)}")
    files = ", ".join(f"`{path}`" for path in args.from_csv)
    text = report(records, args.methods, fresh=args.fresh_process) + per_seed_table(records)
    text += f"\nRendered from {files} (no fit run now). Command: {' '.join(sys.argv)}\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return records


def per_seed_table(records: list[Record]) -> str:
    """Each setting and method's test accuracy seed by seed: a report rendered from CSV files
    that are not kept (results keep Markdown) still holds the figures behind its means and its
    paired differences."""
    cells: dict[tuple, dict[int, float]] = {}
    for r in records:
        cells.setdefault((r.dataset, r.n_train, r.noise, r.method), {})[r.seed] = r.accuracy
    lines = ["", "Test accuracy (%) seed by seed (seed: accuracy), the rows rendered above:", "",
             "| dataset | training rows | noise | method | per seed |", "|---|---|---|---|---|"]
    for (dataset, n_train, noise, method), by_seed in cells.items():
        seeds = ", ".join(f"{seed}: {100 * acc:.2f}" for seed, acc in sorted(by_seed.items()))
        lines.append(f"| {dataset} | {n_train} | {noise} | {BY_NAME[method].label} | {seeds} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
