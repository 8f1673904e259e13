"""How the pipeline's cost grows with p, the number of voxels: 4 mm, 2 mm and 1 mm at the same n.

Usage::

    .venv/bin/python scripts/bench_scale.py [--grids 4mm,2mm,1mm] [--n 24] [--repeat 1]
        [--workdir DIR] [--keep] [--out scripts/results/bench_scale.md] [--quick]

Data: SYNTHETIC NIfTI cohorts (``fgscale.images.make_cohort``, .nii.gz, 4 classes, the same
``--n`` volumes and seed on every grid): p = 33,854 at 4 mm, 270,806 at 2 mm, 1,827,243 at
1 mm. A grid may also be a tiny custom shape such as ``12x14x12`` (what the test runs).

For each grid, in this order, one process, one Dask LocalCluster of 2 THREAD workers
(``fgscale.get_client(n_workers=2, processes=False)``, one thread each), so that the process's
wall time, CPU time and resident memory cover the workers' work too:

1. ``convert``: the cohort to a fresh store (``fgscale.convert``, mask computed from the data);
2. ``ReNA``: one ``fgscale.grouping.rena`` on r = 50 rows drawn from the training rows with
   replacement (``bootstrap_rows``, as a bank task draws them; read from the store beforehand,
   not timed) to k = 10% of p, on the mask's grid edges (computed inside ``rena``, as a bank
   task does);
3. ``standardization``: ``compute_stats`` of the store's training rows on the cluster;
4. ``FG epoch``: one epoch of streamed feature-grouping training, the ``seconds`` the training
   loop records for it (``clf.history_[0]``) in ``FeatureGroupingClassifier(n_groupings=4,
   max_epochs=1, early_stopping=False, random_state=0).fit(store, client=client)``. The bank
   (4 groupings, r = 50, k = 10%) is built beforehand with ``build_bank`` (its time is printed,
   not a stage) and the statistics are those of stage 3, so the fit only reads both. The row
   ``whole fit`` is that fit's wall time (model set-up, bank and statistics read, the epoch).

Per stage and grid: wall seconds, CPU seconds of the process (all threads: less sensitive
than wall time to the other jobs of a shared machine) and the peak RSS increase: the maximum
VmRSS of the process sampled every 10 ms by a thread during the stage, minus VmRSS just before
it. Memory the process freed earlier and kept counts as free, so it is a lower bound of what a
fresh process would need. The ``whole fit`` peak is that of the epoch stage.

Slopes: least squares of log(seconds) (and log(peak MB)) against log(p) over the grids; the goal
of the issue "Cost grows linearly in p" is <= 1.1. Fixed costs (task scheduling, Python
overhead) weigh most on the smallest grid and pull the slope over three grids down, hence the
second slope, between the two largest grids only. A slope needs every value > 0; memory
increases under 1 MB are below what the sampler resolves and read as n/a. The stages of every
grid run in the same process, one after the other, so a slope compares timings of one run;
on a busy machine they are still noisy (``--repeat N`` keeps the best of N for each stage).

Before the timed grids, an untimed warm-up runs the whole pipeline on a tiny grid (12x14x12,
n = 4), so that first imports and first calls are not charged to the smallest grid
(``--no-warm-up`` skips it). Cohort generation is timed but is not a stage; with ``--keep``
the cohorts stay in ``--workdir`` (default ``$TMPDIR/fgscale-bench-scale`` then) and are
reused by the next run with the same grid, n and seed. Stores are always written afresh.

Measured on this project's 2-core, 24 GiB machine while other engineers' long experiments ran
on it (load average 7-8.5 on 2 cores; this process averaged 0.45 of a core:
timings are noisy, read the CPU-time slopes beside the wall-time ones):

- ``.venv/bin/python scripts/bench_scale.py --n 16 --keep``: 2 min 1 s, of which 42 s
  generating the three cohorts (4 mm 0.4 s, 2 mm 3.1 s, 1 mm 38.6 s), 12 s of warm-up, 36 s of
  building the 1 mm bank (not a stage); peak RSS of the process 3.0 GB;
- ``.venv/bin/python scripts/bench_scale.py --n 16 --repeat 3 --keep --out
  scripts/results/bench_scale.md`` (cohorts reused): 1 min 57 s, peak RSS 3.1 GB;
- ``.venv/bin/python scripts/bench_scale.py --quick`` (4 mm and 2 mm, n = 8): 18 s.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, when imported as a module
from bench_accuracy import PeakRSS  # noqa: E402
from benchlib import parse_args  # noqa: E402

STAGES = ("convert", "ReNA", "standardization", "FG epoch", "whole fit")
GOAL = 1.1
R_ROWS = 50  # r, rows of one ReNA (bootstrap draws, as a bank task)
K_FRACTION = 0.1
N_GROUPINGS = 4
N_CLASSES = 4
SEED = 0
WARM_UP_GRID = (12, 14, 12)


# ------------------------------------------------------------------------------ measuring


def measure(fn):
    """``fn()`` timed: (wall s, CPU s of the process, peak RSS increase in bytes, result)."""
    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, mem.peak, result


def loglog_slope(p, values) -> float:
    """Least-squares slope of log(values) against log(p): the exponent a of values ~ p**a.
    NaN with fewer than two distinct p, or a value that is not finite and > 0."""
    p, values = np.asarray(p, dtype=float), np.asarray(values, dtype=float)
    if p.size != values.size or np.unique(p).size < 2 or not np.all(np.isfinite(values)) \
            or not np.all(values > 0) or not np.all(p > 0):
        return math.nan
    return float(np.polyfit(np.log(p), np.log(values), 1)[0])


# ------------------------------------------------------------------------------- grids


def parse_grid(text: str):
    """"4mm", "2mm", "1mm", or a custom shape "AxBxC" (a tuple)."""
    text = text.strip()
    if text.endswith("mm"):
        return text
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a grid is 4mm, 2mm, 1mm or AxBxC, got {text!r}") from None
    if len(shape) != 3:
        raise argparse.ArgumentTypeError(f"a custom grid is AxBxC, got {text!r}")
    return shape


def grid_name(grid) -> str:
    return grid if isinstance(grid, str) else "x".join(str(s) for s in grid)


def cohort(workdir: Path, grid, n: int) -> tuple[Path, float | None]:
    """The cohort table of (grid, n) in ``workdir``, generated unless a complete one is there;
    and the generation's seconds (None when reused)."""
    from fgscale.images import make_cohort

    folder = workdir / f"cohort-{grid_name(grid)}-n{n}-seed{SEED}"
    csv_path, done = folder / "cohort.csv", folder / ".complete"
    if done.exists() and csv_path.exists():
        return csv_path, None
    shutil.rmtree(folder, ignore_errors=True)
    t = time.perf_counter()
    make_cohort(folder, n_samples=n, n_classes=N_CLASSES, grid=grid, seed=SEED)
    seconds = time.perf_counter() - t
    done.touch()
    return csv_path, seconds


# ------------------------------------------------------------------------------- stages


def run_grid(grid, csv_path: Path, store_path: Path, client, repeat: int = 1) -> dict:
    """The stages on one grid: {stage: (wall s, cpu s, peak bytes)} plus "p" and notes."""
    from fgscale import FeatureGroupingClassifier
    from fgscale.grouping import build_bank, rena
    from fgscale.grouping._bank import bootstrap_rows, resolve_n_clusters
    from fgscale.store import convert, open_store
    from fgscale.store._stats import compute_stats, stats_key

    out: dict = {}

    def best(name, fn, reset=None):
        """Best wall time of ``repeat`` runs (its CPU time with it) and the largest peak."""
        runs = []
        for i in range(repeat):
            if reset is not None and i:
                reset()
            runs.append(measure(fn))
        wall, cpu, _, result = min(runs, key=lambda r: r[0])
        out[name] = (wall, cpu, max(r[2] for r in runs))
        return result

    def fresh_convert():
        shutil.rmtree(store_path, ignore_errors=True)
        return convert(csv_path, store_path, client=client, progress=False)

    best("convert", fresh_convert)
    store = open_store(store_path)
    p, train = store.n_features, store.train_rows()
    k = resolve_n_clusters(K_FRACTION, p)
    out.update(p=p, k=k, n=store.n_samples, n_train=int(train.size))

    rows = bootstrap_rows(SEED, train, R_ROWS)
    t = time.perf_counter()
    X = store.read_rows(rows)
    out["read_rows_s"] = time.perf_counter() - t
    labels = best("ReNA", lambda: rena(X, store.mask, k, random_state=SEED))
    out["clusters"] = int(labels.max()) + 1
    X = labels = None  # free the rows before the next stage

    def drop_stats():
        import zarr

        group = zarr.open_group(str(store_path), mode="r+")
        del group[f"stats/{stats_key(train)}"]

    best("standardization", lambda: compute_stats(store_path, client=client, progress=False),
         reset=drop_stats)

    t = time.perf_counter()
    build_bank(store_path, n_groupings=N_GROUPINGS, n_bootstrap=R_ROWS, n_clusters=K_FRACTION,
               seed=SEED, client=client, progress=False)
    out["bank_s"] = time.perf_counter() - t

    def fit():
        clf = FeatureGroupingClassifier(n_groupings=N_GROUPINGS, n_bootstrap=R_ROWS,
                                        n_clusters=K_FRACTION, max_epochs=1,
                                        early_stopping=False, random_state=SEED, verbose=0)
        return clf.fit(str(store_path), client=client)

    fits = [measure(fit) for _ in range(repeat)]
    wall, cpu, _, clf = min(fits, key=lambda r: r[3].history_[0]["seconds"])
    peak = max(r[2] for r in fits)
    epoch = float(clf.history_[0]["seconds"])
    # the CPU time of the epoch alone is not recorded: the fit's, scaled by the epoch's share
    out["FG epoch"] = (epoch, cpu * epoch / wall, peak)
    out["whole fit"] = (wall, cpu, peak)
    out["batch_size"] = int(clf.batch_size_)
    return out


# ------------------------------------------------------------------------------- report


def _fmt_p(p: int) -> str:
    return f"{p:,}"


def report(results: dict, args, generation: dict, load: tuple) -> list[str]:
    """The Markdown lines: context, the time table, the memory table, notes."""
    grids = list(results)
    ps = [results[g]["p"] for g in grids]
    lines = [
        f"SYNTHETIC cohorts (`fgscale.images.make_cohort`, {N_CLASSES} classes, seed {SEED}), "
        f"n = {args.n} volumes on every grid; one process, a LocalCluster of 2 thread workers "
        "(`processes=False`): the process's RSS and CPU time cover the workers. "
        f"Best of {args.repeat} per stage. "
        f"Load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (a shared 2-core "
        "machine: timings are noisy; the slopes compare stages timed in the same process).",
        "",
        f"Versions: {versions()}.",
        "",
        "Time per stage, wall seconds (CPU seconds of the process in brackets); slopes of "
        f"log(wall time) against log(p), goal <= {GOAL}:",
        "",
    ]
    last2 = f"slope {grid_name(grids[-2])} -> {grid_name(grids[-1])}" if len(grids) > 2 else None
    head = ["stage"] + [f"{grid_name(g)} (p = {_fmt_p(p)})" for g, p in zip(grids, ps, strict=True)]
    head += [f"x {grid_name(grids[-1])} / {grid_name(grids[0])} (p x{ps[-1] / ps[0]:.1f})",
             "slope, wall", "slope, CPU"] + ([last2] if last2 else []) + ["goal"]
    lines += [_row(head), "|" + "---|" * len(head)]
    slopes = {}
    for stage in STAGES:
        walls = [results[g][stage][0] for g in grids]
        cpus = [results[g][stage][1] for g in grids]
        s_wall, s_cpu = loglog_slope(ps, walls), loglog_slope(ps, cpus)
        slopes[stage] = s_wall
        cells = [stage] + [f"{_secs(w)} ({_secs(c)})" for w, c in zip(walls, cpus, strict=True)]
        cells += [f"{walls[-1] / walls[0]:.1f}" if walls[0] > 0 else "n/a", _slope(s_wall),
                  _slope(s_cpu)]
        if last2:
            cells.append(_slope(loglog_slope(ps[-2:], walls[-2:])))
        cells.append(_verdict(s_wall) if stage != "whole fit" else "(context)")
        lines.append(_row(cells))
    lines += ["", "Peak RSS increase per stage, MB; slope of log(peak) against log(p):", ""]
    head = ["stage"] + [grid_name(g) for g in grids] + ["slope"]
    if last2:
        head.append(last2)
    lines += [_row(head), "|" + "---|" * len(head)]
    for stage in STAGES[:-1]:  # the whole fit's peak is the epoch's
        mbs = [results[g][stage][2] / 1e6 for g in grids]
        valid = [m if m >= 1 else math.nan for m in mbs]
        cells = [stage] + [f"{m:.0f}" for m in mbs] + [_slope(loglog_slope(ps, valid))]
        if last2:
            cells.append(_slope(loglog_slope(ps[-2:], valid[-2:])))
        lines.append(_row(cells))
    lines += ["", "Not stages (per grid): " + "; ".join(
        f"{grid_name(g)}: cohort generation "
        f"{'reused' if generation[g] is None else f'{generation[g]:.1f} s'}, "
        f"reading the r = {R_ROWS} rows {results[g]['read_rows_s']:.2f} s, "
        f"bank of {N_GROUPINGS} groupings {results[g]['bank_s']:.1f} s, "
        f"k = {_fmt_p(results[g]['k'])}, {results[g]['n_train']} training rows, "
        f"batch {results[g]['batch_size']}"
        for g in grids) + "."]
    lines += ["", "The FG epoch's CPU time is the whole fit's, scaled by the epoch's share of its "
              "wall time (the loop records the epoch's wall seconds only). Memory under 1 MB: n/a "
              "in slopes."]
    above = [s for s, v in slopes.items() if s != "whole fit" and not (v <= GOAL)]
    lines += ["", ("Every stage is within the goal." if not above else
                   f"Above the goal (or n/a): {', '.join(above)}.")]
    return lines


def _secs(seconds: float) -> str:
    """Seconds to 3 significant digits (at least 2 decimals under 10 s)."""
    return f"{seconds:.3g}" if seconds < 0.01 else f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _slope(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.2f}"


def _verdict(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    return "ok" if value <= GOAL else "ABOVE"


def versions() -> str:
    import dask
    import scipy
    import torch
    import zarr

    return (f"Python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
            f"torch {torch.__version__}, zarr {zarr.__version__}, dask {dask.__version__}; "
            f"{os.cpu_count()} cores")


# ------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default="4mm,2mm,1mm",
                        help="comma-separated grids: 4mm, 2mm, 1mm or a custom AxBxC (default "
                             "4mm,2mm,1mm)")
    parser.add_argument("--n", type=int, default=24, help="volumes per cohort, the same on every "
                        "grid (default 24)")
    parser.add_argument("--repeat", type=int, default=1, help="best of N per stage (default 1)")
    parser.add_argument("--workdir", default=None,
                        help="folder of the cohorts and stores (default: a temporary folder, "
                             "removed at the end; with --keep, $TMPDIR/fgscale-bench-scale)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the generated cohorts in --workdir for the next run")
    parser.add_argument("--out", default=None, help="also write the Markdown report to this file "
                        "(e.g. scripts/results/bench_scale.md)")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="skip the untimed warm-up run on a tiny grid")
    return parser


def main(argv=None) -> dict:
    parser = build_parser()
    if argv is None:
        args = parse_args(parser, quick=dict(grids="4mm,2mm", n=8))
    else:
        args = parser.parse_args(argv)
    args.command = " ".join(["python scripts/bench_scale.py", *(sys.argv[1:] if argv is None else argv)])
    grids = [parse_grid(g) for g in args.grids.split(",") if g.strip()]
    if len(grids) < 2:
        parser.error("a slope needs two grids at least")
    if args.n < N_CLASSES:
        parser.error(f"--n must be >= {N_CLASSES} (one volume per class)")
    if args.workdir is not None:
        workdir, temporary = Path(args.workdir), False
    elif args.keep:
        workdir, temporary = Path(tempfile.gettempdir()) / "fgscale-bench-scale", False
    else:
        workdir, temporary = Path(tempfile.mkdtemp(prefix="fgscale-bench-scale-")), True
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        return _run(args, grids, workdir, started)
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.keep:  # a given --workdir without --keep: drop what this run generated
            for g in grids:
                shutil.rmtree(workdir / f"cohort-{grid_name(g)}-n{args.n}-seed{SEED}",
                              ignore_errors=True)


def _run(args, grids, workdir: Path, started: float) -> dict:
    from fgscale import get_client

    generation = {}
    for g in grids:
        csv_path, seconds = cohort(workdir, g, args.n)
        generation[g] = seconds
        what = "reused" if seconds is None else f"generated in {seconds:.1f} s"
        print(f"SYNTHETIC cohort {grid_name(g)}, n = {args.n}: {what} ({csv_path.parent})",
              flush=True)
    load_start = os.getloadavg()[0]
    results = {}
    with get_client(n_workers=2, processes=False) as client:
        if args.warm_up:
            t = time.perf_counter()
            csv_path, _ = cohort(workdir, WARM_UP_GRID, N_CLASSES)
            run_grid(WARM_UP_GRID, csv_path, workdir / "warm-up.zarr", client)
            shutil.rmtree(workdir / "warm-up.zarr", ignore_errors=True)
            print(f"warm-up on {grid_name(WARM_UP_GRID)}: {time.perf_counter() - t:.1f} s",
                  flush=True)
        for g in grids:
            t = time.perf_counter()
            store_path = workdir / f"store-{grid_name(g)}.zarr"
            try:
                results[g] = run_grid(g, cohort(workdir, g, args.n)[0], store_path, client,
                                      args.repeat)
            finally:
                shutil.rmtree(store_path, ignore_errors=True)
            r = results[g]
            print(f"{grid_name(g)} (p = {_fmt_p(r['p'])}): " + ", ".join(
                f"{s} {_secs(r[s][0])} s" for s in STAGES) + f"; {time.perf_counter() - t:.0f} s",
                flush=True)
    lines = report(results, args, generation, (load_start, os.getloadavg()[0]))
    lines += ["", f"Total run time {time.perf_counter() - started:.0f} s (cohort generation "
              "and warm-up included)."]
    text = "\n".join(lines)
    print()
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# Cost against p (`{args.command}`)\n\n{text}\n")
    return {"results": results, "lines": lines}


if __name__ == "__main__":
    main()
