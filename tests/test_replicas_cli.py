"""``fgscale train --replicas R`` on a real store and a real cluster of worker processes: a run
resumed from its checkpoint, the LocalCluster's kind for replicas, and the refusals said in
one line."""

import json

import numpy as np
from helpers import refused

from fgscale.cli import build_parser, main

ARGS = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size", "4",
        "--learning-rate", "0.05", "--seed", "3", "--no-progress"]


def assert_same_model(run, other):
    with np.load(run / "model.npz") as a, np.load(other / "model.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_replicas_make_the_local_cluster_one_of_processes():
    """Without --worker-processes or --worker-threads, the LocalCluster for --replicas 2 is of
    processes (threads, the default for 2 workers, would be refused)."""
    from fgscale.cli._train import _processes

    parser = build_parser()
    for given, replicas, processes in (([], 1, False), ([], 2, True),
                                       (["--worker-threads"], 2, False),
                                       (["--worker-processes"], 1, True)):
        args = parser.parse_args(["train", "s.zarr", "--out", "r", "--n-workers", "2", *given])
        assert _processes(args, {"replicas": replicas}) is processes, (given, replicas)


def test_a_resumed_replicated_run_ends_as_an_uninterrupted_one(tiny_store, client, tmp_path):
    run, whole = tmp_path / "run", tmp_path / "whole"
    args = [str(tiny_store.path), "--replicas", "2", "--early-stopping", "false",
            "--scheduler", client.scheduler.address, *ARGS]
    assert main(["train", *args, "--out", str(run), "--max-epochs", "2"]) == 0
    assert main(["train", *args, "--out", str(run), "--max-epochs", "4", "--resume"]) == 0
    assert main(["train", *args, "--out", str(whole), "--max-epochs", "4"]) == 0
    assert_same_model(run, whole)
    assert json.loads((run / "config.json").read_text())["params"]["replicas"] == 2
    assert (run / "model.npz").exists() and (run / "final.json").exists()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(4))


def test_what_replicas_cannot_train_is_one_error_line(tiny_store, tmp_path, capsys):
    run = tmp_path / "run"
    refused(["train", tiny_store.path, "--out", run, "--replicas", "2", "--regularizer", "l2",
             *ARGS], capsys, r"^fgscale train: error: replicas=2 needs feature grouping, "
                             r"regularizer='feature_grouping': .* give replicas=1 to train it$")
    assert not run.exists()
    refused(["train", tiny_store.path, "--out", run, "--replicas", "2", "--worker-threads",
             "--n-workers", "2", *ARGS], capsys,
            r"^fgscale train: error: replicas=2 needs as many worker processes; the cluster has "
            r"1 \(.*--n-workers 2 or more, not --worker-threads\)$")
    assert not run.exists()
    refused(["train", tiny_store.path, "--out", run, "--replicas", "0", *ARGS], capsys,
            r"--replicas: expected an int in the range \[1, inf\), got '0'")
