"""Benchmark: converting 4D runs (one file of many volumes per run), whose blocks hold a few
volumes each, against a plain nibabel loop over the same files.

Writes SYNTHETIC 4D runs (random float32 volumes on the 2 mm grid, gzip level 1) and a mask,
then times, each as a subprocess (start-up included), best of ``--repeat``, with the peak
resident memory of the process and its children:

- the loop: ``X = np.asarray(nibabel.load(path).dataobj, np.float32)[mask]`` for each run,
  one process: every run read once, whole;
- ``fgscale convert`` with the mask, ``--n-workers`` (default 2) and ``--block-rows`` (default
  8: a run of 60 volumes spans 8 blocks).

    .venv/bin/python scripts/bench_convert_4d.py [--n-runs 4] [--volumes 60] [--n-workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
from benchlib import best_monitored, markdown_row, markdown_table, parse_args, scratch_dir

GRID = (91, 109, 91)
LOOP = """
import sys, nibabel as nib, numpy as np
mask = np.asarray(nib.load(sys.argv[1]).dataobj) > 0
for path in sys.argv[2:]:
    X = np.asarray(nib.load(path).dataobj, np.float32)[mask]
"""


def write_runs(folder: Path, n_runs: int, volumes: int, grid) -> list[Path]:
    """The runs and their cohort table in ``folder``, written unless there already."""
    paths = [folder / f"run{i}.nii.gz" for i in range(n_runs)]
    table = folder / "cohort.csv"
    if table.is_file() and table.read_text().count("\n") == n_runs + 1 and all(
            p.is_file() and nib.load(p).shape == (*grid, volumes) for p in paths):
        return paths
    rng = np.random.default_rng(0)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    mask = np.zeros(grid, np.uint8)
    mask[5:-5, 5:-5, 5:-5] = 1
    nib.save(nib.Nifti1Image(mask, affine), folder / "mask.nii.gz")
    paths = []
    for i in range(n_runs):
        plain = folder / f"run{i}.nii"
        data = rng.standard_normal((*grid, volumes), dtype=np.float32)
        nib.save(nib.Nifti1Image(data, affine), plain)
        paths.append(plain.with_name(plain.name + ".gz"))
        with open(plain, "rb") as src, gzip.open(paths[-1], "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        plain.unlink()
    (folder / "cohort.csv").write_text("path,label\n" + "".join(
        f"{p.name},c{i % 2}\n" for i, p in enumerate(paths)))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-runs", type=int, default=4)
    parser.add_argument("--volumes", type=int, default=60)
    parser.add_argument("--block-rows", type=int, default=8)
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs")
    parser.add_argument("--dir", default=None, help="folder of the runs (kept; default temp)")
    args = parse_args(parser, quick=dict(n_runs=2, volumes=6, block_rows=2, repeat=1))
    grid = (20, 24, 20) if args.quick else GRID
    with scratch_dir(args.dir) as folder:
        folder.mkdir(parents=True, exist_ok=True)
        paths = write_runs(folder, args.n_runs, args.volumes, grid)
        mb = sum(p.stat().st_size for p in paths) / 1e6
        loop = best_monitored([sys.executable, "-c", LOOP, str(folder / "mask.nii.gz"),
                               *map(str, paths)], args.repeat)
        store = folder / "s.zarr"
        convert = best_monitored(
            [sys.executable, "-m", "fgscale", "convert", str(folder / "cohort.csv"), "--out",
             str(store), "--mask", str(folder / "mask.nii.gz"), "--block-rows",
             str(args.block_rows), "--n-workers", str(args.n_workers), "--no-progress"],
            args.repeat, lambda: shutil.rmtree(store, ignore_errors=True))
    print(f"SYNTHETIC: {args.n_runs} runs of {args.volumes} volumes on a {grid} grid, "
          f"{mb:.0f} MB of .nii.gz; blocks of {args.block_rows} rows\n")
    markdown_table("what", "seconds", "ratio to the loop", "peak memory (MB)",
                   "ratio to the loop")
    markdown_row("loop: each run read whole once (nibabel)", f"{loop[0]:.2f}", "1.00",
                 f"{loop[1]:.0f}", "1.00")
    markdown_row(f"fgscale convert --n-workers {args.n_workers}", f"{convert[0]:.2f}",
                 f"{convert[0] / loop[0]:.2f}", f"{convert[1]:.0f}", f"{convert[1] / loop[1]:.2f}")


if __name__ == "__main__":
    main()
