"""Benchmark zarr layouts of X for the two access patterns of fgscale.

Usage::

    .venv/bin/python scripts/bench_store.py [--rows 1000] [--features 270806] [--out DIR] [--quick]

For each layout it writes the same random float32 matrix (n_rows, p), then reports rows/s and
MB/s for (a) random 200-row minibatches (rows drawn without replacement, read the way
``Store.read_rows`` does: one sorted orthogonal selection) and (b) sequential blocks of 256
rows, against (c) the raw sequential read of the same files with ``numpy.fromfile``: the limit
on this machine. Everything is read warm (the files fit in the page cache), which is the regime
of a store smaller than RAM; it isolates the decoding and chunk-lookup cost of each layout.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
import zarr
from benchlib import FixedTable, chunk_files, parse_args, scratch_dir
from zarr.codecs import ZstdCodec

from fgscale.store._shards import ShardRowReader


def layouts(n_rows: int, p: int, shard_rows: int) -> dict[str, dict]:
    return {
        "64-row chunks, zstd": dict(chunks=(64, p), compressors=ZstdCodec(level=3)),
        f"(1,p) chunks in ({shard_rows},p) shards, raw": dict(
            chunks=(1, p), shards=(shard_rows, p), compressors=None),
        f"(1,p) chunks in ({shard_rows},p) shards, zstd": dict(
            chunks=(1, p), shards=(shard_rows, p), compressors=ZstdCodec(level=3)),
    }


def raw_read(path: Path) -> tuple[float, int]:
    """Seconds and bytes to read every chunk/shard file of an array with numpy.fromfile."""
    files = chunk_files(path)
    t = time.perf_counter()
    nbytes = sum(np.fromfile(f, dtype=np.uint8).size for f in files)
    return time.perf_counter() - t, nbytes


def readers(arr: zarr.Array) -> dict:
    """Row readers to compare: zarr's orthogonal selection, and fgscale's when it applies."""
    out = {"zarr oindex": lambda rows: arr.get_orthogonal_selection((rows, slice(None)))}
    direct = ShardRowReader.from_array(arr)
    if direct is not None:
        def read(rows):  # what Store.read_rows does for sorted rows
            out = np.empty((rows.size, arr.shape[1]), np.float32)
            direct.read(rows, out, np.arange(rows.size))
            return out

        out["fgscale Store.read_rows"] = read
    return out


def bench(path: Path, X: np.ndarray, spec: dict, batches: int, rng) -> list[dict]:
    n, p = X.shape
    mb_row = p * 4 / 1e6
    arr = zarr.create_array(str(path), shape=X.shape, dtype="float32", fill_value=0.0, **spec)
    t = time.perf_counter()
    step = spec.get("shards", spec["chunks"])[0]
    for start in range(0, n, step):
        arr[start:start + step] = X[start:start + step]
    write = time.perf_counter() - t
    disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    arr = zarr.open_array(str(path), mode="r")
    arr[0:1]  # warm the metadata
    raw, raw_bytes = raw_read(path)
    results = []
    for reader_name, read in readers(arr).items():
        t = time.perf_counter()
        for _ in range(batches):
            rows = np.sort(rng.choice(n, size=200, replace=False))
            batch = read(rows)
        rand = (time.perf_counter() - t) / batches
        if not np.array_equal(batch, X[rows]):
            raise RuntimeError(f"{reader_name} read wrong rows")
        t = time.perf_counter()
        for start in range(0, n, 256):
            read(np.arange(start, min(start + 256, n)))
        seq = time.perf_counter() - t
        results.append(dict(reader=reader_name, write_mbs=n * mb_row / write,
                            disk_mb=disk / 1e6, rand_rows=200 / rand,
                            rand_mbs=200 * mb_row / rand, rand_ms=rand * 1e3,
                            seq_rows=n / seq, seq_mbs=n * mb_row / seq,
                            raw_mbs=raw_bytes / 1e6 / raw))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--features", type=int, default=270_806, help="p (HCP 2 mm: 270806)")
    parser.add_argument("--shard-rows", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--out", default=None, help="scratch folder (default: a temp dir)")
    args = parse_args(parser, quick=dict(rows=300, features=5_000, shard_rows=16, batches=3))
    rng = np.random.default_rng(0)
    # Smooth-ish noise, like masked contrast maps: a random walk along the voxels plus noise.
    X = rng.standard_normal((args.rows, args.features), dtype=np.float32)
    X += np.cumsum(rng.standard_normal(args.features, dtype=np.float32)) * 0.01
    print(f"X: {args.rows} x {args.features} float32 = {X.nbytes / 1e6:.0f} MB; "
          f"{args.batches} random 200-row batches; sequential blocks of 256 rows; warm reads")
    table = FixedTable(("layout", 40, "s"), ("reader", 24, "s"), ("write MB/s", 10, ".0f"),
                       ("disk MB", 8, ".0f"), ("rand ms", 8, ".1f"), ("rand rows/s", 11, ".0f"),
                       ("rand MB/s", 9, ".0f"), ("seq rows/s", 10, ".0f"), ("seq MB/s", 9, ".0f"),
                       ("raw MB/s", 9, ".0f"), ("rand/raw", 8, ".2f"))
    table.header()
    with scratch_dir(args.out) as scratch:
        for i, (name, spec) in enumerate(layouts(args.rows, args.features, args.shard_rows).items()):
            path = scratch / f"layout{i}.zarr"
            shutil.rmtree(path, ignore_errors=True)
            for r in bench(path, X, spec, args.batches, rng):
                table.row(name, r["reader"], r["write_mbs"], r["disk_mb"], r["rand_ms"], r["rand_rows"],
                          r["rand_mbs"], r["seq_rows"], r["seq_mbs"], r["raw_mbs"],
                          r["rand_mbs"] / r["raw_mbs"])
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
