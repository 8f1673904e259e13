"""Appending new images to a converted store (convert(..., append=True), --append): the store it
leaves equals a conversion of the whole table afresh, its rows keep their place, and whatever
an append refuses or leaves unfinished, the store's rows are never lost."""

import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import zarr

from fgscale.store import StoreError, compute_stats, load_stats, open_store
from fgscale.store._convert import convert

SHAPE = (6, 7, 5)
AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])
ARRAYS = ("X", "y", "classes", "source", "volume", "groups", "split", "mask", "affine")


def save(folder, name, data):
    nib.save(nib.Nifti1Image(data, AFFINE), folder / name)


def cohort(tmp_path, rng, n_files=7, n_first=4, volumes=(1, 2, 1, 3, 1, 2, 1)):
    """Files sub0..sub{n_files-1} (3D where 1 volume, else 4D) and two tables: the first
    ``n_first`` files, then all of them (label, group, split and a target per file)."""
    folder = tmp_path / "cohort"
    folder.mkdir()
    lines = []
    for i in range(n_files):
        data = rng.standard_normal(SHAPE + ((volumes[i],) if volumes[i] > 1 else ())) + 4
        save(folder, f"sub{i}.nii.gz", data.astype(np.float32))
        lines.append(f"sub{i}.nii.gz,c{i % 3 % 2},s{i // 2},{'test' if i == 2 else ''},{i / 2}\n")
    head = "path,label,group,split,target\n"
    first, whole = folder / "first.csv", folder / "whole.csv"
    first.write_text(head + "".join(lines[:n_first]))
    whole.write_text(head + "".join(lines))
    return first, whole


def assert_same_store(a, b):
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name)[:] if name == "X" else getattr(a, name),
                                      getattr(b, name)[:] if name == "X" else getattr(b, name),
                                      err_msg=name)
    np.testing.assert_array_equal(a.target, b.target)


@pytest.mark.parametrize("mask", [False, True])
def test_an_append_gives_the_store_of_the_whole_table(tmp_path, rng, client, mask):
    """The store grown by the new files' rows (a partial last block included: 6 rows in blocks
    of 4) equals the whole table converted afresh; its rows and their statistics stay."""
    first, whole = cohort(tmp_path, rng)
    kwargs = {"block_rows": 4, "progress": False}
    if mask:
        kwargs["mask"] = tmp_path / "mask.nii.gz"
        save(tmp_path, "mask.nii.gz", (rng.random(SHAPE) < 0.7).astype(np.uint8))
    out = tmp_path / "s.zarr"
    before = convert(first, out, **kwargs)
    rows_before, n_before = before.X[:], before.n_samples
    stats_before = compute_stats(out, np.arange(n_before), client=client, progress=False)
    middle = whole.with_name("middle.csv")  # two files more (3 rows): appended twice
    middle.write_text("".join(whole.read_text().splitlines(keepends=True)[:7]))
    assert convert(middle, out, append=True, **kwargs).n_samples == 10
    grown = convert(whole, out, append=True, **kwargs)
    fresh = convert(whole, tmp_path / "fresh.zarr", **kwargs)
    assert (n_before, grown.n_samples) == (7, 11)
    assert_same_store(grown, fresh)
    np.testing.assert_array_equal(grown.X[:n_before], rows_before)
    assert grown.attrs["summary"]["rows_appended"] == 1
    assert grown.attrs["summary"]["blocks_skipped"] == 2  # block 2 held rows 8-9: written again
    for saved, again in zip(load_stats(out, np.arange(n_before)), stats_before, strict=True):
        np.testing.assert_array_equal(saved, again)
    # the same command again: nothing to do, and a fresh conversion refuses nothing
    assert convert(whole, out, append=True, **kwargs).attrs["summary"] == grown.attrs["summary"]
    assert convert(whole, out, **kwargs).n_samples == 11


def test_without_append_a_longer_table_is_refused_naming_the_option(tmp_path, rng):
    first, whole = cohort(tmp_path, rng)
    out = tmp_path / "s.zarr"
    convert(first, out, progress=False)
    with pytest.raises(StoreError, match=r"\(7 rows there, 11 now: files added or removed\); "
                                         r"remove it or choose another --out, or add --append"):
        convert(whole, out, progress=False)
    assert open_store(out).n_samples == 7


def refused(out, table, match, **kwargs):
    """Convert with append=True, expecting ``match``; the store must be left as it was."""
    before = open_store(out)
    rows, attrs = before.X[:], dict(before.attrs)
    with pytest.raises(StoreError, match=match):
        convert(table, out, append=True, progress=False, **kwargs)
    after = open_store(out)
    np.testing.assert_array_equal(after.X[:], rows)
    assert dict(after.attrs) == attrs


def test_appends_that_would_not_give_the_whole_tables_store_are_refused(tmp_path, rng):
    first, whole = cohort(tmp_path, rng)
    out = tmp_path / "s.zarr"
    convert(first, out, progress=False)
    text = whole.read_text()
    # a row of the store relabelled
    whole.write_text(text.replace("sub1.nii.gz,c1", "sub1.nii.gz,c0"))
    refused(out, whole, r"must list the store's 7 rows first.*\(row 1: label 'c1' there, 'c0'")
    # a new class
    whole.write_text(text.replace("sub5.nii.gz,c0", "sub5.nii.gz,c2"))
    refused(out, whole, r"label 'c2' of .*sub5.nii.gz is not among the store's classes")
    # other arguments
    whole.write_text(text)
    refused(out, whole, r"converted with --nan error; append with the same", nan="zero")
    refused(out, whole, r"same --mask, --resample, --intersect-mask and --block-rows \(--block-rows "
            r"default there, 2 now\)", block_rows=2)
    # a new image zero on part of the mask computed from the store's images
    data = nib.load(tmp_path / "cohort" / "sub5.nii.gz").get_fdata().astype(np.float32)
    data[1, 2, 3] = 0.0
    save(tmp_path / "cohort", "sub5.nii.gz", data)
    refused(out, whole, r"sub5.nii.gz \(volume 0\) is zero or not finite at 1 voxel\(s\) of "
                        r"the store's mask, and 1 other new image\(s\); .*afresh")
    # one of the store's files changed since it was converted
    save(tmp_path / "cohort", "sub5.nii.gz", data + 1)
    save(tmp_path / "cohort", "sub0.nii.gz",
         nib.load(tmp_path / "cohort" / "sub0.nii.gz").get_fdata().astype(np.float32) + 1)
    refused(out, whole, r"sub0.nii.gz changed \(size or modification time\) since the store was "
                        r"converted")


def test_an_append_interrupted_by_a_bad_file_resumes_and_is_never_removed(tmp_path, rng):
    """A new file with a NaN stops the append half-way (given mask: no check before); the old
    table, converted meanwhile, is refused rather than making the store afresh; the fixed file
    and the same command finish the store of the whole table."""
    first, whole = cohort(tmp_path, rng)
    save(tmp_path, "mask.nii.gz", np.ones(SHAPE, np.uint8))
    kwargs = {"mask": tmp_path / "mask.nii.gz", "block_rows": 2, "progress": False}
    out = tmp_path / "s.zarr"
    convert(first, out, **kwargs)
    good = nib.load(tmp_path / "cohort" / "sub6.nii.gz").get_fdata().astype(np.float32)
    bad = good.copy()
    bad[0, 0, 0] = np.nan
    save(tmp_path / "cohort", "sub6.nii.gz", bad)
    with pytest.raises(ValueError, match=r"sub6.nii.gz \(volume 0\): 1 NaN/inf"):
        convert(whole, out, append=True, **kwargs)
    g = zarr.open_group(out, mode="r")
    assert not g.attrs["complete"] and g.attrs["appending"]["n_old"] == 7
    with pytest.raises(StoreError, match="an append to it was interrupted; finish it first"):
        convert(first, out, **kwargs)
    save(tmp_path / "cohort", "sub6.nii.gz", good)
    grown = convert(whole, out, append=True, **kwargs)
    assert_same_store(grown, convert(whole, tmp_path / "fresh.zarr", **kwargs))
    assert grown.attrs["appending"] is None


_DRIVER = """
import os, signal, sys

out, k, count = os.path.abspath(sys.argv[3]), int(sys.argv[4]), [0]


def kill_at_the_kth_write(event, args):  # in whichever thread writes: zarr's I/O thread too
    if event == "open" and isinstance(args[0], str) and args[0].startswith(out) and (
            isinstance(args[1], str) and "w" in args[1] or isinstance(args[2], int)
            and args[2] & (os.O_WRONLY | os.O_RDWR)):
        count[0] += 1
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)


from fgscale.store._convert import convert

convert(sys.argv[1], out, block_rows=4, progress=False)
sys.addaudithook(kill_at_the_kth_write)
convert(sys.argv[2], out, block_rows=4, progress=False, append=True)
"""


@pytest.mark.parametrize("k", [1, 3, 8, 17, 25, 28, 31])
def test_an_append_killed_at_any_write_is_finished_by_the_same_command(tmp_path, rng, k):
    """Killed at its k-th file written (of 33: the grown arrays' 26, the blocks' 4, the
    flags'), the append is finished by the same command into the whole table's store."""
    first, whole = cohort(tmp_path, rng)
    out = tmp_path / "s.zarr"
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    done = subprocess.run([sys.executable, str(driver), str(first), str(whole), str(out), str(k)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]
    grown = convert(whole, out, block_rows=4, progress=False, append=True)
    assert_same_store(grown, convert(whole, tmp_path / "fresh.zarr", block_rows=4,
                                     progress=False))


def test_the_command_appends_and_says_so_then_has_nothing_to_do(tmp_path, rng, capsys):
    from fgscale.cli import main

    first, whole = cohort(tmp_path, rng)
    out = tmp_path / "s.zarr"
    assert main(["convert", str(first), "--out", str(out), "--block-rows", "4",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["convert", str(whole), "--out", str(out), "--block-rows", "4", "--append",
                 "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{out}: 11 rows x 210 voxels, 2 classes and a target") and \
        said.rstrip().endswith("(1 blocks already done, 4 rows appended)"), said
    assert main(["convert", str(whole), "--out", str(out), "--block-rows", "4", "--append",
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == (f"{out}: already complete, nothing to do (11 "
                                               "rows x 210 voxels)")
