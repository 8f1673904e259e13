"""Reproduce the paper's Fig. 6: test accuracy against the number of training samples (not a test).

Aydore, Thirion & Varoquaux (ICML 2019), Fig. 6: on HCP at full resolution, the accuracy of
logistic regression and of an MLP, each with no regularization, L2, dropout or feature
grouping, as the training set grows. Here the data are SYNTHETIC, standing in for HCP at 2 mm:
one cohort from ``fgscale.images.make_cohort(grid="2mm")`` (p = 270,806 in-mask voxels, 480
volumes, 8 classes, 60 subjects; snr -27 dB with 10% of the noise power smooth, the
'brain-white' setting of ``scripts/bench_accuracy.py``; data seed 0), written as NIfTI files
and a cohort table, converted to a Zarr store on a LocalCluster of worker processes, then every
fit streams its minibatches from the store on a LocalCluster of thread workers (the path of
``fgscale train``), and is scored on the store's test rows (the generator's 15 held-out
subjects, 120 rows), streamed as well.

Training rows: for seed s, each class's training rows (45 subjects, 360 rows) are shuffled and
interleaved class by class; a size n takes the first n rows of that order, so the draws are
stratified and nested across sizes (the 40 rows of n = 40 are among the 80 of n = 80). The
fit on those rows is ``FeatureGroupingClassifier.fit(store, client=client, rows=rows)``, the
call ``fgscale.runs._crossval.cross_validate`` makes for a fold: fgscale has no public row selection
on a store (``fit(store)`` takes its train split). L2 and dropout choose alpha and the dropout
rate with the estimator's own "auto" (a grid scored on a validation split of the given rows,
by subject, then a refit on all of them); the test rows are only read to score. Feature
grouping: k = 10% of p (the paper's; the estimator's default is "auto"), r = 50 (the
default). ``--n-groupings`` and ``--max-epochs`` are given to every model alike. The seed is
the estimator's random_state and the seed of the row draw; the cohort stays the same.

    .venv/bin/python scripts/reproduce_learning_curve.py --quick --out /tmp/lcq/lc_quick.md \\
        --png /tmp/lcq/lc_quick.png --csv /tmp/lcq/lc_quick.csv
    .venv/bin/python scripts/reproduce_learning_curve.py --models logreg --seeds 3 \\
        --sizes 40,80,160,320 --n-groupings 20 --max-epochs 20 --csv /tmp/lc/logreg.csv
    .venv/bin/python scripts/reproduce_learning_curve.py --models mlp --n-groupings 20 \\
        --max-epochs 100 --regularizers l2 --sizes 320 --first-seed 1 --seeds 2 \\
        --csv /tmp/lc/mlp_l2_320.csv --out /tmp/lc/part.md --png /tmp/lc/part.png
    .venv/bin/python scripts/reproduce_learning_curve.py --models mlp --seeds 3 \\
        --sizes 40,80,160,320 --from-csv /tmp/lc/mlp_a.csv,/tmp/lc/mlp_l2_320.csv \\
        --out scripts/results/learning_curve_mlp.md --png scripts/results/fig6_learning_curve_mlp.png

The second wrote ``scripts/results/learning_curve.md``. The MLP's grid was run in parts (a
regularizer, a size, a range of seeds each, as the third), and the last command rendered
``learning_curve_mlp.md`` from their CSVs; its "Every fit" table lists each row it used.
The script sets OMP_NUM_THREADS=1 unless it is set; Ctrl-C or ``kill PID`` reports the fits
that finished. Run times on this project's machines are in the README ("Results: the paper
reproduced"): the default full grid (2 models x 4 regularizers x 4 sizes x 3 seeds, b = 100,
200 epochs) takes well over ten hours on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core per worker: other jobs share this machine

import numpy as np  # noqa: E402 - after the thread limits above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import _pm, mean_se, versions  # noqa: E402
from benchlib import path_list, read_csv_rows  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REGULARIZERS = ("none", "l2", "dropout", "feature_grouping")
COHORT = dict(n_classes=8, snr_db=-27.0, smooth_noise=0.1, n_subjects=60, test_fraction=0.25,
              seed=0)
FULL = dict(models="logreg,mlp", sizes="40,80,160,320", seeds=3, n_groupings=100, max_epochs=200)
QUICK = dict(models="logreg", sizes="40,160", seeds=1, n_groupings=20, max_epochs=20)


@dataclass
class Cell:
    model: str
    regularizer: str
    n_train: int
    seed: int
    accuracy: float
    fit_s: float
    score_s: float
    epochs: int
    candidates: int
    chosen: str


def make_store(work: Path, grid, n_samples: int, n_workers: int) -> Path:
    """The SYNTHETIC cohort as NIfTI files, converted to a Zarr store; both reused if there."""
    from fgscale import convert, get_client, make_cohort

    csv_path = work / "cohort" / "cohort.csv"
    if not csv_path.exists():
        start = time.perf_counter()
        # a smaller cohort (--n-samples) has as many subjects as it holds samples of each class
        design = {**COHORT, "n_subjects": min(COHORT["n_subjects"], n_samples // COHORT["n_classes"])}
        make_cohort(csv_path.parent, n_samples=n_samples, grid=grid, compress=False, **design)
        log(f"wrote the SYNTHETIC cohort ({n_samples} volumes, grid {grid}) in "
            f"{time.perf_counter() - start:.0f} s")
    start = time.perf_counter()
    with get_client(n_workers=n_workers) as client:  # worker processes, as `fgscale convert`
        store = convert(csv_path, work / "cohort.zarr", client=client, progress=False)
    log(f"store {store.path}: {store.n_samples} rows x {store.n_features} voxels, "
        f"{store.train_rows().size} train / {store.test_rows().size} test "
        f"({time.perf_counter() - start:.0f} s)")
    return store.path


def nested_rows(y: np.ndarray, train_rows: np.ndarray, seed: int) -> np.ndarray:
    """The training rows in draw order: each class shuffled, classes interleaved, so that any
    prefix is stratified and shorter prefixes are nested in longer ones."""
    rng = np.random.default_rng([seed, 6])
    perms = [rng.permutation(train_rows[y[train_rows] == k]) for k in np.unique(y[train_rows])]
    order = [p[i] for i in range(max(map(len, perms))) for p in perms if i < len(p)]
    return np.asarray(order, np.int64)


def fit_cell(store, client, rows, model: str, regularizer: str, seed: int, args) -> Cell:
    """Fit one estimator on ``rows`` of the store, streamed, and score it on the test rows."""
    from fgscale import FeatureGroupingClassifier
    from fgscale.runs._reports import score_store

    # feature grouping at the paper's k = 10% of p, as every published cell was measured (the
    # estimator's default is now n_clusters="auto")
    params = {"l2": {"alpha": "auto"}, "dropout": {"dropout": "auto"},
              "feature_grouping": {"n_clusters": 0.1}}.get(regularizer, {})
    clf = FeatureGroupingClassifier(model=model, regularizer=regularizer, random_state=seed,
                                    n_groupings=args.n_groupings, max_epochs=args.max_epochs,
                                    **params)
    start = time.perf_counter()
    clf.fit(store, client=client, rows=rows)  # as fgscale.runs._crossval does for a fold
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    test, _ = score_store(clf, store, client, store.test_rows())
    chosen = {"l2": f"alpha={clf.alpha_:g}", "dropout": f"dropout={clf.dropout_:g}"}
    return Cell(model, regularizer, len(rows), seed, float(test["accuracy"]), fit_s,
                time.perf_counter() - start, len(clf.history_), len(clf.cv_results_),
                chosen.get(regularizer, ""))


def plot(cells: list[Cell], models, regularizers, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.3), squeeze=False,
                             sharey=True)
    for ax, model in zip(axes[0], models, strict=True):
        for regularizer in regularizers:
            sizes = sorted({c.n_train for c in cells if (c.model, c.regularizer)
                            == (model, regularizer)})
            stats = [mean_se([c.accuracy for c in cells
                              if (c.model, c.regularizer, c.n_train) == (model, regularizer, n)])
                     for n in sizes]
            mean = 100 * np.array([m for m, _ in stats])
            se = 100 * np.nan_to_num(np.array([s for _, s in stats]))
            ax.errorbar(sizes, mean, yerr=se, marker="o", capsize=3, label=regularizer)
        ax.set_xscale("log", base=2)
        ticks = sorted({c.n_train for c in cells})
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.minorticks_off()
        ax.set_title(f"{model}, SYNTHETIC cohort", fontsize=9)
        ax.set_xlabel("training samples")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def report(cells: list[Cell], args, store, command: str, setup_s: float, total_s: float,
           interrupted: bool = False) -> str:
    seeds = sorted({c.seed for c in cells})
    per_cell = Counter((c.model, c.regularizer, c.n_train) for c in cells)
    uneven = len(set(per_cell.values())) > 1
    train, test = store.train_rows(), store.test_rows()
    n_subjects = {part: len(np.unique(store.groups[rows])) for part, rows in
                  (("train", train), ("test", test))}
    out = [
        "# Test accuracy against training samples (the paper's Fig. 6), SYNTHETIC data",
        "",
        f"**SYNTHETIC data, standing in for HCP at 2 mm**: one cohort of `make_cohort` (grid "
        f"{args.grid}, p = {store.n_features:,} in-mask voxels, {store.n_samples} volumes, "
        f"8 classes, 60 subjects, snr -27 dB, 10% smooth noise, data seed 0); not real fMRI. NIfTI files -> "
        f"Zarr store (LocalCluster, {args.n_workers} worker process(es)) -> every fit streamed "
        f"from the store (LocalCluster, {args.n_workers} single-threaded thread worker(s)) and "
        f"scored on the store's test rows ({test.size} rows of {n_subjects['test']} held-out "
        f"subjects). n training rows drawn from the {train.size} rows of the "
        f"{n_subjects['train']} training subjects, stratified, nested across sizes, redrawn with each seed. "
        f"L2 and dropout: the estimator's own 'auto' on a validation split of those rows. "
        f"Feature grouping: k = 10% of p (the paper's). "
        f"Every model: b = {args.n_groupings} groupings (feature grouping only), at most "
        f"{args.max_epochs} epochs; other parameters at their defaults.",
        "",
        f"Test accuracy (%), mean ± standard error over {len(seeds)} seed(s) "
        f"({', '.join(map(str, seeds))}; n/a with one seed"
        f"{'; a cell with fewer gives their number in brackets' if uneven else ''}); figure: "
        f"`{args.png.name}`.",
        "",
    ]
    for model in args.models:
        out += [f"**{model}**", "",
                "| n train | " + " | ".join(args.regularizers) + " |",
                "|---|" + "---|" * len(args.regularizers)]
        for n in args.sizes:
            row = []
            for regularizer in args.regularizers:
                got = [c for c in cells if (c.model, c.regularizer, c.n_train)
                       == (model, regularizer, n)]
                text = _pm(*mean_se([c.accuracy for c in got])) if got else "-"
                row.append(f"{text} ({len(got)})" if got and uneven and len(got) < len(seeds)
                           else text)
            out.append(f"| {n} | " + " | ".join(row) + " |")
        out.append("")
    out += [f"Wall time per fit (s, mean over seeds: fit, then scoring the {test.size} test "
            "rows; the fit includes standardization statistics, the bank and every candidate), "
            "candidates tried, epochs of the kept candidate plus its refit, and the values "
            "'auto' chose:", "",
            "| model | regularizer | n train | fit (s) | score (s) | candidates | epochs | chosen |",
            "|---|---|---|---|---|---|---|---|"]
    for model in args.models:
        for regularizer in args.regularizers:
            for n in args.sizes:
                got = [c for c in cells if (c.model, c.regularizer, c.n_train)
                       == (model, regularizer, n)]
                if got:
                    out.append(f"| {model} | {regularizer} | {n} | "
                               f"{np.mean([c.fit_s for c in got]):.1f} | "
                               f"{np.mean([c.score_s for c in got]):.1f} | "
                               f"{got[0].candidates} | "
                               f"{np.mean([c.epochs for c in got]):.0f} | "
                               f"{', '.join(c.chosen for c in got if c.chosen) or '-'} |")
    from fgscale.estimators._auto import AUTO_GRIDS as grids

    capped = sum(c.epochs >= 2 * args.max_epochs for c in cells)
    out += ["", f"Chance: {100 / len(store.classes):.1f}% ({len(store.classes)} balanced classes). "
                f"In {capped} of {len(cells)} fits the kept candidate ran all {args.max_epochs} "
                "epochs (then as many in the refit): the epoch budget, not early stopping, ended "
                "its training. The candidates of 'auto' are the estimator's "
                f"(`fgscale.estimators._auto.AUTO_GRIDS`): alpha {grids['alpha'][0]:g} to "
                f"{grids['alpha'][-1]:g}, dropout {grids['dropout'][0]:g} to "
                f"{grids['dropout'][-1]:g}; a value chosen at an edge may lie beyond it."]
    out += ["", "A store keeps its banks and standardization statistics, keyed by their parameters "
                "and rows: a fit whose bank or statistics an earlier run in the same `--work` "
                "folder made (the same seed, size and b) reuses them, and its time excludes them."]
    if interrupted and total_s is None:  # --from-csv of a part of the grid
        out += ["", f"**INCOMPLETE**: {len(cells)} fits of the grid's {_grid_size(args)}; '-' marks "
                    "those not run."]
    elif interrupted:
        out += ["", f"**INTERRUPTED** (stopped) after {len(cells)} fits: the tables hold only the "
                    "fits that finished; '-' marks those that did not run."]
    if total_s is None:  # --from-csv
        spent = sum(c.fit_s + c.score_s for c in cells)
        files = ", ".join(f"`{path}`" for path in args.from_csv)
        timing = (f"Rendered from {files} (no fit run now); their fits and scoring took "
                  f"{spent:.0f} s in all, setup and cluster starts not counted.")
    else:
        timing = (f"Setup (cohort and store, reused when present): {setup_s:.0f} s. Total run "
                  f"time: {total_s:.0f} s.")
    out += ["", f"{timing} Machine: {os.cpu_count()} CPU(s).",
            f"Command: `{command}`", f"Versions: {versions()}", ""]
    return "\n".join(out)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="logreg, sizes 40,160, 1 seed, b = 20, 20 epochs (a few minutes)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 (default 3; 1 with --quick)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="start the seeds there, FIRST..FIRST+N-1 (default 0): a long grid run "
                        "in parts, merged with --from-csv")
    p.add_argument("--models", help="comma list of logreg, mlp (default both)")
    p.add_argument("--regularizers", default=",".join(REGULARIZERS), help="comma list")
    p.add_argument("--sizes", help="comma list of training sizes (default 40,80,160,320)")
    p.add_argument("--n-groupings", type=int, help="b of feature grouping (default 100)")
    p.add_argument("--max-epochs", type=int, help="epochs at most, every model (default 200)")
    p.add_argument("--n-workers", type=int, default=2, help="LocalCluster workers (default 2)")
    p.add_argument("--work", type=Path, default=Path("/tmp/fgscale_learning_curve"),
                   help="folder of the cohort and the store (reused when present)")
    p.add_argument("--out", type=Path, default=RESULTS / "learning_curve.md")
    p.add_argument("--png", type=Path, default=RESULTS / "fig6_learning_curve.png")
    p.add_argument("--csv", type=Path, help="also one row per fit here")
    p.add_argument("--from-csv", type=path_list,
                   help="fit nothing: write the report and the figure from the --csv of "
                        "earlier runs (a comma list: parts of one grid, or a run stopped "
                        "before the end), with the same options")
    p.add_argument("--grid", default="2mm", help=argparse.SUPPRESS)  # tests: "12x12x12"
    p.add_argument("--n-samples", type=int, default=480, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.models = args.models.split(",")
    args.regularizers = args.regularizers.split(",")
    args.sizes = sorted(int(n) for n in args.sizes.split(","))
    bad = [m for m in args.models if m not in ("logreg", "mlp")]
    bad += [r for r in args.regularizers if r not in REGULARIZERS]
    if bad:
        p.error(f"unknown model(s) or regularizer(s): {', '.join(bad)}")
    if "x" in args.grid:
        args.grid = tuple(int(v) for v in args.grid.split("x"))
    return args


def _grid_size(args) -> int:
    """Fits in the grid the options name: seeds x sizes x models x regularizers."""
    return args.seeds * len(args.sizes) * len(args.models) * len(args.regularizers)


def main(argv=None) -> list[Cell]:
    from fgscale import get_client, open_store

    argv = None if argv is None else [str(a) for a in argv]  # Paths welcome
    args = parse_args(argv)
    versions()  # the commit measured: read now, not when the run ends
    command = " ".join([Path(sys.argv[0]).name if argv is None else "reproduce_learning_curve.py",
                        *(sys.argv[1:] if argv is None else argv)])
    if args.from_csv:
        return _from_csv(args, command)
    start = time.perf_counter()
    store = open_store(make_store(args.work, args.grid, args.n_samples, args.n_workers))
    setup_s = time.perf_counter() - start
    train = store.train_rows()
    if args.sizes[-1] > train.size:
        raise SystemExit(f"--sizes: at most {train.size} training rows in {store.path}")
    cells: list[Cell] = []
    csv_file = writer = None
    if args.csv:
        csv_file = open(args.csv, "w", newline="")  # closed in the finally below
        writer = csv.DictWriter(csv_file, fieldnames=list(Cell.__dataclass_fields__))
        writer.writeheader()
    interrupted = False
    # `kill PID` as Ctrl-C (a job started in the background with `&` ignores SIGINT)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with get_client(n_workers=args.n_workers, processes=False) as client:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                order = nested_rows(store.y, train, seed)
                for n in args.sizes:
                    for model in args.models:
                        for regularizer in args.regularizers:
                            cell = fit_cell(store, client, order[:n], model, regularizer, seed,
                                            args)
                            cells.append(cell)
                            if writer:
                                writer.writerow(asdict(cell))
                                csv_file.flush()
                            log(f"[{time.perf_counter() - start:7.1f} s] seed={seed} n={n} "
                                f"{model} {regularizer}: acc {100 * cell.accuracy:.2f}% "
                                f"fit {cell.fit_s:.1f} s score {cell.score_s:.1f} s "
                                f"({cell.epochs} epochs) {cell.chosen}")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: report what finished
        interrupted = True
        log(f"interrupted: reporting the {len(cells)} fits that finished")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if csv_file:
            csv_file.close()
    plot(cells, args.models, args.regularizers, args.png)
    text = report(cells, args, store, command, setup_s, time.perf_counter() - start,
                  interrupted)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return cells


def _stop(signum, frame):
    raise KeyboardInterrupt


def _from_csv(args, command: str) -> list[Cell]:
    """The report and the figure of earlier runs' CSV rows."""
    from fgscale import open_store

    cells = read_csv_rows(args.from_csv, Cell, ("model", "regularizer", "n_train", "seed"))
    store = open_store(args.work / "cohort.zarr")
    plot(cells, args.models, args.regularizers, args.png)
    text = report(cells, args, store, command, 0.0, None, len(cells) < _grid_size(args))
    text += fits_table(cells)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return cells


def fits_table(cells: list[Cell]) -> str:
    """Every fit, a row each, every field of its CSV row: a report rendered from CSV files that
    are not kept (results keep Markdown) still holds the figures it was rendered from."""
    order = {name: i for i, name in enumerate(REGULARIZERS)}
    lines = ["", "## Every fit", "",
             "The rows of the CSV files the tables above were rendered from, one per fit.", "",
             "| model | regularizer | n train | seed | test accuracy (%) | fit (s) | score (s) "
             "| epochs | candidates | chosen |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c.model, order.get(c.regularizer, len(order)),
                                          c.n_train, c.seed)):
        lines.append(f"| {c.model} | {c.regularizer} | {c.n_train} | {c.seed} | "
                     f"{100 * c.accuracy:.2f} | {c.fit_s:.0f} | {c.score_s:.1f} | {c.epochs} | "
                     f"{c.candidates} | {c.chosen or '-'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
