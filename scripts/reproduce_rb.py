"""Reproduce the paper's Table A.3: sensitivity of feature grouping to r and b (not a test).

Aydore, Thirion & Varoquaux (ICML 2019), Table A.3: logistic regression with feature grouping
on HCP-small, r (bootstrap rows per grouping) from 10 to 200 and b (groupings in the bank) from
100 to 1,500; test accuracy stayed within 77.97-79.88%. Here the data are SYNTHETIC, standing
in for HCP-small: the 'brain-white' cohort of ``scripts/bench_accuracy.py`` (``fgscale demo``'s
cohort: ``make_classification_volumes`` on the 4 mm HCP-small grid, p = 33,854, 480 volumes,
8 classes, 60 subjects, snr -27 dB, 10% of the noise power smooth), generated anew with each
seed. Rows as in bench_accuracy's ``brain_split``: test = the generator's 15 test subjects (120
rows); the model is fitted on train+validation (45 subjects, 360 rows). Each cell fits
``FeatureGroupingClassifier(model="logreg", regularizer="feature_grouping", n_bootstrap=r,
n_groupings=b, random_state=seed, mask=mask)`` (other parameters at their defaults: k = 10% of
p, early stopping off for logistic regression, up to 500 epochs) in memory, and reports test
accuracy (mean ± standard error over seeds) and the wall time of ``fit`` (bank included).

    .venv/bin/python scripts/reproduce_rb.py --quick --out /tmp/rbq/rb_quick.md \\
        --csv /tmp/rbq/rb_quick.csv
    .venv/bin/python scripts/reproduce_rb.py --csv scripts/results/rb_sensitivity.csv  # full

(The script sets OMP_NUM_THREADS=1 unless it is set.) Durations measured on 2 cores shared with
other jobs, one used (git b141970/31957ed-dirty, 2026-11-23): ``--quick`` (r in 10, 50; b in 10,
50; 1 seed) 38 s; the full grid (r in 10, 50, 100, 200; b in 10, 50, 100, 500; 5 seeds, which
is what ``scripts/results/rb_sensitivity.md`` holds) 977 s (16 min): a fit takes 4-14 s, the
b = 500 ones 15-44 s (mean over seeds): what grows with b and r is the bank.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: other jobs share this machine

import numpy as np  # noqa: E402 - after the thread limits above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import _pm, brain_split, mean_se, versions  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PAPER = "77.97-79.88% (HCP-small, r in 10..200, b in 100..1500; the paper's Table A.3)"
FULL = dict(r=(10, 50, 100, 200), b=(10, 50, 100, 500), seeds=5)
QUICK = dict(r=(10, 50), b=(10, 50), seeds=1)


@dataclass
class Cell:
    seed: int
    r: int
    b: int
    accuracy: float
    fit_s: float
    epochs: int


def fit_cell(split, r: int, b: int, max_epochs: int | None) -> Cell:
    """Fit feature grouping with (r, b) on the split's train+validation rows; score on test."""
    from fgscale import FeatureGroupingClassifier

    extra = {} if max_epochs is None else {"max_epochs": max_epochs}
    X = np.concatenate([split.X_tr, split.X_val])
    y = np.concatenate([split.y_tr, split.y_val])
    clf = FeatureGroupingClassifier(model="logreg", regularizer="feature_grouping", n_bootstrap=r,
                                    n_groupings=b, random_state=split.seed, mask=split.mask,
                                    **extra)
    start = time.perf_counter()
    clf.fit(X, y)
    seconds = time.perf_counter() - start
    accuracy = float(np.mean(clf.predict(split.X_te) == split.y_te))
    return Cell(split.seed, r, b, accuracy, seconds, int(clf.n_iter_))


def report(cells: list[Cell], rs, bs, command: str, total_s: float) -> str:
    """The Markdown file: header, accuracy table (rows r, columns b), fit-time table."""
    seeds = sorted({c.seed for c in cells})
    head = "| r \\ b | " + " | ".join(str(b) for b in bs) + " |"
    rule = "|---|" + "---|" * len(bs)
    acc_lines, time_lines, means = [head, rule], [head, rule], []
    for r in rs:
        accs, times = [], []
        for b in bs:
            got = [c for c in cells if (c.r, c.b) == (r, b)]
            m, se = mean_se([c.accuracy for c in got])
            means.append(m)
            accs.append(_pm(m, se))
            times.append(f"{np.mean([c.fit_s for c in got]):.1f}")
        acc_lines.append(f"| **{r}** | " + " | ".join(accs) + " |")
        time_lines.append(f"| **{r}** | " + " | ".join(times) + " |")
    lo, hi = 100 * min(means), 100 * max(means)
    return "\n".join([
        "# Sensitivity of feature grouping to r and b (the paper's Table A.3), SYNTHETIC data",
        "",
        "**SYNTHETIC data, standing in for HCP-small**: the 'brain-white' cohort of "
        "`scripts/bench_accuracy.py` (`make_classification_volumes` on the 4 mm HCP-small grid, "
        "p = 33,854, 480 volumes, 8 classes, 60 subjects, snr -27 dB, 10% smooth noise), "
        "generated anew with each seed; not real fMRI. Logistic regression with feature "
        "grouping (k = 10% of p, other parameters at their defaults), fitted in memory on "
        "train+validation (45 subjects, 360 rows), scored on the 15 test subjects (120 rows). "
        "r: bootstrap rows per grouping; b: groupings in the bank.",
        "",
        f"Paper: {PAPER}, a spread of 1.91 points. Here: {lo:.2f}-{hi:.2f}% over the cells' "
        f"means, a spread of {hi - lo:.2f} points (b = 10 and 50 lie below the paper's b range).",
        "",
        f"Test accuracy (%), mean ± standard error over {len(seeds)} seed(s) "
        f"({', '.join(map(str, seeds))}; n/a with one seed):",
        "",
        *acc_lines,
        "",
        "Wall time of `fit` (s, bank of groupings included), mean over seeds, one core:",
        "",
        *time_lines,
        "",
        f"Total run time: {total_s:.0f} s. Command: `{command}`",
        f"Versions: {versions()}",
        "",
    ])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"r in {QUICK['r']}, b in {QUICK['b']}, 1 seed (a few minutes)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 (default 5; 1 with --quick)")
    p.add_argument("--r", help="comma list of r (default 10,50,100,200)")
    p.add_argument("--b", help="comma list of b (default 10,50,100,500)")
    p.add_argument("--out", type=Path, default=RESULTS / "rb_sensitivity.md",
                   help="the Markdown report (default scripts/results/rb_sensitivity.md)")
    p.add_argument("--csv", type=Path, help="also one row per (seed, r, b) here")
    p.add_argument("--max-epochs", type=int, help=argparse.SUPPRESS)  # tests: a tiny run
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    args.seeds = defaults["seeds"] if args.seeds is None else args.seeds
    args.r = defaults["r"] if args.r is None else tuple(int(v) for v in args.r.split(","))
    args.b = defaults["b"] if args.b is None else tuple(int(v) for v in args.b.split(","))
    if args.seeds < 1 or min(args.r + args.b) < 1:
        p.error("--seeds, --r and --b must be at least 1")
    return args


def main(argv=None) -> list[Cell]:
    argv = None if argv is None else [str(a) for a in argv]  # Paths welcome
    args = parse_args(argv)
    versions()  # the commit measured: read now, not when the run ends
    command = " ".join([Path(sys.argv[0]).name if argv is None else "reproduce_rb.py",
                        *(sys.argv[1:] if argv is None else argv)])
    cells: list[Cell] = []
    start = time.perf_counter()
    writer = csv_file = None
    if args.csv:
        csv_file = open(args.csv, "w", newline="")  # closed in the finally below
        writer = csv.DictWriter(csv_file, fieldnames=list(Cell.__dataclass_fields__))
        writer.writeheader()
    try:
        for seed in range(args.seeds):
            split = brain_split(seed, "brain-white")
            for r in args.r:
                for b in args.b:
                    cell = fit_cell(split, r, b, args.max_epochs)
                    cells.append(cell)
                    if writer:
                        writer.writerow(asdict(cell))
                        csv_file.flush()
                    print(f"[{time.perf_counter() - start:7.1f} s] seed={seed} r={r} b={b}: "
                          f"acc {100 * cell.accuracy:.2f}% fit {cell.fit_s:.1f} s "
                          f"({cell.epochs} epochs)", file=sys.stderr, flush=True)
    finally:
        if csv_file:
            csv_file.close()
    text = report(cells, args.r, args.b, command, time.perf_counter() - start)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return cells


if __name__ == "__main__":
    main()
