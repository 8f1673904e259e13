"""fgscale cv: grouped K-fold on a store, each fold streamed, against in-memory fits."""

import json
import math
import sys

import numpy as np
import pytest
from helpers import kill_once_written
from sklearn.model_selection import GroupKFold

from fgscale import FeatureGroupingClassifier
from fgscale.cli import main
from fgscale.images import make_classification_volumes
from fgscale.runs._crossval import cross_validate
from fgscale.store import list_banks, write_store

# each outer fold's fit with one validation split (cv=None): the phases its checkpoints name
PARAMS = dict(regularizer="none", max_epochs=20, random_state=0, cv=None)


@pytest.fixture(scope="module")
def grouped_store(tmp_path_factory):
    """A SYNTHETIC store of 60 rows from 6 subjects, the last 12 rows held out as test."""
    X, y, mask, affine = make_classification_volumes(60, 3, grid=(10, 12, 10), n_subjects=6,
                                                     snr_db=-3.0, seed=1)
    groups = [f"sub-{(i // 3) % 6}" for i in range(60)]  # every subject has every class
    split = ["train"] * 48 + ["test"] * 12
    return write_store(tmp_path_factory.mktemp("cv") / "cv.zarr", X, y, mask, affine,
                       groups=groups, split=split, block_rows=16)


def _copy_store(store, path, **changes):
    """A copy of ``store`` at ``path``, with other ``groups`` or ``split`` if given."""
    kwargs = {"groups": store.groups, "split": store.split, **changes}
    return write_store(path, store.read_rows(np.arange(store.n_samples)), store.y, store.mask,
                       store.affine, classes=store.classes, **kwargs)


def test_each_fold_equals_an_in_memory_fit_on_its_rows(grouped_store, client):
    store = grouped_store
    scores = cross_validate(store.path, params=PARAMS, n_folds=3, client=client)
    assert scores["grouped"] and len(scores["folds"]) == 3
    rows = store.train_rows()
    X, y, groups = store.read_rows(rows), store.y[rows], store.groups[rows]
    splits = list(GroupKFold(n_splits=3).split(rows, groups=groups))
    for fold, (train, test) in zip(scores["folds"], splits, strict=True):
        assert not set(groups[train]) & set(groups[test])  # no subject on both sides
        memory = FeatureGroupingClassifier(**PARAMS).fit(X[train], y[train])
        assert fold["n"] == test.size and fold["n_train"] == train.size
        assert fold["accuracy"] == pytest.approx(memory.score(X[test], y[test]))
        majority = np.bincount(y[test]).max() / test.size  # the most frequent class alone
        assert fold["chance"] == pytest.approx(majority)
    accuracy = [f["accuracy"] for f in scores["folds"]]
    assert scores["mean_accuracy"] == pytest.approx(np.mean(accuracy))
    assert scores["mean_chance"] == pytest.approx(np.mean([f["chance"] for f in scores["folds"]]))


def test_feature_grouping_folds_build_their_own_banks(grouped_store, client, tmp_path):
    store = _copy_store(grouped_store, tmp_path / "copy.zarr")
    cross_validate(store.path, params=dict(n_groupings=3, n_bootstrap=8, max_epochs=5,
                                           n_clusters=0.1, random_state=0),
                   n_folds=2, client=client)
    banks = list_banks(store.path)
    assert len(banks) == 2 and {b["n_rows"] for b in banks} == {24}  # one per fold's rows


def test_cli(grouped_store, client, capsys):
    assert main(["cv", str(grouped_store.path), "--folds", "3", "--regularizer", "none", "--cv", "none",
                 "--max-epochs", "5", "--scheduler", client.scheduler.address]) == 0
    captured = capsys.readouterr()
    out = captured.out
    lines = out.splitlines()
    assert sum(line.startswith("fold ") for line in lines) == 3
    # groups, whether subjects or runs, as the store's group column holds them
    assert "3-fold cross-validation, grouped by the store's 6 groups: " in lines[-1]
    # each fold's bars (statistics, bank, epochs, predictions) are named by the fold
    err = captured.err
    for fold in range(3):
        assert f"fold {fold}: epochs" in err and f"fold {fold}: predicting" in err
    assert "fold 3:" not in err


def test_more_folds_than_subjects_or_rows_partly_grouped_are_refused(grouped_store, tmp_path,
                                                                     capsys, caplog, client):
    """Refused before any fold trains, not split into folds that share a subject."""
    for folds, most in ((7, "6 training groups"), (1, "6 training groups")):
        assert main(["cv", str(grouped_store.path), "--folds", str(folds)]) == 2
        err = capsys.readouterr().err
        assert (f"fgscale cv: error: {grouped_store.path}: {folds} folds; give 2 or more, and at "
                f"most the {most} (rows of a group never straddle folds)") in err, err
        assert "dashboard" not in err.lower()
    # what a fold's fit would refuse is refused before the cluster starts, too
    assert main(["cv", str(grouped_store.path), "--folds", "3", "--n-clusters", "99999"]) == 2
    err = capsys.readouterr().err
    assert "fgscale cv: error: n_clusters must be at most the number of features, " in err, err
    assert "dashboard" not in err.lower()
    groups = grouped_store.groups.copy()
    groups[:3] = ""
    partly = _copy_store(grouped_store, tmp_path / "partly.zarr", groups=groups)
    with pytest.raises(ValueError, match=r"partly\.zarr: 3 of the 48 training rows have no "
                                         r"group: give each row its group \(subject or run\), or none "
                                         "of them"):
        cross_validate(partly.path, params=PARAMS, n_folds=3)
    # train takes it, splitting by row, and says so: it said nothing
    with caplog.at_level("WARNING"):
        FeatureGroupingClassifier(**QUICK).fit(str(partly.path), client=client)
    assert "partly.zarr: 3 of its rows have no group: the validation split is by row" in caplog.text


# --- the results file (--out) and --resume ---

QUICK = dict(regularizer="none", max_epochs=5, random_state=0, cv=None)


class _Killed(Exception):
    """Stands for a cross-validation killed between two folds."""


@pytest.fixture(scope="module")
def full_run(grouped_store, client, tmp_path_factory):
    """An uninterrupted 3-fold cross-validation with a results file: (its scores, the file,
    the number of folds the file held at each fold's line)."""
    out = tmp_path_factory.mktemp("cv_out") / "cv.json"
    held = []
    scores = cross_validate(grouped_store.path, params=QUICK, n_folds=3, client=client,
                            out=out, echo=lambda line: held.append(_read(out)["folds"]))
    return scores, out, [len(folds) for folds in held]


def _read(path):
    return json.loads(path.read_text())


def test_the_results_file_is_written_after_each_fold(full_run, grouped_store):
    scores, out, held = full_run
    assert held == [1, 2, 3]  # on disk before each fold's line
    saved = _read(out)
    assert saved["complete"] and not scores["already_complete"] and scores["out"] == str(out)
    assert saved["folds"] == scores["folds"]
    assert saved["mean_score"] == scores["mean_score"] == pytest.approx(
        np.mean([f["accuracy"] for f in saved["folds"]]))
    assert saved["std_score"] == scores["std_score"]
    assert saved["store"] == str(grouped_store.path.resolve())
    assert saved["store_id"] == grouped_store.identity()
    assert (saved["n_folds"], saved["task"], saved["grouped"], saved["seed"]) == (
        3, "classification", True, 0)
    assert saved["params"]["max_epochs"] == 5 and "fgscale" in saved["versions"]
    test_rows = np.concatenate(saved["test_rows"])
    assert np.array_equal(np.sort(test_rows), grouped_store.train_rows())  # each row once
    assert [len(t) for t in saved["test_rows"]] == [f["n"] for f in saved["folds"]]
    assert list(out.parent.iterdir()) == [out]  # no temporary file left


def test_an_interrupted_cross_validation_resumes_to_the_uninterrupted_result(
        full_run, grouped_store, client, tmp_path, monkeypatch):
    scores, full, _ = full_run
    out = tmp_path / "cv.json"

    def killed_after_fold_1(line):
        if line.startswith("fold 1:"):
            raise _Killed

    with pytest.raises(_Killed):
        cross_validate(grouped_store.path, params=QUICK, n_folds=3, client=client, out=out,
                       echo=killed_after_fold_1)
    assert not _read(out)["complete"] and len(_read(out)["folds"]) == 2
    lines = []
    resumed = cross_validate(grouped_store.path, params={**QUICK, "verbose": 1}, n_folds=3,
                             client=client, out=out, resume=True, echo=lines.append)
    assert [line.endswith(f"), from {out}") for line in lines] == [True, True, False]
    # the same numbers as in one go: each fold's seed and rows come from the plan, not the run
    assert resumed["folds"] == scores["folds"]
    assert resumed["mean_score"] == scores["mean_score"]
    assert resumed["std_score"] == scores["std_score"]
    # the file as in one go, params included: the resume's verbose=1 shows, it is not recorded
    assert _read(out) == _read(full)

    # complete: reported, nothing trained (no cluster asked for), the file left as it is
    before = out.read_bytes()
    monkeypatch.setattr("fgscale.runs._crossval.get_client", None)
    again = cross_validate(grouped_store.path, params=QUICK, n_folds=3, out=out, resume=True)
    assert again["already_complete"] and again["folds"] == scores["folds"]
    assert out.read_bytes() == before


def test_resume_refuses_other_parameters_folds_or_store_and_leaves_the_file(
        full_run, grouped_store, tmp_path, monkeypatch):
    _, full, _ = full_run
    before = full.read_bytes()
    monkeypatch.setattr("fgscale.runs._crossval.get_client", None)  # refused before any cluster
    split = grouped_store.split.copy()
    split[:3] = "test"
    other = _copy_store(grouped_store, tmp_path / "other.zarr", split=split)
    for store, params, folds, differs in (
            (grouped_store, {**QUICK, "max_epochs": 6}, 3,
             "parameters (max_epochs: saved 5, given 6)"),
            (grouped_store, {**QUICK, "random_state": 1}, 3,
             "parameters (random_state: saved 0, given 1)"),
            (grouped_store, QUICK, 2, "n_folds (saved 3, given 2)"),
            (other, QUICK, 3, f"store (saved {grouped_store.path.resolve()}, given "
                              f"{other.path.resolve()}")):
        with pytest.raises(ValueError) as info:
            cross_validate(store.path, params=params, n_folds=folds, out=full, resume=True)
        assert str(info.value).startswith(f"{full}: --resume does not match the saved cross-validation in "
                                      f"its {differs}"), info.value
        assert f"choose another --out, or delete {full} to start afresh" in str(info.value)
        assert full.read_bytes() == before


def test_a_file_saved_before_a_parameter_existed_resumes(full_run, grouped_store, tmp_path,
                                                         monkeypatch):
    """A parameter added since the results file was saved is absent from it: it had its
    default there, and --resume reads the file as complete rather than as other parameters."""
    scores, full, _ = full_run
    old = _read(full)
    for name in ("replicas", "scoring"):  # as a file saved before they were written it
        del old["params"][name]
    out = tmp_path / "old_cv.json"
    out.write_text(json.dumps(old))
    monkeypatch.setattr("fgscale.runs._crossval.get_client", None)  # nothing left to train
    again = cross_validate(grouped_store.path, params=QUICK, n_folds=3, out=out, resume=True)
    assert again["already_complete"] and again["folds"] == scores["folds"]
    with pytest.raises(ValueError, match=r"parameters \(scoring: saved None, given 'accuracy'\)"):
        cross_validate(grouped_store.path, params={**QUICK, "scoring": "accuracy"}, n_folds=3,
                       out=out, resume=True)


def test_an_existing_file_is_refused_without_resume(full_run, grouped_store, monkeypatch):
    _, full, _ = full_run
    before = full.read_bytes()
    monkeypatch.setattr("fgscale.runs._crossval.get_client", None)
    with pytest.raises(ValueError, match=f"{full}: cross-validation results already exist "
                                         "there; pass --resume to continue them, or choose "
                                         "another --out"):
        cross_validate(grouped_store.path, params=QUICK, n_folds=3, out=full)
    assert full.read_bytes() == before


def test_a_file_that_is_not_cv_results_is_refused_by_name(grouped_store, tmp_path, capsys):
    out = tmp_path / "cv.json"
    for text, why in (("{not json", "it is not JSON"), (b"\xff\xfe\x00", "it is not JSON"),
                      ("[1, 2]", "it holds a JSON list, not an object"),
                      ('{"params": {}}', """its "kind" is missing (or null), expected """
                                         "'fgscale cv results'")):
        out.write_bytes(text if isinstance(text, bytes) else text.encode())
        for resume in ([], ["--resume"]):  # the CLI reads the file first with --resume
            assert main(["cv", str(grouped_store.path), "--out", str(out), *resume]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"fgscale cv: error: {out}: not a results file of fgscale cv, "
                                  f"or a damaged one; choose another --out ({why}"), err
            assert "Traceback" not in err
    with pytest.raises(ValueError, match="not a results file of fgscale cv"):
        cross_validate(grouped_store.path, params=QUICK, n_folds=3, out=out, resume=True)
    with pytest.raises(ValueError, match=f"{tmp_path}: a folder; --out is the results file"):
        cross_validate(grouped_store.path, params=QUICK, n_folds=3, out=tmp_path)


def test_a_damaged_results_file_names_the_field_and_what_it_should_be(full_run, grouped_store,
                                                                      tmp_path, capsys):
    _, full, _ = full_run
    out = tmp_path / "cv.json"
    for change, why in (
            (lambda r: r["folds"][1].update(accuracy="high"),
             'its "folds"[1]["accuracy"] is "high", expected a number'),
            (lambda r: r["folds"][1].update(accuracy=None),
             'its "folds"[1]["accuracy"] is missing (or null), expected a number'),
            (lambda r: r["folds"][0].update(n="x"), 'its "folds"[0]["n"] is "x", expected an '
                                                    "integer"),
            (lambda r: r["folds"][2].update(fold=5), 'its "folds"[2]["fold"] is 5, expected 2'),
            (lambda r: r.update(n_folds="3"), 'its "n_folds" is "3", expected an integer'),
            (lambda r: r.update(params=[1]), 'its "params" is [1], expected an object'),
            (lambda r: r.update(task="or"),
             """its "task" is "or", expected 'classification' or 'regression'"""),
            (lambda r: r["test_rows"][0].__setitem__(0, "a"),
             'its "test_rows" is [["a", '),
            (lambda r: r.update(score="r2"), 'its "folds"[0]["r2"] is missing (or null)'),
            (lambda r: [f.update(r2=None) for f in r["folds"]] and r.update(score="r2"),
             'its "folds"[0]["mae"] is missing (or null), expected a number')):
        results = _read(full)
        change(results)
        out.write_text(json.dumps(results))
        before = out.read_bytes()
        assert main(["cv", str(grouped_store.path), "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fgscale cv: error: {out}: not a results file of fgscale cv, or a "
                              f"damaged one; choose another --out ({why}"), err
        assert "Traceback" not in err and out.read_bytes() == before


def test_an_out_that_cannot_be_written_is_refused_before_any_fold(grouped_store, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.setattr("fgscale.runs._crossval.get_client", None)  # refused before any cluster
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "cv.json"  # a folder no one can create, root included
    assert main(["cv", str(grouped_store.path), "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"fgscale cv: error: {out}: its folder {out.parent} cannot be created or written, so no "
        "fold could be saved there: choose another --out; nothing trained\n")


def test_a_cross_validation_refused_or_failed_before_its_first_epoch_writes_nothing(
        grouped_store, client, tmp_path, monkeypatch):
    out = tmp_path / "cv.json"
    with pytest.raises(ValueError, match="max_epochs"):
        cross_validate(grouped_store.path, params={**QUICK, "max_epochs": 0}, out=out)

    def fails(*args, **kwargs):
        raise RuntimeError("a worker died")

    with monkeypatch.context() as patch:
        patch.setattr(FeatureGroupingClassifier, "_fit_store", fails)
        with pytest.raises(RuntimeError):
            cross_validate(grouped_store.path, params=QUICK, n_folds=3, client=client, out=out)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_fold_that_failed_after_training_keeps_its_checkpoints_for_resume(
        full_run, grouped_store, client, tmp_path, monkeypatch, capsys, caplog):
    scores, _, _ = full_run
    out = tmp_path / "cv.json"

    def fails(*args, **kwargs):
        raise RuntimeError("a worker died")

    with monkeypatch.context() as patch:
        patch.setattr("fgscale.runs._crossval.score_store", fails)
        with pytest.raises(RuntimeError):
            cross_validate(grouped_store.path, params=QUICK, n_folds=3, client=client, out=out)
    folder = tmp_path / "cv.json.fold-0"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [folder.name]
    assert (folder / "checkpoint-refit.pt").exists()
    # the same command without --resume is refused, naming the folder, before any cluster
    assert main(["cv", str(grouped_store.path), "--folds", "3", "--regularizer", "none", "--cv", "none",
                 "--max-epochs", "5", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: the checkpoints of a fold of an unfinished cross-validation" in err
    assert "pass --resume" in err and "Traceback" not in err
    # other parameters do not resume it, and the folder is kept for the right ones
    with pytest.raises(ValueError, match=r"cv\.json\.fold-0: --resume does not match these "
                                         r"checkpoints in their parameters \(max_epochs"):
        cross_validate(grouped_store.path, params={**QUICK, "max_epochs": 6}, n_folds=3,
                       out=out, resume=True)
    assert folder.is_dir()
    # resumed: fold 0 from its checkpoints, each phase at its last epoch, then folds 1 and 2
    with caplog.at_level("INFO", logger="fgscale"):
        resumed = cross_validate(grouped_store.path, params=QUICK, n_folds=3, client=client,
                                 out=out, resume=True)
    assert caplog.text.count(f"resumed {folder} after epoch 4") == 2  # its search and refit
    assert caplog.text.count("resumed ") == 2
    assert resumed["folds"] == scores["folds"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cv.json"]


@pytest.mark.parametrize("fold", [0, 1])
def test_a_cross_validation_killed_mid_fold_resumes_that_fold_from_its_checkpoint(
        full_run, grouped_store, tmp_path, capsys, fold):
    """A SIGKILL of the command (and its LocalCluster) in a fold's third epoch, before the
    results file is written (fold 0) or after (fold 1): --resume, alone, takes the saved
    options, trains that fold from its checkpoint and gives the uninterrupted folds."""
    scores, _, _ = full_run
    out = tmp_path / "cv.json"
    cmd = [sys.executable, "-m", "fgscale", "cv", str(grouped_store.path), "--folds", "3",
           "--regularizer", "none", "--cv", "none", "--max-epochs", "5", "--out", str(out),
           "--n-workers", "1", "--no-progress"]
    metrics = tmp_path / f"cv.json.fold-{fold}" / "metrics.jsonl"
    kill_once_written(cmd, metrics, 3)
    assert 3 <= len(metrics.read_text().splitlines()) < 5, "not killed mid-fold"
    assert out.exists() == (fold > 0)
    assert main(["cv", str(grouped_store.path), "--out", str(out), "--resume", "--n-workers",
                 "1", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("3-fold cross-validation")
    # fold 0 (or its first epochs) trained in the killed command's own process: its float
    # figures agree with this process's to float32 rounding, not bit for bit, as another
    # process's torch and BLAS may sum in another order; everything else is exact
    assert _close(_read(out)["folds"], scores["folds"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cv.json"]


def _close(a, b, rel: float = 1e-6) -> bool:
    """``a`` equals ``b``, nested lists and dicts alike, their floats to ``rel`` relative."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[key], b[key], rel) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b, strict=True))
    return a == b


def test_cli_out_and_resume_with_the_saved_parameters(full_run, grouped_store, client,
                                                      tmp_path, capsys):
    scores, full, _ = full_run
    out = tmp_path / "cv.json"
    scheduler = ["--scheduler", client.scheduler.address, "--no-progress"]
    assert main(["cv", str(grouped_store.path), "--folds", "3", "--regularizer", "none", "--cv", "none",
                 "--max-epochs", "5", "--out", str(out), *scheduler]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("fold ") for line in lines) == 3
    assert lines[-1].startswith("3-fold cross-validation, grouped by the store's 6 groups: "
                                "accuracy ")
    assert lines[-1].endswith(f"(mean ± sd), the most frequent class alone "
                              f"{scores['mean_chance']:.4f}; results in {out}")
    assert _read(out)["folds"] == scores["folds"]
    # --resume alone: the saved folds and parameters, not the options' defaults (5 folds,
    # feature grouping), so the finished cross-validation is found finished
    assert main(["cv", str(grouped_store.path), "--out", str(out), "--resume", *scheduler]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(line.endswith(f"), from {out}") for line in lines[:3])
    assert lines[-1].endswith(f"already complete in {out}, nothing trained")
    # an option given on the command line is the command's, and is checked against the file
    assert main(["cv", str(grouped_store.path), "--out", str(out), "--resume",
                 "--max-epochs", "6", *scheduler]) == 2
    assert "max_epochs: saved 5, given 6" in capsys.readouterr().err
    assert main(["cv", str(grouped_store.path), "--resume", *scheduler]) == 2
    assert "--resume continues the cross-validation saved in --out: give --out" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="resume=True continues the cross-validation saved in "
                                         "out: give out"):
        cross_validate(grouped_store.path, params=QUICK, resume=True)


@pytest.mark.parametrize("task, kind", [
    ("classification", "stratified by class, shuffled (the store has no groups)"),
    ("regression", "shuffled (the store has no groups)")])
def test_the_summary_says_how_folds_without_groups_were_drawn(task, kind):
    """Without groups a classification's folds are stratified (StratifiedKFold), which a
    methods section must say; a regression's are shuffled (KFold)."""
    from fgscale.runs._crossval import summary_line

    scores = {"n_folds": 3, "score": "accuracy" if task == "classification" else "r2",
              "mean_score": 0.5, "std_score": 0.1, "grouped": False}
    assert summary_line(scores).startswith(f"3-fold cross-validation, {kind}: ")
