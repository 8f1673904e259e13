"""Ctrl-C and unreachable schedulers through the command line, in real processes: a one-line
message that says what was kept and how to go on, no traceback."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import synthetic_store

from fgscale.cli import main

TRAIN = ["--regularizer", "none", "--early-stopping", "false", "--batch-size", "8",
         "--n-workers", "1", "--no-progress", "--seed", "0"]


def _interrupt(command: list, started, name: str, *, group: bool = False,
               signum: int = signal.SIGINT) -> list[str]:
    """Run ``command``, send it ``signum`` once ``started()`` holds, and check the interruption:
    exit status 128 + signum (130 for SIGINT, 143 for SIGTERM), no traceback. Returns its
    ``fgscale <name>:`` lines on stderr (Dask may warn there too, about a busy dashboard port).
    Skips when the job ended first. ``group``: to its whole process group, its worker processes
    too, as a terminal's Ctrl-C or a batch scheduler's SIGTERM is sent."""
    # SIGINT as a terminal leaves it: a test run in the background has it ignored, inherited
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while proc.poll() is None and not started():  # however long it takes to get there
            time.sleep(0.05)
        assert proc.poll() is None or proc.returncode == 0, proc.communicate()[1]
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if proc.returncode == 0:
        pytest.skip(f"fgscale {name} ended before the interrupt landed")
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "lose already computed" not in err, err
    assert "CRITICAL" not in err, err  # distributed's log of a result it could not report
    return [line for line in err.splitlines() if line.startswith(f"fgscale {name}:")]


def test_ctrl_c_during_training_exits_130_and_the_run_resumes(tiny_store, tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out", str(run),
               "--max-epochs", "100000", *TRAIN]
    lines = _interrupt(command, (run / "metrics.jsonl").exists, "train")
    assert lines == ["fgscale train: interrupted. The run folder keeps the checkpoint of the last "
                     "finished epoch (before the first, no folder is left): run the same command "
                     "with --resume to go on from there."]
    done = len((run / "metrics.jsonl").read_text().splitlines())
    assert done >= 1
    # the corrected budget, resumed: it goes on from the checkpoint, not from epoch 0
    resumed = subprocess.run([*command[:-len(TRAIN) - 2], "--max-epochs", str(done + 2), *TRAIN,
                              "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == list(range(done + 2))


@pytest.fixture
def not_dask():
    """A TCP port where something that is not Dask answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nnot a scheduler" * 64)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_ctrl_c_during_cv_exits_130_and_says_how_to_resume(tiny_store, tmp_path):
    out = tmp_path / "cv.json"
    command = [sys.executable, "-m", "fgscale", "cv", str(tiny_store.path), "--folds", "2",
               "--out", str(out), "--max-epochs", "100000", "--tol", "0", *TRAIN]
    lines = _interrupt(command, lambda: any((tiny_store.path / "stats").glob("*")), "cv")
    assert lines == ["fgscale cv: interrupted. With --out, its file keeps the folds finished so "
                     "far: run the same command with --resume to train only the others."]


def test_an_unreachable_or_foreign_scheduler_is_a_clear_error(not_dask, tiny_store, capsys):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nobody = f"tcp://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
    # listening, never answering (a dashboard's port taken for the scheduler's): the
    # connection is made, and the handshake's read hung for ever, whatever --timeout said
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    quiet = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    for address in (nobody, not_dask, quiet):
        start = time.monotonic()
        assert main(["bank", str(tiny_store.path), "--scheduler", address,
                     "--timeout", "2"]) == 2
        assert time.monotonic() - start < 30  # a bounded wait, not a hang
        err = capsys.readouterr().err
        assert err.startswith(f"fgscale bank: error: cannot reach a Dask scheduler at {address} "
                              "within 2 s")
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    closed.close()
    silent.close()
    # the dashboard's link, or the scheduler file, given as the address: said what to give
    for address, message in (("http://127.0.0.1:8787/status", "is a web address \\(the "
                              "dashboard's\\?\\); give the scheduler's own, such as tcp://"),
                             ("sched.json", "is a file: give it as --scheduler-file")):
        assert main(["bank", str(tiny_store.path), "--scheduler", address]) == 2
        assert re.match(f"fgscale bank: error: {re.escape(address)} {message}",
                        capsys.readouterr().err)


def test_dask_scheduler_address_is_joined_as_dasks_client_joins_it(tiny_store, capsys,
                                                                   monkeypatch):
    """DASK_SCHEDULER_ADDRESS, which a batch job exports for every Dask client, was ignored:
    the command started a LocalCluster on the login node."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nobody = f"tcp://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", nobody)
    assert main(["bank", str(tiny_store.path), "--timeout", "1"]) == 2
    assert capsys.readouterr().err.startswith(  # where the address came from: said
        f"fgscale bank: error: cannot reach a Dask scheduler at {nobody} (from "
        "$DASK_SCHEDULER_ADDRESS) within 1 s")
    # --scheduler given still wins
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    given = f"tcp://127.0.0.1:{other.getsockname()[1]}"
    assert main(["bank", str(tiny_store.path), "--scheduler", given, "--timeout", "1"]) == 2
    assert f"at {given} within" in capsys.readouterr().err
    other.close()
    closed.close()


def test_a_run_that_fails_before_its_first_epoch_does_not_block_the_corrected_one(
        tiny_store, tmp_path, capsys):
    run = tmp_path / "run"
    fg = ["--regularizer", "feature_grouping", "--n-groupings", "2", "--n-bootstrap", "8",
          "--max-epochs", "2", "--n-workers", "1", "--no-progress"]
    too_many = str(tiny_store.n_features + 1)  # k > p: found when the bank is made
    assert main(["train", str(tiny_store.path), "--out", str(run), "--n-clusters", too_many,
                 *fg]) == 2
    assert "n_clusters" in capsys.readouterr().err
    assert not run.exists()
    assert main(["train", str(tiny_store.path), "--out", str(run), "--n-clusters", "0.1",
                 *fg]) == 0
    assert (run / "model.json").exists()


def test_resume_keeps_the_saved_parameters_not_given_again(tiny_store, tmp_path):
    """A finished 3-epoch run resumed without --max-epochs stays a 3-epoch run; a larger
    --max-epochs given again extends it."""
    run = tmp_path / "run"
    args = ["train", str(tiny_store.path), "--out", str(run)]
    assert main([*args, "--max-epochs", "3", *TRAIN]) == 0
    assert main([*args, *TRAIN, "--resume"]) == 0  # the saved 3, not the table's default
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert main([*args, "--max-epochs", "5", *TRAIN, "--resume"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 5


def test_a_failed_conversion_does_not_block_the_corrected_cohort(tiny_cohort, tmp_path, capsys):
    import csv as csv_module

    rows = list(csv_module.DictReader(open(tiny_cohort)))
    bad = tmp_path / "cut.nii.gz"
    data = (tiny_cohort.parent / rows[0]["path"]).read_bytes()
    bad.write_bytes(data[: len(data) * 4 // 5])  # its header reads; its data is cut short
    table = tmp_path / "cohort.csv"

    def write(entries):
        with open(table, "w", newline="") as f:
            writer = csv_module.DictWriter(f, fieldnames=["path", "label", "group", "split"])
            writer.writeheader()
            writer.writerows(entries)

    absolute = [dict(r, path=str(tiny_cohort.parent / r["path"])) for r in rows]
    write(absolute + [dict(absolute[0], path=str(bad))])
    store, mask = tmp_path / "s.zarr", tmp_path / "mask.nii.gz"
    from fgscale.images import compute_mask

    compute_mask([r["path"] for r in absolute]).to_filename(mask)  # no mask pass: blocks first
    convert = ["convert", str(table), "--out", str(store), "--n-workers", "1", "--no-progress",
               "--block-rows", "4", "--mask", str(mask)]
    assert main(convert) == 2
    assert "cut.nii.gz: cannot read the image data" in capsys.readouterr().err
    assert store.exists()  # the blocks of the good files are kept...
    write(absolute)  # ...and the corrected table (the bad row removed) converts afresh
    assert main(convert) == 0
    from fgscale.store import open_store

    converted = open_store(store)
    assert converted.attrs["complete"] and converted.n_samples == len(rows)


def test_ctrl_c_during_conversion_exits_130_and_the_same_command_finishes(tmp_path):
    from fgscale.images import make_cohort
    from fgscale.store import open_store

    table = make_cohort(tmp_path / "cohort", n_samples=160, n_classes=2, grid=(24, 28, 24),
                        seed=0)
    store = tmp_path / "s.zarr"
    command = [sys.executable, "-m", "fgscale", "convert", str(table), "--out", str(store),
               "--n-workers", "1", "--block-rows", "4", "--no-progress"]
    # once the store is made, blocks are being converted
    lines = _interrupt(command, (store / "done").exists, "convert")
    assert lines == ["fgscale convert: interrupted. The blocks converted so far, if any (none "
                     "before the mask is computed), are kept in the store: run the same command "
                     "again to convert the rest."]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert open_store(store).attrs["complete"]


def test_paths_in_a_cohort_table_never_make_fgscale_write_outside_its_output(tiny_cohort,
                                                                              tmp_path):
    """Convert, train and predict from a table whose paths climb out of its folder ("../"):
    every file outside the output folders is as it was, byte for byte."""
    import csv as csv_module
    import hashlib

    data = tmp_path / "data"
    shutil.copytree(tiny_cohort.parent, data)
    tables = tmp_path / "tables" / "deep"
    tables.mkdir(parents=True)
    table = tables / "cohort.csv"
    with open(data / "cohort.csv") as f:
        rows = list(csv_module.DictReader(f))
    with open(table, "w", newline="") as f:
        writer = csv_module.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(dict(r, path=f"../../data/{r['path']}") for r in rows)

    def snapshot():
        return {p: hashlib.sha1(p.read_bytes()).hexdigest()
                for p in tmp_path.rglob("*") if p.is_file() and "out" not in p.parts}

    before = snapshot()
    out = tmp_path / "out"
    assert main(["convert", str(table), "--out", str(out / "s.zarr"), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert main(["train", str(out / "s.zarr"), "--out", str(out / "run"), "--max-epochs", "2",
                 *TRAIN]) == 0
    assert main(["predict", str(out / "run"), str(table), "--out", str(out / "p.csv"),
                 "--no-progress"]) == 0
    assert snapshot() == before


def _built(store_path) -> int:
    """Groupings built so far in the store's only bank (0 while it has none), read while
    another process writes it."""
    from fgscale.store._banks import list_banks

    banks = list_banks(store_path)
    return banks[0]["built"] if banks else 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_during_the_bank_and_the_same_command_finishes(tmp_path, client, signum):
    from fgscale.grouping._dask_bank import build_bank, load_bank

    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    stores = [synthetic_store(tmp_path / name, 40, 4, n_subjects=5, seed=0, split=split,
                              block_rows=8) for name in ("s.zarr", "reference.zarr")]
    bank = {"n_groupings": 150, "n_bootstrap": 20, "n_clusters": 0.1, "seed": 7}
    command = [sys.executable, "-m", "fgscale", "bank", str(stores[0].path),
               *[f"--{name.replace('_', '-')}={value}" for name, value in bank.items()],
               "--n-workers", "1", "--no-progress"]
    # once some groupings are written, the tasks run
    # Ctrl-C in a terminal, and a batch scheduler's SIGTERM (a time limit, scancel), reach the
    # LocalCluster's worker processes too: they leave it to the command, no traceback of
    # theirs, no warning of the results lost with them
    lines = _interrupt(command, lambda: _built(stores[0].path) >= 5, "bank", group=True,
                       signum=signum)
    how = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert lines == [f"fgscale bank: {how}. The groupings built so far are kept in the "
                     "store: run the same command again to build the rest."]
    kept = _built(stores[0].path)
    assert 5 <= kept < bank["n_groupings"]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{bank['n_groupings'] - kept} groupings built, {kept} reused" in again.stdout
    # the groupings of the interrupted run and of the one that finished it, row for row those
    # of a bank built in one go: each grouping is seeded by (seed, index) alone
    labels, _ = load_bank(stores[0].path, **{k: v for k, v in bank.items() if k != "n_groupings"})
    reference = build_bank(stores[1].path, client=client, progress=False, **bank)
    np.testing.assert_array_equal(labels, reference)


@pytest.mark.slow  # 20,000 tasks, stopped after a few hundred: 20 to 30 s here, 2 cores
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_bank_of_many_tasks_stops_as_cleanly_and_promptly(tmp_path, signum):
    # the scheduler once lagged seconds behind 20,000 submits and took n² steps to cancel
    # them: the cluster was closed under it, and it logged each result it could not report
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, block_rows=8)
    command = [sys.executable, "-m", "fgscale", "bank", str(store.path), "--n-groupings=20000",
               "--n-bootstrap=10", "--n-clusters=0.2", "--n-workers=2", "--no-progress"]
    start = []
    lines = _interrupt(command, lambda: _built(store.path) >= 300 and not start.append(
        time.monotonic()), "bank", group=True, signum=signum)
    assert lines and "run the same command again to build the rest" in lines[0]
    assert time.monotonic() - start[0] < 20


@pytest.mark.slow  # the demo's own cohort (480 volumes), 2 epochs: 45 to 70 s here, 2 cores
def test_ctrl_c_during_the_demo_exits_130_and_the_same_command_finishes(tmp_path):
    """Interrupted while it converts its cohort; run again, it reuses the cohort and finishes
    (--max-epochs 2: the demo's 100 epochs take minutes)."""
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "fgscale", "demo", "--out", str(out), "--max-epochs", "2",
               "--no-progress"]
    # once the cohort is written, it is being converted
    lines = _interrupt(command, (out / "cohort.zarr").exists, "demo")
    assert lines == ["fgscale demo: interrupted. Finished steps are kept: run the same command "
                     "again to go on."]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "1/4 generating" not in again.stdout  # the cohort written before Ctrl-C is reused
    assert f"SYNTHETIC data; 2 runs in {out / 'runs'}" in again.stdout
    for regularizer in ("feature_grouping", "l2"):
        assert (out / "runs" / regularizer / "maps.nii.gz").exists()


def test_ctrl_c_during_a_checkpoint_write_lands_after_it_whole(tmp_path):
    """Ctrl-C inside torch.save's zip writer made it fail closing the archive with a
    RuntimeError that hid the KeyboardInterrupt (a traceback, exit 1): the write now ends whole,
    then the interrupt is raised."""
    import torch

    from fgscale._utils.files import atomic_path, signals_deferred

    path = tmp_path / "checkpoint.pt"
    state = {"w": torch.arange(1000.0)}
    # Python's own Ctrl-C handler: a module imported by another test (dask_jobqueue's runner)
    # replaces it process-wide
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred(), atomic_path(path) as tmp, open(tmp, "wb") as f:
                os.kill(os.getpid(), signal.SIGINT)  # delivered here, in the middle of the write
                torch.save(state, f)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.equal(torch.load(path, weights_only=True)["w"], state["w"])
