"""Benchmark: appending new images to a converted store (``fgscale convert --append``) against
converting the whole, grown table afresh.

Writes a SYNTHETIC cohort (``make_cohort``, 3D .nii.gz maps, a mask computed from the images)
and a table of its first rows, converts that table once, then times, each as a subprocess
(start-up included), best of ``--repeat``, with the peak resident memory of the process and its
children:

- the whole table converted afresh into a new store (the reference);
- ``--append`` of the rows after the first into a copy of the first rows' store (copied before
  each run, the copy not timed): a read of the new images to check that the computed mask fits
  them, then their conversion, and that of the store's last block when it was partial.

The appended store is checked equal to the fresh one (every row, label and the mask).

    .venv/bin/python scripts/bench_append.py [--n-samples 400] [--n-new 40] [--grid 2mm] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys

import numpy as np
from benchlib import (
    best_monitored,
    markdown_row,
    markdown_table,
    parse_args,
    run_monitored,
    scratch_dir,
)

from fgscale.images import make_cohort
from fgscale.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=400, help="rows of the grown table")
    parser.add_argument("--n-new", type=int, default=40, help="rows appended")
    parser.add_argument("--grid", default="2mm", help="make_cohort's grid (2mm: p = 270,806)")
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs")
    parser.add_argument("--dir", default=None, help="work folder (kept; default temporary)")
    args = parse_args(parser, quick=dict(n_samples=24, n_new=5, grid="4mm", repeat=1))
    if not 0 < args.n_new < args.n_samples:
        parser.error(f"--n-new must be in 1..{args.n_samples - 1}, got {args.n_new}")
    with scratch_dir(args.dir) as folder:
        table = make_cohort(folder / "cohort", n_samples=args.n_samples, grid=args.grid,
                            n_subjects=max(2, args.n_samples // 20), seed=0)
        lines = table.read_text().splitlines(keepends=True)
        first = table.with_name("first.csv")
        first.write_text("".join(lines[:1 + args.n_samples - args.n_new]))
        base, grown, fresh = folder / "first.zarr", folder / "grown.zarr", folder / "fresh.zarr"
        shutil.rmtree(base, ignore_errors=True)

        def convert(cohort, out, *extra):
            return [sys.executable, "-m", "fgscale", "convert", str(cohort), "--out", str(out),
                    "--n-workers", str(args.n_workers), "--no-progress", *extra]

        run_monitored(convert(first, base))

        def copy_base():
            shutil.rmtree(grown, ignore_errors=True)
            shutil.copytree(base, grown)

        whole = best_monitored(convert(table, fresh), args.repeat,
                               lambda: shutil.rmtree(fresh, ignore_errors=True))
        append = best_monitored(convert(table, grown, "--append"), args.repeat, copy_base)
        a, b = open_store(grown), open_store(fresh)
        equal = (np.array_equal(a.X[:], b.X[:]) and np.array_equal(a.y, b.y)
                 and np.array_equal(a.mask, b.mask) and list(a.source) == list(b.source))
        p = b.n_features
    print(f"SYNTHETIC: {args.n_samples} maps on the {args.grid} grid (p = {p}), {args.n_new} of "
          f"them appended; --n-workers {args.n_workers}; appended store equal to the fresh "
          f"one: {equal}\n")
    markdown_table("what", "rows converted", "seconds", "ratio", "peak memory (MB)", "ratio")
    markdown_row("the whole table afresh", args.n_samples, f"{whole[0]:.2f}", "1.00",
                 f"{whole[1]:.0f}", "1.00")
    markdown_row("--append of the new rows", args.n_new, f"{append[0]:.2f}",
                 f"{append[0] / whole[0]:.2f}", f"{append[1]:.0f}", f"{append[1] / whole[1]:.2f}")
    if not equal:
        sys.exit("the appended store differs from the fresh one")


if __name__ == "__main__":
    main()
