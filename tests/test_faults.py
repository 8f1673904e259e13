"""Faults survived (issue 14): a worker process or the client process SIGKILLed mid-job.

Every job ends with what an undisturbed run gives, compared exactly. Kills that other files
already show, not repeated here:

- a worker killed while the bank is built: tests/grouping/test_banks.py
  (test_killed_worker_does_not_change_the_bank);
- the client killed while converting blocks: tests/store/test_convert.py
  (test_killed_conversion_resumes_to_identical_store);
- the client killed during training (``fgscale train``, then ``--resume``): tests/test_runs.py
  (test_resume_after_a_killed_run_gives_the_uninterrupted_result).

Write failures (a full or read-only disk) are in tests/test_faults_disk.py, the soak in
tests/test_faults_soak.py; the helpers in tests/faults.py.
"""

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from faults import (
    TRAIN,
    assert_same_model,
    assert_same_store,
    fit_in_memory,
    flags_set,
    kill_a_busy_worker,
    kill_client_when,
    paused_cluster,
    temporary_files,
    when,
)
from helpers import synthetic_store

from fgscale.grouping._bank import make_bank
from fgscale.grouping._dask_bank import load_bank
from fgscale.runs import load_run, train_run
from fgscale.store import bank_key, compute_stats, list_banks, load_stats, open_store
from fgscale.store._convert import convert
from fgscale.store._stats import STATS, stats_key


@pytest.fixture(scope="module")
def slow_cluster():
    with paused_cluster(pause=0.1) as client:
        yield client


def kill_a_worker_during(client, job, progress, *, at_least: int, total: int):
    """Run ``job()``, and SIGKILL a busy worker process once ``progress()`` reaches
    ``at_least`` of ``total``; return the job's result, and check that the user was told that a
    worker left and work was redone."""
    pids = set(client.run(os.getpid).values())
    finished, seen = threading.Event(), []

    def kill():
        if not finished.is_set():
            seen.append(progress())
            kill_a_busy_worker(client)

    killer = when(lambda: finished.is_set() or progress() >= at_least, kill)
    try:
        with pytest.warns(UserWarning, match=r"1 of the 2 Dask worker\(s\) left during this step"):
            result = job()
    finally:
        finished.set()
        killer.join()
    assert seen, "the job ended before a worker was killed"
    assert at_least <= seen[0] < total, f"killed after {seen[0]} of {total}, not mid-job"
    client.wait_for_workers(2)  # the nanny's new worker: however long a loaded machine takes
    assert set(client.run(os.getpid).values()) != pids, "no worker was replaced"
    return result


# ------------------------------------------------------------------ a worker process killed


def test_worker_killed_during_conversion(tiny_cohort, tmp_path, client, slow_cluster):
    out = tmp_path / "killed.zarr"
    store = kill_a_worker_during(
        slow_cluster,
        lambda: convert(tiny_cohort, out, client=slow_cluster, block_rows=2, progress=False),
        lambda: flags_set(out), at_least=3, total=12)
    assert store.attrs["complete"]
    reference = convert(tiny_cohort, tmp_path / "undisturbed.zarr", client=client, block_rows=2,
                        progress=False)
    assert_same_store(out, reference.path)


def test_worker_killed_during_standardization(tmp_path, client, slow_cluster):
    kw = dict(n_subjects=5, seed=1, block_rows=4)
    killed = synthetic_store(tmp_path / "killed.zarr", 64, 4, **kw).path
    reference = synthetic_store(tmp_path / "undisturbed.zarr", 64, 4, **kw).path
    rows = open_store(killed).train_rows()
    n_blocks = len(np.unique(rows // 4))
    partial = f"{STATS}/{stats_key(rows)}/done"
    mean, std = kill_a_worker_during(
        slow_cluster, lambda: compute_stats(killed, client=slow_cluster, progress=False),
        lambda: flags_set(killed, partial), at_least=3, total=n_blocks)
    expected = compute_stats(reference, client=client, progress=False)
    np.testing.assert_array_equal(mean, expected[0])
    np.testing.assert_array_equal(std, expected[1])
    np.testing.assert_array_equal(load_stats(killed)[1], expected[1])  # saved in the store


PLAIN = {name: value for name, value in TRAIN.items()
         if name not in ("n_groupings", "n_bootstrap", "n_clusters")} | {"regularizer": "none"}


@pytest.mark.parametrize("params", [TRAIN, PLAIN], ids=["feature-grouping", "plain-logreg"])
def test_worker_killed_during_a_training_epoch(tiny_store, tmp_path, slow_cluster, params):
    """A worker killed mid-epoch, its tasks rerun on the one its nanny starts: the streamed fit
    ends with the weights of the undisturbed run, the in-memory fit, which the streamed one
    equals (tests/training/test_stream.py). With feature grouping on standardized rows, the
    restarted worker reads the bank and the statistics from the store again (the killed one
    had them cached); plain logistic regression reads no bank."""
    killed = tmp_path / "killed"
    metrics = killed / "metrics.jsonl"
    kill_a_worker_during(
        slow_cluster, lambda: train_run(tiny_store.path, killed, params=params, client=slow_cluster),
        lambda: len(metrics.read_text().splitlines()), at_least=1, total=params["max_epochs"])
    assert_same_model(load_run(killed), fit_in_memory(tiny_store, params))


# ------------------------------------------------------------------ the client process killed


def start(cmd, stderr: Path | None = None):
    """Start ``cmd``; its standard error goes to the file ``stderr`` (read when it fails)."""
    if stderr is None:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(stderr, "wb") as err:  # the child has its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)


def run_again(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_client_killed_while_the_store_is_created(tiny_cohort, tmp_path, client):
    """Killed in the instant between the store's first file and its last metadata: the same
    command run again must not find a folder that it refuses as "not an fgscale store"."""
    out = tmp_path / "killed.zarr"
    cmd = [sys.executable, "-m", "fgscale", "convert", str(tiny_cohort), "--out", str(out),
           "--block-rows", "2", "--n-workers", "1", "--no-progress"]
    # convert's workers are threads of the command (killed with it)
    log = tmp_path / "stderr.txt"
    proc = start(cmd, log)
    # the first file in the folder, not the folder: zarr opens a group with mode="w" by making
    # the folder, removing it and making it again, and a kill in between leaves nothing at all
    kill_client_when(proc, lambda: any(tmp_path.glob("killed.zarr*/zarr.json")),
                     worker_processes=False)
    assert any(tmp_path.glob("killed.zarr*")), \
        f"killed before it wrote anything (exit {proc.returncode}): {log.read_text()[-3000:]}"
    metadata = out / "zarr.json"
    assert not (metadata.exists() and "fgscale_format_version" in metadata.read_text()), \
        "killed once the store was whole, not while it was created"
    run_again(cmd)
    assert sorted(tmp_path.glob("killed.zarr*")) == [out]  # nothing else left behind
    reference = convert(tiny_cohort, tmp_path / "undisturbed.zarr", client=client, block_rows=2,
                        progress=False)
    assert_same_store(out, reference.path)
    assert not temporary_files(out)


def test_client_killed_while_the_bank_is_built(tmp_path):
    # a larger grid (23k voxels): a grouping takes long enough to kill the command mid-bank
    store = synthetic_store(tmp_path / "big.zarr", 40, 4, grid=(40, 48, 40), n_subjects=8,
                            split=["train"] * 30 + ["test"] * 10)
    b, r, k = 40, 20, 2304
    cmd = [sys.executable, "-m", "fgscale", "bank", str(store.path), "--n-groupings", str(b),
           "--n-bootstrap", str(r), "--n-clusters", str(k), "--n-workers", "1"]
    done = f"banks/{bank_key(k, r, 0, store.train_rows())}/done"
    kill_client_when(start(cmd), lambda: flags_set(store.path, done) >= 2)
    n_built = flags_set(store.path, done)
    assert 2 <= n_built < b, f"killed after {n_built} of {b} groupings, not mid-bank"
    again = run_again(cmd)
    assert f"{b - n_built} groupings built, {n_built} reused" in again.stdout
    [info] = list_banks(store.path)
    assert (info["built"], info["total"]) == (b, b)
    expected = make_bank(store.X[:], store.mask, k, n_groupings=b, n_bootstrap=r,
                         rows=store.train_rows(), seed=0)
    np.testing.assert_array_equal(load_bank(store.path, n_clusters=k, n_bootstrap=r, seed=0)[0],
                                  expected)


_STATS_DRIVER = """
import sys
sys.path.insert(0, sys.argv[2])  # tests/, for faults.py
from faults import paused_cluster
from fgscale.store import compute_stats

if __name__ == "__main__":
    with paused_cluster(pause=0.15) as client:  # so that the test can kill the run mid-way
        compute_stats(sys.argv[1], client=client, progress=False)
"""


def test_client_killed_during_standardization(tmp_path, client):
    kw = dict(n_subjects=5, seed=2, block_rows=4)
    killed = synthetic_store(tmp_path / "killed.zarr", 64, 4, **kw).path
    reference = synthetic_store(tmp_path / "undisturbed.zarr", 64, 4, **kw).path
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(_STATS_DRIVER))
    cmd = [sys.executable, str(driver), str(killed), str(Path(__file__).parent)]
    rows = open_store(killed).train_rows()
    n_blocks, partial = len(np.unique(rows // 4)), f"{STATS}/{stats_key(rows)}/done"
    kill_client_when(start(cmd), lambda: flags_set(killed, partial) >= 3)
    n_done = flags_set(killed, partial)
    assert 3 <= n_done < n_blocks, f"killed after {n_done} of {n_blocks} blocks, not mid-way"
    assert load_stats(killed) is None  # partial statistics are never served
    run_again(cmd)
    expected = compute_stats(reference, client=client, progress=False)
    for got, want in zip(load_stats(killed), expected, strict=True):
        np.testing.assert_array_equal(got, want)
