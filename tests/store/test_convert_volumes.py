"""A cohort table that lists the volumes of 4D runs one per row (its ``volume`` column), each
with a label of its own: the design of nilearn's Haxby example, where a run holds the volumes of
every condition. Real 4D NIfTI files, converted, resumed and appended as any cohort."""

import nibabel as nib
import numpy as np
import pytest

from fgscale.cli import main
from fgscale.store._convert import convert

SHAPE = (6, 7, 5)
AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])
CONDITIONS = ("face", "house", "rest")


def runs(folder, rng, n_runs=3, n_volumes=9):
    """4D runs (.nii.gz) and a table of their volumes, ``rest`` left out (as the Haxby example
    leaves it), a run's volumes listed backwards in the last run; returns the table and the
    expected (file, volume, label, group) of each row."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = []
    for r in range(n_runs):
        data = (rng.standard_normal((*SHAPE, n_volumes)) + 4).astype(np.float32)
        nib.save(nib.Nifti1Image(data, AFFINE), folder / f"run{r}.nii.gz")
        order = range(n_volumes) if r < n_runs - 1 else range(n_volumes - 1, -1, -1)
        expected += [(folder / f"run{r}.nii.gz", v, CONDITIONS[v % 3], f"run{r}")
                     for v in order if CONDITIONS[v % 3] != "rest"]
    table = folder / "cohort.csv"
    table.write_text("path,volume,label,group\n" + "".join(
        f"{f.name},{v},{label},{group}\n" for f, v, label, group in expected))
    return table, expected


def rows_of(expected, mask):
    """The oracle: each listed volume indexed by the mask with numpy."""
    return np.stack([np.asarray(nib.load(f).dataobj)[..., v][mask] for f, v, _, _ in expected])


def test_the_volumes_of_a_run_take_the_labels_of_their_rows(tmp_path, rng, capsys):
    table, expected = runs(tmp_path / "cohort", rng)
    run0 = tmp_path / "cohort" / "run0.nii.gz"
    data = np.asarray(nib.load(run0).dataobj).copy()
    data[2, 3, 1, 2] = 0.0  # in volume 2, a rest volume, which the table does not list
    nib.save(nib.Nifti1Image(data, AFFINE), run0)
    assert main(["convert", str(table), "--out", str(tmp_path / "s.zarr"), "--block-rows", "4",
                 "--no-progress"]) == 0
    assert "18 rows x 210 voxels, 2 classes" in capsys.readouterr().out
    from fgscale.store import open_store

    store = open_store(tmp_path / "s.zarr")
    assert [(s, int(v)) for s, v in zip(store.source, store.volume, strict=True)] == [
        (str(f), v) for f, v, _, _ in expected]
    assert store.classes[store.y].tolist() == [label for _, _, label, _ in expected]
    assert store.groups.tolist() == [group for _, _, _, group in expected]
    np.testing.assert_array_equal(store.X[:], rows_of(expected, store.mask))
    # the mask computed from the listed volumes only: a rest volume zero at a voxel is not one
    assert store.mask.all()


def test_the_same_volumes_as_3d_files_give_the_same_rows(tmp_path, rng):
    table, expected = runs(tmp_path / "cohort", rng, n_runs=2)
    split = tmp_path / "split"
    split.mkdir()
    lines = []
    for f, v, label, group in expected:
        img = nib.load(f)
        name = f"{f.name[:-7]}_{v:03d}.nii.gz"
        nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[..., v], img.affine), split / name)
        lines.append(f"{name},{label},{group}\n")
    (split / "cohort.csv").write_text("path,label,group\n" + "".join(lines))
    by_volume = convert(table, tmp_path / "a.zarr", block_rows=3, progress=False)
    by_file = convert(split / "cohort.csv", tmp_path / "b.zarr", block_rows=3, progress=False)
    np.testing.assert_array_equal(by_volume.X[:], by_file.X[:])
    np.testing.assert_array_equal(by_volume.mask, by_file.mask)
    np.testing.assert_array_equal(by_volume.y, by_file.y)


def test_a_volume_beyond_the_run_is_refused_before_anything_is_written(tmp_path, rng):
    table, _ = runs(tmp_path / "cohort", rng, n_runs=1)
    table.write_text(table.read_text() + "run0.nii.gz,9,face,run0\n")
    with pytest.raises(ValueError, match=r"cohort.csv:8: .*run0.nii.gz: volume 9, but the file "
                                         r"has 9 volumes \(0 to 8\)"):
        convert(table, tmp_path / "s.zarr", progress=False)
    assert not (tmp_path / "s.zarr").exists()


def test_a_run_changed_before_resuming_is_named_once_and_its_blocks_written_again(
        tmp_path, rng, caplog):
    """An unfinished conversion (stopped by a NaN in the last run) resumed after the first run
    was preprocessed again: its blocks are written again from the new file, which the warning
    names once, though six rows list it."""
    table, expected = runs(tmp_path / "cohort", rng, n_runs=2)
    bad = tmp_path / "cohort" / "run1.nii.gz"
    data = np.asarray(nib.load(bad).dataobj).copy()
    data[1, 2, 3, 0] = np.nan
    nib.save(nib.Nifti1Image(data, AFFINE), bad)
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), AFFINE), mask)
    out = tmp_path / "s.zarr"
    kwargs = dict(mask=mask, block_rows=2, n_workers=1, progress=False)
    with pytest.raises(ValueError, match=r"cohort.csv:13: .*run1.nii.gz \(volume 0\): 1 NaN/inf"):
        convert(table, out, **kwargs)
    changed = tmp_path / "cohort" / "run0.nii.gz"
    nib.save(nib.Nifti1Image((rng.standard_normal((*SHAPE, 9)) + 4).astype(np.float32),
                             AFFINE), changed)
    with caplog.at_level("WARNING"):
        store = convert(table, out, nan="zero", **kwargs)
    np.testing.assert_array_equal(store.X[:], np.nan_to_num(rows_of(expected, store.mask)))
    assert f"{changed} changed (size or modification time) since this conversion" in caplog.text
    assert "other file(s)" not in caplog.text


def test_more_volumes_of_a_run_are_appended_as_the_whole_table_converts(tmp_path, rng):
    table, expected = runs(tmp_path / "cohort", rng, n_runs=2)
    lines = table.read_text().splitlines(keepends=True)
    first = table.with_name("first.csv")
    first.write_text("".join(lines[:5]))  # 4 volumes of run0; 2 more of it and run1 follow
    kwargs = dict(block_rows=3, progress=False)
    out = tmp_path / "s.zarr"
    before = convert(first, out, **kwargs)
    rows_before = before.X[:]
    grown = convert(table, out, append=True, **kwargs)
    fresh = convert(table, tmp_path / "fresh.zarr", **kwargs)
    np.testing.assert_array_equal(grown.X[:], fresh.X[:])
    np.testing.assert_array_equal(grown.X[:4], rows_before)
    np.testing.assert_array_equal(grown.volume, fresh.volume)
    assert grown.attrs["summary"]["rows_appended"] == len(expected) - 4
