"""``fgscale predict`` on a BIDS dataset (SYNTHETIC, written in the test): the images that
``--bids-filter`` selects predicted with a run trained on other subjects, a line per image (per
volume of a 4D series) with its path and entities as columns, the same predictions as the files
given by name; each bad input one line and exit status 2."""

import csv

import pytest
from bids_trees import MAPS, SPACE, TRAIN, diagnosis, series_dataset, statmap_dataset
from helpers import refused

from fgscale.cli import main
from fgscale.images import parse_bids_name


@pytest.fixture(scope="module")
def maps(tmp_path_factory):
    return statmap_dataset(tmp_path_factory.mktemp("bids") / "maps")


@pytest.fixture(scope="module")
def run(maps, tmp_path_factory):
    """A run trained on the maps of subjects 01-06, their diagnosis the class."""
    folder = tmp_path_factory.mktemp("run")
    store, run = folder / "maps.zarr", folder / "run"
    assert main(["convert", str(maps), "--out", str(store), *MAPS, "sub=01,02,03,04,05,06",
                 "--label", "participants:diagnosis", "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *TRAIN]) == 0
    return run


def _rows(path, delimiter=","):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter=delimiter))


def test_new_subjects_of_a_bids_dataset_are_predicted_with_their_entities(maps, run, tmp_path,
                                                                          capsys):
    out = tmp_path / "new.csv"
    capsys.readouterr()
    assert main(["predict", str(run), str(maps), *MAPS, "sub=07,08", "--out", str(out),
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"8 predictions written to {out} (")
    rows = _rows(out)
    assert list(rows[0]) == ["path", "subject", "session", "task", "run", "space", "stat",
                             "prediction", "proba_control", "proba_patient"]
    assert len(rows) == 8
    for r in rows:
        name = parse_bids_name(r["path"].rsplit("/", 1)[1])
        assert (r["subject"], r["session"], r["run"], r["task"], r["space"], r["stat"]) == (
            name.entities["sub"], name.entities["ses"], name.entities["run"], "faces", SPACE,
            "effect")
        assert r["subject"] in ("07", "08")
        assert r["prediction"] == diagnosis(r["subject"])  # a pattern 6 times the noise
    # the same files given by name: the same predictions, without the entities
    by_name = tmp_path / "by_name.csv"
    assert main(["predict", str(run), *(r["path"] for r in rows), "--out", str(by_name),
                 "--no-progress"]) == 0
    plain = _rows(by_name)
    assert list(plain[0]) == ["path", "prediction", "proba_control", "proba_patient"]
    assert [{k: r[k] for k in plain[0]} for r in rows] == plain


def test_predict_run_reads_a_bids_dataset_as_the_cli_does(maps, run, tmp_path, capsys):
    """fgscale.runs.predict_run on the dataset itself (bids_filter its query), and on the
    BidsCohort read_bids selects: the CLI's columns and predictions, and its summary."""
    from fgscale.images import read_bids
    from fgscale.runs import predict_line, predict_run

    cli = tmp_path / "cli.csv"
    capsys.readouterr()
    assert main(["predict", str(run), str(maps), *MAPS, "sub=07,08", "--out", str(cli),
                 "--no-progress"]) == 0
    said = capsys.readouterr().out.strip()
    expected = _rows(cli)
    query = {"space": SPACE, "suffix": "statmap", "sub": ["07", "08"]}
    by_root, by_cohort = tmp_path / "root.csv", tmp_path / "cohort.csv"
    summary = predict_run(run, maps, by_root, bids_filter=query)
    assert predict_line(summary) == said.replace(str(cli), str(by_root))
    assert summary["n"] == 8 and sum(summary["counts"].values()) == 8
    assert _rows(by_root) == expected
    assert list(expected[0])[:2] == ["path", "subject"]
    assert predict_run(run, read_bids(maps, query), by_cohort) == {**summary,
                                                                   "out": str(by_cohort)}
    assert _rows(by_cohort) == expected
    # the query as the CLI types it, and a one-element list of the dataset
    assert predict_run(run, [str(maps)], by_root, bids_filter=[*MAPS[1:], "sub=07,08"])["n"] == 8
    assert _rows(by_root) == expected
    # what a BIDS dataset does not take is refused before anything is written
    bad = tmp_path / "bad.csv"
    for kwargs, message in [
        ({"rows": "test"}, r"rows='test' selects a store's rows .* a BIDS dataset .* has none"),
        ({"columns": {"label": "diagnosis"}}, r"columns names a cohort table's label column"),
    ]:
        with pytest.raises(ValueError, match=message):
            predict_run(run, maps, bad, bids_filter=query, **kwargs)
    with pytest.raises(ValueError, match=r"bids_filter reads a BIDS dataset"):
        predict_run(run, [r["path"] for r in expected], bad, bids_filter=query)
    with pytest.raises(ValueError, match=r"a BidsCohort given is already selected"):
        predict_run(run, read_bids(maps, query), bad, bids_filter=query)
    assert not bad.exists()


def test_4d_series_are_predicted_a_line_per_volume_as_tsv(run, tmp_path_factory, tmp_path):
    """The series share the maps' grid and box: the maps' run predicts them (the classes mean
    nothing here; the layout is what is checked)."""
    series = series_dataset(tmp_path_factory.mktemp("bids") / "raw", n_subjects=2)
    out = tmp_path / "series.tsv"
    assert main(["predict", str(run), str(series), "--bids-filter", "desc=preproc",
                 "suffix=bold", "--out", str(out), "--no-progress"]) == 0
    rows = _rows(out, delimiter="\t")
    assert list(rows[0]) == ["path", "subject", "task", "run", "space", "description", "volume",
                             "prediction", "proba_control", "proba_patient"]
    assert len(rows) == 2 * 2 * 30
    assert [(r["subject"], r["run"], r["volume"]) for r in rows] == [
        (s, run, str(v)) for s in ("01", "02") for run in ("1", "2") for v in range(30)]


def test_each_bad_bids_input_to_predict_is_one_line_and_exit_status_2(maps, run, tmp_path,
                                                                      capsys):
    out = tmp_path / "p.csv"
    cases = [
        ([str(maps), *MAPS, "sub=09"],
         r"no NIfTI file matches the filters space=.* sub=09; among its \d+ NIfTI files, .*sub "
         r"is one of \['01', '02'"),
        ([str(maps), "--bids-filter", f"space={SPACE}"],
         r"the files selected differ in suffix .* choose one with --bids-filter suffix=VALUE"),
        ([str(maps / "sub-01" / "ses-1" / "func" / "*.nii.gz"), *MAPS],
         r"--bids-filter reads a BIDS dataset \(a folder with dataset_description.json\)"),
        ([str(maps), *MAPS, "--rows", "test"],
         r"--rows test selects a store's rows or a cohort table's files by split; a BIDS "
         r"dataset .* has none"),
        ([str(maps), *MAPS, "--label-column", "diagnosis"],
         r"--label-column names a column of a cohort table to copy; a BIDS dataset"),
    ]
    for argv, message in cases:
        refused(["predict", str(run), *argv, "--out", out, "--no-progress"], capsys, message)
        assert not out.exists()
