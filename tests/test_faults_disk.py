"""Faults survived (issue 14): a write that fails mid-job, because the disk fills up or is made
read-only, on a real tmpfs of its own (tests/faults.py; skipped where this process may not
mount one). The job fails with an error that names the store and says what to do; the store
still opens and keeps what was written before the failure; once the disk is fixed, the same
call resumes and ends as an undisturbed run.
"""

import errno

import numpy as np
import pytest
from faults import (
    TRAIN,
    assert_same_model,
    assert_same_store,
    between_tasks,
    fit_in_memory,
    flags_set,
    mount_small_disk,
    paused_cluster,
    temporary_files,
    unmount,
    when,
)
from helpers import synthetic_store

from fgscale.cli import main
from fgscale.grouping._bank import make_bank
from fgscale.grouping._dask_bank import build_bank
from fgscale.runs import load_run, train_run
from fgscale.store import (
    StoreError,
    bank_key,
    compute_stats,
    list_banks,
    load_stats,
    open_bank,
    open_store,
)
from fgscale.store._convert import convert
from fgscale.store._stats import STATS, stats_key

FAULTS = {"full": (errno.ENOSPC, "fill", "free"), "read-only": (errno.EROFS, "read_only",
                                                                  "writable")}


@pytest.fixture
def disk(tmp_path):
    """An 8 MiB tmpfs of its own (tests/faults.py)."""
    disk = mount_small_disk(tmp_path / "disk")
    try:
        yield disk
    finally:
        unmount(disk)


@pytest.fixture(params=list(FAULTS))
def fault(request, disk):
    """A disk of its own, the errno of the fault, a function that strikes, one that repairs."""
    code, strike, repair = FAULTS[request.param]
    return disk, code, getattr(disk, strike), getattr(disk, repair)


@pytest.fixture(scope="module")
def hold(tmp_path_factory):
    """The file that holds the workers of ``slow_cluster`` between two tasks."""
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def slow_cluster(hold):
    with paused_cluster(pause=0.05, hold=hold) as client:  # a fault strikes mid-job
        yield client


def fails_mid_job(job, progress, strike, code, *, at_least: int, total: int, names, hold):
    """Run ``job()`` on ``slow_cluster`` with the fault striking between two tasks once
    ``progress()`` reaches ``at_least``; check that it fails with that fault's errno and a
    message naming ``names``; return the progress it had made."""
    struck = when(lambda: progress() >= at_least, lambda: between_tasks(hold, strike))
    try:
        with pytest.raises(OSError) as info:
            job()
    finally:
        struck.stop()
    assert info.value.errno == code, info.value
    assert str(names) in str(info.value) and "re-run" in str(info.value), str(info.value)
    made = progress()
    assert at_least <= made < total, f"the fault struck after {made} of {total}, not mid-job"
    return made


def test_conversion(tiny_cohort, tmp_path, client, slow_cluster, hold, fault):
    disk, code, strike, repair = fault
    out = disk.path / "s.zarr"
    kw = dict(block_rows=2, progress=False)
    n_done = fails_mid_job(lambda: convert(tiny_cohort, out, client=slow_cluster, **kw),
                           lambda: flags_set(out), strike, code, at_least=3, total=12,
                           names=out, hold=hold)
    assert not temporary_files(out)
    with pytest.raises(StoreError, match="re-run fgscale convert to finish it"):
        open_store(out)  # what a reader gets: the store is known, and not complete
    repair()
    resumed = convert(tiny_cohort, out, client=slow_cluster, **kw)
    assert resumed.attrs["summary"]["blocks_skipped"] >= n_done  # kept, not rewritten
    reference = convert(tiny_cohort, tmp_path / "undisturbed.zarr", client=client, **kw)
    assert_same_store(out, reference.path)


def test_bank(slow_cluster, hold, fault):
    disk, code, strike, repair = fault
    store = synthetic_store(disk.path / "s.zarr", 40, 4, n_subjects=5, seed=0)
    b, r, k = 16, 8, 20
    kw = dict(n_groupings=b, n_bootstrap=r, n_clusters=k, client=slow_cluster, progress=False)
    done = f"banks/{bank_key(k, r, 0, store.train_rows())}/done"
    n_built = fails_mid_job(lambda: build_bank(store.path, **kw),
                            lambda: flags_set(store.path, done), strike, code, at_least=3,
                            total=b, names=store.path, hold=hold)
    assert not temporary_files(store.path)
    expected = make_bank(store.X[:], store.mask, k, n_groupings=b, n_bootstrap=r,
                         rows=store.train_rows(), seed=0)
    [info] = list_banks(store.path)  # the store opens, and lists the bank as it is
    assert info["built"] == n_built
    bank = open_bank(store.path, info["key"])
    built = np.flatnonzero(bank.done[:])
    np.testing.assert_array_equal(bank.labels[:][built], expected[built])
    repair()
    again, info = build_bank(store.path, return_info=True, **kw)
    assert (info["built"], info["reused"]) == (b - n_built, n_built)
    np.testing.assert_array_equal(again, expected)


def test_standardization(tmp_path, client, slow_cluster, hold, fault):
    disk, code, strike, repair = fault
    kw = dict(n_subjects=5, seed=1, block_rows=4)
    path = synthetic_store(disk.path / "s.zarr", 64, 4, **kw).path
    rows = open_store(path).train_rows()
    n_blocks, partial = len(np.unique(rows // 4)), f"{STATS}/{stats_key(rows)}/done"
    fails_mid_job(lambda: compute_stats(path, client=slow_cluster, progress=False),
                  lambda: flags_set(path, partial), strike, code, at_least=3, total=n_blocks,
                  names=path, hold=hold)
    assert not temporary_files(path)
    assert load_stats(path) is None  # the store opens; partial statistics are not served
    repair()
    got = compute_stats(path, client=slow_cluster, progress=False)
    reference = synthetic_store(tmp_path / "undisturbed.zarr", 64, 4, **kw).path
    for a, b in zip(got, compute_stats(reference, client=client, progress=False), strict=True):
        np.testing.assert_array_equal(a, b)



def test_training_run(tiny_store, slow_cluster, fault, request):
    """The run folder on the failing disk (the store elsewhere): the checkpoint of the last
    epoch written whole stays, and ``resume`` ends as an undisturbed run."""
    disk, code, strike, repair = fault
    run = disk.path / "run"
    metrics = run / "metrics.jsonl"
    params = dict(TRAIN, max_epochs=8)
    struck = when(lambda: len(metrics.read_text().splitlines()) >= 2, strike)
    try:
        with pytest.raises(Exception) as info:
            train_run(tiny_store.path, run, params=params, client=slow_cluster)
    finally:
        struck.stop()
    epochs = len(metrics.read_text().splitlines())
    assert 2 <= epochs < params["max_epochs"], f"the fault struck after {epochs} epochs"
    assert not list(run.glob(".tmp-*"))
    repair()
    train_run(tiny_store.path, run, params=params, client=slow_cluster, resume=True)
    assert_same_model(load_run(run), fit_in_memory(tiny_store, params))
    assert isinstance(info.value, OSError) and info.value.errno == code, repr(info.value)
    assert str(run) in str(info.value), str(info.value)


def test_cli_reports_a_full_disk_and_resumes(tiny_cohort, slow_cluster, hold, disk, capsys):
    out = disk.path / "s.zarr"
    argv = ["convert", str(tiny_cohort), "--out", str(out), "--block-rows", "2", "--no-progress",
            "--scheduler", slow_cluster.scheduler.address]
    struck = when(lambda: flags_set(out) >= 3, lambda: between_tasks(hold, disk.fill))
    try:
        assert main(argv) == 2
    finally:
        struck.stop()
    err = capsys.readouterr().err
    assert f"fgscale convert: error: [Errno {errno.ENOSPC}] {out}: block" in err, err
    assert "re-run to resume" in err and "Traceback" not in err, err
    disk.free()
    assert main(argv) == 0
    assert open_store(out).attrs["complete"]
