"""NIfTI edges: loading with clear errors, unmask against nilearn, export through the CLI."""

import gzip

import nibabel as nib
import numpy as np
import pytest
import zarr

from fgscale.cli import main
from fgscale.grouping import export_map
from fgscale.grouping._bank import omega_diagonal
from fgscale.images import load_img, load_mask, read_data, read_header, unmask


@pytest.fixture
def mask():
    m = np.zeros((5, 6, 4), bool)
    m[1:4, 2:5, 1:3] = True
    m[2, 1, 1] = True
    return m


def test_unmask_vector_and_matrix(mask, rng):
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    v = rng.standard_normal(mask.sum())
    img = unmask(v, mask, affine)
    assert img.shape == mask.shape and img.get_data_dtype() == np.float32
    np.testing.assert_allclose(img.get_fdata()[mask], v, rtol=1e-6)
    assert (img.get_fdata()[~mask] == 0).all()
    M = rng.integers(0, 9, size=(3, mask.sum()))
    img4 = unmask(M, mask, affine)
    assert img4.shape == (*mask.shape, 3) and img4.get_data_dtype() == np.int32
    np.testing.assert_array_equal(np.asarray(img4.dataobj)[mask].T, M)
    with pytest.raises(ValueError, match="to match the mask"):
        unmask(v[:-1], mask, affine)


def test_unmask_inverts_nilearn_masker(mask, rng, tmp_path):
    from nilearn.maskers import NiftiMasker

    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    M = rng.standard_normal((2, mask.sum())).astype(np.float32)
    nib.save(unmask(M, mask, affine), tmp_path / "m.nii.gz")
    masker = NiftiMasker(nib.Nifti1Image(mask.astype(np.uint8), affine), standardize=None).fit()
    np.testing.assert_array_equal(masker.transform(str(tmp_path / "m.nii.gz")), M)


@pytest.mark.parametrize("load, suffix", [(load_img, ".nii"), (read_header, ".nii"),
                                          (read_header, ".nii.gz")])
def test_load_img_and_read_header_errors(tmp_path, load, suffix):
    with pytest.raises(FileNotFoundError, match=f"nope{suffix}: no such NIfTI file"):
        load(tmp_path / f"nope{suffix}")
    (tmp_path / f"junk{suffix}").write_bytes(b"this is not a nifti file" * 20)
    with pytest.raises(ValueError, match=f"junk{suffix}: not a readable NIfTI image"):
        load(tmp_path / f"junk{suffix}")
    nib.save(nib.Nifti1Image(np.ones((4, 4), np.float32), np.eye(4)), tmp_path / f"flat{suffix}")
    with pytest.raises(ValueError, match=f"flat{suffix}: expected a 3D or 4D image"):
        load(tmp_path / f"flat{suffix}")


def test_load_img_refuses_other_objects():
    with pytest.raises(ValueError, match="expected a NIfTI path"):
        load_img(np.zeros((3, 3, 3)))


@pytest.mark.parametrize("name", ["a.nii", "a.nii.gz", "a2.nii.gz", "pair.img"])
@pytest.mark.parametrize("shape", [(5, 6, 4), (5, 6, 4, 3)])
def test_read_header_equals_nibabel(tmp_path, rng, name, shape):
    affine = np.array([[-2.0, 0.1, 0, 90], [0, 2, 0.2, -126], [0, 0, 2, -72], [0, 0, 0, 1]])
    kind = nib.Nifti2Image if name.startswith("a2") else (
        nib.Nifti1Pair if name.endswith(".img") else nib.Nifti1Image)
    nib.save(kind(rng.standard_normal(shape).astype(np.float32), affine), tmp_path / name)
    header, img = read_header(tmp_path / name), nib.load(tmp_path / name)
    assert header.shape == img.shape and header.ndim == len(shape)
    np.testing.assert_array_equal(header.affine, img.affine)


def test_read_data_truncated_gzip(tmp_path, rng):
    nib.save(nib.Nifti1Image(rng.standard_normal((20, 20, 20)).astype(np.float32), np.eye(4)),
             tmp_path / "ok.nii.gz")
    data = (tmp_path / "ok.nii.gz").read_bytes()
    (tmp_path / "cut.nii.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.nii.gz: cannot read the image data"):
        read_data(tmp_path / "cut.nii.gz")
    assert gzip.decompress(data)  # the original is fine


def test_load_mask(tmp_path, mask):
    nib.save(nib.Nifti1Image(mask.astype(np.uint8), np.eye(4)), tmp_path / "m.nii")
    m, affine = load_mask(tmp_path / "m.nii")
    np.testing.assert_array_equal(m, mask)
    nib.save(nib.Nifti1Image(np.zeros((3, 3, 3), np.uint8), np.eye(4)), tmp_path / "e.nii")
    with pytest.raises(ValueError, match="e.nii: the mask is empty"):
        load_mask(tmp_path / "e.nii")


def test_export_round_trip(tiny_store, tmp_path, rng):
    store = tiny_store
    w = rng.standard_normal((4, store.n_features)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    assert main(["export", str(store.path), "--npy", str(tmp_path / "w.npy"),
                 "--out", str(tmp_path / "w.nii.gz")]) == 0
    img = nib.load(tmp_path / "w.nii.gz")
    np.testing.assert_array_equal(img.affine, store.affine)
    np.testing.assert_array_equal(img.get_fdata(dtype=np.float32)[store.mask], w.T)
    # vector, straight from the API
    export_map(store, tmp_path / "v.nii", values=w[0])
    np.testing.assert_array_equal(nib.load(tmp_path / "v.nii").get_fdata()[store.mask], w[0])


def test_export_bank(tiny_store, tmp_path, rng, capsys):
    store = tiny_store
    assert main(["export", str(store.path), "--omega", "--out", str(tmp_path / "o.nii")]) == 2
    assert "no bank in the store yet" in capsys.readouterr().err
    bank = rng.integers(0, 50, size=(3, store.n_features)).astype(np.int32)
    zarr.open_group(store.path, mode="r+").create_array("bank", data=bank)
    assert main(["export", str(store.path), "--grouping", "1",
                 "--out", str(tmp_path / "g.nii.gz")]) == 0
    np.testing.assert_array_equal(np.asarray(nib.load(tmp_path / "g.nii.gz").dataobj)[store.mask],
                                  bank[1])
    assert main(["export", str(store.path), "--omega", "--out", str(tmp_path / "o.nii")]) == 0
    np.testing.assert_allclose(nib.load(tmp_path / "o.nii").get_fdata()[store.mask],
                               omega_diagonal(bank), rtol=1e-6)
    assert main(["export", str(store.path), "--grouping", "3",
                 "--out", str(tmp_path / "x.nii")]) == 2
    assert "out of range" in capsys.readouterr().err
