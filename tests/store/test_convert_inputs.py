"""Conversion of what real cohorts hold: odd files, odd tables, files changed between runs."""


import nibabel as nib
import numpy as np
import pytest
import zarr
from helpers import kill_conversion

from fgscale.store._convert import convert

SHAPE = (10, 12, 10)
AFFINE = np.array([[2.0, 0, 0, -10], [0, 2, 0, -12], [0, 0, 2, -10], [0, 0, 0, 1]])


def write_cohort(folder, images, table=None):
    """Save ``images`` ({file name: array}) beside a cohort table; return the table's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in images.items():
        nib.save(nib.Nifti1Image(data, AFFINE), folder / name)
    path = folder / "cohort.csv"
    path.write_text(table if table is not None else "path,label\n" + "".join(
        f"{name},c{i % 2}\n" for i, name in enumerate(images)))
    return path


def volumes(rng, n, *extra):
    return [(rng.standard_normal(SHAPE + extra) + 5).astype(np.float32) for _ in range(n)]


def test_a_four_d_file_of_no_volume_is_refused_naming_it(tmp_path, rng):
    images = dict(zip(["a.nii.gz", "b.nii.gz", "c.nii.gz"], volumes(rng, 3), strict=True))
    images["run.nii.gz"] = np.zeros((*SHAPE, 0), np.float32)  # adds no row, without a word
    table = write_cohort(tmp_path / "cohort", images)
    with pytest.raises(ValueError, match=r"cohort.csv:5: .*run.nii.gz: image of shape "
                                         r"\(10, 12, 10, 0\) holds no voxel"):
        convert(table, tmp_path / "s.zarr", progress=False)
    assert not (tmp_path / "s.zarr").exists()


def oracle(store):
    """Rows recomputed with plain nibabel from the files as they are now."""
    rows = []
    for path, v in zip(store.source, store.volume, strict=True):
        data = nib.load(path).get_fdata(dtype=np.float32)
        rows.append((data if data.ndim == 3 else data[..., v])[store.mask])
    return np.asarray(rows)


def test_a_file_changed_before_resuming_is_converted_again(tmp_path, rng, caplog):
    """An unfinished conversion (stopped by a NaN in its last file) resumed after a file of a
    block already written was preprocessed again: that block is written again from the new
    file, not kept with the former rows beside the others as they are now."""
    names = [f"sub{i}.nii.gz" for i in range(6)]
    images = dict(zip(names, volumes(rng, 6, 2), strict=True))  # 4D: 2 volumes each
    images["sub5.nii.gz"][3, 4, 5, 1] = np.nan
    table = write_cohort(tmp_path / "cohort", images)
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), AFFINE), mask)
    out = tmp_path / "s.zarr"
    kwargs = dict(mask=mask, block_rows=4, progress=False)
    with pytest.raises(ValueError, match="NaN/inf values inside the mask"):
        convert(table, out, **kwargs)
    nib.save(nib.Nifti1Image(volumes(rng, 1, 2)[0], AFFINE), tmp_path / "cohort" / names[2])
    with caplog.at_level("WARNING"):
        store = convert(table, out, nan="zero", **kwargs)
    np.testing.assert_array_equal(store.X[:], np.nan_to_num(oracle(store)))
    assert "sub2.nii.gz changed (size or modification time) since this conversion began" in caplog.text
    assert store.attrs["summary"]["blocks_skipped"] == 1  # block 0 (sub0, sub1) kept


def test_a_file_changed_before_resuming_a_computed_mask_starts_afresh(tmp_path, rng, caplog):
    """The mask computed from the images may change with a file: the unfinished store is made
    again, on the mask of the files as they are now."""
    names = [f"sub{i}.nii.gz" for i in range(12)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, 12), strict=True)))
    out = tmp_path / "s.zarr"
    kill_conversion(table, out, block_rows=1, after_blocks=2)
    assert 2 <= zarr.open_group(out, mode="r")["done"][:].sum() < 12, "not killed mid-way"
    changed = volumes(rng, 1)[0]
    changed[0, 0, 0] = 0.0  # out of the mask now
    nib.save(nib.Nifti1Image(changed, AFFINE), tmp_path / "cohort" / names[0])
    with caplog.at_level("WARNING"):
        store = convert(table, out, block_rows=1, progress=False)
    assert store.n_features == np.prod(SHAPE) - 1 and not store.mask[0, 0, 0]
    np.testing.assert_array_equal(store.X[:], oracle(store))
    assert "sub0.nii.gz changed (size or modification time) since this conversion began" in caplog.text


def unfinished_store_of_a_changed_file(tmp_path, rng, n: int, zeroed):
    """A cohort of ``n`` files converted into s.zarr, left as a conversion stopped before its
    last block leaves it; then the first file rewritten with ``zeroed`` voxels at 0 (out of
    the mask computed from the files: the store must be made afresh). (table, store path)."""
    names = [f"sub{i}.nii.gz" for i in range(n)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, n), strict=True)))
    out = tmp_path / "s.zarr"
    convert(table, out, block_rows=1, progress=False)
    g = zarr.open_group(out, mode="r+")
    g["done"][n - 1], g.attrs["complete"] = 0, False
    changed = volumes(rng, 1)[0]
    changed[zeroed] = 0.0
    nib.save(nib.Nifti1Image(changed, AFFINE), tmp_path / "cohort" / names[0])
    return table, out


def test_a_store_made_afresh_in_the_same_process_is_written_on_its_own_mask(tmp_path, rng):
    """The store's mask, cached by the process that converts, is the new store's (same out,
    same fingerprint, another mask), not the one of the store it replaces."""
    table, out = unfinished_store_of_a_changed_file(tmp_path, rng, 4, (slice(0, 2),))
    store = convert(table, out, block_rows=1, progress=False)
    assert store.n_features == np.prod(SHAPE) - 2 * 12 * 10
    np.testing.assert_array_equal(store.X[:], oracle(store))


def test_a_complete_store_whose_files_changed_says_so(tmp_path, rng, caplog):
    names = [f"sub{i}.nii.gz" for i in range(3)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, 3), strict=True)))
    convert(table, tmp_path / "s.zarr", progress=False)
    nib.save(nib.Nifti1Image(volumes(rng, 1)[0], AFFINE), tmp_path / "cohort" / names[1])
    with caplog.at_level("WARNING"):
        convert(table, tmp_path / "s.zarr", progress=False)
    assert ("sub1.nii.gz changed (size or modification time) since the store was converted: it "
            "holds their former data" in caplog.text)


def test_a_row_of_zeros_in_the_whole_given_mask_is_named(tmp_path, rng, caplog):
    """A computed mask refuses an all-zero image; a given mask took it, or an image resampled
    from far off the mask's grid, as a row of zeros without a word."""
    names = [f"sub{i}.nii.gz" for i in range(4)]
    images = dict(zip(names, volumes(rng, 4), strict=True))
    images["sub2.nii.gz"] = np.zeros(SHAPE, np.float32)  # a failed contrast
    table = write_cohort(tmp_path / "cohort", images)
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), AFFINE), mask)
    with caplog.at_level("WARNING"):
        store = convert(table, tmp_path / "s.zarr", mask=mask, progress=False)
    assert not store.X[2].any()
    assert "1 row(s) are 0 at every voxel of the mask" in caplog.text
    assert "sub2.nii.gz (volume 0)" in caplog.text
    caplog.clear()
    far = AFFINE.copy()
    far[:3, 3] += 500.0  # another space's origin: no overlap with the mask
    nib.save(nib.Nifti1Image(volumes(rng, 1)[0], far), tmp_path / "cohort" / names[2])
    with caplog.at_level("WARNING"):
        convert(table, tmp_path / "r.zarr", mask=mask, resample="mask", progress=False)
    assert "sub2.nii.gz (volume 0)" in caplog.text


def test_a_cohort_of_nifti_pairs_keeps_its_space(tmp_path, rng):
    """The store records the first image's qform/sform codes, which its maps carry (MNI stays
    MNI); a .hdr/.img pair's were dropped for nibabel's default ('aligned')."""
    folder = tmp_path / "cohort"
    folder.mkdir()
    for i, data in enumerate(volumes(rng, 3)):
        img = nib.Nifti1Pair(data, AFFINE)
        img.set_sform(AFFINE, code=4)
        img.set_qform(AFFINE, code=4)
        nib.save(img, folder / f"sub{i}.hdr")
    (folder / "cohort.csv").write_text("path,label\nsub0.hdr,a\nsub1.hdr,b\nsub2.hdr,a\n")
    store = convert(folder / "cohort.csv", tmp_path / "s.zarr", progress=False)
    assert store.attrs["space_codes"] == [4, 4]
    np.testing.assert_array_equal(store.X[:], oracle(store))


def test_a_damaged_shard_and_a_changed_file_are_both_converted_again(tmp_path, rng):
    """A complete store with a shard deleted since is converted again where damaged; a file
    changed since, in another block, is then not kept with its former rows."""
    names = [f"sub{i}.nii.gz" for i in range(6)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, 6), strict=True)))
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), AFFINE), mask)
    out = tmp_path / "s.zarr"
    convert(table, out, mask=mask, block_rows=2, progress=False)
    (out / "X" / "c" / "0" / "0").unlink()  # block 0's shard, deleted
    nib.save(nib.Nifti1Image(volumes(rng, 1)[0], AFFINE), tmp_path / "cohort" / names[4])
    store = convert(table, out, mask=mask, block_rows=2, progress=False)
    np.testing.assert_array_equal(store.X[:], oracle(store))
    assert store.attrs["summary"]["blocks_skipped"] == 1


def test_the_record_of_the_files_is_an_array_not_an_attribute(tmp_path, rng):
    """Every task opens the store and parses its attributes: the files' record of a cohort of
    100,000 files would be megabytes of JSON there (0.15 s per open)."""
    names = [f"sub{i}.nii.gz" for i in range(3)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, 3), strict=True)))
    store = convert(table, tmp_path / "s.zarr", progress=False)
    g = zarr.open_group(store.path, mode="r")
    assert g["inputs"].shape == (3, 2) and "inputs" not in g.attrs
    assert g["inputs"][1, 0] == (tmp_path / "cohort" / names[1]).stat().st_size


def test_a_store_of_other_inputs_is_refused_saying_what_differs(tmp_path, rng):
    """Hours after a conversion, a corrected command on its store: the refusal names the
    change, not only that there is one."""
    from fgscale.store import StoreError

    names = [f"sub{i}.nii.gz" for i in range(3)]
    table = write_cohort(tmp_path / "cohort", dict(zip(names, volumes(rng, 3), strict=True)))
    out = tmp_path / "s.zarr"
    convert(table, out, progress=False)
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), AFFINE), mask)
    with pytest.raises(StoreError, match=r"other inputs or arguments \(--mask none there, "
                                         r".*mask.nii.gz now\); remove it"):
        convert(table, out, mask=mask, progress=False)
    with pytest.raises(StoreError, match=r"\(--block-rows default there, 2 now\); remove it"):
        convert(table, out, block_rows=2, progress=False)
    with pytest.raises(StoreError, match=r"\(--resample none there, 1.0 now\); remove it"):
        convert(table, out, resample=1, progress=False)  # 1 mm, not read as True
    # a store converted before its params recorded --block-rows: the blocks' size tells
    g = zarr.open_group(out, mode="r+")
    g.attrs["params"] = {k: v for k, v in g.attrs["params"].items() if k != "block_rows"}
    with pytest.raises(StoreError, match=rf"\(blocks of {g.attrs['block_rows']} rows there, "
                                         r"--block-rows 2 now\)"):
        convert(table, out, block_rows=2, progress=False)
    table.write_text("path,label\nsub0.nii.gz,c0\nsub1.nii.gz,c0\nsub2.nii.gz,c0\n")
    with pytest.raises(StoreError, match=r"\(row 1: label 'c1' there, 'c0' now\)"):
        convert(table, out, progress=False)
    nib.save(nib.Nifti1Image(volumes(rng, 1)[0], AFFINE), tmp_path / "cohort" / "sub3.nii.gz")
    table.write_text("path,label\n" + "".join(f"sub{i}.nii.gz,c{i % 2}\n" for i in range(4)))
    with pytest.raises(StoreError, match=r"\(3 rows there, 4 now: files added or removed\)"):
        convert(table, out, progress=False)


_REMOVAL_DRIVER = """
import os, sys
from pathlib import Path

out, k, count = os.path.abspath(sys.argv[2]), int(sys.argv[3]), [0]


def interrupt_the_kth_removal(event, args):
    # a removal inside the store's folder (or a folder it was renamed to, beside it)
    if event in ("os.remove", "os.rmdir") and isinstance(args[1], int) and args[1] >= 0:
        if os.readlink(f"/proc/self/fd/{args[1]}").startswith(out):
            count[0] += 1
            if count[0] == k:
                raise KeyboardInterrupt


sys.addaudithook(interrupt_the_kth_removal)
from fgscale.store._convert import convert

convert(sys.argv[1], out, block_rows=1, progress=False)
"""


@pytest.mark.parametrize("k", [1, 5, 15, 30])
def test_a_store_removal_interrupted_anywhere_blocks_no_conversion(tmp_path, rng, k):
    """An unfinished store of files that changed since is removed to start afresh; interrupted
    at its k-th file, the removal leaves nothing at --out that the command, run again,
    refuses as "not a store", and that run removes what was left."""
    import subprocess
    import sys

    table, out = unfinished_store_of_a_changed_file(tmp_path, rng, 6, (0, 0, 0))
    driver = tmp_path / "driver.py"
    driver.write_text(_REMOVAL_DRIVER)
    done = subprocess.run([sys.executable, str(driver), str(table), str(out), str(k)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, done.stderr[-2000:]
    store = convert(table, out, block_rows=1, progress=False)
    np.testing.assert_array_equal(store.X[:], oracle(store))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort", "driver.py", "s.zarr"]


def test_numeric_labels_are_classes_in_the_order_of_their_values(tmp_path, rng):
    """Labels 2, 10, 1 give classes ['1', '2', '10'] (scikit-learn's order of the numbers),
    not the text order ['1', '10', '2'] that put 10 between 1 and 2 in every report."""
    images = dict(zip(["a.nii.gz", "b.nii.gz", "c.nii.gz"], volumes(rng, 3), strict=True))
    table = write_cohort(tmp_path / "cohort", images,
                         "path,label\na.nii.gz,2\nb.nii.gz,10\nc.nii.gz,1\n")
    store = convert(table, tmp_path / "s.zarr", progress=False)
    assert store.classes.tolist() == ["1", "2", "10"]
    assert store.y.tolist() == [1, 2, 0]
