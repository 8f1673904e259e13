"""Benchmark the distributed bank build against a serial loop of nilearn's ReNA.

Data: a SYNTHETIC cohort on the HCP 2 mm grid (brain-shaped mask, p = 270,806 voxels) from
:func:`fgscale.images.make_classification_volumes`, written once to a Zarr store (every 4th row
is a test row). The bank is b groupings, each ReNA with k = p / 10 clusters on r = 50 bootstrap
rows of the training rows.

Compared, on the same rows (the bootstrap rows of grouping i, read from the same store):

- nilearn: ``nilearn.regions.ReNA(n_clusters=k, scaling=False)`` (its default ``n_iter=10``),
  one grouping after the other in this process, reads included;
- fgscale: :func:`fgscale.grouping.build_bank` on a LocalCluster of 1 then 2 single-threaded
  worker processes (cluster start and the workers' imports not counted; ``overwrite=True`` so
  every grouping is built).

Run::

    .venv/bin/python scripts/bench_bank.py                  # b = 100 (the paper's bank)
    .venv/bin/python scripts/bench_bank.py --n-groupings 10 # a shorter run
    .venv/bin/python scripts/bench_bank.py --quick          # the smallest: b = 2, r = 10, 16 rows
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
from benchlib import import_on_workers, markdown_row, markdown_table, parse_args, synthetic_store

from fgscale._dask.client import get_client
from fgscale.grouping._bank import bootstrap_rows, grouping_seed
from fgscale.grouping._dask_bank import build_bank


def nilearn_loop(store, n_groupings: int, n_bootstrap: int, k: int, seed: int) -> float:
    """Seconds for a serial loop of nilearn's ReNA over the bank's bootstrap rows."""
    from nilearn.regions import ReNA

    mask_img = nib.Nifti1Image(store.mask.astype(np.uint8), store.affine)
    train = store.train_rows()
    start = time.perf_counter()
    for i in range(n_groupings):
        X = store.read_rows(bootstrap_rows(grouping_seed(seed, i), train, n_bootstrap))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ReNA(mask_img=mask_img, n_clusters=k, scaling=False).fit(X)
    return time.perf_counter() - start


def fgscale_bank(path: Path, n_workers: int, n_groupings: int, n_bootstrap: int, k: int,
                 seed: int) -> tuple[float, np.ndarray]:
    """Seconds for build_bank on a fresh LocalCluster of ``n_workers`` (start excluded)."""
    with get_client(n_workers=n_workers) as client:
        client.wait_for_workers(n_workers)
        import_on_workers(client, "fgscale.grouping._dask_bank")
        start = time.perf_counter()
        bank = build_bank(path, n_groupings=n_groupings, n_bootstrap=n_bootstrap, n_clusters=k,
                          seed=seed, client=client, progress=False, overwrite=True)
        return time.perf_counter() - start, bank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-groupings", type=int, default=100, help="b (default 100)")
    parser.add_argument("--n-bootstrap", type=int, default=50, help="r (default 50)")
    parser.add_argument("--n-samples", type=int, default=80, help="rows of the store")
    parser.add_argument("--store", type=Path, default=Path("/tmp/fgscale-bench/bank-2mm.zarr"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-nilearn", action="store_true")
    args = parse_args(parser, quick=dict(n_groupings=2, n_bootstrap=10, n_samples=16,
                                         store=Path("/tmp/fgscale-bench/bank-2mm-quick.zarr")))

    store = synthetic_store(args.store, args.n_samples, generator="scripts/bench_bank.py")
    p = store.n_features
    k = p // 10
    b, r = args.n_groupings, args.n_bootstrap
    print(f"SYNTHETIC 2 mm store: p = {p}, {store.train_rows().size} train rows; "
          f"b = {b}, r = {r}, k = {k}", flush=True)

    rows = []
    nilearn_s = None
    if not args.skip_nilearn:
        nilearn_s = nilearn_loop(store, b, r, k, args.seed)
        rows.append(("nilearn ReNA, serial loop", "-", nilearn_s))
        print(f"nilearn: {nilearn_s:.1f} s", flush=True)
    banks = {}
    for n_workers in (1, 2):
        seconds, banks[n_workers] = fgscale_bank(args.store, n_workers, b, r, k, args.seed)
        rows.append((f"fgscale build_bank, {n_workers} worker(s)", str(n_workers), seconds))
        print(f"fgscale, {n_workers} worker(s): {seconds:.1f} s", flush=True)
    same = np.array_equal(banks[1], banks[2])

    one = rows[-2][2]
    print()
    print(f"b = {b}, r = {r}, p = {p} (SYNTHETIC 2 mm), k = {k}; 1- and 2-worker banks "
          f"identical: {same}")
    print()
    markdown_table("method", "workers", "seconds", "s / grouping", "speed-up vs nilearn",
                   "vs 1 worker")
    for name, workers, seconds in rows:
        vs_nilearn = f"{nilearn_s / seconds:.2f}x" if nilearn_s else "n/a"
        vs_one = f"{one / seconds:.2f}x" if workers != "-" else ""
        markdown_row(name, workers, f"{seconds:.1f}", f"{seconds / b:.2f}", vs_nilearn, vs_one)


if __name__ == "__main__":
    main()
