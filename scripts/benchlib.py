"""What the benchmark scripts share: timing, a ``--quick`` option, tables, SYNTHETIC stores.

Each ``scripts/bench_*.py`` runs as ``python scripts/bench_x.py``, which puts ``scripts/`` on
sys.path: ``import benchlib`` works there. Nothing here starts a cluster or imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

# ------------------------------------------------------------------------------ options


def parse_args(parser: argparse.ArgumentParser, quick: dict, help: str | None = None):
    """``parser.parse_args()`` with a ``--quick`` option: the values of ``quick`` (argument
    destinations) become the defaults; options given on the command line still win."""
    shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items())
    parser.add_argument("--quick", action="store_true",
                        help=help or f"the smallest run that exercises every step ({shown})")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args()
    return args


# ------------------------------------------------------------------------ earlier runs


def comma_list(text: str) -> list[str]:
    """The items of an option's comma list, spaces around them and blank ones dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def path_list(text: str) -> list[Path]:
    """The paths of a comma list (an option's value such as ``--from-csv a.csv,b.csv``)."""
    return [Path(part) for part in comma_list(text)]


def read_csv_rows(paths, row_type, key: tuple[str, ...], option: str = "--from-csv") -> list:
    """The rows of earlier runs' CSV files as ``row_type`` dataclasses (fields converted by
    their annotations, ``int`` or ``float``, else ``str``), in file order.

    A missing file, columns other than ``row_type``'s, or a row whose ``key`` fields another
    row already had (one measurement in two files) ends the script with a one-line message
    naming the file (SystemExit), not a traceback.
    """
    import csv

    types = row_type.__annotations__
    convert = {"int": int, "float": float}
    rows, seen = [], {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise SystemExit(f"{path}: no such file ({option})")
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != list(types):
                raise SystemExit(f"{path}: columns {reader.fieldnames}, expected those this "
                                 f"script's --csv writes: {', '.join(types)}")
            for line, values in enumerate(reader, start=2):
                try:
                    row = row_type(**{k: convert.get(types[k], str)(v) for k, v in values.items()})
                except (TypeError, ValueError) as err:
                    raise SystemExit(f"{path}, line {line}: {err}") from None
                ident = tuple(getattr(row, k) for k in key)
                if ident in seen:
                    named = " ".join(f"{k}={v}" for k, v in zip(key, ident, strict=True))
                    raise SystemExit(f"{path}: the fit {named} is also in {seen[ident]}; each "
                                     "fit may come from one file only")
                seen[ident] = path
                rows.append(row)
    return rows


@contextlib.contextmanager
def csv_writer(path, row_type) -> Iterator[Callable]:
    """A function that writes one ``row_type`` dataclass as a row of the CSV at ``path`` as
    each result comes (flushed, so that an interrupted run keeps what it measured; read back by
    :func:`read_csv_rows`), or does nothing where ``path`` is None."""
    import csv

    if path is None:
        yield lambda row: None
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row_type.__dataclass_fields__))
        writer.writeheader()

        def write(row) -> None:
            writer.writerow(row.__dict__)
            f.flush()
        yield write


# ------------------------------------------------------------------------------- timing


def timings(fn: Callable, repeats: int, *, warm_up: bool = False) -> tuple[list[float], object]:
    """Wall seconds of ``repeats`` calls of ``fn()`` (after one untimed call if ``warm_up``),
    and the result of the last call."""
    if warm_up:
        fn()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def median_time(fn: Callable, repeats: int, *, warm_up: bool = True) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn()``, after one untimed warm-up call."""
    return statistics.median(timings(fn, repeats, warm_up=warm_up)[0])


def best_time(fn: Callable, passes: int) -> float:
    """Shortest wall seconds of ``passes`` calls of ``fn()``: a busy moment of the machine does
    not lower the figure."""
    return min(timings(fn, passes)[0])


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MB (Linux: ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _children() -> dict[int, list[int]]:
    """parent pid -> child pids, for every process in /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in brackets may hold spaces
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def proc_status_kib(field: str, pid: int | str = "self") -> int | None:
    """A memory field of a live process's /proc status, KiB (for example VmRSS, or VmHWM: the
    kernel's record of its peak resident memory); None if the process or field is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run_monitored(cmd: list[str], *, interval: float = 0.1, **kwargs) -> tuple[float, dict]:
    """Run ``cmd``; return its wall seconds and the peak resident memory (MB) of it and of every
    process it started (Dask workers, their nannies), read from /proc every ``interval`` s.

    The kernel records each process's peak (VmHWM), so a short spike between two reads is not
    missed; only what a process adds after its last read before it exits is. Raises
    ``subprocess.CalledProcessError`` (with the output) when the command fails.
    """
    import subprocess
    import threading

    peaks: dict[int, tuple[str, int]] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)
    done = threading.Event()

    def poll():
        while not done.is_set():
            tree, todo = _children(), [proc.pid]
            while todo:
                pid = todo.pop()
                todo.extend(tree.get(pid, []))
                kib = proc_status_kib("VmHWM", pid)
                if kib is not None:
                    role = "command" if pid == proc.pid else "child"
                    peaks[pid] = (role, max(kib, peaks.get(pid, (role, 0))[1]))
            done.wait(interval)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    output, _ = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, output)
    return seconds, {"output": output, "peaks_mb": {pid: (role, kib / 1024)
                                                    for pid, (role, kib) in peaks.items()}}


def best_monitored(cmd: list[str], repeat: int, before: Callable = lambda: None
                   ) -> tuple[float, float]:
    """Best wall seconds of ``repeat`` runs of ``cmd`` (:func:`run_monitored`; ``before`` is
    called, untimed, before each) and its peak memory over them (MB: the command's process plus
    its children at their peaks)."""
    best, peak = None, 0.0
    for _ in range(repeat):
        before()
        seconds, info = run_monitored(cmd)
        best = seconds if best is None else min(best, seconds)
        peak = max(peak, sum(mb for _, mb in info["peaks_mb"].values()))
    return best, peak


def import_on_workers(client, module: str) -> None:
    """Import ``module`` on every worker, so that a timing excludes the workers' first import."""
    client.run(__import__, module)


# ------------------------------------------------------------------------------- tables


def markdown_table(*titles: str) -> None:
    """Print the header and the rule of a Markdown table."""
    markdown_row(*titles)
    print("|" + "---|" * len(titles))


def markdown_row(*cells) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


class FixedTable:
    """A plain-text table of fixed-width columns ``(title, width, format)``, e.g.
    ``("seconds", 8, ".2f")``: text columns (format ``"s"``) are left-aligned, numbers right."""

    def __init__(self, *columns: tuple[str, int, str]):
        self.columns = columns

    def header(self) -> None:
        line = " ".join(f"{t:{w}s}" if f == "s" else f"{t:>{w}s}" for t, w, f in self.columns)
        print(line)
        print("-" * len(line))

    def row(self, *values) -> None:
        print(" ".join(f"{v:{w}{f}}" for v, (_, w, f) in zip(values, self.columns, strict=True)))


# ---------------------------------------------------------------------- files and stores


@contextlib.contextmanager
def scratch_dir(path=None, prefix: str = "fgscale-bench-") -> Iterator[Path]:
    """``path`` (kept), or a new temporary folder removed at the end."""
    if path is not None:
        yield Path(path)
        return
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def chunk_files(array_path: Path) -> list[Path]:
    """The chunk (or shard) files of a Zarr v3 array, sorted."""
    return sorted(f for f in (Path(array_path) / "c").rglob("*") if f.is_file())


def reuse_store(path: Path, write: Callable, accept: Callable = lambda store: True):
    """The complete store at ``path`` if there is one that ``accept`` takes, else the store
    that ``write(path)`` writes and returns."""
    from fgscale.store import open_store

    try:
        store = open_store(path)
        if accept(store):
            return store
    except ValueError:  # StoreError: none there, or not complete
        pass
    return write(path)


def synthetic_store(path: Path, n_samples: int, *, seed: int = 0, generator: str):
    """A SYNTHETIC 2 mm cohort (``make_classification_volumes``, 4 classes, every 4th row a
    test row) as a store at ``path``, written unless one of ``n_samples`` rows is there."""
    from fgscale.images._synthetic import make_classification_volumes
    from fgscale.store import write_store

    def write(path):
        print(f"writing a synthetic 2 mm store of {n_samples} rows to {path} ...", flush=True)
        X, y, mask, affine = make_classification_volumes(n_samples, 4, grid="2mm", seed=seed)
        split = np.where(np.arange(n_samples) % 4 == 3, "test", "train")
        return write_store(path, X, y, mask, affine, split=split,
                           attrs={"synthetic": True, "generator": generator})

    return reuse_store(path, write,
                       lambda store: store.n_samples == n_samples and store.attrs.get("synthetic"))


def random_store(path: Path, n: int, p: int, n_classes: int = 20, *, generator: str):
    """A SYNTHETIC store of ``n`` random rows of ``p`` voxels on the 2 mm grid (its first ``p``
    voxels), written block by block (never all in memory) unless a complete one is there."""
    from fgscale.store import block_range, create_store, mark_complete, open_store, write_block

    def write(path):
        rng = np.random.default_rng(0)
        mask = np.zeros((91, 109, 91), bool)
        mask.reshape(-1)[:p] = True  # a full-resolution grid, p voxels in mask order
        y = rng.integers(0, n_classes, n)
        g = create_store(path, n_samples=n, mask=mask, affine=np.eye(4), y=y,
                         classes=[f"class_{k}" for k in range(n_classes)],
                         attrs={"synthetic": True, "generator": generator})
        rows = int(g.attrs["block_rows"])
        for b in range(g["done"].shape[0]):
            start, stop = block_range(b, rows, n)
            write_block(path, b, rng.standard_normal((stop - start, p), dtype=np.float32))
        mark_complete(path)
        return open_store(path)

    return reuse_store(path, write)
