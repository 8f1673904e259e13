"""A cluster started by hand (``dask scheduler``, ``dask worker``: separate processes, the
workers in another folder) whose scheduler is SIGKILLed while a command works on it: one line
that says the scheduler was lost, what was kept and how to go on; the same command then
finishes on a new cluster."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import synthetic_store

BIN = Path(sys.executable).parent


ENV = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


def _start_scheduler(folder: Path) -> tuple[subprocess.Popen, Path]:
    """A scheduler on a free port, run from ``folder``, once its scheduler file is written."""
    scheduler_file = folder / "sched.json"
    scheduler_file.unlink(missing_ok=True)
    scheduler = subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--dashboard-address", ":0", "--scheduler-file", scheduler_file],
                                 cwd=folder, env=ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    while not scheduler_file.exists():  # however long a loaded machine takes to write it
        assert scheduler.poll() is None, f"the scheduler ended (status {scheduler.returncode})"
        time.sleep(0.1)
    return scheduler, scheduler_file


def _start_cluster(folder: Path) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    """A scheduler on a free port and one single-threaded worker, run from ``folder``."""
    scheduler, scheduler_file = _start_scheduler(folder)
    worker = subprocess.Popen([BIN / "dask", "worker", "--scheduler-file", scheduler_file,
                               "--nthreads", "1", "--no-nanny"], cwd=folder, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return scheduler, worker, scheduler_file


def _stop(*procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _built(store_path) -> int:
    from fgscale.store._banks import list_banks

    banks = list_banks(store_path)
    return banks[0]["built"] if banks else 0


@pytest.mark.parametrize("command", ["bank", "train"])
def test_a_scheduler_killed_mid_job_is_one_line_and_the_same_command_goes_on(tmp_path, command):
    workers_folder = tmp_path / "elsewhere"
    workers_folder.mkdir()
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            block_rows=8)
    argv = {"bank": ["bank", store.path.name, "--n-groupings", "400", "--n-bootstrap", "20",
                     "--n-clusters", "0.1"],
            "train": ["train", store.path.name, "--out", "run", "--n-groupings", "2",
                      "--n-bootstrap", "8", "--n-clusters", "0.1", "--batch-size", "4",
                      "--max-epochs", "400", "--early-stopping", "false", "--patience", "400"]
            }[command]
    started = {"bank": lambda: _built(store.path) >= 5,
               "train": lambda: (tmp_path / "run" / "checkpoint.pt").exists()}[command]
    scheduler, worker, scheduler_file = _start_cluster(workers_folder)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fgscale", *argv, "--no-progress",
                                 "--scheduler-file", str(scheduler_file), "--timeout", "5"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        while proc.poll() is None and not started():  # however long it takes to get there
            time.sleep(0.05)
        if proc.poll() is not None:
            pytest.skip(f"the {command} ended before the scheduler was killed")
        scheduler.send_signal(signal.SIGKILL)
        start = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - start < 30  # not a hang
    finally:
        _stop(scheduler, worker)
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("fgscale")]
    assert len(lines) == 1 and lines[0].startswith(f"fgscale {command}: error: lost the Dask "
                                                   "scheduler at "), err
    assert {"bank": "run the same command again",
            "train": "with --resume"}[command] in lines[0]
    # a new cluster: the same command (train: with --resume) goes on from what was kept
    scheduler, worker, scheduler_file = _start_cluster(workers_folder)
    try:
        again = subprocess.run([sys.executable, "-m", "fgscale", *argv, "--no-progress",
                                "--scheduler-file", str(scheduler_file),
                                *(["--resume"] if command == "train" else [])],
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        _stop(scheduler, worker)
    assert again.returncode == 0, again.stderr
    assert {"bank": "reused", "train": "for 400 epochs"}[command] in again.stdout


def test_workers_paused_for_memory_end_the_command_with_a_line_not_a_hang(tmp_path):
    """A worker whose --memory-limit is below what the process itself takes is paused by Dask
    for good (above distributed.worker.memory.pause): no task would ever run. The command
    says so and stops, instead of waiting for ever."""
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            block_rows=8)
    scheduler, scheduler_file = _start_scheduler(tmp_path)
    # paused at 80% of 60 MiB, less than a bare worker process takes; not restarted by its
    # nanny at 95%, as it would be by default (which leaves it paused whenever it is there)
    worker = subprocess.Popen([BIN / "dask", "worker", "--scheduler-file", scheduler_file,
                               "--nthreads", "1", "--memory-limit", "60MiB"],
                              env={**ENV, "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "fgscale", "bank", str(store.path),
                               "--n-groupings", "4", "--n-bootstrap", "8", "--n-clusters", "0.1",
                               "--no-progress", "--scheduler-file", str(scheduler_file)],
                              capture_output=True, text=True, timeout=240)
        assert time.monotonic() - start < 120
    finally:
        _stop(scheduler, worker)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fgscale")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fgscale bank: error: every worker of the Dask cluster at ")
    assert "paused" in lines[0] and "MiB of its memory limit of 60 MiB" in lines[0]
    assert "run the same command again" in lines[0]


def _can_hide_folders() -> bool:
    """Whether this process may start one in a mount namespace of its own (root, unshare)."""
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_hide_folders(), reason="needs unshare -m (a mount namespace)")
def test_a_worker_that_cannot_see_the_store_is_said_to_be_the_cause(tmp_path):
    """A worker on a machine without the shared file system (here: its own mount namespace,
    the store's folder hidden under an empty tmpfs) said 'no such store', which sent the user
    to a path that is there."""
    shared = tmp_path / "shared"
    store = synthetic_store(shared / "s.zarr", 40, 4, n_subjects=5, seed=0, block_rows=8)
    scheduler, scheduler_file = _start_scheduler(tmp_path)
    worker = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none '{shared}' && exec '{BIN / 'dask'}' "
         f"worker --scheduler-file '{scheduler_file}' --nthreads 1 --no-nanny"],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = subprocess.run([sys.executable, "-m", "fgscale", "bank", str(store.path),
                               "--n-groupings", "2", "--n-bootstrap", "8", "--n-clusters", "0.1",
                               "--no-progress", "--scheduler-file", str(scheduler_file)],
                              capture_output=True, text=True, timeout=240)
    finally:
        _stop(scheduler, worker)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fgscale")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"fgscale bank: error: {store.path}: no such store")
    assert lines[0].endswith("yet it is there for this process: a worker of the cluster does "
                             "not see it, and every worker must see the store and images at the "
                             "same path (a shared file system)")


def test_a_cluster_with_no_worker_is_said_to_wait_for_one(tmp_path):
    """Workers not started yet (a SLURM job array still queued): the command waited with no
    word of why."""
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, block_rows=8)
    scheduler, scheduler_file = _start_scheduler(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "fgscale", "bank", str(store.path),
                             "--n-groupings", "2", "--n-bootstrap", "8", "--n-clusters", "0.1",
                             "--no-progress", "--scheduler-file", str(scheduler_file)],
                            stderr=subprocess.PIPE, text=True)
    said = []
    try:
        # the command waits: read until the warning (however long a loaded machine takes to
        # get there; pytest's timeout ends a command that never says it), then stop it
        for line in proc.stderr:
            said.append(line)
            if "no worker yet" in line:
                break
    finally:
        _stop(proc, scheduler)
    assert said and "has no worker yet: the work waits until one joins" in said[-1], said


def test_a_cluster_left_with_no_worker_while_tasks_wait_is_said_once(caplog):
    """Every worker lost mid-run (killed, their jobs requeued): the command waits for new ones,
    and says so once after the watch's patience, where it waited without a word."""
    from distributed import Client, LocalCluster

    from fgscale._dask.joined import PausedWatch

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client, caplog.at_level("WARNING", logger="fgscale._dask.joined"):
        with PausedWatch(client, "the test's cluster", every=0.05, patience=0.3):
            time.sleep(0.5)  # no task yet: nothing to say
            assert "no worker" not in caplog.text
            future = client.submit(sum, [1, 2])  # waits: there is no worker to run it
            deadline = time.monotonic() + 30
            while "no worker" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
        assert caplog.text.count("the Dask cluster at the test's cluster has had no worker "
                                 "for 0 s: the work waits until one joins") == 1, caplog.text
        assert not future.done()
