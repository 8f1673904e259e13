"""read_volumes reads some volumes of a 4D file, with the numbers of the whole file's read, and
conversion of 4D runs whose blocks hold a few volumes each."""

import gzip
import zlib

import nibabel as nib
import numpy as np
import pytest

from fgscale.images._nifti import read_array
from fgscale.images._volumes import read_volumes
from fgscale.store._convert import convert

SHAPE = (7, 8, 9, 13)
RANGES = [(0, 1), (3, 7), (7, 12), (12, 13), (0, 12), (1, 13), (5, 6), (2, 3)]  # some resumed


def save_4d(path, rng, dtype, slope=None, inter=None, shape=SHAPE):
    if np.dtype(dtype).kind == "f":
        data = (rng.standard_normal(shape) * 50).astype(dtype)
    else:
        data = rng.integers(0, 200, shape).astype(dtype)
    img = nib.Nifti1Image(data, np.diag([2.0, 2.0, 2.0, 1.0]))
    img.header.set_data_dtype(dtype)
    if slope is not None:
        img.header.set_slope_inter(slope, inter)
    img.header.extensions.append(nib.nifti1.Nifti1Extension("comment", b"an extension" * 3))
    nib.save(img, path)
    return path


@pytest.mark.parametrize("ext", [".nii", ".nii.gz"])
@pytest.mark.parametrize("dtype, slope, inter", [
    (np.float32, None, None), (np.int16, 0.37, 5.0), (np.uint8, 2.0, -1.0),
    (np.float64, None, None), (np.int32, 1e-3, 0.0), (np.float32, 2.5, 1.0)],
    ids=["float32", "int16-scaled", "uint8-scaled", "float64", "int32-scaled", "float32-scaled"])
def test_some_volumes_are_the_whole_reads_volumes(tmp_path, rng, ext, dtype, slope, inter):
    path = save_4d(tmp_path / f"run{ext}", rng, dtype, slope, inter)
    whole = read_array(path)
    for start, stop in RANGES:
        got = read_volumes(path, start, stop, SHAPE[3])
        assert got.dtype == np.float32 and got.shape == (*SHAPE[:3], stop - start)
        np.testing.assert_array_equal(got, whole[..., start:stop], err_msg=f"{start}:{stop}")
    img, got = read_volumes(path, 3, 5, SHAPE[3], image=True)
    np.testing.assert_array_equal(img.affine, np.diag([2.0, 2.0, 2.0, 1.0]))
    np.testing.assert_array_equal(got, whole[..., 3:5])


def test_a_truncated_run_gives_the_volumes_before_the_cut_and_names_the_file_after(tmp_path,
                                                                                   rng):
    """Only the bytes of the volumes asked for are inflated: those of a run cut short (a copy
    that failed) are read up to the cut, where reading the whole run fails."""
    path = save_4d(tmp_path / "run.nii.gz", rng, np.float32)
    whole = read_array(path)
    raw = path.read_bytes()
    cut = tmp_path / "cut.nii.gz"
    payload = zlib.decompressobj(wbits=31).decompress(raw)
    cut.write_bytes(gzip.compress(payload[:len(payload) * 2 // 3])[:-8])  # no gzip trailer
    with pytest.raises(ValueError, match=r"cut\.nii\.gz: cannot read the image data"):
        read_array(cut)
    np.testing.assert_array_equal(read_volumes(cut, 2, 5, SHAPE[3]), whole[..., 2:5])
    with pytest.raises(ValueError, match=r"cut\.nii\.gz: cannot read the image data, the file is "
                                         r"truncated or corrupt \(.* needed up to volume 12\)"):
        read_volumes(cut, 10, 13, SHAPE[3])


def test_a_run_of_several_gzip_members_is_read_by_nibabel(tmp_path, rng):
    path = save_4d(tmp_path / "run.nii.gz", rng, np.int16, 0.5, 1.0)
    payload = zlib.decompressobj(wbits=31).decompress(path.read_bytes())
    members = tmp_path / "members.nii.gz"
    members.write_bytes(gzip.compress(payload[:5000]) + gzip.compress(payload[5000:]))
    whole = read_array(path)
    for start, stop in [(0, 2), (4, 9), (12, 13)]:
        np.testing.assert_array_equal(read_volumes(members, start, stop, SHAPE[3]),
                                      whole[..., start:stop])


@pytest.mark.parametrize("ext", [".nii", ".nii.gz"])
@pytest.mark.parametrize("resample", [None, 3.0], ids=["same-grid", "resampled"])
def test_runs_converted_a_few_volumes_a_block(tmp_path, rng, ext, resample):
    """Blocks of 3 rows over runs of 7 volumes: each block reads its volumes of one or two
    runs; the store holds what nibabel reads of every volume (resampled as the whole run)."""
    folder = tmp_path / "cohort"
    folder.mkdir()
    paths = [save_4d(folder / f"sub{i}{ext}", rng, np.int16, 0.25, 3.0, shape=(6, 7, 5, 7))
             for i in range(3)]
    table = folder / "cohort.csv"
    table.write_text("path,label\n" + "".join(f"{p.name},c{i % 2}\n" for i, p in enumerate(paths)))
    store = convert(table, tmp_path / "s.zarr", block_rows=3, resample=resample, progress=False)
    assert store.n_samples == 21 and list(store.volume) == list(range(7)) * 3
    if resample is None:
        expected = np.concatenate([nib.load(p).get_fdata(dtype=np.float32)[store.mask].T
                                   for p in paths])
    else:  # one block of 21 rows: each run read whole
        expected = convert(table, tmp_path / "whole.zarr", block_rows=21, resample=resample,
                           progress=False).X[:]
    np.testing.assert_array_equal(store.X[:], expected)
