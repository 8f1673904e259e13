"""Soak: many epochs of streamed training on a LocalCluster, and what the central process holds
after each one.

Trains a FeatureGroupingClassifier (feature grouping, standardized rows, a validation pass
every epoch, no early stop) on a SYNTHETIC store of random rows, streaming from the store, and
after every epoch records, in the central process: its resident memory (VmRSS), its threads
(Python's and the OS's), its open file descriptors, the client's futures, the tasks the
scheduler knows, and the maps the block pool has made; with worker processes, their resident
memory too. Leaks show as growth after the first epoch (which opens the store, reads the bank,
starts thread pools); the script prints one row per epoch, then the growth from the end of
epoch 1 to the last epoch, against the bounds of issue 14: RSS within 10%, no more threads,
descriptors, futures or scheduler tasks. It measures, it does not time.

With worker processes, every block reaches the central process through a socket as a fresh
buffer; a validation block of full rows can be tens of MB, and glibc's adaptive mmap threshold
keeps freed blocks in the heap. The streamed source calls ``malloc_trim`` after each pass of
full rows, which halves that step (figures in the README's
soak section); ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment removes it. Thread workers, the
default of training, hand blocks over without a copy.

    .venv/bin/python scripts/bench_soak.py [--epochs 50] [--rows 2000] [--p 20000]
        [--workers threads|processes|both] [--dir DIR] [--quick]

tests/test_faults_soak.py runs :func:`soak` for a few epochs on a tiny store.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from benchlib import FixedTable, parse_args, random_store, scratch_dir

from fgscale.store._buffers import POOL

BANK = dict(n_clusters=0.1, n_groupings=10, n_bootstrap=20)
COLUMNS = ("rss_mb", "threads", "os_threads", "fds", "sockets", "futures", "scheduler_tasks",
           "pool_maps")


def _rss_mb(pid: int | str = "self") -> float:
    """Resident memory now (not the peak), MB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/PID/status")


def _worker_rss_mb() -> float:
    return _rss_mb()


def _descriptors() -> tuple[int, int]:
    """Open file descriptors of this process, and how many of them are sockets (Dask's
    connections; the rest are files and pipes)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return len(links), sum(link.startswith("socket:") for link in links)


def _scheduler_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _settled(count, timeout: float = 2.0) -> int:
    """``count()`` once releases in flight have gone through (0 reached, or ``timeout``): a
    future released a moment ago is counted until the client's event loop has run, and its
    task until the scheduler has heard of it."""
    deadline = time.monotonic() + timeout
    value = count()
    while value and time.monotonic() < deadline:
        time.sleep(0.01)
        value = count()
    return value


def sample(client, processes: bool) -> dict:
    """What the central process holds now."""
    row = {
        "rss_mb": _rss_mb(),
        "threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        **dict(zip(("fds", "sockets"), _descriptors(), strict=True)),
        "futures": _settled(lambda: len(client.futures)),
        "scheduler_tasks": _settled(lambda: client.run_on_scheduler(_scheduler_tasks)),
        "pool_maps": POOL.fresh,  # with thread workers, the workers' pool is this process's
    }
    if processes:
        row["workers_rss_mb"] = sum(client.run(_worker_rss_mb).values())
    return row


def soak(store_path, client, *, epochs: int, processes: bool, batch_size: int = 64,
         seed: int = 0) -> list[dict]:
    """Train for ``epochs`` epochs on ``store_path`` with ``client``; return one sample per
    epoch (:func:`sample`, plus ``epoch`` and ``seconds``), taken at the end of the epoch."""
    from fgscale import FeatureGroupingClassifier
    from fgscale.training import History

    samples: list[dict] = []
    clock = [time.perf_counter()]

    class Sampled(History):
        def epoch_end(self, metrics: dict) -> None:
            super().epoch_end(metrics)
            now = time.perf_counter()
            samples.append({"epoch": metrics["epoch"] + 1, "seconds": now - clock[0],
                            **sample(client, processes)})
            clock[0] = now

    clf = FeatureGroupingClassifier(**BANK, batch_size=batch_size, max_epochs=epochs,
                                    early_stopping=True, patience=epochs + 1, refit=False,
                                    learning_rate=0.01, random_state=seed)
    clf.fit(store_path, client=client, checkpoint=Sampled)
    return samples


def growth(samples: list[dict]) -> dict:
    """From the end of the first epoch to the largest value after it: RSS as a fraction, the
    counts as differences (0: nothing accumulates)."""
    first, later = samples[0], samples[1:] or samples[:1]
    out = {"rss": max(s["rss_mb"] for s in later) / first["rss_mb"] - 1}
    for name in COLUMNS[1:]:
        out[name] = max(s[name] for s in later) - first[name]
    if "workers_rss_mb" in first:
        out["workers_rss"] = max(s["workers_rss_mb"] for s in later) / first["workers_rss_mb"] - 1
    return out


def report(samples: list[dict], kind: str) -> dict:
    """Print the per-epoch table and the growth against the bounds; return the growth."""
    processes = "workers_rss_mb" in samples[0]
    table = FixedTable(("epoch", 5, "d"), ("seconds", 8, ".2f"), ("rss_mb", 8, ".1f"),
                       ("threads", 7, "d"), ("os_thr", 6, "d"), ("fds", 5, "d"), ("socks", 5, "d"),
                       ("futures", 7, "d"), ("sched", 5, "d"), ("pool", 5, "d"),
                       *([("wrk_rss", 8, ".1f")] if processes else []))
    print(f"\n{kind}: one row per epoch, sampled at its end in the central process (epoch 1's "
          "seconds include the bank and the statistics)")
    table.header()
    for s in samples:
        table.row(s["epoch"], s["seconds"], *(s[c] for c in COLUMNS),
                  *([s["workers_rss_mb"]] if processes else []))
    g = growth(samples)
    flat = {"rss": g["rss"] <= 0.10, **{c: g[c] <= 0 for c in COLUMNS[1:]}}
    print(f"growth after epoch 1 (max of epochs 2..{samples[-1]['epoch']} minus epoch 1): "
          f"central RSS {100 * g['rss']:+.1f}% (bound +10%: "
          f"{'ok' if flat['rss'] else 'EXCEEDED'})"
          + (f", workers' RSS {100 * g['workers_rss']:+.1f}%" if processes else ""))
    print("  " + ", ".join(f"{c} {g[c]:+d} ({'ok' if flat[c] else 'GREW'})" for c in COLUMNS[1:]))
    half, last = samples[len(samples) // 2], samples[-1]  # a one-off step, or a steady climb?
    print(f"second half (end of epoch {half['epoch']} to end of epoch {last['epoch']}): central "
          f"RSS {100 * (last['rss_mb'] / half['rss_mb'] - 1):+.1f}%, "
          + ", ".join(f"{c} {last[c] - half[c]:+d}" for c in COLUMNS[1:]))
    return g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--p", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--workers", choices=["threads", "processes", "both"], default="both",
                        help="thread workers in this process (training's default), worker "
                             "processes, or one run of each")
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder for the store (default: a temporary one, removed)")
    args = parse_args(parser, quick=dict(epochs=5, rows=200, p=2_000))

    from fgscale._dask.client import get_client

    kinds = ["threads", "processes"] if args.workers == "both" else [args.workers]
    with scratch_dir(args.dir, prefix="fgscale-soak-") as folder:
        path = folder / f"soak_{args.rows}x{args.p}.zarr"
        store = random_store(path, args.rows, args.p, n_classes=4,
                             generator="scripts/bench_soak.py")
        print(f"SYNTHETIC store {path}: {store.n_samples} x {store.n_features} float32; "
              f"{args.epochs} epochs, batch {args.batch_size}, {args.n_workers} workers")
        for kind in kinds:
            processes = kind == "processes"
            with get_client(n_workers=args.n_workers, processes=processes) as client:
                samples = soak(path, client, epochs=args.epochs, processes=processes,
                               batch_size=args.batch_size)
            report(samples, f"{args.n_workers} worker {kind}")


if __name__ == "__main__":
    main()
