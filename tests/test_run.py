"""``fgscale train`` / ``evaluate`` on real stores and a real LocalCluster."""

import json
import os
import signal
import subprocess
import sys
import time

import nibabel as nib
import numpy as np
import pytest

from fgscale.cli import main
from fgscale.run import evaluate_run, train_run

ARGS = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size", "8",
        "--learning-rate", "0.05", "--seed", "3"]
PARAMS = dict(n_groupings=4, n_bootstrap=10, n_clusters=0.1, batch_size=8, learning_rate=0.05,
              random_state=3)


def weights(run):
    return np.asarray(nib.load(run / "weights.nii.gz").dataobj)


def test_train_writes_a_complete_run_folder(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    summary = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=5), client=client)
    for name in ("config.json", "checkpoint.pt", "metrics.jsonl", "estimator.pkl",
                 "weights.nii.gz", "final.json"):
        assert (run / name).exists(), name
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(5))
    img = nib.load(run / "weights.nii.gz")
    assert img.shape == (*tiny_store.mask.shape, len(tiny_store.classes))
    np.testing.assert_array_equal(img.affine, tiny_store.affine)
    w = np.asarray(img.dataobj)
    assert np.all(w[~tiny_store.mask] == 0) and np.any(w[tiny_store.mask] != 0)
    assert summary["test"]["n"] == tiny_store.test_rows().size
    assert summary["test"] == evaluate_run(run, tiny_store.path, client=client)
    with pytest.raises(ValueError, match="already exists"):
        train_run(tiny_store.path, run, params=PARAMS, client=client)
    with pytest.raises(ValueError, match="other parameters than the saved run .learning_rate"):
        train_run(tiny_store.path, run, params=dict(PARAMS, learning_rate=0.5), resume=True,
                  client=client)


def test_cli_train_and_evaluate(tiny_store, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(tiny_store.path), "--out", str(run), "--max-epochs", "2",
                 "--n-workers", "1", *ARGS]) == 0
    assert "test accuracy" in capsys.readouterr().out
    assert main(["evaluate", str(run), str(tiny_store.path), "--n-workers", "1",
                 "--worker-processes"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["n"] == tiny_store.test_rows().size
    # a bad store path is a clear error, not a traceback
    assert main(["train", str(tmp_path / "nope.zarr"), "--out", str(tmp_path / "r2")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_resume_after_a_killed_run_gives_the_uninterrupted_result(tiny_store, client, tmp_path):
    epochs = 40
    killed_run, whole_run = tmp_path / "killed", tmp_path / "whole"
    cmd = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out",
           str(killed_run), "--max-epochs", str(epochs), "--n-workers", "1", *ARGS]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = killed_run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its LocalCluster, mid-run
    proc.wait()
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < epochs, "the run was not killed mid-way"
    assert not (killed_run / "final.json").exists()

    params = dict(PARAMS, max_epochs=epochs)
    train_run(tiny_store.path, killed_run, params=params, resume=True, client=client)
    train_run(tiny_store.path, whole_run, params=params, client=client)
    np.testing.assert_allclose(weights(killed_run), weights(whole_run), rtol=1e-6, atol=1e-7)
    lines = metrics.read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(epochs))


def test_atomic_path_keeps_the_old_file_when_a_write_fails(tmp_path):
    from fgscale.checkpoint import atomic_path

    target = tmp_path / "final.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]  # no temporary left behind
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]
