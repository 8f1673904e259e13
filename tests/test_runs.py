"""``fgscale train`` / ``evaluate`` on real stores and a real LocalCluster."""

import csv
import json
import pickle
import shutil
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import torch
from helpers import TOLERANCE, assert_weight_map, kill_once_written, synthetic_store
from sklearn import metrics

from fgscale.cli import main
from fgscale.runs import evaluate_run, load_run, summary_lines, train_run

# one validation split (cv none): a run folder of one search phase and the refit, as a run of
# 250 training rows or more has; the folds' phases are tested with cv=2
ARGS = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size", "8",
        "--learning-rate", "0.05", "--seed", "3", "--cv", "none"]
PARAMS = dict(n_groupings=4, n_bootstrap=10, n_clusters=0.1, batch_size=8, learning_rate=0.05,
              random_state=3, cv=None)


def assert_same_model(run, other, **tolerance):
    """The two runs' saved models (every weight, the standardization) are equal."""
    with np.load(run / "model.npz") as a, np.load(other / "model.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], err_msg=name, **tolerance)


def test_train_writes_a_complete_run_folder(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    summary = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=5), client=client)
    assert sorted(p.name for p in run.iterdir()) == [  # early stopping, then the refit
        "checkpoint-refit.pt", "checkpoint.pt", "config.json", "final.json", "maps",
        "maps.json", "maps.nii.gz", "mask.nii.gz", "metrics-refit.jsonl", "metrics.jsonl",
        "model.json", "model.npz", "test_predictions.csv"]
    np.testing.assert_array_equal(nib.load(run / "mask.nii.gz").get_fdata() != 0, tiny_store.mask)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(5))
    assert_weight_map(run / "maps.nii.gz", tiny_store)
    assert summary["maps"] == str(run / "maps.nii.gz")
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
                 "--worker-processes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == tiny_store.test_rows().size
    assert main(["evaluate", str(run), str(tiny_store.path), "--n-workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{report['n']} rows: accuracy {report['accuracy']:.4f}" in out
    assert "confusion matrix (rows: true class, columns: predicted)" in out
    assert out.count("class_3") == 3  # its line in the table and the matrix, and its column
    # a bad store path is a clear error, not a traceback
    assert main(["train", str(tmp_path / "nope.zarr"), "--out", str(tmp_path / "r2")]) == 2
    assert "no such store" in capsys.readouterr().err
    for rows in ([], ["--rows", "test"]):  # not "no such NIfTI file", nor "NIfTI files have none"
        assert main(["predict", str(run), str(tmp_path / "nope.zarr"), "--out", "-", *rows]) == 2
        assert f"{tmp_path / 'nope.zarr'}: no such store" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_resume_after_a_killed_run_gives_the_uninterrupted_result(tiny_store, client, tmp_path,
                                                                    device):
    epochs = 40
    killed_run, whole_run = tmp_path / "killed", tmp_path / "whole"
    cmd = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out",
           str(killed_run), "--max-epochs", str(epochs), "--n-workers", "1", "--device", device,
           *ARGS]
    metrics = killed_run / "metrics.jsonl"
    kill_once_written(cmd, metrics, 3)
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < epochs, "the run was not killed mid-way"
    assert not (killed_run / "final.json").exists()

    params = dict(PARAMS, max_epochs=epochs, device=device)
    train_run(tiny_store.path, killed_run, params=params, resume=True, client=client)
    train_run(tiny_store.path, whole_run, params=params, client=client)
    assert_same_model(killed_run, whole_run, **TOLERANCE[device])
    lines = metrics.read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(epochs))


def test_a_search_killed_in_its_second_candidate_resumes_to_the_uninterrupted_result(
        tiny_store, client, tmp_path):
    epochs = 30
    killed_run, whole_run = tmp_path / "killed", tmp_path / "whole"
    args = [a if a != "0.1" else "0.1,0.2" for a in ARGS]  # --n-clusters: two candidates
    cmd = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out",
           str(killed_run), "--max-epochs", str(epochs), "--n-workers", "1", "--patience",
           str(epochs), *args]
    metrics = killed_run / "metrics-candidate-2.jsonl"
    kill_once_written(cmd, metrics, 3)
    assert 3 <= len(metrics.read_text().splitlines()) < epochs, "not killed mid-candidate"
    first = (killed_run / "metrics-candidate-1.jsonl").read_text()
    assert len(first.splitlines()) == epochs and not (killed_run / "metrics.jsonl").exists()

    params = dict(PARAMS, n_clusters=[0.1, 0.2], max_epochs=epochs, patience=epochs)
    summary = train_run(tiny_store.path, killed_run, params=params, resume=True, client=client)
    whole = train_run(tiny_store.path, whole_run, params=params, client=client)
    assert_same_model(killed_run, whole_run, rtol=1e-6, atol=1e-7)
    assert summary["candidates"] == whole["candidates"] and len(summary["candidates"]) == 2
    assert (killed_run / "metrics-candidate-1.jsonl").read_text() == first  # read, not rerun
    assert len((killed_run / "metrics-candidate-2.jsonl").read_text().splitlines()) == epochs


def test_a_cv_search_killed_in_its_second_fold_resumes_to_the_uninterrupted_result(
        tiny_store, client, tmp_path):
    """With cv=, each fold of each candidate is a phase with its own checkpoint: the folds done
    are read back, the killed one goes on from its last whole epoch."""
    epochs = 30
    killed_run, whole_run = tmp_path / "killed", tmp_path / "whole"
    cmd = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out",
           str(killed_run), "--max-epochs", str(epochs), "--n-workers", "1", "--patience",
           str(epochs), *ARGS, "--cv", "2"]
    metrics = killed_run / "metrics-fold-2.jsonl"
    kill_once_written(cmd, metrics, 3)
    assert 3 <= len(metrics.read_text().splitlines()) < epochs, "not killed mid-fold"
    first = (killed_run / "metrics-fold-1.jsonl").read_text()
    assert len(first.splitlines()) == epochs

    params = dict(PARAMS, cv=2, max_epochs=epochs, patience=epochs)
    summary = train_run(tiny_store.path, killed_run, params=params, resume=True, client=client)
    whole = train_run(tiny_store.path, whole_run, params=params, client=client)
    assert_same_model(killed_run, whole_run, rtol=1e-6, atol=1e-7)
    assert summary["candidates"] == whole["candidates"] and summary["folds"] == 2
    assert (killed_run / "metrics-fold-1.jsonl").read_text() == first  # read, not rerun
    assert len(metrics.read_text().splitlines()) == epochs


@pytest.mark.parametrize("params, match", [
    (dict(dropout=2.0), "'dropout' parameter of FeatureGroupingClassifier must be"),
    (dict(device="cuda:99"), "'cuda:99'"),  # a GPU this machine lacks: before the bank is built
])
def test_bad_parameters_stop_before_anything_is_written(tiny_store, client, tmp_path,
                                                        params, match):
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=match):
        train_run(tiny_store.path, run, params=dict(PARAMS, **params), client=client)
    assert not run.exists()  # so the corrected command is not refused as a resumed run
    assert "bank" not in tiny_store.group


def test_a_run_folder_that_cannot_be_made_is_named_before_any_work(tiny_store, tmp_path,
                                                                   monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr("fgscale.runs._train.get_client", None)  # refused before any cluster starts
    assert main(["train", str(tiny_store.path), "--out", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert f"fgscale train: error: [Errno 20] {blocker / 'run'}: the run folder cannot be created" in err
    assert "choose another --out" in err and blocker.read_text() == "not a folder"


def test_raising_max_epochs_extends_a_finished_run(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    first = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), client=client)
    summary = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=4), resume=True,
                        client=client)
    assert summary["epochs"] == 4
    # its time: this command's, and that of the epochs of both commands, said as such
    assert (first["resumed"], summary["resumed"]) == (False, True)
    assert summary["epoch_seconds"] > first["epoch_seconds"] > 0
    line = summary_lines(summary, dict(PARAMS))[0]
    assert (f"in {summary['seconds']:.1f} s this time, {summary['epoch_seconds']:.1f} s of "
            "epochs over all its sessions;") in line
    assert "all its sessions" not in summary_lines(first, dict(PARAMS))[0]
    train_run(tiny_store.path, tmp_path / "whole", params=dict(PARAMS, max_epochs=4), client=client)
    assert_same_model(run, tmp_path / "whole", rtol=1e-6, atol=1e-7)
    # a smaller max_epochs is refused, the run left as it is: it was accepted, and config.json
    # then said 3 epochs for a model of 4
    config = (run / "config.json").read_text()
    with pytest.raises(ValueError, match=r"run: --resume with max_epochs 3, fewer than the 4 "
                                         r"epochs the run has trained: leave --max-epochs out"):
        train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=3), resume=True,
                  client=client)
    assert (run / "config.json").read_text() == config and (run / "final.json").exists()


def test_an_extension_killed_mid_way_resumes_rather_than_passing_for_finished(tiny_store, client,
                                                                            tmp_path):
    """A finished run extended by a larger --max-epochs and killed: the same command goes on
    from the last epoch, not "already complete" with the first run's summary and model."""
    run, whole, epochs = tmp_path / "run", tmp_path / "whole", 40
    train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), client=client)
    cmd = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out", str(run),
           "--resume", "--max-epochs", str(epochs), "--n-workers", "1", *ARGS]
    kill_once_written(cmd, run / "metrics.jsonl", 5)
    assert 5 <= len((run / "metrics.jsonl").read_text().splitlines()) < epochs, "not killed mid-way"
    assert not (run / "final.json").exists()  # the extension has not finished

    params = dict(PARAMS, max_epochs=epochs)
    summary = train_run(tiny_store.path, run, params=params, resume=True, client=client)
    assert not summary.get("already_complete") and summary["epochs"] == epochs
    train_run(tiny_store.path, whole, params=params, client=client)
    assert_same_model(run, whole, rtol=1e-6, atol=1e-7)


def test_a_copied_finished_run_names_its_own_folder(tiny_store, client, tmp_path, capsys):
    """--resume on a copy of a finished run says where the copy's files are, not the folder
    it was copied from (which may be gone, or someone else's)."""
    run, copy = tmp_path / "run", tmp_path / "copy"
    train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), client=client)
    shutil.copytree(run, copy)
    shutil.rmtree(run)
    summary = train_run(tiny_store.path, copy, params=dict(PARAMS, max_epochs=2), resume=True,
                        client=client)
    assert summary["already_complete"] and summary["run"] == str(copy)
    assert summary["maps"] == str(copy / "maps.nii.gz")
    assert summary["predictions"] == str(copy / "test_predictions.csv")
    assert main(["train", str(tiny_store.path), "--out", str(copy), "--resume", "--no-progress",
                 "--n-workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"run folder: {copy} (maps: {copy / 'maps.nii.gz'}," in out and str(run) + " " not in out


def test_a_run_saved_before_a_parameter_existed_resumes(tiny_store, client, tmp_path):
    """A parameter added since a run was saved is absent from its config.json: it had its
    default there, and --resume goes on rather than calling it changed."""
    run = tmp_path / "run"
    first = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), client=client)
    config = json.loads((run / "config.json").read_text())
    del config["params"]["replicas"]  # as a run saved before replicas= was written it
    (run / "config.json").write_text(json.dumps(config))
    again = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), resume=True,
                      client=client)
    assert again["already_complete"] and again["test"] == first["test"]
    with pytest.raises(ValueError, match="replicas: saved 1, given 2"):
        train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2, replicas=2),
                  resume=True, client=client)


def test_an_early_stopped_run_is_not_restarted_by_a_larger_max_epochs(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    params = dict(PARAMS, model="mlp", hidden_layer_sizes=(8,), early_stopping=True, patience=1,
                  learning_rate=5.0, max_epochs=30)  # a step this large stops it early
    first = train_run(tiny_store.path, run, params=params, client=client)
    assert first["epochs"] < 30
    again = train_run(tiny_store.path, run, params=dict(params, max_epochs=60), resume=True,
                      client=client)
    assert again["epochs"] == first["epochs"]
    assert again["test"] == first["test"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_resumed_dropout_run_draws_the_same_masks(tiny_store, client, tmp_path, device):
    """An MLP with dropout, stopped after 3 epochs and resumed to 6, ends as a 6-epoch run:
    the checkpoint restores the generator dropout draws from (the CPU's, or the GPU's)."""
    params = dict(PARAMS, model="mlp", hidden_layer_sizes=(16,), dropout=0.5,
                  early_stopping=False, device=device)
    run, whole = tmp_path / "run", tmp_path / "whole"
    train_run(tiny_store.path, run, params=dict(params, max_epochs=3), client=client)
    train_run(tiny_store.path, run, params=dict(params, max_epochs=6), resume=True, client=client)
    summary = train_run(tiny_store.path, whole, params=dict(params, max_epochs=6), client=client)
    assert_same_model(run, whole, **TOLERANCE[device])
    # the saved model loads on the CPU: a GPU run is scored on a CPU-only node
    loaded = load_run(whole, device="cpu")
    assert {p.device.type for p in loaded.model_.parameters()} == {"cpu"}
    on_cpu = evaluate_run(whole, tiny_store.path, device="cpu", client=client)
    assert on_cpu["accuracy"] == summary["test"]["accuracy"]
    assert on_cpu["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)


def test_atomic_path_keeps_the_old_file_when_a_write_fails(tmp_path):
    from fgscale._utils.files import atomic_path

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


_WRITER = """
import sys
from fgscale._utils.files import atomic_path
for _ in range(300):
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(sys.argv[2].encode() * 200_000)
"""


def test_two_processes_writing_one_file_at_once_leave_one_whole(tmp_path):
    """Both wrote into the one temporary name '.tmp-<name>': one's rename took the other's
    half-written bytes, or failed ('No such file or directory'). A writer killed before its
    rename leaves its temporary file, which the next write on its machine removes; on a file
    system that nodes share, the next write on another node, where no process has that id, took
    it for dead and removed it, a file that writer might still rename."""
    from fgscale._utils.files import owner_tag

    host = owner_tag().partition("@")[2]
    target = tmp_path / "predictions.csv"
    for tag in ("999999999", f"999999999@{host}"):  # of writers killed mid-write
        (tmp_path / f".tmp-{tag}-predictions.csv").write_text("half")
    elsewhere = tmp_path / f".tmp-999999999@{host}x-predictions.csv"  # another node's
    elsewhere.write_text("half")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(target), byte],
                              stderr=subprocess.PIPE, text=True) for byte in "ab"]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert target.read_bytes() in (b"a" * 200_000, b"b" * 200_000)
    assert sorted(tmp_path.iterdir()) == [elsewhere, target]


def test_atomic_path_error_names_the_file_not_its_temporary(tmp_path, monkeypatch):
    from fgscale._utils.files import atomic_path, read_json

    monkeypatch.chdir(tmp_path)  # a relative path: its temporary name contains it
    (tmp_path / "final.json").mkdir()
    (tmp_path / "final.json" / "keep").write_text("x")  # the rename onto it fails for real
    with pytest.raises(OSError) as err, atomic_path("final.json") as tmp:
        tmp.write_text("new")
    assert str(err.value.strerror).startswith("final.json: not written (")
    assert ".tmp" not in str(err.value) and not list(tmp_path.glob(".tmp-*"))
    (tmp_path / "config.json").write_text('{"params": {"alpha": 0.1')  # cut short
    with pytest.raises(ValueError, match=r"^config.json: not a valid run configuration \("):
        read_json("config.json", "run configuration")


def test_evaluate_report_is_sklearn_metrics_of_its_predictions(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    summary = train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=2), client=client)
    report = evaluate_run(run, tiny_store.path, client=client, predictions=tmp_path / "p.csv")
    assert report == summary["test"] == json.loads((run / "final.json").read_text())["test"]
    with open(tmp_path / "p.csv") as f:
        table = list(csv.DictReader(f))
    classes = list(tiny_store.classes)
    test = tiny_store.test_rows()
    assert [int(r["row"]) for r in table] == test.tolist()
    assert [r["label"] for r in table] == tiny_store.classes[tiny_store.y[test]].tolist()
    clf = load_run(run)
    X = tiny_store.read_rows(test)
    assert [r["prediction"] for r in table] == clf.predict(X).tolist()
    proba = np.array([[float(r[f"proba_{c}"]) for c in classes] for r in table])
    np.testing.assert_array_equal(proba, clf.predict_proba(X))  # every digit kept in the CSV
    y_true, y_pred = [r["label"] for r in table], [r["prediction"] for r in table]
    assert report["n"] == len(table) == test.size
    assert report["accuracy"] == metrics.accuracy_score(y_true, y_pred)
    assert report["balanced_accuracy"] == pytest.approx(
        metrics.balanced_accuracy_score(y_true, y_pred))
    assert report["loss"] == pytest.approx(metrics.log_loss(y_true, proba, labels=classes))
    assert report["confusion_matrix"] == metrics.confusion_matrix(y_true, y_pred,
                                                                  labels=classes).tolist()
    precision, recall, f1, support = metrics.precision_recall_fscore_support(
        y_true, y_pred, labels=classes, zero_division=0)
    for i, c in enumerate(classes):  # None where scikit-learn's zero_division says 0
        shown = {k: 0.0 if v is None else v for k, v in report["per_class"][c].items()}
        assert shown == pytest.approx(
            {"precision": precision[i], "recall": recall[i], "f1": f1[i], "support": support[i]})


def test_an_unfinished_run_is_a_clear_error(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    train_run(tiny_store.path, run, params=dict(PARAMS, max_epochs=1), client=client)
    (run / "model.json").unlink()
    with pytest.raises(FileNotFoundError, match="model.json: no such file; the run .* has not "
                                                "finished"):
        evaluate_run(run, tiny_store.path, client=client)


class _Payload:
    """Unpickling this creates ``marker``: what a crafted file would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_planted_pickles_are_never_run(tiny_store, client, tmp_path):
    run = tmp_path / "run"
    params = dict(PARAMS, model="mlp", hidden_layer_sizes=(8,), early_stopping=True,
                  max_epochs=2)
    expected = train_run(tiny_store.path, run, params=params, client=client)["test"]
    # the checkpoint is plain data: it loads where nothing but tensors and numbers may
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["stopper"]["best_state"].keys() == state["model"].keys()

    # an estimator.pkl of an older fgscale, or planted: evaluate never opens it
    marker = tmp_path / "executed-pkl"
    (run / "estimator.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    assert evaluate_run(run, tiny_store.path, client=client) == expected
    assert not marker.exists()
    pickle.loads((run / "estimator.pkl").read_bytes())  # it does run when unpickled
    assert marker.exists()

    # a checkpoint holding an object: resuming refuses it unread
    marker = tmp_path / "executed-pt"
    torch.save({"epoch": 0, "model": _Payload(marker)}, run / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: the checkpoint holds objects other "
                                         "than plain tensors and numbers: refused unread"):
        train_run(tiny_store.path, run, params=dict(params, max_epochs=4), resume=True,
                  client=client)
    assert not marker.exists()


def test_labels_the_model_does_not_know_are_named_as_written(tiny_runs, tmp_path):
    """A store of the run's voxels whose labels include a new one: the message lists the
    labels as the cohort table wrote them, not numpy's reprs (np.str_('sofa'))."""
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    other = synthetic_store(tmp_path / "other.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            classes=["face", "house/home", "Face", "sofa"], block_rows=8)
    with pytest.raises(ValueError) as info:
        evaluate_run(tiny_runs["logreg"], other.path, rows="all")
    assert str(info.value) == (
        f"{other.path}: label(s) ['sofa'] the model does not know; its classes are "
        "['Face', 'chair b', 'face', 'house/home']")
