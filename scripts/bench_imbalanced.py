"""Accuracy on imbalanced classes: fgscale with and without ``class_weight="balanced"`` against
scikit-learn's LogisticRegressionCV with and without it, on Fashion-MNIST.

The training rows are Fashion-MNIST's real images with white noise of the given SNR (as
``bench_accuracy.py`` draws them, seed by seed), their classes made imbalanced: class c keeps
``round(n_max * ratio ** (c / 9))`` of its rows (100 down to 10 by default), as a cohort of
many controls and few patients of some kinds. The test rows are balanced (200 per class), and
the score that matters is the balanced accuracy (the mean recall over classes), there the
plain accuracy. Every method fits on the training rows only and chooses its
hyper-parameters there (fgscale on its validation split, LogisticRegressionCV on 5 folds);
the test rows are never seen before the score. A Markdown table, mean ± standard error over
seeds, with the differences to scikit-learn's balanced model (± the standard error of the
per-seed differences).

Run with one thread per library, as ``bench_accuracy.py``'s figures were::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_imbalanced.py --seeds 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import (  # noqa: E402
    FASHION_DIR,
    fashion_split,
    load_fashion,
    mean_se,
    noise_label,
    versions,
)
from benchlib import markdown_row, markdown_table  # noqa: E402


def fgscale(class_weight):
    def fit(X, y, mask, seed):
        from fgscale import FeatureGroupingClassifier

        return FeatureGroupingClassifier(mask=mask, class_weight=class_weight,
                                         random_state=seed).fit(X, y)
    return fit


def lrcv(class_weight):
    def fit(X, y, mask, seed):
        from sklearn.linear_model import LogisticRegressionCV
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        # the model a scikit-learn user aiming at each score picks: C chosen by accuracy, or
        # by balanced accuracy with balanced weights
        scoring = "accuracy" if class_weight is None else "balanced_accuracy"
        return make_pipeline(StandardScaler(), LogisticRegressionCV(
            max_iter=1000, l1_ratios=(0.0,), scoring=scoring, class_weight=class_weight,
            use_legacy_attributes=False)).fit(X, y)
    return fit


METHODS = {"fgscale default": fgscale(None),
           "fgscale class_weight='balanced'": fgscale("balanced"),
           "LogisticRegressionCV + std.": lrcv(None),
           "LogisticRegressionCV + std., class_weight='balanced'": lrcv("balanced")}
ANCHOR = "LogisticRegressionCV + std., class_weight='balanced'"


def imbalanced_rows(y: np.ndarray, n_max: int, ratio: float) -> np.ndarray:
    """The rows kept: the first ``round(n_max * ratio ** (c / (K - 1)))`` of class c."""
    classes = np.unique(y)
    keep = [np.flatnonzero(y == c)[: max(1, round(n_max * ratio ** (i / (len(classes) - 1))))]
            for i, c in enumerate(classes)]
    return np.concatenate(keep)


def balanced_accuracy(y, pred) -> float:
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    p.add_argument("--n-max", type=int, default=100, help="rows of the largest class (default 100)")
    p.add_argument("--ratio", type=float, default=0.1,
                   help="rows of the smallest class / of the largest (default 0.1)")
    p.add_argument("--noise", type=float, default=0.6, help="SNR in dB (default 0.6)")
    p.add_argument("--data", type=Path, default=FASHION_DIR,
                   help=f"Fashion-MNIST's folder (default {FASHION_DIR})")
    args = p.parse_args(argv)
    started, stamp = time.perf_counter(), versions()
    data, mask = load_fashion(args.data), np.ones((28, 28), bool)
    scores = {name: {"balanced": [], "seconds": []} for name in METHODS}
    counts = None
    for seed in range(args.seeds):
        split = fashion_split(data, args.n_max, args.noise, seed, n_val=0)
        rows = imbalanced_rows(split.y_tr, args.n_max, args.ratio)
        X, y = split.X_tr[rows], split.y_tr[rows]
        counts = np.bincount(y)
        for name, fit in METHODS.items():
            t0 = time.perf_counter()
            pred = fit(X, y, mask, seed).predict(split.X_te)
            scores[name]["seconds"].append(time.perf_counter() - t0)
            scores[name]["balanced"].append(balanced_accuracy(split.y_te, pred))
        print(f"seed {seed}: " + ", ".join(f"{name} {s['balanced'][-1]:.4f}"
                                            for name, s in scores.items()),
              file=sys.stderr, flush=True)

    print(f"Fashion-MNIST, {noise_label(args.noise)}, training rows per class "
          f"{counts.tolist()} ({counts.sum()} rows), {args.seeds} seeds; balanced test rows "
          "(200 per class): their accuracy is the balanced accuracy\n")
    markdown_table("method", "test accuracy (%)", "− the last row (paired)", "fit + predict (s)")
    anchor = np.array(scores[ANCHOR]["balanced"])
    for name, s in scores.items():
        diff = np.array(s["balanced"]) - anchor
        m, se = mean_se(diff)
        markdown_row(name, "{:.2f} ± {:.2f}".format(*(100 * v for v in mean_se(s["balanced"]))),
                     "-" if name == ANCHOR else f"{100 * m:+.2f} ± {100 * se:.2f}",
                     f"{np.mean(s['seconds']):.1f}")
    gain = np.array(scores["fgscale class_weight='balanced'"]["balanced"]) - np.array(
        scores["fgscale default"]["balanced"])
    print("\nfgscale class_weight='balanced' − fgscale default: "
          "{:+.2f} ± {:.2f} points (paired)".format(*(100 * v for v in mean_se(gain))))
    print(f"\nTotal run time: {time.perf_counter() - started:.0f} s. Command: "
          f"scripts/bench_imbalanced.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"Versions: {stamp}")


if __name__ == "__main__":
    main()
