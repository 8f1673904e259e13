"""``fgscale predict``: NIfTI files, a cohort table or a store in, one CSV line per volume out,
equal to the predictions of the run's estimator on the store's rows (SYNTHETIC cohorts)."""

import csv
import json
import re
import shutil

import nibabel as nib
import numpy as np
import pytest
from helpers import TINY_GRID, synthetic_store

from fgscale.cli import main
from fgscale.images import make_cohort
from fgscale.runs import load_run, train_run
from fgscale.store import convert, write_store

PARAMS = dict(n_groupings=4, n_bootstrap=8, n_clusters=0.1, batch_size=8, learning_rate=0.05,
              max_epochs=2, random_state=0)
# float32 logits of a row alone or among others differ in their last bits
FLOAT32 = dict(rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def trained(tiny_cohort, client, tmp_path_factory):
    """The tiny cohort converted to a store (its mask computed from the images) and a run
    trained on it."""
    out = tmp_path_factory.mktemp("predict")
    store = convert(tiny_cohort, out / "cohort.zarr", client=client, block_rows=5,
                    progress=False)
    train_run(store.path, out / "run", params=PARAMS, client=client)
    return store, out / "run"


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def proba(table, classes):
    return np.array([[float(r[f"proba_{c}"]) for c in classes] for r in table])


def by_file(store):
    """Store row of each source file (3D files: one row each)."""
    return {s: i for i, s in enumerate(store.source)}


def predict(capsys, run, *inputs, out, extra=()):
    code = main(["predict", str(run), *map(str, inputs), "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_nifti_files_are_predicted_as_the_store_rows(trained, tiny_cohort, tmp_path, capsys):
    store, run = trained
    files = sorted(tiny_cohort.parent.glob("synthetic_*.nii.gz"))
    code, out, _ = predict(capsys, run, *files, out=tmp_path / "p.csv")
    assert code == 0
    assert out.strip().startswith(f"{len(files)} predictions written to {tmp_path / 'p.csv'}")
    table = read_csv(tmp_path / "p.csv")
    classes = list(store.classes)
    assert list(table[0]) == ["path", "prediction", *(f"proba_{c}" for c in classes)]
    assert [r["path"] for r in table] == list(map(str, files))
    rows = [by_file(store)[str(f)] for f in files]
    clf = load_run(run)
    X = store.read_rows(rows)
    assert [r["prediction"] for r in table] == clf.predict(X).tolist()
    np.testing.assert_allclose(proba(table, classes), clf.predict_proba(X), **FLOAT32)


def test_a_quoted_pattern_is_expanded_as_the_shell_would(trained, tiny_cohort, tmp_path,
                                                         capsys):
    """A pattern the shell did not expand (quoted, or from a script without a shell) names
    the files it matches, sorted, as the estimator's predict and the cohort tables take it."""
    _, run = trained
    files = sorted(map(str, tiny_cohort.parent.glob("synthetic_0000*.nii.gz")))
    code, out, err = predict(capsys, run, tiny_cohort.parent / "synthetic_0000*.nii.gz",
                             out=tmp_path / "p.csv")
    assert code == 0, err
    assert [r["path"] for r in read_csv(tmp_path / "p.csv")] == files
    assert predict(capsys, run, *files, out=tmp_path / "q.csv")[0] == 0
    assert read_csv(tmp_path / "p.csv") == read_csv(tmp_path / "q.csv")
    code, _, err = predict(capsys, run, tiny_cohort.parent / "nothing_*.nii.gz",
                           out=tmp_path / "p.csv")
    assert code == 2 and "nothing_*.nii.gz: no file matches this pattern" in err


def test_a_cohort_table_by_split(trained, tiny_cohort, tmp_path, capsys):
    store, run = trained
    assert predict(capsys, run, tiny_cohort, out=tmp_path / "p.csv", extra=["--rows", "test"])[0] == 0
    table = read_csv(tmp_path / "p.csv")
    test = store.test_rows()
    assert [r["path"] for r in table] == store.source[test].tolist()
    assert [r["label"] for r in table] == store.classes[store.y[test]].tolist()
    clf = load_run(run)
    assert [r["prediction"] for r in table] == clf.predict(store.read_rows(test)).tolist()


def test_tables_end_their_lines_as_unix_tools_expect(trained, tiny_cohort, tmp_path, capsys):
    """make-cohort's table and the predictions' CSV end each line with a line feed alone:
    with csv's default "\\r\\n", ``grep ',test$' cohort.csv`` matched no line and the last
    column read by cut or awk carried a carriage return."""
    store, run = trained
    assert predict(capsys, run, store.path, out=tmp_path / "p.csv")[0] == 0
    for path in (tiny_cohort, tmp_path / "p.csv"):
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"" and not any(line.endswith(b"\r") for line in lines), path
    test = [line for line in tiny_cohort.read_bytes().split(b"\n") if line.endswith(b",test")]
    assert len(test) == store.test_rows().size


def test_a_table_of_new_images_needs_no_label(trained, tiny_cohort, tmp_path, capsys):
    """Images to predict have no label yet: a table of paths only, or with some labels left
    blank, is predicted (the labels given copied, blank for the others)."""
    store, run = trained
    files = [str(tiny_cohort.parent / f"synthetic_{i:05d}.nii.gz") for i in (0, 1, 2)]
    (tmp_path / "paths.csv").write_text("path\n" + "\n".join(files) + "\n")
    assert predict(capsys, run, tmp_path / "paths.csv", out=tmp_path / "p.csv")[0] == 0
    table = read_csv(tmp_path / "p.csv")
    assert list(table[0])[:2] == ["path", "prediction"]
    rows = [by_file(store)[f] for f in files]
    assert [r["prediction"] for r in table] == load_run(run).predict(store.read_rows(rows)).tolist()
    (tmp_path / "some.tsv").write_text(f"path\tlabel\n{files[0]}\t\n{files[1]}\tclass_1\n")
    code, _, err = predict(capsys, run, tmp_path / "some.tsv", out=tmp_path / "s.csv")
    assert code == 0, err
    assert [(r["path"], r["label"]) for r in read_csv(tmp_path / "s.csv")] == [
        (files[0], ""), (files[1], "class_1")]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(command, trained,
                                                                     tiny_cohort, tmp_path,
                                                                     capsys):
    """Found unwritable only once every row was predicted, the work was lost: the output is
    checked first (no cluster started, nothing read)."""
    store, run = trained
    (tmp_path / "afile").write_text("")
    for out, message in ((tmp_path / "afile" / "p.csv", "its folder .*afile cannot be created "
                                                         "or written"),
                         (tmp_path, "a folder, not a file name")):
        if command == "predict":
            argv = ["predict", run, tiny_cohort, "--out", out]
        else:
            argv = ["evaluate", run, store.path, "--predictions", out, "--n-workers", "1"]
        assert main([*map(str, argv), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert re.search(f"fgscale {command}: error: .*{message}; choose another "
                         f"{'--out' if command == 'predict' else '--predictions'}; nothing "
                         f"{'predicted' if command == 'predict' else 'evaluated'}", err), err
        assert "Dask dashboard" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_dash_writes_the_predictions_on_stdout_and_the_rest_on_stderr(command, trained,
                                                                       tiny_cohort, tmp_path,
                                                                       capsys, monkeypatch):
    """``--out -`` (``--predictions -``): the CSV alone on stdout, for a pipe, as Unix tools
    read "-"; no file named "-" is written. A spreadsheet's name is refused before any work."""
    store, run = trained
    monkeypatch.chdir(tmp_path)
    option = "--out" if command == "predict" else "--predictions"
    argv = (["predict", run, tiny_cohort] if command == "predict" else
            ["evaluate", run, store.path, "--n-workers", "1"])
    assert main([*map(str, argv), option, "-", "--no-progress"]) == 0
    captured = capsys.readouterr()
    lines = list(csv.DictReader(captured.out.splitlines()))
    assert len(lines) == (24 if command == "predict" else int(np.sum(store.split == "test")))
    assert {"prediction", *(f"proba_{c}" for c in store.classes)} <= set(lines[0])
    said = "predictions written to -" if command == "predict" else "accuracy"
    assert said in captured.err and said not in captured.out
    assert not (tmp_path / "-").exists()
    assert main([*map(str, argv), option, "p.xlsx", "--no-progress"]) == 2
    assert re.search(rf"p.xlsx: a .xlsx name, but {option} is written as CSV; give a .csv "
                     r"name \(.tsv: tab-separated\), or - for the standard output",
                     capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_evaluate_scores_a_store_of_new_subjects_without_a_split(trained, tiny_cohort,
                                                                  tmp_path, capsys, caplog):
    """New subjects converted with the run's mask, as the README says, from files and labels:
    their store has no split, so it has no test rows: evaluate says so and what to give,
    ``--rows all``, which scores every row."""
    store, run = trained
    test = store.test_rows()
    files = [str(f) for f in store.source[test]]
    (tmp_path / "labels.txt").write_text("\n".join(store.classes[store.y[test]]) + "\n")
    new = tmp_path / "new.zarr"
    assert main(["convert", *files, "--labels", str(tmp_path / "labels.txt"), "--mask",
                 str(run / "mask.nii.gz"), "--out", str(new), "--no-progress"]) == 0
    capsys.readouterr()
    # an error (status 2, for a batch job), before a cluster starts: it exited 0, said only
    # "no rows to score", after starting one
    assert main(["evaluate", str(run), str(new), "--no-progress", "--n-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"new.zarr: no test rows to score \(its cohort table gave none the split "
                     r"'test'\); --rows all \(rows='all'\) scores every row; nothing evaluated",
                     err), err
    assert "Dask dashboard" not in err
    assert main(["evaluate", str(run), str(new), "--rows", "all", "--json", "--no-progress",
                 "--n-workers", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    clf = load_run(run)
    assert report["n"] == len(files)
    assert report["accuracy"] == pytest.approx(clf.score(store.read_rows(test),
                                                         store.classes[store.y[test]]))


def test_evaluate_refuses_a_store_of_other_voxels_before_a_cluster_starts(trained, tmp_path,
                                                                          capsys):
    _, run = trained
    other = synthetic_store(tmp_path / "other.zarr", 12, 3, grid=(10, 12, 9), block_rows=4,
                            split=np.where(np.arange(12) % 3 == 0, "test", "train"))
    assert main(["evaluate", str(run), str(other.path), "--n-workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"fgscale evaluate: error: .*other\.zarr: \d+ features, the model was "
                     r"trained on \d+", err), err
    assert "Dask dashboard" not in err
    # as many voxels on a shifted grid: other voxels, with the way to the model's own
    store, _ = trained
    moved = store.affine.copy()
    moved[:3, 3] += 4
    shifted = write_store(tmp_path / "shifted.zarr", store.X[:], store.y, store.mask, moved,
                          classes=store.classes, split=store.split)
    assert main(["evaluate", str(run), str(shifted.path), "--n-workers", "1", "--no-progress"]) == 2
    assert ("shifted.zarr: its mask or grid differs from the model's mask: its rows are other "
            "voxels; convert the images again with fgscale convert --mask RUN/mask.nii.gz (the "
            "model's mask), or predict the NIfTI images themselves (--resample on another grid)"
            ) in capsys.readouterr().err


def test_a_store_all_rows(trained, tmp_path, capsys):
    store, run = trained
    assert predict(capsys, run, store.path, out=tmp_path / "p.csv")[0] == 0
    table = read_csv(tmp_path / "p.csv")
    assert [int(r["row"]) for r in table] == list(range(store.n_samples))
    assert [r["label"] for r in table] == store.classes[store.y].tolist()
    clf = load_run(run)
    X = store.read_rows(np.arange(store.n_samples))
    assert [r["prediction"] for r in table] == clf.predict(X).tolist()
    np.testing.assert_allclose(proba(table, store.classes), clf.predict_proba(X), **FLOAT32)
    assert predict(capsys, run, store.path, out=tmp_path / "t.csv", extra=["--rows", "train"])[0] == 0
    assert [int(r["row"]) for r in read_csv(tmp_path / "t.csv")] == store.train_rows().tolist()
    # --resample is for images: with a store it was ignored without a word
    code, _, err = predict(capsys, run, store.path, out=tmp_path / "r.csv", extra=["--resample"])
    assert code == 2 and "resample applies to images; a store's rows are read as they are" in err
    assert not (tmp_path / "r.csv").exists()


def test_four_d_files_give_a_line_per_volume(trained, tmp_path, capsys):
    store, run = trained
    cohort = make_cohort(tmp_path / "c4", n_samples=9, n_classes=3, grid=TINY_GRID,
                         n_subjects=2, four_d=True, seed=5)
    files = sorted(cohort.parent.glob("*.nii.gz"))
    code, _, err = predict(capsys, run, *files, out=tmp_path / "p.csv")
    assert code == 0
    assert "predicting: 100%|" in err and "| 9/9 [" in err  # the bar's total: volumes, not files
    table = read_csv(tmp_path / "p.csv")
    # the oracle: each volume indexed by the store's mask with numpy
    expected = [(str(f), t, np.asarray(nib.load(f).dataobj)[..., t][store.mask])
                for f in files for t in range(nib.load(f).shape[3])]
    assert len(table) == len(expected) == 9
    assert [(r["path"], int(r["volume"])) for r in table] == [e[:2] for e in expected]
    clf = load_run(run)
    X = np.stack([e[2] for e in expected]).astype(np.float32)
    assert [r["prediction"] for r in table] == clf.predict(X).tolist()
    np.testing.assert_allclose(proba(table, store.classes), clf.predict_proba(X), **FLOAT32)


def test_a_table_of_volumes_gives_a_line_per_listed_volume(trained, tmp_path, capsys):
    """A cohort table with a ``volume`` column: a line per row, in the table's order, with its
    label; a run's volumes listed out of order and some left out."""
    store, run = trained
    cohort = make_cohort(tmp_path / "c4", n_samples=9, n_classes=3, grid=TINY_GRID,
                         n_subjects=2, four_d=True, seed=5)
    runs = sorted(f for f in cohort.parent.glob("*.nii.gz") if nib.load(f).shape[3] > 1)
    listed = [(f, v) for f in runs for v in reversed(range(nib.load(f).shape[3]))][1:]
    assert len(runs) >= 2 and len(listed) >= 3
    table = tmp_path / "volumes.csv"
    table.write_text("path,volume,label\n" + "".join(f"{f},{v},lab{v}\n" for f, v in listed))
    code, _, err = predict(capsys, run, table, out=tmp_path / "p.csv")
    assert code == 0, err
    lines = read_csv(tmp_path / "p.csv")
    assert [(r["path"], int(r["volume"]), r["label"]) for r in lines] == [
        (str(f), v, f"lab{v}") for f, v in listed]
    X = np.stack([np.asarray(nib.load(f).dataobj)[..., v][store.mask]
                  for f, v in listed]).astype(np.float32)
    clf = load_run(run)
    assert [r["prediction"] for r in lines] == clf.predict(X).tolist()
    np.testing.assert_allclose(proba(lines, store.classes), clf.predict_proba(X), **FLOAT32)


def test_an_image_on_another_grid_needs_resample(trained, tiny_cohort, tmp_path, capsys):
    store, run = trained
    img = nib.load(sorted(tiny_cohort.parent.glob("synthetic_*.nii.gz"))[0])
    affine = img.affine.copy()
    affine[:3, 3] += 2.0  # half a voxel off
    moved = tmp_path / "moved.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), moved)
    code, _, err = predict(capsys, run, moved, out=tmp_path / "p.csv")
    assert code == 2
    assert f"{moved}: grid" in err and "does not match the mask's grid" in err
    assert "--resample" in err  # the option that fixes it, as the command line spells it
    assert not (tmp_path / "p.csv").exists()
    assert predict(capsys, run, moved, out=tmp_path / "p.csv", extra=["--resample"])[0] == 0
    assert len(read_csv(tmp_path / "p.csv")) == 1


def test_refusals_are_clear(trained, tiny_cohort, tmp_path, capsys):
    store, run = trained
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished)
    (unfinished / "model.json").unlink()
    code, _, err = predict(capsys, unfinished, tiny_cohort, out=tmp_path / "p.csv")
    assert code == 2 and "has not finished" in err

    # a store of as many voxels, but other ones
    mask = store.mask.copy()
    inside, outside = np.flatnonzero(mask)[0], np.flatnonzero(~mask)[0]
    mask.flat[inside], mask.flat[outside] = False, True
    other = write_store(tmp_path / "other.zarr", store.read_rows(np.arange(4)), store.y[:4],
                        mask, store.affine, classes=store.classes)
    code, _, err = predict(capsys, run, other.path, out=tmp_path / "p.csv")
    assert code == 2 and "differs from the model's mask" in err

    code, _, err = predict(capsys, run, tiny_cohort.parent / "synthetic_00000.nii.gz",
                           out=tmp_path / "p.csv", extra=["--rows", "test"])
    assert code == 2 and "NIfTI files have none" in err
