"""Benchmark: the screening pass against one epoch's projections (not a test).

A fit with feature grouping and ``screening_percentile < 100`` first projects every training
row with every grouping of the bank, to test each grouping's clusters against the target
(``fgscale/training/_screening.py``). This script times that pass in memory, on one thread,
against the baseline it is made of, run in the same process: one projection of all the rows
with one grouping (what an epoch of training projects, one grouping a minibatch). The ratio
says how many epochs' projections the pass costs; with b groupings it should be about b.

Data: SYNTHETIC rows (standard normal, float32) and random groupings of k = 10% of p, on the
voxel counts of the 4 mm and 2 mm grids; 8 classes, screened for each class apart (the
logistic classifier's screening). Peak memory: the process's peak resident memory increase
during the pass (a lower bound: memory freed earlier counts as free).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_screening.py [--n 200] [--groupings 100]
    .venv/bin/python scripts/bench_screening.py --quick
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: the pass runs on one thread

import numpy as np  # noqa: E402 - after the thread limit above
import torch  # noqa: E402
from benchlib import best_time, comma_list, parse_args, peak_rss_mb  # noqa: E402

GRIDS = {"4mm": 33_854, "2mm": 270_806}


def screening_pass(X, y, bank, k: int, n_classes: int, block: int):
    """The estimator's pass: blocks of rows, their sums, one-vs-rest F, the kept clusters."""
    from fgscale.training._screening import screen_bank

    blocks = ((X[i : i + block], y[i : i + block]) for i in range(0, len(X), block))
    return screen_bank(blocks, bank, k, 20.0, n_outputs=n_classes, one_vs_rest=True)


def measure(p: int, n: int, n_groupings: int, n_classes: int, passes: int, seed: int = 0):
    """Seconds of the pass and of one projection of all rows, and the pass's peak MB."""
    from fgscale.grouping._projection import project

    rng = np.random.default_rng(seed)
    k = p // 10
    X = rng.standard_normal((n, p), dtype=np.float32)
    y = rng.integers(0, n_classes, n)
    bank = torch.from_numpy(np.stack([rng.permutation(np.arange(p) % k)
                                      for _ in range(n_groupings)]).astype(np.int32))
    block = max(1, (64 << 20) // (4 * p))  # an in-memory source's evaluation block
    baseline = best_time(lambda: project(X, bank[0], k), passes)
    before = peak_rss_mb()
    seconds = best_time(lambda: screening_pass(X, y, bank, k, n_classes, block), passes)
    return seconds, baseline, max(0.0, peak_rss_mb() - before)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", type=comma_list, default=list(GRIDS),
                        help="4mm, 2mm, or a number of voxels (default 4mm,2mm)")
    parser.add_argument("--n", type=int, default=200, help="training rows (default 200)")
    parser.add_argument("--groupings", type=int, default=100, help="b (default 100)")
    parser.add_argument("--classes", type=int, default=8, help="(default 8)")
    parser.add_argument("--passes", type=int, default=3, help="the best of (default 3)")
    args = parse_args(parser, dict(grids=["3000"], n=20, groupings=5, passes=1))
    print(f"rows n = {args.n}, b = {args.groupings} groupings of k = 10% of p, "
          f"{args.classes} classes (one-vs-rest); threads: torch {torch.get_num_threads()}; "
          f"best of {args.passes}\n")
    print("| grid | p | screening pass (s) | one projection of all rows (s) | ratio | "
          "pass peak (MB) |")
    print("|---|---|---|---|---|---|")
    for grid in args.grids:
        p = GRIDS[grid] if grid in GRIDS else int(grid)
        seconds, baseline, peak = measure(p, args.n, args.groupings, args.classes, args.passes)
        print(f"| {grid} | {p:,} | {seconds:.2f} | {baseline:.3f} | {seconds / baseline:.0f} | "
              f"{peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
