"""BIDS datasets through the command line: a derivatives dataset of 3D maps and one of 4D
series (SYNTHETIC, written in the test) converted, trained with subject-grouped splits and
evaluated end to end; the cohort table written beside the store converted again into the same
store; labels from sessions.tsv and scans.tsv, and from events.tsv with a hemodynamic delay,
recorded beside the table; each bad input one line and exit status 2; the run's maps exported
as a BIDS derivatives dataset."""

import json
import re
import shutil

import nibabel as nib
import numpy as np
import pytest
from bids_trees import (
    LABELLED,
    MAPS,
    SPACE,
    TRAIN,
    age,
    condition,
    diagnosis,
    drug,
    series_dataset,
    statmap_dataset,
)
from helpers import cohort_rows, refused

from fgscale import __version__
from fgscale.cli import build_parser, main
from fgscale.images import parse_bids_name
from fgscale.runs._maps import read_maps
from fgscale.store import open_store


@pytest.fixture(scope="module")
def maps(tmp_path_factory):
    return statmap_dataset(tmp_path_factory.mktemp("bids") / "maps")


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    return series_dataset(tmp_path_factory.mktemp("bids") / "raw")


def _store_arrays(store):
    return {name: np.asarray(getattr(store, name)) for name in
            ("y", "classes", "split", "groups", "source", "volume", "mask", "affine")} | {
        "X": store.read_rows(np.arange(store.n_samples))}


def test_3d_maps_convert_train_evaluate_and_export(maps, tmp_path, capsys):
    store_path, run, deriv = tmp_path / "maps.zarr", tmp_path / "run", tmp_path / "deriv"
    assert main(["convert", str(maps), "--out", str(store_path), *MAPS, "--label",
                 "participants:diagnosis", "--test-subjects", "07,08", "--no-progress"]) == 0
    table = tmp_path / "maps.zarr.csv"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{table}: the cohort table of {maps} (32 rows from 32 files of 8 subjects)"
    assert out[1].startswith(f"{store_path}: 32 rows x ")
    store = open_store(store_path)
    # the subject is the group: the test split is whole subjects, and so are the folds
    assert sorted(set(store.groups)) == [f"sub-{i:02d}" for i in range(1, 9)]
    assert set(store.groups[store.split == "test"]) == {"sub-07", "sub-08"}
    assert not set(store.groups[store.split == "test"]) & set(store.groups[store.split == "train"])
    for source, group, klass in zip(store.source, store.groups, store.y, strict=True):
        name = parse_bids_name(str(source).rsplit("/", 1)[1])
        assert group == f"sub-{name.subject}" and store.classes[klass] == diagnosis(name.subject)
    rows = cohort_rows(table)
    assert list(rows[0]) == ["path", "label", "group", "session", "run", "split"]
    assert {(r["session"], r["run"]) for r in rows} == {("1", "1"), ("1", "2"), ("2", "1"),
                                                          ("2", "2")}

    assert main(["train", str(store_path), "--out", str(run), *TRAIN]) == 0
    assert "test accuracy" in capsys.readouterr().out
    assert main(["evaluate", str(run), str(store_path), "--json", "--n-workers", "1",
                 "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 8 and report["accuracy"] == 1.0  # a pattern 6 times the noise

    assert main(["export-bids", str(run), "--out", str(deriv)]) == 0
    _, run_maps = read_maps(run)  # two classes: one map each, or one for both
    n = len(run_maps)
    assert capsys.readouterr().out.startswith(
        f"{deriv}: a BIDS derivatives dataset of {n} map{'s' * (n > 1)} in {deriv / 'group'}")
    description = json.loads((deriv / "dataset_description.json").read_text())
    assert description["DatasetType"] == "derivative" and description["BIDSVersion"]
    assert description["GeneratedBy"][0]["Name"] == "fgscale"
    assert description["GeneratedBy"][0]["Version"] == __version__
    for klass, path in run_maps.items():
        # every row's file has task-faces and space-MNI...: the maps keep them
        name = f"task-faces_space-{SPACE}_desc-{klass}_stat-weights_statmap"
        exported = deriv / "group" / f"{name}.nii.gz"
        assert exported.read_bytes() == path.read_bytes()
        about = json.loads((deriv / "group" / f"{name}.json").read_text())
        assert about["Class"] == klass and about["Run"] == str(run.resolve())
        assert about["Estimator"] == "FeatureGroupingClassifier"
        assert "logistic regression weights" in about["Description"]
    mask = nib.load(deriv / "group" / f"task-faces_space-{SPACE}_mask.nii.gz")
    np.testing.assert_array_equal(np.asarray(mask.dataobj) != 0, store.mask)


def test_the_written_table_converts_into_the_same_store(maps, tmp_path, capsys, caplog):
    store_path, again = tmp_path / "maps.zarr", tmp_path / "again.zarr"
    args = ["--bids-filter", f"space={SPACE}", "suffix=statmap", "--target", "participants:age",
            "--no-progress"]
    assert main(["convert", str(maps), "--out", str(store_path), *args]) == 0
    table = tmp_path / "maps.zarr.csv"
    store = open_store(store_path)
    assert not store.has_labels
    np.testing.assert_array_equal(store.target, [age(f"{i:02d}") for i in range(1, 9)
                                                 for _ in range(4)])
    capsys.readouterr()
    # the same query again, or its table: nothing to do (the same fingerprint)
    for argv in (["convert", str(maps), "--out", str(store_path), *args],
                 ["convert", str(table), "--out", str(store_path), "--no-progress"]):
        assert main(argv) == 0
        assert "already complete, nothing to do" in capsys.readouterr().out
    # the table into another store: the same arrays, row for row
    caplog.clear()
    assert main(["convert", str(table), "--out", str(again), "--no-progress"]) == 0
    assert not caplog.records  # no word of its session and run columns as unused
    first, second = _store_arrays(store), _store_arrays(open_store(again))
    for name, value in first.items():
        np.testing.assert_array_equal(value, second[name], err_msg=name)
    np.testing.assert_array_equal(store.target, open_store(again).target)


def test_new_subjects_of_a_grown_dataset_are_appended(maps, tmp_path, capsys):
    """--append converts the query again, its table replacing the store's: only the new
    subjects' rows are converted, and the store is the one the whole query gives."""
    grown, whole = tmp_path / "grown.zarr", tmp_path / "whole.zarr"
    label = ["--label", "participants:diagnosis", "--no-progress"]
    first = [*MAPS, "sub=01,02,03,04,05,06"]
    assert main(["convert", str(maps), "--out", str(grown), *first, *label]) == 0
    refused(["convert", str(maps), "--out", str(grown), *MAPS, *label], capsys,
            "grown.zarr.csv: exists with other rows")
    assert main(["convert", str(maps), "--out", str(grown), *MAPS, *label, "--append"]) == 0
    assert "8 rows appended" in capsys.readouterr().out
    assert len(cohort_rows(tmp_path / "grown.zarr.csv")) == 32
    assert main(["convert", str(maps), "--out", str(whole), *MAPS, *label]) == 0
    first, second = _store_arrays(open_store(grown)), _store_arrays(open_store(whole))
    for name, value in first.items():
        np.testing.assert_array_equal(value, second[name], err_msg=name)


def test_4d_series_labelled_by_their_events_convert_and_train(series, tmp_path, capsys, caplog):
    store_path, run = tmp_path / "series.zarr", tmp_path / "run"
    assert main(["convert", str(series), "--out", str(store_path), "--bids-filter",
                 "desc=preproc", "suffix=bold", "--label", "events:trial_type",
                 "--test-subjects", "sub-06", "--no-progress"]) == 0
    assert any(re.search(r"168 volume\(s\) of its 12 series are in no event of one value",
                         r.getMessage()) for r in caplog.records)
    store = open_store(store_path)
    assert store.n_samples == 12 * len(LABELLED)
    # each row a volume of its run, with the label of the block it falls in
    assert [store.classes[k] for k in store.y] == [LABELLED[v] for v in store.volume]
    assert set(store.groups[store.split == "test"]) == {"sub-06"}
    assert main(["train", str(store_path), "--out", str(run), *TRAIN]) == 0
    assert re.search(r"test accuracy 1\.0000 on 32 rows", capsys.readouterr().out)


def test_a_hemodynamic_delay_shifts_the_labels_and_is_recorded(series, tmp_path, capsys):
    store_path = tmp_path / "series.zarr"
    args = [str(series), "--out", str(store_path), "--bids-filter", "desc=preproc",
            "suffix=bold", "sub=01,02", "--label", "events:trial_type", "--no-progress"]
    assert main(["convert", *args, "--hrf-delay", "4"]) == 0
    assert "(64 rows from 4 files of 2 subjects, events 4 s before each volume)" in (
        capsys.readouterr().out)
    store = open_store(store_path)
    # each block's label 4 s (2 volumes) later
    shifted = {v + 2: label for v, label in LABELLED.items()}
    assert [store.classes[k] for k in store.y] == [shifted[v] for v in store.volume]
    query = json.loads((tmp_path / "series.zarr.json").read_text())["bids_query"]
    assert query["hrf_delay"] == 4.0 and query["label"] == "events:trial_type"
    assert query["filters"] == {"desc": ["preproc"], "suffix": ["bold"], "sub": ["01", "02"]}
    # the same query again: nothing to do; without the delay: other rows, refused
    assert main(["convert", *args, "--hrf-delay", "4.0"]) == 0
    assert "already complete, nothing to do" in capsys.readouterr().out
    refused(["convert", *args], capsys, r"series.zarr.csv: exists with other rows \(the table "
                                        r"of another query: --hrf-delay 4.0 there, 0.0 now\)")


def test_labels_from_sessions_and_scans_tables(maps, series, tmp_path):
    by_session, by_scan = tmp_path / "sessions.zarr", tmp_path / "scans.zarr"
    assert main(["convert", str(maps), "--out", str(by_session), *MAPS, "sub=01,02", "--label",
                 "sessions:drug", "--no-progress"]) == 0
    store = open_store(by_session)
    for source, klass in zip(store.source, store.y, strict=True):
        session = parse_bids_name(str(source).rsplit("/", 1)[1]).entities["ses"]
        assert store.classes[klass] == drug(session)
    # a derivatives dataset's series by their raw files' rows in the raw dataset's scans.tsv
    assert main(["convert", str(series), "--out", str(by_scan), "--bids-filter", "desc=preproc",
                 "suffix=bold", "sub=01", "--label", "scans:condition", "--no-progress"]) == 0
    store = open_store(by_scan)
    assert sorted(set(store.classes)) == ["closed", "open"]
    for source, klass in zip(store.source, store.y, strict=True):
        run = parse_bids_name(str(source).rsplit("/", 1)[1]).entities["run"]
        assert store.classes[klass] == condition(run)


def test_help_shows_the_bids_options_with_an_example():
    text = build_parser()._subparsers._group_actions[0].choices["convert"].format_help()
    for option in ("--bids-filter", "--label", "--target", "--hrf-delay", "--bids-raw",
                   "--test-subjects", "sessions:COL", "scans:COL"):
        assert option in text
    assert "--bids-filter space=MNI152NLin2009cAsym desc=preproc suffix=bold" in text
    assert "--label events:trial_type --hrf-delay 5" in text
    assert "--label participants:diagnosis" in text
    assert "--label sessions:drug" in text and "--label scans:condition" in text


# ------------------------------------------------------------------------- bad input


def test_each_bad_input_is_one_line_and_exit_status_2(maps, series, tmp_path, capsys):
    out = str(tmp_path / "s.zarr")
    cases = [
        ([str(maps), *MAPS[:2]], "a BIDS dataset is converted with --label or --target"),
        ([str(maps), "--label", "ses", "--bids-filter", "space"],
         r"--bids-filter: 'space'; expected KEY=VALUE"),
        ([str(maps), "--bids-filter", "space=MNI152NLin6Asym", "--label", "ses"],
         rf"no NIfTI file matches the filters space=MNI152NLin6Asym; among its \d+ NIfTI "
         rf"files, space is one of \['{SPACE}', 'T1w'\]"),
        ([str(maps), "--label", "ses"], r"the files selected differ in suffix \(mask: 16 files, "
         r"statmap: 64 files\); .* choose one with --bids-filter suffix=VALUE"),
        ([str(maps), *MAPS, "--label", "participants:group"],
         "participants.tsv: no column 'group'"),
        ([str(maps), *MAPS, "--label", "participants:sex"],
         r"participants.tsv:2: 'sex' is 'n/a' for sub-01"),
        ([str(maps), *MAPS, "--target", "participants:diagnosis"],
         "expected a finite number for a regression target"),
        ([str(maps), *MAPS, "--label", "acq"], r"no 'acq' entity in its name \(--label acq\)"),
        ([str(maps), *MAPS, "--label", "events:trial_type"], "a 3D image"),
        ([str(maps), *MAPS, "--label", "ses", "--test-subjects", "12"],
         "--test-subjects sub-12: no file selected"),
        ([str(maps), *MAPS, "--label", "ses", "--label-column", "x"],
         r"--label-column reads a cohort table or files; a BIDS dataset .* takes --label"),
        ([str(maps), *MAPS, "--label", "ses", "--bids-raw", str(tmp_path)],
         "not a BIDS dataset .*expected the raw dataset"),
        ([str(maps / "sub-01"), "--label", "ses"],
         r"--label reads a BIDS dataset \(a folder with dataset_description.json\)"),
        ([str(maps / "sub-01"), "--hrf-delay", "5"],
         r"--hrf-delay reads a BIDS dataset \(a folder with dataset_description.json\)"),
        ([str(series), "--label", "events:trial_type", "--hrf-delay", "-1"],
         r"hrf_delay -1.0 \(--hrf-delay\); expected a finite number of seconds, 0 or more"),
        ([str(series), "--label", "events:trial_type", "--hrf-delay", "nan"],
         r"hrf_delay nan \(--hrf-delay\); expected a finite number of seconds"),
        ([str(series), "--label", "events:trial_type", "--hrf-delay", "five"],
         r"argument --hrf-delay: invalid float value: 'five'"),
        ([str(maps), *MAPS, "--label", "ses", "--hrf-delay", "5"],
         r"hrf_delay 5 \(--hrf-delay\) shifts the labels .*expected --label or --target "
         r"events:COLUMN with it, got --label ses"),
        ([str(maps), *MAPS, "--label", "sessions:dose"],
         r"sub-01_sessions.tsv:2: 'dose' is 'n/a' for ses-1 \(--label sessions:dose\)"),
        ([str(series), "--bids-filter", "desc=preproc", "suffix=bold", "--label",
          "scans:acq_time"], r"sub-01_scans.tsv: no column 'acq_time' \(--label scans:acq_time\)"),
        ([str(shutil.copytree(series, tmp_path / "prep")), "--bids-filter", "desc=preproc",
          "suffix=bold", "--label", "events:trial_type"], "no events.tsv applies to it"),
    ]
    for argv, message in cases:
        refused(["convert", *argv, "--out", out, "--no-progress"], capsys, message)
        assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "s.zarr.csv").exists()
        assert not (tmp_path / "s.zarr.json").exists()
    # a table of other rows beside the store is not overwritten
    (tmp_path / "s.zarr.csv").write_text("path,label\nedited.nii.gz,a\n")
    refused(["convert", str(maps), *MAPS, "--label", "ses", "--out", out], capsys,
            r"s.zarr.csv: exists with other rows .*; remove it")
    assert (tmp_path / "s.zarr.csv").read_text() == "path,label\nedited.nii.gz,a\n"

