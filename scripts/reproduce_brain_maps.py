"""Reproduce the paper's Fig. 4 for brains: logistic-regression weights per regularizer (not a test).

Aydore, Thirion & Varoquaux (ICML 2019), Fig. 4: the weights that logistic regression learns
with no regularizer, L2, dropout and feature grouping, shown as brain maps; feature grouping's
are the smoothest and closest to the signal. Here the data are SYNTHETIC, standing in for
HCP: the 'brain-white' cohort of ``scripts/bench_accuracy.py`` (``make_classification_volumes``
on the 4 mm HCP-small grid, p = 33,854, 480 volumes, 8 classes, 60 subjects, snr -27 dB, 10% of
the noise power smooth), generated from ``--seed``. Rows as in bench_accuracy's ``brain_split``:
each model is fitted on train+validation (45 subjects, 360 rows) and scored on the generator's
15 test subjects (120 rows). Each fit is ``FeatureGroupingClassifier(model="logreg",
mask=<mask image>, random_state=seed, regularizer=R)`` with R in none, l2 (``alpha="auto"``),
dropout (``dropout="auto"``) and feature_grouping (the paper's: ``screening_percentile=100``);
"auto" picks the value on the estimator's own validation rows. The weights of one class
(``--class-index``, ``clf.coef_img_[class]``, on standardized features) are written as NIfTI,
``<nifti-dir>/<regularizer>.nii.gz`` (plus ``truth.nii.gz``: the generator's pattern of that
class, the signal added to each of its volumes), and drawn in ONE figure,
``<out>/fig4_brain_weights.png``: a first row with the true pattern, then one row per
regularizer, orthogonal slices through the same point (the peak of the true pattern), each
row with its own colour scale, over the MNI152 template when nilearn has it offline.

The NIfTI maps go by default to ``fig4_brain_maps/`` in ``--out`` (scripts/results/
fig4_brain_maps/): they are NOT committed (about 0.1 MB each; regenerate them with this
script); only the PNG is.

    .venv/bin/python scripts/reproduce_brain_maps.py            # seed 0, class 0

(The script sets OMP_NUM_THREADS=1 unless it is set.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: other jobs share this machine

import numpy as np  # noqa: E402 - after the thread limits above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import BRAIN, brain_split, mean_se, versions  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PNG_NAME = "fig4_brain_weights.png"
REGULARIZERS = ("none", "l2", "dropout", "feature_grouping")
# the paper's feature grouping screens no cluster: its maps, not those of screened clusters
AUTO = {"none": {}, "l2": {"alpha": "auto"}, "dropout": {"dropout": "auto"},
        "feature_grouping": {"screening_percentile": 100}}


def true_patterns(seed: int, mask: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The generator's class patterns, shape (n_classes, *grid), redrawn as ``_volumes`` draws
    them: the design first, then the patterns, from ``default_rng(seed)`` (labels checked)."""
    from fgscale.images._synthetic import _class_patterns, _design

    rng = np.random.default_rng(seed)
    y_design, *_ = _design(BRAIN["n_samples"], BRAIN["n_classes"], BRAIN["n_subjects"],
                           BRAIN["test_fraction"], rng)
    if not np.array_equal(np.sort(y_design), np.sort(y)):
        raise RuntimeError("the redrawn design disagrees with the cohort's labels")
    return _class_patterns(rng, mask, BRAIN["n_classes"])


def fit_one(split, mask_img, regularizer: str, extra: dict):
    """Fit on train+validation; return the classifier and its test accuracy."""
    from fgscale import FeatureGroupingClassifier

    X = np.concatenate([split.X_tr, split.X_val])
    y = np.concatenate([split.y_tr, split.y_val])
    clf = FeatureGroupingClassifier(model="logreg", mask=mask_img, random_state=split.seed,
                                    regularizer=regularizer, **AUTO[regularizer], **extra)
    clf.fit(X, y)
    return clf, float(np.mean(clf.predict(split.X_te) == split.y_te))


def peak_world(img) -> tuple[float, float, float]:
    """World coordinates (mm) of the voxel of largest absolute value."""
    data = np.asarray(img.dataobj)
    ijk = np.unravel_index(int(np.argmax(np.abs(data))), data.shape)
    return tuple(float(v) for v in (img.affine @ [*ijk, 1.0])[:3])


def background():
    """The MNI152 template at 2 mm if nilearn has it offline, else None (no background)."""
    try:
        from nilearn.datasets import load_mni152_template

        return load_mni152_template(resolution=2)
    except Exception as e:  # noqa: BLE001 - any failure: draw without a background
        print(f"no MNI template ({e!r}): bg_img=None", file=sys.stderr)
        return None


def draw(rows: list[tuple[str, object]], cut_coords, png: Path, suptitle: str, dpi: int = 80):
    """One row of orthogonal slices per (title, image), all through ``cut_coords``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from nilearn import plotting

    bg = background()
    fig, axes = plt.subplots(len(rows), 1, figsize=(8.0, 1.9 * len(rows) + 0.8))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - 0.7 / (1.9 * len(rows) + 0.8),
                        hspace=0.08)
    axes = np.atleast_1d(axes)
    for ax, (title, img) in zip(axes, rows, strict=True):
        plotting.plot_stat_map(img, display_mode="ortho", cut_coords=cut_coords, axes=ax,
                               colorbar=True, title=title, annotate=True, draw_cross=False,
                               black_bg=False, figure=fig, bg_img=bg)
    fig.suptitle(suptitle, fontsize=10)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=dpi)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="the cohort's and the fits' seed (0)")
    p.add_argument("--out", type=Path, default=RESULTS,
                   help=f"folder of {PNG_NAME} (default scripts/results)")
    p.add_argument("--nifti-dir", type=Path,
                   help="where the NIfTI maps go (default <out>/fig4_brain_maps, i.e. "
                        "scripts/results/fig4_brain_maps; not committed)")
    p.add_argument("--class-index", type=int, default=0, help="the class whose weights to show (0)")
    p.add_argument("--seeds", type=int, default=1,
                   help="also fit seeds --seed+1 .. --seed+N-1 (each a new cohort) and write "
                        "the test accuracy and the weights' correlation with the true patterns, "
                        "mean ± standard error, to <out>/brain_maps_seeds.md; the figure and the "
                        "NIfTI maps are --seed's (default 1)")
    # tests: a tiny run
    p.add_argument("--max-epochs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--n-groupings", type=int, help=argparse.SUPPRESS)
    p.add_argument("--regularizers", default=",".join(REGULARIZERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.regularizers = [r for r in args.regularizers.split(",") if r]
    unknown = sorted(set(args.regularizers) - set(REGULARIZERS))
    if unknown or not args.regularizers:
        p.error(f"--regularizers: unknown {unknown}; choose among {', '.join(REGULARIZERS)}")
    if args.nifti_dir is None:
        args.nifti_dir = args.out / "fig4_brain_maps"
    if not 0 <= args.class_index < BRAIN["n_classes"]:
        p.error(f"--class-index must be in 0..{BRAIN['n_classes'] - 1}")
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    return args


def pattern_correlation(clf, truths: np.ndarray, mask: np.ndarray) -> float:
    """Mean over classes of the Pearson correlation, over the mask's voxels, between a class's
    weights and the generator's pattern of that class."""
    weights = np.asarray(clf.coef_, dtype=np.float64)
    return float(np.mean([np.corrcoef(w, t[mask])[0, 1] for w, t in zip(weights, truths,
                                                                         strict=True)]))


def seed_table(records: list[dict], regularizers: list[str], command: str) -> str:
    """Markdown: accuracy and pattern correlation per regularizer, mean ± SE over seeds."""
    seeds = sorted({r["seed"] for r in records})
    lines = ["# Fig. 4 for brains over seeds: accuracy and closeness to the true patterns", "",
             "SYNTHETIC data standing in for HCP: the 'brain-white' cohort (see "
             "`scripts/reproduce_brain_maps.py`), a new cohort per seed; logistic regression "
             "fitted on 360 rows (45 subjects), tested on 120 (15 other subjects). Correlation: "
             "Pearson's, over the mask's voxels, between each class's weights and the "
             "generator's pattern of that class, averaged over the 8 classes. Mean ± standard "
             f"error over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}).", "",
             "| regularizer | test accuracy (%) | weights-pattern correlation | fit (s) |",
             "|---|---|---|---|"]
    for reg in regularizers:
        rows = [r for r in records if r["regularizer"] == reg]
        cells = []
        for key, scale, digits in (("accuracy", 100.0, 1), ("correlation", 1.0, 3)):
            mean, se = mean_se([r[key] * scale for r in rows])
            cells.append(f"{mean:.{digits}f} ± {se:.{digits}f}")
        cells.append(f"{np.mean([r['seconds'] for r in rows]):.0f}")
        lines.append(f"| {reg} | " + " | ".join(cells) + " |")
    lines += ["", f"Command: `{command}`; {versions()}.", ""]
    return "\n".join(lines)


def fit_seed(seed: int, args, extra: dict, records: list[dict], rows: list | None = None):
    """Fit every regularizer on the cohort of ``seed``; append one record per fit to
    ``records``, and with ``rows`` save the maps of ``--class-index`` and add them to ``rows``.
    Returns the truth image of the shown class and its label."""
    import nibabel as nib

    from fgscale.images import grid_geometry

    split = brain_split(seed, "brain-white")
    shape, affine, _ = grid_geometry(BRAIN["grid"])
    if tuple(shape) != split.mask.shape:
        raise RuntimeError(f"grid {shape} and mask {split.mask.shape} disagree")
    mask_img = nib.Nifti1Image(split.mask.astype(np.uint8), affine)
    y_all = np.concatenate([split.y_tr, split.y_val, split.y_te])
    classes = np.unique(y_all)
    label = int(classes[args.class_index])
    truths = true_patterns(seed, split.mask, y_all)
    truth_img = nib.Nifti1Image(truths[label].astype(np.float32), affine)
    if rows is not None:
        args.nifti_dir.mkdir(parents=True, exist_ok=True)
        nib.save(truth_img, args.nifti_dir / "truth.nii.gz")
        rows.append((f"true pattern of class {label} (SYNTHETIC generator)", truth_img))
    for regularizer in args.regularizers:
        fg_extra = extra if regularizer == "feature_grouping" else \
            {k: v for k, v in extra.items() if k == "max_epochs"}
        t0 = time.perf_counter()
        clf, acc = fit_one(split, mask_img, regularizer, fg_extra)
        seconds = time.perf_counter() - t0
        corr = pattern_correlation(clf, truths[classes], split.mask)
        records.append({"seed": seed, "regularizer": regularizer, "accuracy": acc,
                        "correlation": corr, "seconds": seconds})
        chosen = {k: getattr(clf, f"{k}_", None) for k in AUTO[regularizer]}
        note = "".join(f", {k}={v:g}" for k, v in chosen.items() if v is not None)
        print(f"seed {seed} {regularizer}: test accuracy {acc:.2%}, weights-pattern "
              f"correlation {corr:.3f} (fit {seconds:.1f} s, {clf.n_iter_} epochs{note})",
              flush=True)
        if rows is not None:
            img = clf.coef_img_[label]
            nib.save(img, args.nifti_dir / f"{regularizer}.nii.gz")
            rows.append((f"{regularizer}: test {acc:.1%}{note}", img))
    return truth_img, label


def main(argv=None) -> dict[str, float]:
    """Fit, save the maps, draw the figure; returns each regularizer's test accuracy, the mean
    over seeds."""
    argv = None if argv is None else [str(a) for a in argv]  # Paths welcome
    args = parse_args(argv)
    versions()  # the commit measured: read now, not when the run ends
    start = time.perf_counter()
    extra = {k: v for k, v in (("max_epochs", args.max_epochs),
                               ("n_groupings", args.n_groupings)) if v is not None}
    records: list[dict] = []
    rows: list = []
    truth_img, label = fit_seed(args.seed, args, extra, records, rows)
    cut = peak_world(truth_img)
    png = args.out / PNG_NAME
    draw(rows, cut, png, f"SYNTHETIC 'brain-white' cohort (4 mm, seed {args.seed}): logistic-"
                         f"regression weights of class {label}\nper regularizer (fitted on 360 "
                         f"rows, tested on 120); cut at the true pattern's peak "
                         f"{tuple(round(c) for c in cut)} mm")
    print(f"wrote {png} and {args.nifti_dir}/*.nii.gz in {time.perf_counter() - start:.0f} s; "
          f"versions: {versions()}", flush=True)
    if args.seeds > 1:
        for seed in range(args.seed + 1, args.seed + args.seeds):
            fit_seed(seed, args, extra, records)
        table = args.out / "brain_maps_seeds.md"
        command = "python scripts/reproduce_brain_maps.py " + " ".join(argv or sys.argv[1:])
        table.write_text(seed_table(records, args.regularizers, command.strip()))
        print(f"wrote {table} in {time.perf_counter() - start:.0f} s", flush=True)
    return {reg: float(np.mean([r["accuracy"] for r in records if r["regularizer"] == reg]))
            for reg in args.regularizers}


if __name__ == "__main__":
    main()
