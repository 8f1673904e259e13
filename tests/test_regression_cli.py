"""Regression through the command line: a cohort table with a target column, converted, trained
(task inferred from the store), evaluated (R², MAE, correlation) and applied to the images."""

import csv
import json

import numpy as np
import pytest
from helpers import cohort_rows
from sklearn import metrics

from fgscale.cli import main
from fgscale.runs import load_run
from fgscale.store import open_store

# one validation split (cv none): a run folder of one search phase and the refit
TRAIN = ["--n-groupings", "4", "--n-bootstrap", "10", "--batch-size", "8", "--seed", "0",
         "--max-epochs", "4", "--n-workers", "1", "--no-progress", "--cv", "none"]


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def regression_cohort(tiny_cohort, tmp_path):
    """The tiny cohort's files with a numeric target instead of a label (SYNTHETIC)."""
    rows = cohort_rows(tiny_cohort)
    table = tmp_path / "ages.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "target", "participant_id", "split"])
        for i, r in enumerate(rows):
            writer.writerow([str(tiny_cohort.parent / r["path"]), 20.0 + 1.5 * i + 0.25 * (i % 3),
                             r["group"], r["split"]])
    return table


def test_regression_from_a_target_column_to_predictions(regression_cohort, tmp_path, capsys):
    store_path, run = tmp_path / "ages.zarr", tmp_path / "run"
    assert main(["convert", str(regression_cohort), "--out", str(store_path), "--n-workers", "1",
                 "--no-progress"]) == 0
    store = open_store(store_path)
    targets = np.array([float(r["target"]) for r in _read(regression_cohort)])
    assert not store.has_labels and np.array_equal(store.target, targets)

    assert main(["train", str(store_path), "--out", str(run), *TRAIN]) == 0
    out = capsys.readouterr().out
    assert "test R² " in out and "the target's 3D map in maps/" in out
    assert type(load_run(run)).__name__ == "FeatureGroupingRegressor"

    predictions = tmp_path / "test_predictions.csv"
    assert main(["evaluate", str(run), str(store_path), "--n-workers", "1", "--json",
                 "--predictions", str(predictions), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    table = _read(predictions)
    y = np.array([float(r["target"]) for r in table])
    pred = np.array([float(r["prediction"]) for r in table])
    assert report["n"] == len(table) == store.test_rows().size
    assert report["r2"] == pytest.approx(metrics.r2_score(y, pred))
    assert report["mae"] == pytest.approx(metrics.mean_absolute_error(y, pred))
    assert report["correlation"] == pytest.approx(np.corrcoef(y, pred)[0, 1])
    assert report["mae_of_mean"] == pytest.approx(metrics.mean_absolute_error(y, y * 0 + y.mean()))
    # the same scores in words, one line as a classifier's accuracy is said
    assert main(["evaluate", str(run), str(store_path), "--n-workers", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"target on {report['n']} rows: r2 {report['r2']:.4f}, mae {report['mae']:.4f} "
        f"(predicting the mean: {report['mae_of_mean']:.4f}), rmse {report['rmse']:.4f}, "
        f"correlation {report['correlation']:.4f}")

    # the same predictions from the images, reading only the run folder and the files
    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(regression_cohort), "--rows", "test", "--out",
                 str(out), "--no-progress"]) == 0
    from_images = np.array([float(r["prediction"]) for r in _read(out)])
    np.testing.assert_allclose(from_images, pred, rtol=1e-5)
    # numbers summed up by their range, not counted as if each were a class
    assert capsys.readouterr().out.strip() == (
        f"{len(pred)} predictions of target written to {out} (min {from_images.min():.4g}, mean "
        f"{from_images.mean():.4g}, max {from_images.max():.4g})")

    # new images, whose targets are what is sought: a table of paths, or some targets unknown
    rows = [r for r in _read(regression_cohort) if r["split"] == "test"]
    paths, some = tmp_path / "new.csv", tmp_path / "some.csv"
    paths.write_text("path\n" + "".join(f"{r['path']}\n" for r in rows))
    some.write_text("path,target\n" + "".join(
        f"{r['path']},{r['target'] if i % 2 else ''}\n" for i, r in enumerate(rows)))
    for table, known in ((paths, False), (some, True)):
        assert main(["predict", str(run), str(table), "--out", str(out), "--no-progress"]) == 0
        lines = _read(out)
        assert list(lines[0]) == (["path", "target", "prediction"] if known
                                  else ["path", "prediction"])
        np.testing.assert_allclose([float(r["prediction"]) for r in lines], pred, rtol=1e-5)
        if known:
            assert [r["target"] for r in lines] == [
                r["target"] if i % 2 else "" for i, r in enumerate(rows)]


def test_task_regression_on_a_store_with_labels_only_is_refused(tiny_store, tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", str(tiny_store.path), "--out", str(run), "--task", "regression",
                 *TRAIN]) == 2
    assert "the store has no target" in capsys.readouterr().err
    assert not run.exists()  # nothing written: the corrected command is not blocked
    assert main(["train", str(tiny_store.path), "--out", str(run), *TRAIN]) == 0


def test_cv_of_a_regression_store_grouped_by_subject(regression_cohort, tmp_path, capsys):
    store = tmp_path / "ages.zarr"
    assert main(["convert", str(regression_cohort), "--out", str(store), "--n-workers", "1",
                 "--no-progress"]) == 0
    results = tmp_path / "cv.json"
    assert main(["cv", str(store), "--folds", "2", "--out", str(results), *TRAIN]) == 0
    out = capsys.readouterr().out
    folds = [line for line in out.splitlines() if line.startswith("fold ")]
    assert len(folds) == 2 and all(" r2 " in line for line in folds)
    r2 = [float(line.split(" r2 ")[1].split(",")[0]) for line in folds]
    summary = out.split("2-fold cross-validation of target, grouped by the store's ")[1]
    summary = summary.split(" groups: r2 ")[1]
    assert float(summary.split()[0]) == pytest.approx(np.mean(r2), abs=1e-4)
    # the errors in the target's units beside R², each fold's and their mean, as saved
    saved = json.loads(results.read_text())
    for line, fold in zip(folds, saved["folds"], strict=True):
        assert f", mae {fold['mae']:.4g}, rmse {fold['rmse']:.4g} on {fold['n']} rows" in line
        assert f"n_clusters {fold['selected']['n_clusters']})" in line
    assert saved["mean_mae"] == pytest.approx(np.mean([f["mae"] for f in saved["folds"]]))
    assert f"(mean ± sd), mae {saved['mean_mae']:.4g}, rmse {saved['mean_rmse']:.4g}" in summary
    # each fold's out-of-fold predictions, row by row, pooled into one more R²
    target = open_store(store).target
    for fold, test in zip(saved["folds"], saved["test_rows"], strict=True):
        np.testing.assert_allclose(fold["targets"], target[test])
        assert fold["r2"] == pytest.approx(metrics.r2_score(fold["targets"], fold["predictions"]))
    pooled = metrics.r2_score(target[sum(saved["test_rows"], [])],
                              sum((f["predictions"] for f in saved["folds"]), []))
    assert saved["pooled_r2"] == pytest.approx(pooled) and saved["n_scored"] == 2
    assert f"; pooled out-of-fold: r2 {pooled:.4g}, mae " in summary
    # a resumed complete file says the same, and a fold without its errors is a damaged file
    assert main(["cv", str(store), "--folds", "2", "--out", str(results), "--resume",
                 *TRAIN]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [f"{line}, from {results}" for line in folds]
    del saved["folds"][1]["mae"]
    results.write_text(json.dumps(saved))
    assert main(["cv", str(store), "--folds", "2", "--out", str(results), "--resume",
                 *TRAIN]) == 2
    assert '"folds"[1]["mae"] is missing (or null), expected a number' in capsys.readouterr().err


def test_leave_one_subject_out_is_scored_on_the_pooled_predictions(regression_cohort, tmp_path,
                                                                   capsys):
    rows = _read(regression_cohort)
    one_each, constant = tmp_path / "one_each.csv", tmp_path / "constant.csv"
    # a scan per subject, every subject a fold: no fold's own R² is defined (one test row)
    one_each.write_text("path,target,group\n" + "".join(
        f"{r['path']},{r['target']},s{i}\n" for i, r in enumerate(rows[:6])))
    constant.write_text("path,target\n" + "".join(f"{r['path']},50\n" for r in rows[:6]))
    for table in (one_each, constant):
        assert main(["convert", str(table), "--out", str(tmp_path / f"{table.stem}.zarr"),
                     "--n-workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    results = tmp_path / "loso.json"
    assert main(["cv", str(tmp_path / "one_each.zarr"), "--folds", "6", "--out", str(results),
                 *TRAIN]) == 0
    out = capsys.readouterr().out.splitlines()
    saved = json.loads(results.read_text())
    assert [f["r2"] for f in saved["folds"]] == [None] * 6
    assert all(line.startswith(f"fold {i}: target r2 n/a (one row), mae ")
               for i, line in enumerate(out[:6]))
    # the pooled scores are scikit-learn's on the six out-of-fold predictions together
    y = np.concatenate([f["targets"] for f in saved["folds"]])
    pred = np.concatenate([f["predictions"] for f in saved["folds"]])
    assert sorted(y) == sorted(float(r["target"]) for r in rows[:6])
    assert saved["pooled_r2"] == pytest.approx(metrics.r2_score(y, pred))
    assert saved["pooled_mae"] == pytest.approx(metrics.mean_absolute_error(y, pred))
    assert saved["mean_score"] is None and saved["n_scored"] == 0
    assert out[6].startswith("6-fold cross-validation of target, grouped by the store's 6 groups: "
                             "r2 n/a in every fold")
    assert f"; pooled out-of-fold: r2 {saved['pooled_r2']:.4g}, mae {saved['pooled_mae']:.4g}" in out[6]
    # read back on --resume as the file it is (a null R², the rows' predictions)
    assert main(["cv", str(tmp_path / "one_each.zarr"), "--folds", "6", "--out", str(results),
                 "--resume", *TRAIN]) == 0
    assert capsys.readouterr().out.splitlines()[6] == f"{out[6].split('; results in')[0]}; " \
        f"already complete in {results}, nothing trained"
    saved["folds"][2]["predictions"] = []
    results.write_text(json.dumps(saved))
    assert main(["cv", str(tmp_path / "one_each.zarr"), "--folds", "6", "--out", str(results),
                 "--resume", *TRAIN]) == 2
    assert '"folds"[2]["predictions"] is [], expected a list of 1 numbers' in capsys.readouterr().err
    # a target that never varies has nothing to predict: refused before any fold trains
    assert main(["cv", str(tmp_path / "constant.zarr"), "--folds", "2", *TRAIN]) == 2
    captured = capsys.readouterr()
    assert "the target is 50 for all 6 training rows: there is nothing to predict" in captured.err
    assert "fold 0:" not in captured.out


def test_the_target_and_label_columns_can_have_the_tables_own_names(regression_cohort, tmp_path,
                                                                   capsys):
    rows = _read(regression_cohort)
    table = tmp_path / "participants.tsv"  # as a BIDS participants.tsv names them
    table.write_text("path\tage\tdiagnosis\tparticipant_id\n" + "".join(
        f"{r['path']}\t{r['target']}\t{'ad' if i % 2 else 'hc'}\t{r['participant_id']}\n"
        for i, r in enumerate(rows)))
    store = tmp_path / "p.zarr"
    assert main(["convert", str(table), "--out", str(store), "--target-column", "age",
                 "--label-column", "diagnosis", "--n-workers", "1", "--no-progress"]) == 0
    converted = open_store(store)
    np.testing.assert_array_equal(converted.target, [float(r["target"]) for r in rows])
    assert list(converted.classes) == ["ad", "hc"]
    assert list(converted.groups) == [r["participant_id"] for r in rows]
    # a column the table lacks is named, with the table's own; nothing is written
    capsys.readouterr()
    assert main(["convert", str(table), "--out", str(tmp_path / "q.zarr"), "--target-column",
                 "Age", "--n-workers", "1", "--no-progress"]) == 2
    assert ("participants.tsv: no column 'Age' to read as the target (--target-column); the "
            "table's columns are ['path', 'age', 'diagnosis', 'participant_id']"
            in capsys.readouterr().err)
    assert not (tmp_path / "q.zarr").exists()


def test_help_says_what_the_classification_words_mean_for_a_regressor(capsys):
    for command in ("train", "cv"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "or its accuracy (as scikit-learn's MLP and SGD; a regressor's R²)" in text
        assert "'auto': on when every class (a regressor: the target) has rows to spare" in text
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "path, then label and/or a numeric target" in " ".join(capsys.readouterr().out.split())


def test_a_table_with_labels_and_a_target_says_both(tiny_cohort, tmp_path, capsys):
    rows = cohort_rows(tiny_cohort)
    table = tmp_path / "both.csv"
    table.write_text("path,label,target\n" + "".join(
        f"{tiny_cohort.parent / r['path']},{r['label']},{i}\n" for i, r in enumerate(rows)))
    assert main(["convert", str(table), "--out", str(tmp_path / "both.zarr"), "--no-progress"]) == 0
    assert "voxels, 3 classes and a target (train --task regression), " in capsys.readouterr().out


def test_a_regression_run_with_a_validation_split_can_be_extended(regression_cohort, tmp_path,
                                                                   capsys):
    """Its checkpoint loads with weights_only=True (the validation R² is saved as a float, not
    a numpy scalar), so --resume with a larger --max-epochs trains on from it."""
    import torch

    store, run, whole = tmp_path / "ages.zarr", tmp_path / "run", tmp_path / "whole"
    assert main(["convert", str(regression_cohort), "--out", str(store), "--n-workers", "1",
                 "--no-progress"]) == 0
    one = ["--n-clusters", "0.1", "--patience", "50"]  # one candidate: a checkpoint.pt
    at = TRAIN.index("--max-epochs") + 1
    args = [*TRAIN[:at], "2", *TRAIN[at + 1:]]  # --max-epochs 2, then TRAIN's 4
    assert main(["train", str(store), "--out", str(run), *one, *args]) == 0
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert all(type(h["val_r2"]) is float for h in state["history"])
    capsys.readouterr()
    assert main(["train", str(store), "--out", str(run), "--resume", *one, *TRAIN]) == 0, \
        capsys.readouterr().err
    assert main(["train", str(store), "--out", str(whole), *one, *TRAIN]) == 0
    finals = [json.loads((r / "final.json").read_text()) for r in (run, whole)]
    assert finals[0]["epochs"] == finals[1]["epochs"] == 4
    assert finals[0]["test"] == pytest.approx(finals[1]["test"])


def test_resume_keeps_the_runs_task_on_a_store_with_labels_and_a_target(tiny_cohort, tmp_path,
                                                                         capsys):
    """--task not given again on --resume is the saved run's, as every other option: a
    regression run is not resumed as a classifier (a traceback of shapes it used to be)."""
    rows = cohort_rows(tiny_cohort)
    table, store, run = tmp_path / "both.csv", tmp_path / "both.zarr", tmp_path / "run"
    table.write_text("path,label,group,split,target\n" + "".join(
        f"{tiny_cohort.parent / r['path']},{r['label']},{r['group']},{r['split']},{i}\n"
        for i, r in enumerate(rows)))
    assert main(["convert", str(table), "--out", str(store), "--no-progress"]) == 0
    at = TRAIN.index("--max-epochs") + 1
    two = [*TRAIN[:at], "2", *TRAIN[at + 1:], "--n-clusters", "0.1"]
    assert main(["train", str(store), "--out", str(run), "--task", "regression", *two]) == 0
    assert json.loads((run / "config.json").read_text())["task"] == "regression"
    capsys.readouterr()
    assert main(["train", str(store), "--out", str(run), "--resume", "--max-epochs", "4",
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert "test R² " in capsys.readouterr().out
    assert type(load_run(run)).__name__ == "FeatureGroupingRegressor"
    assert json.loads((run / "final.json").read_text())["epochs"] == 4
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "or with --resume the saved run's task" in " ".join(capsys.readouterr().out.split())
    # another task given is refused, named
    assert main(["train", str(store), "--out", str(run), "--resume", "--max-epochs", "6",
                 "--task", "classification", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--resume with another task than the saved run (saved regression, given " \
           "classification" in err and "Traceback" not in err


def test_predict_reads_a_tables_own_column_names(regression_cohort, tmp_path, capsys):
    """The participants.tsv a store was converted from with --target-column age gives its ages
    to predict's CSV too (--target-column, --label-column), beside each prediction."""
    store, run = tmp_path / "ages.zarr", tmp_path / "run"
    assert main(["convert", str(regression_cohort), "--out", str(store), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *TRAIN]) == 0
    rows = [r for r in _read(regression_cohort) if r["split"] == "test"]
    table = tmp_path / "participants.tsv"
    table.write_text("path\tage\tdiagnosis\n" + "".join(
        f"{r['path']}\t{r['target']}\t{'ad' if i % 2 else 'hc'}\n" for i, r in enumerate(rows)))
    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(table), "--out", str(out), "--target-column", "age",
                 "--label-column", "diagnosis", "--no-progress"]) == 0
    lines = _read(out)
    assert list(lines[0]) == ["path", "label", "target", "prediction"]
    assert [float(r["target"]) for r in lines] == [float(r["target"]) for r in rows]
    assert [r["label"] for r in lines] == ["ad" if i % 2 else "hc" for i in range(len(rows))]
    # a column the table lacks is named; the option with NIfTI files is refused
    refused = [(["--target-column", "Age"], "no column 'Age' to read as the target"),
               (["--target-column", "age", rows[0]["path"]], "name columns of a cohort table")]
    for extra, message in refused:
        inputs = [extra.pop()] if len(extra) == 3 else [str(table)]
        capsys.readouterr()
        assert main(["predict", str(run), *inputs, "--out", str(tmp_path / "q.csv"), *extra,
                     "--no-progress"]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "q.csv").exists()


def test_predictions_named_tsv_are_tab_separated(regression_cohort, tmp_path):
    """--out x.tsv (predict) and --predictions x.tsv (evaluate) write what the name says, as a
    BIDS-minded user reads it back (pandas.read_csv(sep="\\t")); a .csv stays comma-separated."""
    store, run = tmp_path / "ages.zarr", tmp_path / "run"
    assert main(["convert", str(regression_cohort), "--out", str(store), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *TRAIN]) == 0
    tsv, csv_ = tmp_path / "p.tsv", tmp_path / "p.csv"
    for out in (tsv, csv_):
        assert main(["predict", str(run), str(regression_cohort), "--out", str(out),
                     "--no-progress"]) == 0
    assert tsv.read_text() == csv_.read_text().replace(",", "\t")
    assert tsv.read_text().splitlines()[0] == "path\ttarget\tprediction"
    evaluated = tmp_path / "e.tsv"
    assert main(["evaluate", str(run), str(store), "--n-workers", "1", "--predictions",
                 str(evaluated), "--no-progress"]) == 0
    assert evaluated.read_text().splitlines()[0] == "row\tpath\tvolume\ttarget\tprediction"


def test_class_weights_on_the_command_line(tiny_store, regression_cohort, tmp_path, capsys):
    """``--class-weight`` trains a classifier with them and saves them in the run; given for
    a regression store, it is refused before anything is written."""
    run = tmp_path / "weighted"
    assert main(["train", str(tiny_store.path), "--out", str(run), *TRAIN,
                 "--class-weight", "class_1:3,class_2:0.5"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["params"]["class_weight"] == {"class_1": 3.0, "class_2": 0.5}
    clf = load_run(run)
    assert clf.class_weight == {"class_1": 3.0, "class_2": 0.5}
    counts = np.bincount(tiny_store.y[tiny_store.train_rows()], minlength=4)
    weights = np.array([1.0, 3.0, 0.5, 1.0])
    np.testing.assert_allclose(clf.class_weight_, weights * counts.sum() / (counts @ weights))
    assert main(["train", str(tiny_store.path), "--out", str(tmp_path / "b"), *TRAIN,
                 "--class-weight", "balanced"]) == 0
    capsys.readouterr()

    with pytest.raises(SystemExit):
        main(["train", str(tiny_store.path), "--out", str(tmp_path / "c"), "--class-weight", "3"])
    assert "expected None, 'balanced' or a non-empty dict" in capsys.readouterr().err
    store_path, regression_run = tmp_path / "ages.zarr", tmp_path / "ages_run"
    assert main(["convert", str(regression_cohort), "--out", str(store_path), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert main(["train", str(store_path), "--out", str(regression_run), *TRAIN,
                 "--class-weight", "balanced"]) == 2
    assert "class_weight='balanced' applies to classification only" in capsys.readouterr().err
    assert not regression_run.exists()


def test_a_class_weight_naming_no_class_of_the_store_is_refused_before_a_cluster(tiny_store,
                                                                              tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", str(tiny_store.path), "--out", str(run), *TRAIN,
                 "--class-weight", "class_9:2"]) == 2
    captured = capsys.readouterr()
    assert "class_weight names ['class_9'], which are not classes" in captured.err
    assert "Dask dashboard" not in captured.out + captured.err and not run.exists()


def test_the_scores_name_the_target_column_the_user_gave(regression_cohort, tmp_path, capsys):
    """R² of "age", not of "target": train, evaluate (text and JSON), cv and the report name the
    cohort table's column that the store was converted from."""
    from fgscale.runs._html import write_report

    rows = _read(regression_cohort)
    table = tmp_path / "participants.tsv"
    table.write_text("path\tage\tparticipant_id\tsplit\n" + "".join(
        f"{r['path']}\t{r['target']}\t{r['participant_id']}\t{r['split']}\n" for r in rows))
    store, run = tmp_path / "p.zarr", tmp_path / "run"
    assert main(["convert", str(table), "--out", str(store), "--target-column", "age",
                 "--n-workers", "1", "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *TRAIN]) == 0
    out = capsys.readouterr().out
    # model="logreg" names the regressor's least squares: it is said to be linear
    assert "test R² of age " in out and "\ntrained linear/feature_grouping for " in out
    assert main(["evaluate", str(run), str(store), "--n-workers", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("age on ")
    assert main(["evaluate", str(run), str(store), "--n-workers", "1", "--no-progress",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "age"
    assert main(["cv", str(store), "--folds", "2", *TRAIN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fold 0: age r2 ") and lines[1].startswith("fold 1: age r2 ")
    assert lines[-1].startswith("2-fold cross-validation of age, ")
    page = write_report(run, tmp_path / "r.html", nilearn=False).read_text()
    assert "Errors in the units of age" in page and "<tr><td>target</td><td>age</td></tr>" in page


def test_predict_names_the_target_column_of_the_run(regression_cohort, tmp_path, capsys):
    """The run keeps the name of its target (config.json), and predict says what it predicted."""
    rows = _read(regression_cohort)
    table = tmp_path / "participants.csv"
    table.write_text("path,age,split\n" + "".join(f"{r['path']},{r['target']},{r['split']}\n"
                                                  for r in rows))
    store, run = tmp_path / "p.zarr", tmp_path / "run"
    assert main(["convert", str(table), "--out", str(store), "--target-column", "age",
                 "--n-workers", "1", "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *TRAIN]) == 0
    assert json.loads((run / "config.json").read_text())["target"] == "age"
    capsys.readouterr()
    assert main(["predict", str(run), str(store), "--out", str(tmp_path / "p.csv"),
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"{len(rows)} predictions of age written to ")


def test_evaluate_says_when_the_store_has_another_target_than_the_run(regression_cohort, tmp_path,
                                                                      capsys, caplog):
    """A run trained on age scored on a store of another column: said, then scored."""
    rows = _read(regression_cohort)
    for column in ("age", "score"):
        table = tmp_path / f"{column}.csv"
        table.write_text(f"path,{column},split\n" + "".join(
            f"{r['path']},{r['target']},{r['split']}\n" for r in rows))
        assert main(["convert", str(table), "--out", str(tmp_path / f"{column}.zarr"),
                     "--target-column", column, "--n-workers", "1", "--no-progress"]) == 0
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "age.zarr"), "--out", str(run), *TRAIN]) == 0
    caplog.clear()
    assert main(["evaluate", str(run), str(tmp_path / "age.zarr"), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert "trained on" not in caplog.text
    assert main(["evaluate", str(run), str(tmp_path / "score.zarr"), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert (f"{tmp_path / 'score.zarr'}: its target is score, the run was trained on age: the "
            "scores compare predictions of age with score" in caplog.text)
    assert capsys.readouterr().out.splitlines()[-1].startswith("score on ")
    # a column named "target" is a name like any: it was taken for one that was not kept
    table = tmp_path / "target.csv"
    table.write_text("path,target,split\n" + "".join(
        f"{r['path']},{r['target']},{r['split']}\n" for r in rows))
    assert main(["convert", str(table), "--out", str(tmp_path / "target.zarr"), "--n-workers",
                 "1", "--no-progress"]) == 0
    caplog.clear()
    assert main(["evaluate", str(run), str(tmp_path / "target.zarr"), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert "its target is target, the run was trained on age" in caplog.text
