"""Benchmark ``fgscale convert`` against plain nibabel on the same files (two modes).

Usage::

    .venv/bin/python scripts/bench_convert.py [--n-files 480] [--grid 2mm] [--block-rows N] [--quick]
    .venv/bin/python scripts/bench_convert.py --end-to-end [--counts 200,1000] [--kinds small,large]
        [--repeat 3] [--cohort-dir DIR] [--out FILE] [--quick]

In-process mode (the default)
-----------------------------
Writes a SYNTHETIC cohort (``fgscale.images.make_cohort``, .nii.gz) once into ``--cohort``,
then reports files/s and MB/s (of float32 in-mask rows) for:

- the baseline: ``nibabel.load(path).get_fdata()`` of every file, one process;
- ``convert`` with a given mask on a LocalCluster of 1 and of 2 workers (one thread each);
- ``convert`` with the computed mask (an extra pass over the data) on 2 workers.

The target is >= 80% of the baseline per worker and near-linear speed-up from 1 to 2 workers.
All files are read once before timing, so every run reads from the page cache alike. Cluster
start and the workers' first import are not timed (paid once per cluster, not per conversion);
conversion time includes everything else (cohort table, headers, store creation, tasks).

End-to-end mode (``--end-to-end``): the start-up tax
-----------------------------------------------------
What a user waits for, start-up included. For each cohort kind and each file count of
``--counts``, two commands run as subprocesses (both pay the interpreter start and their
imports), wall-clock timed, interleaved, best of ``--repeat``:

- the loop: ``python -c ...``, one process: import nibabel and numpy, load the mask, read the
  paths from the cohort CSV, ``X[i] = np.asarray(nibabel.load(path).dataobj)[mask]``;
- ``python -m fgscale convert COHORT.csv --out OUT.zarr --mask MASK --no-progress
  --n-workers 2`` (the store removed before each run).

The ratio is loop seconds / convert seconds; the goal is >= 1.5 at >= 1,000 files and >= 1.0
below. Every file is read once before timing (page cache warm for both). Cohort kinds:

- ``small``: COPIES OF ONE REAL MAP: nilearn's motor-task map
  (``load_sample_motor_activation_image``, 53x63x46 float32 at 3 mm, ~187 KB .nii.gz), copied
  byte for byte; mask = its finite non-zero voxels. Real data, but every file is the same map.
- ``large``: COPIES OF ONE REAL MAP as well: that map resampled onto nilearn's MNI 2 mm grid
  (continuous interpolation), zero outside the MNI brain mask, float32 .nii.gz (~0.9 MB);
  mask = the MNI 2 mm brain mask.
- ``synthetic`` (not in the default kinds): a SYNTHETIC 2 mm cohort from ``make_cohort``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
from benchlib import FixedTable, import_on_workers, markdown_row, markdown_table, parse_args, scratch_dir


def baseline(paths) -> float:
    t = time.perf_counter()
    for p in paths:
        nib.load(p).get_fdata()
    return time.perf_counter() - t


def timed_convert(csv_path, out, client, **kwargs) -> float:
    from fgscale.store._convert import convert

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    convert(csv_path, out, client=client, progress=False, **kwargs)
    seconds = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-files", type=int, default=480)
    parser.add_argument("--grid", default="2mm", choices=["2mm", "4mm"])
    parser.add_argument("--block-rows", type=int, default=None,
                        help="rows per task and shard (default: the store's, ~64 MiB shards)")
    parser.add_argument("--cohort", default=None, help="cohort folder (kept; default temp)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    end = parser.add_argument_group("end-to-end mode (start-up included, subprocesses)")
    end.add_argument("--end-to-end", action="store_true",
                     help="time `python -m fgscale convert` against a plain nibabel loop, both "
                          "as subprocesses (default: the in-process mode)")
    end.add_argument("--counts", default="200,1000", help="file counts, comma-separated")
    end.add_argument("--kinds", default="small,large",
                     help=f"cohort kinds, comma-separated, of {', '.join(KINDS)}")
    end.add_argument("--cohort-dir", default=None,
                     help="folder for the cohorts (kept and reused; default: a temporary one)")
    end.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = parse_args(parser, quick=dict(n_files=8, grid="4mm", repeat=1, counts="8,16",
                                         kinds="small"))
    if args.end_to_end:
        with scratch_dir(args.cohort_dir, prefix="fgscale-bench-convert-e2e-") as scratch:
            report = run_end_to_end(args, Path(scratch))
        if args.out:
            tmp = Path(args.out).with_name(Path(args.out).name + ".tmp")
            tmp.write_text(report)
            os.replace(tmp, args.out)
            print(f"wrote {args.out}")
        return
    with scratch_dir(prefix="fgscale-bench-convert-") as scratch:
        run(args, scratch)


def run(args, scratch: Path) -> None:
    from fgscale._dask.client import get_client
    from fgscale.images._synthetic import brain_mask, grid_geometry, make_cohort

    folder = Path(args.cohort) if args.cohort else scratch / "cohort"
    csv_path = folder / "cohort.csv"
    if not csv_path.exists():
        t = time.perf_counter()
        make_cohort(folder, n_samples=args.n_files, n_classes=4, grid=args.grid, seed=0)
        print(f"wrote {args.n_files} synthetic {args.grid} files in {time.perf_counter() - t:.0f} s")
    shape, affine, n_voxels = grid_geometry(args.grid)
    mask = brain_mask(shape, n_voxels)
    mask_path = scratch / "mask.nii.gz"
    nib.save(nib.Nifti1Image(mask.astype(np.uint8), affine), mask_path)
    paths = sorted(folder.glob("synthetic_*.nii*"))[: args.n_files]
    mb = len(paths) * n_voxels * 4 / 1e6
    baseline(paths)  # warm the page cache

    # Runs are interleaved (baseline, 1 worker, 2 workers, ...) and the best of each is kept, so
    # that a busy moment on a shared machine does not land on one contender only.
    names = ["nibabel get_fdata, 1 process", "fgscale convert, given mask, 1 worker",
             "fgscale convert, given mask, 2 workers", "fgscale convert, computed mask, 2 workers"]
    best = dict.fromkeys(names, np.inf)
    kw = dict(block_rows=args.block_rows)
    with contextlib.ExitStack() as stack:
        clients = {}
        for n_workers in (1, 2):
            # the cluster `fgscale convert` itself starts (fgscale's worker settings)
            clients[n_workers] = stack.enter_context(get_client(n_workers=n_workers))
            import_on_workers(clients[n_workers], "fgscale.store._convert")
            timed_convert(csv_path, scratch / "warm.zarr", clients[n_workers], mask=mask_path, **kw)
        for _ in range(args.repeat):
            runs = [baseline(paths),
                    timed_convert(csv_path, scratch / "b.zarr", clients[1], mask=mask_path, **kw),
                    timed_convert(csv_path, scratch / "b.zarr", clients[2], mask=mask_path, **kw),
                    timed_convert(csv_path, scratch / "b.zarr", clients[2], **kw)]
            for name, seconds in zip(names, runs, strict=True):
                best[name] = min(best[name], seconds)
    base = best[names[0]]
    rows = [(name, workers, best[name]) for name, workers in zip(names, (1, 1, 2, 2), strict=True)]

    print(f"{len(paths)} files, grid {args.grid} (p = {n_voxels}), {mb:.0f} MB of float32 rows, "
          f"block_rows {args.block_rows}, best of {args.repeat}")
    table = FixedTable(("run", 46, "s"), ("seconds", 8, ".2f"), ("files/s", 8, ".1f"),
                       ("MB/s", 7, ".0f"), ("x baseline", 10, ".2f"), ("per worker", 10, ".2f"))
    table.header()
    for name, workers, seconds in rows:
        ratio = base / seconds
        table.row(name, seconds, len(paths) / seconds, mb / seconds, ratio, ratio / workers)


# ------------------------------------------------------------------------ end-to-end mode

KINDS = ("small", "large", "synthetic")

DESCRIPTIONS = {
    "small": "COPIES OF ONE REAL MAP: nilearn's motor-task map (53x63x46 float32, 3 mm), "
             "copied as-is; mask = its finite non-zero voxels",
    "large": "COPIES OF ONE REAL MAP: the same map resampled onto nilearn's MNI 2 mm grid, "
             "zero outside the MNI brain mask, float32; mask = the MNI 2 mm brain mask",
    "synthetic": "SYNTHETIC 2 mm cohort (fgscale make_cohort, 4 classes, seed 0); mask = the "
                 "synthetic brain mask",
}

# The user's plain loop: one process, no cluster. argv: cohort CSV, mask.
LOOP_CODE = """
import csv, os, sys
import nibabel
import numpy as np
cohort, mask_path = sys.argv[1], sys.argv[2]
mask = np.asarray(nibabel.load(mask_path).dataobj) != 0
folder = os.path.dirname(os.path.abspath(cohort))
with open(cohort, newline="") as f:
    paths = [os.path.join(folder, row["path"]) for row in csv.DictReader(f)]
X = np.empty((len(paths), int(mask.sum())), np.float32)
for i, path in enumerate(paths):
    X[i] = np.asarray(nibabel.load(path).dataobj)[mask]
"""


def _copies(folder: Path, n: int, write_first) -> list[Path]:
    """``map_0000.nii.gz`` ... of ``folder``: the first written by ``write_first(path)`` (unless
    there), the others byte-for-byte copies of it (those not there yet)."""
    paths = [folder / f"map_{i:04d}.nii.gz" for i in range(n)]
    if not paths[0].exists():
        write_first(paths[0])
    for path in paths[1:]:
        if not path.exists():
            shutil.copy(paths[0], path)
    return paths


def build_cohort(kind: str, folder: Path, n: int) -> tuple[list[Path], Path]:
    """The first ``n`` files of a cohort of ``kind`` in ``folder`` (made or completed there) and
    its mask file."""
    folder.mkdir(parents=True, exist_ok=True)
    mask_path = folder / "mask.nii.gz"
    if kind == "synthetic":
        from fgscale.images._synthetic import brain_mask, grid_geometry, make_cohort

        paths = [folder / f"synthetic_{i:05d}.nii.gz" for i in range(n)]
        if not all(p.exists() for p in paths):
            make_cohort(folder, n_samples=n, n_classes=4, grid="2mm", seed=0)
        if not mask_path.exists():
            shape, affine, n_voxels = grid_geometry("2mm")
            nib.save(nib.Nifti1Image(brain_mask(shape, n_voxels).astype(np.uint8), affine),
                     mask_path)
        return paths, mask_path

    from nilearn import datasets

    source = datasets.load_sample_motor_activation_image()  # shipped with nilearn: no download
    if kind == "small":
        if not mask_path.exists():
            img = nib.load(source)
            data = np.asarray(img.dataobj)
            mask = np.isfinite(data) & (data != 0)
            nib.save(nib.Nifti1Image(mask.astype(np.uint8), img.affine), mask_path)
        return _copies(folder, n, lambda path: shutil.copy(source, path)), mask_path
    if kind == "large":
        mni = datasets.load_mni152_brain_mask(resolution=2)
        if not mask_path.exists():
            nib.save(mni, mask_path)

        def write_first(path):
            from nilearn.image import resample_to_img

            img = resample_to_img(nib.load(source), mni, interpolation="continuous",
                                  force_resample=True, copy_header=True)
            data = np.asarray(img.dataobj, dtype=np.float32)
            data[np.asarray(mni.dataobj) == 0] = 0
            out = nib.Nifti1Image(data, mni.affine)
            out.set_data_dtype(np.float32)
            nib.save(out, path)

        return _copies(folder, n, write_first), mask_path
    raise ValueError(f"unknown cohort kind {kind!r}: one of {', '.join(KINDS)}")


def write_table(paths: list[Path], csv_path: Path) -> None:
    """A cohort table ``path,label`` (paths relative to its folder, labels "a", "b", "a"...)."""
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for i, path in enumerate(paths):
            writer.writerow([os.path.relpath(path, csv_path.parent), "ab"[i % 2]])


def timed(cmd: list) -> float:
    """Wall seconds of ``cmd`` as a subprocess (its output captured; shown if it fails)."""
    cmd = [str(c) for c in cmd]
    t = time.perf_counter()
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as error:
        print(f"failed: {' '.join(cmd)}\n{error.stdout}{error.stderr}", file=sys.stderr)
        raise
    return time.perf_counter() - t


def goal(n_files: int) -> float:
    return 1.5 if n_files >= 1000 else 1.0


def run_end_to_end(args, scratch: Path) -> str:
    """Time the loop and ``fgscale convert`` as subprocesses; print the table and return it as
    Markdown."""
    counts = sorted({int(c) for c in str(args.counts).split(",") if c.strip()})
    kinds = [k.strip() for k in str(args.kinds).split(",") if k.strip()]
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"unknown cohort kind {kind!r}: one of {', '.join(KINDS)}")
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in kinds:
        folder = scratch / kind
        t = time.perf_counter()
        paths, mask_path = build_cohort(kind, folder, max(counts))
        print(f"{kind}: {len(paths)} files ready in {time.perf_counter() - t:.1f} s ({folder}); "
              f"{DESCRIPTIONS[kind]}", flush=True)
        for path in paths:  # warm the page cache: every run reads from memory alike
            path.read_bytes()
        mask_path.read_bytes()
        p = int((np.asarray(nib.load(mask_path).dataobj) != 0).sum())
        out = folder / "out.zarr"
        for n in counts:
            csv_path = folder / f"cohort_{n}.csv"
            write_table(paths[:n], csv_path)
            mb = sum(path.stat().st_size for path in paths[:n]) / n / 1e6
            loop_cmd = [sys.executable, "-c", LOOP_CODE, csv_path, mask_path]
            convert_cmd = [sys.executable, "-m", "fgscale", "convert", csv_path, "--out", out,
                           "--mask", mask_path, "--no-progress", "--n-workers", "2"]
            best = {"loop": np.inf, "convert": np.inf}
            for _ in range(args.repeat):  # interleaved: a busy moment hits both alike
                best["loop"] = min(best["loop"], timed(loop_cmd))
                shutil.rmtree(out, ignore_errors=True)
                best["convert"] = min(best["convert"], timed(convert_cmd))
            shutil.rmtree(out, ignore_errors=True)
            ratio = best["loop"] / best["convert"]
            rows.append((kind, n, p, mb, best["loop"], best["convert"], ratio, goal(n),
                         "ok" if ratio >= goal(n) else "MISS"))
            print(f"  {kind} {n} files: loop {best['loop']:.2f} s, convert "
                  f"{best['convert']:.2f} s", flush=True)

    print(f"\nend-to-end, subprocesses (interpreter start and imports included), best of "
          f"{args.repeat}; ratio = loop s / convert s; convert --n-workers 2")
    table = FixedTable(("kind", 9, "s"), ("files", 6, "d"), ("p", 7, "d"), ("MB/file", 7, ".3f"),
                       ("loop s", 7, ".3f"), ("convert s", 9, ".3f"), ("ratio", 6, ".3f"),
                       ("goal", 6, "s"), ("verdict", 7, "s"))
    table.header()
    for kind, n, p, mb, loop, conv, ratio, target, verdict in rows:
        table.row(kind, n, p, mb, loop, conv, ratio, f">= {target}", verdict)
    for kind in kinds:
        print(f"{kind}: {DESCRIPTIONS[kind]}")

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print("# fgscale convert against a plain nibabel loop, start-up included\n")
        print(f"Both run as subprocesses (interpreter start and imports included), timed by "
              f"wall clock, interleaved, best of {args.repeat}. The loop: one process, "
              f"`X[i] = np.asarray(nibabel.load(path).dataobj)[mask]`. Convert: `python -m "
              f"fgscale convert COHORT.csv --out OUT.zarr --mask MASK --no-progress --n-workers "
              f"2`. Ratio = loop s / convert s. Page cache warm. MB/file: compressed size.\n")
        for kind in kinds:
            print(f"- `{kind}`: {DESCRIPTIONS[kind]}")
        print()
        markdown_table("cohort kind", "files", "p (voxels)", "MB/file", "loop s", "convert s",
                       "ratio", "goal", "verdict")
        for kind, n, p, mb, loop, conv, ratio, target, verdict in rows:
            markdown_row(kind, n, f"{p:,}", f"{mb:.3f}", f"{loop:.3f}", f"{conv:.3f}",
                         f"{ratio:.3f}", f">= {target}", verdict)
    return text.getvalue()


if __name__ == "__main__":
    main()
