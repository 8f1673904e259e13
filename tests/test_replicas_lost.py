"""A replica lost mid-epoch: ``fgscale train --replicas 2`` on a cluster started by
hand (``dask scheduler`` and two ``dask worker`` processes, no nanny), one replica's worker
process SIGKILLed while its epoch runs.

The command stops at once with one line that names the lost replica and its worker and says
to go on with ``--resume``; the run folder keeps the checkpoint of its last finished epoch,
whole, and nothing half-written. With two worker processes again (a new worker started),
``--resume`` finishes the run, and its model is that of an uninterrupted run of the same
arguments: each epoch's replicas start from the checkpointed weights and draw their rows from
the run's seed and the epoch alone, whichever processes they run in. Both ranks are killed in
turn: replica 0 also holds the process group's store and returns the weights.

The worker is killed at a known point, whatever the machine's load: a thread started in its
process (before the command) waits until a checkpoint exists and the process is in a replica's
process group (``fgscale.training._replicas.in_process_group()``, true only from the moment a
replica's group formed until it was torn down), then freezes the process
(SIGSTOP); the test sees it stopped, and SIGKILLs it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client
from helpers import synthetic_store
from test_replicas_cli import ARGS, assert_same_model

from fgscale.cli import main

BIN = Path(sys.executable).parent
EPOCHS = 4


def _env() -> dict:
    """This process's environment without Dask's settings (the session's private cache of
    derived data, set by conftest.py, is kept)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


class HandCluster:
    """``dask scheduler`` on a free port and ``dask worker`` processes of one thread each and
    no nanny (a killed worker stays dead), started in ``folder``; a client of the test's."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.scheduler_file = folder / "scheduler.json"
        self.procs = [subprocess.Popen(
            [BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", ":0", "--scheduler-file", self.scheduler_file],
            cwd=folder, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        while not self.scheduler_file.exists():  # however long a loaded machine takes
            assert self.procs[0].poll() is None, "the scheduler ended"
            time.sleep(0.05)
        self.client = None

    def add_worker(self) -> None:
        self.procs.append(subprocess.Popen(
            [BIN / "dask", "worker", "--scheduler-file", self.scheduler_file, "--nthreads", "1",
             "--no-nanny", "--memory-limit", "2GiB"],
            cwd=self.folder, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def connect(self, n_workers: int) -> Client:
        if self.client is None:
            self.client = Client(scheduler_file=str(self.scheduler_file), set_as_default=False)
        self.client.wait_for_workers(n_workers)  # however long they take to join
        return self.client

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path):
    folder = tmp_path / "cluster"
    folder.mkdir()
    hand = HandCluster(folder)
    try:
        hand.add_worker()
        hand.add_worker()
        yield hand
    finally:
        hand.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The ``tiny_store`` of conftest.py (40 SYNTHETIC rows, 4 classes), once for the module."""
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    return synthetic_store(tmp_path_factory.mktemp("replicas_lost") / "tiny.zarr", 40, 4,
                           n_subjects=5, seed=0, split=split,
                           classes=[f"class_{k}" for k in range(4)], attrs={"synthetic": True},
                           block_rows=8)


def _args(store) -> list[str]:
    return [str(store.path), "--replicas", "2", "--early-stopping", "false", "--max-epochs",
            str(EPOCHS), *ARGS]


@pytest.fixture(scope="module")
def whole(store, client, tmp_path_factory):
    """The uninterrupted run of the same arguments (on the session's cluster)."""
    out = tmp_path_factory.mktemp("replicas_lost_whole") / "run"
    assert main(["train", *_args(store), "--out", str(out), "--scheduler",
                 client.scheduler.address]) == 0
    return out


def freeze_in_a_replica_epoch(metrics: str):
    """A function for ``client.run`` on a worker: it starts a thread there that, once
    ``metrics`` (the run's metrics.jsonl, written after its checkpoint) exists and the process
    is in a replica's process group, stops the process (SIGSTOP) mid-epoch. Nested, so that
    Dask ships it by value: the worker cannot import this test file."""

    def freeze() -> None:
        import threading

        from fgscale.training._replicas import in_process_group

        def watch():
            while not (os.path.exists(metrics) and in_process_group()):
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGSTOP)

        threading.Thread(target=watch, daemon=True, name="freeze-in-a-replica-epoch").start()

    return freeze


def _state(pid: int) -> str:
    """The process's state letter (R, S, T: stopped, Z, ...), "gone" once it has ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _epochs(run: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_replica_lost_mid_epoch_is_one_line_and_resume_finishes_the_run(
        store, whole, cluster, tmp_path, rank):
    run = tmp_path / "run"
    client = cluster.connect(2)
    pids = client.run(os.getpid)
    victim = sorted(pids)[rank]  # the replicas' ranks follow the workers' sorted addresses
    pid = pids[victim]
    client.run(freeze_in_a_replica_epoch(str(run / "metrics.jsonl")), workers=[victim])
    cmd = [sys.executable, "-m", "fgscale", "train", *_args(store), "--out", str(run),
           "--scheduler-file", str(cluster.scheduler_file)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while _state(pid) != "T":  # frozen mid-epoch: however long a loaded machine takes
            assert proc.poll() is None, f"the run ended first: {proc.communicate()}"
            assert _state(pid) != "gone", "the worker ended before it was frozen"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)  # a hang fails here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # one line, no traceback: the lost replica and its worker, what was kept, --resume
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if not line.startswith("Dask dashboard: ")]
    assert len(said) == 1, err
    assert re.fullmatch(rf"fgscale train: error: replica {rank} of 2 was lost: its worker "
                        rf"{re.escape(victim)} left the Dask cluster \(.*\)\. The run folder "
                        r"keeps the checkpoint of the last finished epoch .*: run the same "
                        r"command with --resume to go on from there\.", said[0]), said[0]
    assert not out.strip(), out

    # the last finished epoch's checkpoint, whole; nothing half-written, nothing final
    epochs = _epochs(run)
    assert 1 <= len(epochs) < EPOCHS and epochs == list(range(len(epochs))), epochs
    state = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert state["epoch"] == epochs[-1] and len(state["history"]) == len(epochs)
    assert not [p.name for p in run.iterdir() if p.name.startswith(".tmp-")]
    assert not (run / "model.npz").exists() and not (run / "final.json").exists()

    # two worker processes again: --resume finishes the run as an uninterrupted one
    cluster.add_worker()
    cluster.connect(2)
    again = subprocess.run([*cmd, "--resume"], cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"for {EPOCHS} epochs" in again.stdout, again.stdout
    assert _epochs(run) == list(range(EPOCHS))
    assert (run / "model.npz").exists() and (run / "final.json").exists()
    assert_same_model(run, whole)
