"""Conversion NIfTI -> store on a real LocalCluster, against nibabel (and nibabel.processing)."""

import csv
import shutil

import nibabel as nib
import numpy as np
import pytest
import zarr
from helpers import TINY_GRID, cohort_rows, kill_conversion, save_mask
from nibabel.processing import resample_to_output

from fgscale.cli import main
from fgscale.images._synthetic import brain_mask, grid_geometry, make_cohort
from fgscale.store import StoreError, open_store
from fgscale.store._convert import convert


def write_rows(csv_path, rows):
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def oracle(store):
    """Rows recomputed with plain nibabel: vol[mask] of each (file, volume)."""
    out = []
    for path, v in zip(store.source, store.volume, strict=True):
        data = nib.load(path).get_fdata()
        out.append((data if data.ndim == 3 else data[..., v])[store.mask])
    return np.asarray(out, dtype=np.float32)


@pytest.fixture
def cohort_copy(tiny_cohort, tmp_path):
    """A private copy of the tiny cohort, free to damage."""
    folder = tmp_path / "cohort"
    shutil.copytree(tiny_cohort.parent, folder)
    return folder / "cohort.csv"


def test_round_trip_equals_nibabel(tiny_cohort, tmp_path, client):
    store = convert(tiny_cohort, tmp_path / "s.zarr", client=client, block_rows=5,
                    progress=False)
    assert store.n_samples == 24 and store.X.shards == (5, store.n_features)
    np.testing.assert_array_equal(store.X[:], oracle(store))
    shape, _, n = grid_geometry(TINY_GRID)
    np.testing.assert_array_equal(store.mask, brain_mask(shape, n))  # computed mask
    rows = cohort_rows(tiny_cohort)
    assert store.classes.tolist() == ["class_0", "class_1", "class_2"]
    assert store.classes[store.y].tolist() == [r["label"] for r in rows]
    assert store.split.tolist() == [r["split"] for r in rows]
    assert store.groups.tolist() == [r["group"] for r in rows]
    assert store.attrs["synthetic"] is True
    assert store.attrs["summary"]["n_samples"] == 24


def test_a_relative_out_reaches_workers_that_run_elsewhere(tiny_cohort, tmp_path, client,
                                                         monkeypatch):
    """Workers of a cluster joined by --scheduler-file run in a working directory of their own
    (a SLURM job's, a pod's, here the session's): a relative --out must reach them as the
    folder the command meant, not as one of theirs."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    store = convert(tiny_cohort, "rel.zarr", client=client, block_rows=5, progress=False)
    assert (here / "rel.zarr" / "zarr.json").is_file()
    np.testing.assert_array_equal(store.X[:], oracle(store))


def test_an_empty_out_folder_takes_the_store_and_another_folder_is_left_alone(tiny_cohort,
                                                                             tmp_path, capsys):
    """A job script's ``mkdir -p $OUT`` before fgscale convert: the store goes there (it was
    refused as "not a Zarr group"). A folder of other files is refused in convert's words
    (not told to "convert them to a store") and left as it was."""
    empty = tmp_path / "made-by-the-job.zarr"
    empty.mkdir()
    assert main(["convert", str(tiny_cohort), "--out", str(empty), "--n-workers", "1",
                 "--no-progress"]) == 0
    np.testing.assert_array_equal(open_store(empty).X[:], oracle(open_store(empty)))
    files = sorted(p.name for p in tiny_cohort.parent.iterdir())
    capsys.readouterr()
    assert main(["convert", str(tiny_cohort), "--out", str(tiny_cohort.parent), "--n-workers",
                 "1", "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"fgscale convert: error: {tiny_cohort.parent}: a folder "
                                       "that is not a store; choose another --out (a new path, "
                                       "or an empty folder)\n")
    assert sorted(p.name for p in tiny_cohort.parent.iterdir()) == files


def test_four_d_and_tsv(tmp_path, client):
    csv_path = make_cohort(tmp_path / "c4", n_samples=10, n_classes=2, grid=TINY_GRID, n_subjects=2,
                           four_d=True, seed=2)
    tsv = csv_path.with_suffix(".tsv")
    tsv.write_text(csv_path.read_text().replace(",", "\t"))
    store = convert(tsv, tmp_path / "s4.zarr", client=client, block_rows=3, progress=False)
    assert store.n_samples == 10 and store.volume.max() >= 1
    np.testing.assert_array_equal(store.X[:], oracle(store))
    assert store.attrs["synthetic"] is True  # cohort.json sits beside cohort.tsv


def test_globs_labels_and_given_mask(tiny_cohort, tmp_path, client):
    folder = tiny_cohort.parent
    labels = [r["label"] for r in cohort_rows(tiny_cohort)]  # rows are in sorted file order
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    shape, affine, n = grid_geometry(TINY_GRID)
    small = brain_mask(shape, n) & (np.indices(shape)[0] < 6)
    save_mask(tmp_path / "mask.nii.gz", small, affine)
    assert main(["convert", str(folder / "synthetic_*.nii.gz"), "--labels",
                 str(tmp_path / "labels.txt"), "--mask", str(tmp_path / "mask.nii.gz"),
                 "--out", str(tmp_path / "g.zarr"), "--scheduler", client.scheduler.address,
                 "--no-progress"]) == 0
    store = open_store(tmp_path / "g.zarr")
    np.testing.assert_array_equal(store.mask, small)
    np.testing.assert_array_equal(store.X[:], oracle(store))
    assert store.classes[store.y].tolist() == labels


def test_resampled_store_matches_nibabel_processing(tiny_cohort, tmp_path, client):
    store = convert(tiny_cohort, tmp_path / "r.zarr", resample=6, client=client,
                    progress=False)
    images = [resample_to_output(nib.load(p), voxel_sizes=6.0, order=1) for p in store.source]
    assert store.mask.shape == images[0].shape
    np.testing.assert_allclose(store.affine, images[0].affine)
    data = np.stack([img.get_fdata(dtype=np.float32) for img in images])
    expected_mask = np.all(np.isfinite(data) & (data != 0), axis=0)
    np.testing.assert_array_equal(store.mask, expected_mask)
    np.testing.assert_allclose(store.X[:], data[:, expected_mask], rtol=1e-6, atol=1e-6)


def test_resample_to_mask_grid(tiny_cohort, tmp_path, client):
    _, affine, _ = grid_geometry(TINY_GRID)
    coarse = affine.copy()
    coarse[:3, :3] *= 2
    save_mask(tmp_path / "m.nii", np.ones((6, 7, 6), bool), coarse)
    store = convert(tiny_cohort, tmp_path / "rm.zarr", mask=tmp_path / "m.nii",
                    resample="mask", intersect_mask=True, client=client, progress=False)
    assert store.mask.shape == (6, 7, 6)
    np.testing.assert_array_equal(store.affine, coarse)
    first = nib.processing.resample_from_to(nib.load(store.source[0]), ((6, 7, 6), coarse),
                                            order=1).get_fdata(dtype=np.float32)
    np.testing.assert_allclose(store.X[0], first[store.mask], rtol=1e-6, atol=1e-6)


def test_images_off_the_mask_grid_are_refused_saying_how_to_resample(tiny_cohort, tmp_path):
    _, affine, _ = grid_geometry(TINY_GRID)
    coarse = affine.copy()
    coarse[:3, :3] *= 2
    save_mask(tmp_path / "m.nii", np.ones((6, 7, 6), bool), coarse)
    with pytest.raises(ValueError, match=r"does not match the mask's grid \(6, 7, 6\).* "
                                         r"\(resample='mask' for convert\(\), --resample mask for "
                                         r"fgscale convert, resamples the images to the mask's "
                                         r"grid\)"):
        convert(tiny_cohort, tmp_path / "rm.zarr", mask=tmp_path / "m.nii", progress=False)
    assert not (tmp_path / "rm.zarr").exists()


def test_rerun_complete_is_noop_and_other_args_refused(tiny_cohort, tmp_path, client):
    out = tmp_path / "n.zarr"
    convert(tiny_cohort, out, client=client, block_rows=8, progress=False)
    shard = out / "X" / "c" / "0" / "0"
    before = shard.stat().st_mtime_ns
    store = convert(tiny_cohort, out, client=client, block_rows=8, progress=False)
    assert shard.stat().st_mtime_ns == before and store.n_samples == 24
    with pytest.raises(StoreError, match="made from other inputs"):
        convert(tiny_cohort, out, client=client, block_rows=4, progress=False)
    zarr.open_group(tmp_path / "foreign.zarr", mode="w")
    with pytest.raises(StoreError, match="not an fgscale store"):
        convert(tiny_cohort, tmp_path / "foreign.zarr", client=client, progress=False)


def test_killed_conversion_resumes_to_identical_store(tiny_cohort, tmp_path, client):
    out = tmp_path / "killed.zarr"
    kill_conversion(tiny_cohort, out, block_rows=2, after_blocks=3)
    g = zarr.open_group(out, mode="r")
    assert 3 <= g["done"][:].sum() < 12 and not g.attrs["complete"], "not killed mid-way"
    with pytest.raises(StoreError, match="re-run fgscale convert to finish it"):
        open_store(out)

    resumed = convert(tiny_cohort, out, client=client, block_rows=2, progress=False)
    assert resumed.attrs["summary"]["blocks_skipped"] >= 3
    fresh = convert(tiny_cohort, tmp_path / "fresh.zarr", client=client, block_rows=2,
                    progress=False)
    a, b = zarr.open_group(out, mode="r"), zarr.open_group(fresh.path, mode="r")
    assert sorted(a.array_keys()) == sorted(b.array_keys())
    for name in a.array_keys():
        np.testing.assert_array_equal(a[name][:], b[name][:], err_msg=name)
    strip = {"summary"}
    assert ({k: v for k, v in a.attrs.items() if k not in strip}
            == {k: v for k, v in b.attrs.items() if k not in strip})


# ---------------------------------------------------------------- bad input


def damage(csv_path, index, how):
    """Damage the file of row ``index`` of a cohort copy; return its path."""
    path = csv_path.parent / cohort_rows(csv_path)[index]["path"]
    img = nib.load(path)
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "nan":
        vol = img.get_fdata(dtype=np.float32)
        vol[tuple(np.argwhere(vol != 0)[0])] = np.nan
        nib.save(nib.Nifti1Image(vol, img.affine), path)
    elif how == "shape":
        nib.save(nib.Nifti1Image(np.ones((12, 14, 11), np.float32), img.affine), path)
    elif how == "affine":
        nib.save(nib.Nifti1Image(img.get_fdata(dtype=np.float32), img.affine * 1.5), path)
    return path


@pytest.mark.parametrize("how, error, message", [
    ("missing", FileNotFoundError, "no such NIfTI file"),
    ("junk", ValueError, "not a readable NIfTI image"),
    ("shape", ValueError, r"grid \(12, 14, 11\).*does not match"),
    ("affine", ValueError, r"does not match the majority's grid .*\(23 of 24 images, e\.g\. "
                           r".*synthetic_00000\.nii\.gz; resample=MM for convert\(\), "
                           r"--resample MM for fgscale convert, resamples every image to a "
                           r"voxel size of MM mm\)"),
    ("truncate", ValueError, "truncated or corrupt"),  # found by the mask pass, before writing
])
def test_bad_file_fails_before_writing(cohort_copy, tmp_path, client, how, error, message):
    if how == "missing":
        path = cohort_copy.parent / cohort_rows(cohort_copy)[7]["path"]
        path.unlink()
    elif how == "junk":
        path = cohort_copy.parent / cohort_rows(cohort_copy)[7]["path"]
        path.write_bytes(b"\x1f\x8b garbage")
    else:
        path = damage(cohort_copy, 7, how)
    with pytest.raises(error, match=message) as info:
        convert(cohort_copy, tmp_path / "bad.zarr", client=client, block_rows=4, progress=False)
    assert path.name in str(info.value)
    if how != "truncate":  # a header's problem: the table's line too, to find it in hundreds
        assert str(info.value).startswith(f"{cohort_copy}:9: ")
    assert not (tmp_path / "bad.zarr").exists()


@pytest.mark.parametrize("how, message", [("truncate", "truncated or corrupt"),
                                          ("nan", r"1 NaN/inf values inside the mask")])
def test_bad_data_keeps_earlier_blocks_and_resumes(cohort_copy, tmp_path, client, how,
                                                   message):
    """With a given mask, data errors surface during conversion: other blocks are kept."""
    shape, affine, n = grid_geometry(TINY_GRID)
    save_mask(tmp_path / "mask.nii.gz", brain_mask(shape, n), affine)
    original = (cohort_copy.parent / cohort_rows(cohort_copy)[21]["path"]).read_bytes()
    path = damage(cohort_copy, 21, how)  # block 5 of 6
    out = tmp_path / "partial.zarr"
    kwargs = dict(mask=tmp_path / "mask.nii.gz", client=client, block_rows=4, progress=False)
    with pytest.raises(ValueError, match=message) as info:
        convert(cohort_copy, out, **kwargs)
    # the table's line, as the checks before the conversion name a file
    assert str(info.value).startswith(f"{cohort_copy}:23: {path}")
    done = zarr.open_group(out, mode="r")["done"][:]
    assert done.tolist() == [1, 1, 1, 1, 1, 0]
    assert not list(out.rglob("*.tmp"))  # the failed block left no partial shard behind
    with pytest.raises(StoreError, match="not complete"):
        open_store(out)
    if how == "nan":  # the option to zero them
        store = convert(cohort_copy, out, nan="zero", **kwargs)
        assert store.attrs["summary"]["blocks_skipped"] == 5
        np.testing.assert_array_equal(store.X[21], np.nan_to_num(oracle(store)[21]))
    else:  # fix the file, re-run: resumes
        path.write_bytes(original)
        store = convert(cohort_copy, out, **kwargs)
        np.testing.assert_array_equal(store.X[:], oracle(store))


def test_bad_table(cohort_copy, tmp_path, client):
    rows = cohort_rows(cohort_copy)
    out = tmp_path / "t.zarr"
    bad = [dict(r) for r in rows]
    bad[3]["label"] = ""
    write_rows(cohort_copy, bad)
    with pytest.raises(ValueError, match=r"cohort.csv:5: missing label for .*synthetic_00003"):
        convert(cohort_copy, out, client=client, progress=False)
    write_rows(cohort_copy, rows)
    with pytest.raises(ValueError, match=r"unknown label 'class_2'.*expected one of"):
        convert(cohort_copy, out, classes=["class_0", "class_1"], client=client, progress=False)
    bad = [dict(r) for r in rows]
    bad[0]["split"] = "validation"
    write_rows(cohort_copy, bad)
    with pytest.raises(ValueError, match="split 'validation'"):
        convert(cohort_copy, out, client=client, progress=False)
    write_rows(cohort_copy, [{"file": r["path"], "label": r["label"]} for r in rows])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['path'\]"):
        convert(cohort_copy, out, client=client, progress=False)
    with pytest.raises(FileNotFoundError, match="no such cohort table"):
        convert(tmp_path / "none.csv", out, client=client, progress=False)
    assert not out.exists()


def test_empty_masks(cohort_copy, tmp_path, client):
    shape, affine, _ = grid_geometry(TINY_GRID)
    save_mask(tmp_path / "empty.nii", np.zeros(shape, bool), affine)
    with pytest.raises(ValueError, match="empty.nii: the mask is empty"):
        convert(cohort_copy, tmp_path / "e.zarr", mask=tmp_path / "empty.nii", client=client,
                progress=False)
    path = cohort_copy.parent / cohort_rows(cohort_copy)[0]["path"]
    nib.save(nib.Nifti1Image(np.zeros(shape, np.float32), affine), path)
    # one all-zero image empties the computed mask: it is named
    with pytest.raises(ValueError, match=rf"{path.name} \(volume 0\): no voxel is finite and "
                                         "non-zero"):
        convert(cohort_copy, tmp_path / "e.zarr", client=client, progress=False)
    # images that each have voxels, but none in common
    for i, row in enumerate(cohort_rows(cohort_copy)):
        data = np.zeros(shape, np.float32)
        data.flat[i] = 1.0
        nib.save(nib.Nifti1Image(data, affine), cohort_copy.parent / row["path"])
    with pytest.raises(ValueError, match="the mask is empty: no voxel is finite and non-zero in "
                                         "every image"):
        convert(cohort_copy, tmp_path / "e.zarr", client=client, progress=False)
    assert not (tmp_path / "e.zarr").exists()


# ---------------------------------------------------------------- numeric targets (regression)


def add_targets(csv_path, targets, keep_labels=True):
    """Rewrite a cohort table with a ``target`` column (and without ``label`` unless
    ``keep_labels``); return its original rows."""
    rows = cohort_rows(csv_path)
    write_rows(csv_path, [{**{k: v for k, v in r.items() if keep_labels or k != "label"},
                           "target": t} for r, t in zip(rows, targets, strict=True)])
    return rows


TARGETS = [f"{(i - 9.5) ** 3 / 7:.6g}" for i in range(24)]  # negative and fractional values


def test_labels_and_targets_round_trip_and_a_changed_target_is_refused(cohort_copy, tmp_path,
                                                                      client):
    rows = add_targets(cohort_copy, TARGETS)
    out = tmp_path / "t.zarr"
    store = convert(cohort_copy, out, client=client, block_rows=8, progress=False)
    assert store.target.dtype == np.float64 and store.has_labels
    np.testing.assert_array_equal(store.target, [float(t) for t in TARGETS])
    assert store.classes[store.y].tolist() == [r["label"] for r in rows]
    np.testing.assert_array_equal(store.X[:], oracle(store))
    shard = out / "X" / "c" / "0" / "0"
    before = shard.stat().st_mtime_ns
    convert(cohort_copy, out, client=client, block_rows=8, progress=False)  # same: a no-op
    assert shard.stat().st_mtime_ns == before
    changed = list(TARGETS)
    changed[5] = "1000"
    add_targets(cohort_copy, changed)
    with pytest.raises(StoreError, match="made from other inputs"):  # as a changed label is
        convert(cohort_copy, out, client=client, block_rows=8, progress=False)
    assert open_store(out).target[5] == float(TARGETS[5])  # the store is left as it was


def test_a_target_only_cohort_gives_a_store_without_classes(cohort_copy, tmp_path, client):
    rows = add_targets(cohort_copy, TARGETS, keep_labels=False)
    store = convert(cohort_copy, tmp_path / "r.zarr", client=client, block_rows=5,
                    progress=False)
    assert not store.has_labels and store.classes.size == 0 and not store.y.any()
    np.testing.assert_array_equal(store.target, [float(t) for t in TARGETS])
    assert store.split.tolist() == [r["split"] for r in rows]
    assert store.groups.tolist() == [r["group"] for r in rows]
    np.testing.assert_array_equal(store.X[:], oracle(store))
    with pytest.raises(ValueError, match="classes were given but the cohort table has no"):
        convert(cohort_copy, tmp_path / "c.zarr", classes=["class_0"], client=client,
                progress=False)


def test_a_four_d_file_gives_its_target_to_every_volume(tmp_path, client):
    csv_path = make_cohort(tmp_path / "c4", n_samples=10, n_classes=2, grid=TINY_GRID,
                           n_subjects=2, four_d=True, seed=2)
    files = cohort_rows(csv_path)
    targets = [str(2.5 * i - 1) for i in range(len(files))]
    add_targets(csv_path, targets, keep_labels=False)
    store = convert(csv_path, tmp_path / "s4.zarr", client=client, block_rows=3, progress=False)
    volumes = [nib.load(csv_path.parent / f["path"]).shape[3] for f in files]
    assert store.n_samples == sum(volumes) == 10 and max(volumes) > 1
    np.testing.assert_array_equal(store.target, np.repeat([float(t) for t in targets], volumes))
    assert store.volume.tolist() == [v for n in volumes for v in range(n)]
    np.testing.assert_array_equal(store.X[:], oracle(store))


@pytest.mark.parametrize("value, message", [("abc", "target 'abc' .* is not a number"),
                                            ("nan", "target 'nan' .* is not finite"),
                                            ("", "missing target")])
@pytest.mark.parametrize("keep_labels", [True, False], ids=["label+target", "target"])
def test_a_bad_target_names_file_and_line_before_writing(cohort_copy, tmp_path, client, value,
                                                         message, keep_labels):
    targets = list(TARGETS)
    targets[3] = value
    add_targets(cohort_copy, targets, keep_labels)
    with pytest.raises(ValueError, match=rf"cohort.csv:5: {message}"):
        convert(cohort_copy, tmp_path / "bad.zarr", client=client, progress=False)
    assert not (tmp_path / "bad.zarr").exists()


def test_an_image_that_cuts_the_computed_mask_is_named(cohort_copy, tmp_path, client, caplog):
    """One image zero over a slab (a partial field of view) cuts the mask computed from the
    images to its own voxels: said in a warning naming it, where it was silent."""
    rows = cohort_rows(cohort_copy)
    assert len(rows) >= 10
    whole = convert(cohort_copy, tmp_path / "whole.zarr", client=client, progress=False)
    path = cohort_copy.parent / rows[3]["path"]
    img = nib.load(path)
    data = np.asarray(img.dataobj).copy()
    data[..., data.shape[2] // 2:] = 0
    nib.save(nib.Nifti1Image(data, img.affine, img.header), path)
    with caplog.at_level("WARNING", logger="fgscale.store._grid"):
        cut = convert(cohort_copy, tmp_path / "cut.zarr", client=client, progress=False)
    assert cut.mask.sum() < 0.75 * whole.mask.sum()
    assert (f"the mask computed from the images holds {cut.mask.sum()} voxels, where most "
            "images are non-zero at ") in caplog.text
    assert f"1 image(s) are non-zero at far fewer and cut it to theirs ({path}: " in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fgscale.store._grid"):  # a given mask: no cut
        convert(cohort_copy, tmp_path / "given.zarr", client=client, progress=False,
                mask=save_mask(tmp_path / "m.nii", cut.mask, cut.affine))
    assert "cut it" not in caplog.text
