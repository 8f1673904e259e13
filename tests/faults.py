"""Helpers of the fault tests (tests/test_faults*.py): real kills, real full and read-only file
systems, and the comparisons of a disturbed job's output with an undisturbed one's.

Not rewritten by pytest (conftest.py registers helpers.py only): every assert says what failed.
"""

import errno
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin


class PauseAfterEachTask(WorkerPlugin):
    """A worker that pauses after each task (its result is kept, its writes are done), so that
    a job of tiny tasks lasts long enough to be disturbed mid-way; and, while the file ``hold``
    exists, waits after its task, saying so with a file ``hold.<pid>`` (:func:`between_tasks`).
    Re-applied by the scheduler to a worker that a nanny restarts."""

    def __init__(self, seconds: float, hold: str | None = None):
        self.seconds = seconds
        self.hold = hold

    def transition(self, key, start, finish, **kwargs):
        if finish != "memory":
            return
        time.sleep(self.seconds)
        if self.hold is None or not os.path.exists(self.hold):
            return
        marker = f"{self.hold}.{os.getpid()}"
        Path(marker).touch()
        try:
            deadline = time.monotonic() + 60
            while os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.002)
        finally:
            os.unlink(marker)


_N_WORKERS = 2  # of a paused cluster


@contextmanager
def paused_cluster(pause: float, hold: Path | None = None):
    """A client of two worker processes (restarted by their nannies when killed) that pause
    ``pause`` seconds after each task, and wait while the file ``hold`` exists."""
    with LocalCluster(n_workers=_N_WORKERS, threads_per_worker=1, processes=True,
                      dashboard_address=":0", memory_limit="2GiB") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.register_plugin(PauseAfterEachTask(pause, None if hold is None else str(hold)))
        yield client


def between_tasks(hold: Path, action, timeout=5.0) -> None:
    """Run ``action()`` while the workers of a cluster paused with ``hold`` rest between two
    tasks, each waiting after the task it ran (or idle, after ``timeout`` seconds): a fault
    struck there finds no write half done (a disk remounted read-only between zarr's write of
    a chunk and its rename would leave its temporary file behind), and the job's next tasks
    meet it."""
    hold.touch()
    try:
        deadline = time.monotonic() + timeout
        while (len(list(hold.parent.glob(f"{hold.name}.*"))) < _N_WORKERS
               and time.monotonic() < deadline):
            time.sleep(0.002)
        action()
    finally:
        hold.unlink()


TRAIN = dict(n_groupings=4, n_bootstrap=10, n_clusters=0.1, batch_size=8, learning_rate=0.05,
             random_state=3, max_epochs=6, early_stopping=False)
"""Estimator parameters of the fault tests' training runs: feature grouping, standardized."""


def flags_set(path, name="done") -> int:
    """How many of the flags ``name`` of the Zarr group at ``path`` are set."""
    return int(zarr.open_group(str(path), mode="r")[name][:].sum())


def assert_same_store(path, reference):
    """The same arrays (bit for bit) and attributes, bar the run's timings and counters."""
    a, b = zarr.open_group(str(path), mode="r"), zarr.open_group(str(reference), mode="r")
    names = sorted(a.array_keys())
    assert names == sorted(b.array_keys()), f"arrays {names}, expected {sorted(b.array_keys())}"
    for name in names:
        np.testing.assert_array_equal(a[name][:], b[name][:], err_msg=name)
    attrs, expected = ({k: v for k, v in g.attrs.items() if k != "summary"} for g in (a, b))
    assert attrs == expected, f"attributes {attrs}, expected {expected}"


def fit_in_memory(store, params: dict):
    """The in-memory fit on a store's training rows: the undisturbed run that a streamed fit
    equals (tests/training/test_stream.py shows it)."""
    from fgscale import FeatureGroupingClassifier

    train = store.train_rows()
    return FeatureGroupingClassifier(mask=store.mask, **params).fit(
        store.X[:][train], store.classes[store.y[train]])


def assert_same_model(a, b) -> None:
    """The same weights, to float32 rounding, in two fitted estimators."""
    import torch

    for (name, x), y in zip(a.model_.state_dict().items(), b.model_.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7, msg=name)


def temporary_files(path) -> list[Path]:
    """Files a writer left under a temporary name (ours: ``*.tmp``, zarr's: ``*.partial``)."""
    return [p for p in Path(path).rglob("*") if p.name.endswith((".tmp", ".partial"))]


class _Watch(threading.Thread):
    """A thread that runs ``action()`` once ``ready()`` is true (:func:`when`)."""

    def __init__(self, ready, action):
        super().__init__(daemon=True)
        self._ready, self._action = ready, action
        self._stopped = threading.Event()

    def run(self):
        while not self._stopped.is_set():
            try:
                ready = self._ready()
            except Exception:  # a flag array not created yet, a file not written yet
                ready = False
            if ready:
                self._action()
                return
            time.sleep(0.001)

    def stop(self) -> None:
        """Wait for the watch to end, and end it if ``ready()`` has not held yet (the job it
        watched ended first): ``action`` is then not run."""
        self._stopped.set()
        self.join()


def when(ready, action) -> _Watch:
    """Start a thread that runs ``action()`` once ``ready()`` is true (errors of ``ready``,
    such as a flag array not created yet, count as not ready), however long a loaded machine
    takes to get there: no number of seconds. Join it to wait for that; or, once the job it
    watches has ended, ``stop()`` it, which does not wait for a ``ready()`` that may never
    come."""
    watch = _Watch(ready, action)
    watch.start()
    return watch


# ---------------------------------------------------------------- processes


def kill_a_busy_worker(client) -> None:
    """SIGKILL a worker process that holds tasks; its nanny starts another, Dask reruns them."""
    pids = client.run(os.getpid)
    busy = [w for w, keys in client.processing().items() if keys] or list(pids)
    os.kill(pids[busy[0]], signal.SIGKILL)


def alive(pids) -> set[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    running = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                running.add(pid)
        except OSError:
            pass
    return running


def descendants(pid: int) -> set[int]:
    """The running processes that ``pid`` started, their own children included (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # ended meanwhile
            continue
        if state != "Z":
            children.setdefault(int(parent), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def kill_client_when(proc: subprocess.Popen, ready, *, worker_processes: bool = True) -> None:
    """SIGKILL ``proc``, the client alone, once ``ready()`` (or once it ended); check that the
    worker processes it started end with it (left running, they would write on while the
    command re-runs). ``worker_processes=False``: a command whose workers are threads of its
    own process, which die with it."""
    when(lambda: proc.poll() is not None or ready(), lambda: None).join()
    started = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if not worker_processes:
        return
    assert started, "the client had started no worker process"
    deadline = time.monotonic() + 30
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(started), "worker processes outlived the killed client"


# ---------------------------------------------------------------- file systems


_SMALL_DISK_MB = 8  # the size of a test's tmpfs


class SmallDisk:
    """A folder on a tmpfs of its own (8 MiB), which a test fills up or makes read-only."""

    def __init__(self, path: Path):
        self.path = path
        self.filler = path / "filler"

    def _remount(self, option: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mount", "-o", f"remount,{option}", str(self.path)],
                              capture_output=True, text=True)

    def fill(self) -> None:
        """Take every free byte, as another program writing to the same disk would; never
        more than the tmpfs holds: a folder that is no longer its own mount (unmounted
        beneath the test) would otherwise fill the real disk."""
        assert os.path.ismount(self.path), f"{self.path} is not a mount point"
        block = b"\0" * 65536
        with open(self.filler, "ab", buffering=0) as f:
            try:
                for _ in range(2 * _SMALL_DISK_MB * 16):  # twice the tmpfs, in 64 KiB blocks
                    f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
            else:
                raise AssertionError(f"{self.path}: wrote twice its size without ENOSPC")
        for size in (4096, 1):  # the last partial page, if any
            with open(self.filler, "ab", buffering=0) as f:
                try:
                    while True:
                        f.write(block[:size])
                except OSError:
                    pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def read_only(self, timeout=30) -> None:
        """Remount read-only: refused while a writer has a file open, so retried until none
        has (writers here open a file only for the time of one write)."""
        deadline = time.monotonic() + timeout
        while (done := self._remount("ro")).returncode and time.monotonic() < deadline:
            time.sleep(0.001)
        assert done.returncode == 0, done.stderr

    def writable(self) -> None:
        done = self._remount("rw")
        assert done.returncode == 0, done.stderr


def mount_small_disk(path: Path):
    """Mount an 8 MiB tmpfs on ``path`` (an empty folder) and return its SmallDisk; skip the
    test where mounting is not allowed (it needs root or CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={_SMALL_DISK_MB}m", "fgscale-test",
                           str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip("a full or read-only disk is made with a tmpfs of its own, which this "
                    f"process may not mount (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    return SmallDisk(path)


def unmount(disk: SmallDisk) -> None:
    subprocess.run(["umount", "-l", str(disk.path)], capture_output=True)
