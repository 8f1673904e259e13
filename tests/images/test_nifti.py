"""NIfTI edges: loading with clear errors, unmask against nilearn, export through the CLI."""

import gzip

import nibabel as nib
import numpy as np
import pytest
import zarr
from helpers import mask_img, save_mask

from fgscale.cli import main
from fgscale.grouping import export_map
from fgscale.grouping._bank import omega_diagonal
from fgscale.images import load_img, load_mask, read_data, read_header, read_image, unmask
from fgscale.images._nifti import read_array


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
    masker = NiftiMasker(mask_img(mask, affine), standardize=None).fit()
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


@pytest.mark.parametrize("name", ["a.nii", "a.nii.gz", "a2.nii.gz", "pair.img"])
@pytest.mark.parametrize("shape", [(5, 6, 4), (5, 6, 4, 3)])
@pytest.mark.parametrize("dtype, slope", [("<f4", None), (">f4", None), ("<i2", 0.5),
                                          ("<f4", 2.0), ("<f8", None)])
def test_read_array_equals_nibabel_whatever_the_file(tmp_path, rng, name, shape, dtype, slope):
    """The header-only fast path (float32, unscaled, one .gz file) and the fallback to
    read_image for everything else give nibabel's float32 values."""
    kind = nib.Nifti2Image if name.startswith("a2") else (
        nib.Nifti1Pair if name.endswith(".img") else nib.Nifti1Image)
    img = kind((100 * rng.standard_normal(shape)).astype(dtype), np.eye(4))
    img.set_data_dtype(dtype)
    if slope is not None:
        img.header.set_slope_inter(slope, 1.0)
    nib.save(img, tmp_path / name)
    data = read_array(tmp_path / name)
    assert data.dtype == np.float32 and data.shape == shape
    np.testing.assert_array_equal(data, np.asarray(nib.load(tmp_path / name).dataobj,
                                                   dtype=np.float32))
    np.testing.assert_array_equal(data, read_image(tmp_path / name)[1])


def test_read_data_truncated_gzip(tmp_path, rng):
    nib.save(nib.Nifti1Image(rng.standard_normal((20, 20, 20)).astype(np.float32), np.eye(4)),
             tmp_path / "ok.nii.gz")
    data = (tmp_path / "ok.nii.gz").read_bytes()
    (tmp_path / "cut.nii.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.nii.gz: cannot read the image data"):
        read_data(tmp_path / "cut.nii.gz")
    assert gzip.decompress(data)  # the original is fine


def test_load_mask(tmp_path, mask):
    save_mask(tmp_path / "m.nii", mask)
    m, affine = load_mask(tmp_path / "m.nii")
    np.testing.assert_array_equal(m, mask)
    save_mask(tmp_path / "e.nii", np.zeros((3, 3, 3), bool))
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


def _write_bank(store, k: int, labels) -> str:
    """A bank of key k<k>... holding ``labels`` (all rows built), written without a cluster."""
    from fgscale.store import bank_key, bank_params, create_bank

    rows = store.train_rows()
    key = bank_key(k, 5, 0, rows)
    group = zarr.open_group(store.path, mode="r+")
    bank = create_bank(group, key, bank_params(k, 5, 0, rows), len(labels), store.n_features)
    for i, row in enumerate(labels):
        bank.write(i, row)
    return key


def test_export_bank(tiny_store, tmp_path, rng, capsys):
    store = tiny_store
    assert main(["export", str(store.path), "--omega", "--out", str(tmp_path / "o.nii")]) == 2
    assert "no bank in the store or its cache yet" in capsys.readouterr().err
    bank = rng.integers(0, 50, size=(3, store.n_features)).astype(np.int32)
    key = _write_bank(store, 50, bank)
    assert main(["export", str(store.path), "--grouping", "1",
                 "--out", str(tmp_path / "g.nii.gz")]) == 0
    exported = np.asarray(nib.load(tmp_path / "g.nii.gz").dataobj)
    np.testing.assert_array_equal(exported[store.mask], bank[1] + 1)  # from 1: 0 is outside
    assert (exported[~store.mask] == 0).all() and (exported[store.mask] >= 1).all()
    assert main(["export", str(store.path), "--omega", "--out", str(tmp_path / "o.nii")]) == 0
    np.testing.assert_allclose(nib.load(tmp_path / "o.nii").get_fdata()[store.mask],
                               omega_diagonal(bank), rtol=1e-6)
    assert main(["export", str(store.path), "--grouping", "3",
                 "--out", str(tmp_path / "x.nii")]) == 2
    assert "out of range" in capsys.readouterr().err

    # a second bank: the one to export must be named
    other = rng.integers(0, 20, size=(2, store.n_features)).astype(np.int32)
    other_key = _write_bank(store, 20, other)
    assert main(["export", str(store.path), "--grouping", "0",
                 "--out", str(tmp_path / "y.nii")]) == 2
    err = capsys.readouterr().err
    assert "2 banks" in err and key in err and other_key in err
    assert main(["export", str(store.path), "--grouping", "0", "--bank", other_key,
                 "--out", str(tmp_path / "y.nii")]) == 0
    np.testing.assert_array_equal(np.asarray(nib.load(tmp_path / "y.nii").dataobj)[store.mask],
                                  other[0] + 1)
    export_map(store, tmp_path / "o2.nii", omega=True, bank=key)
    np.testing.assert_allclose(nib.load(tmp_path / "o2.nii").get_fdata()[store.mask],
                               omega_diagonal(bank), rtol=1e-6)
    assert main(["export", str(store.path), "--omega", "--bank", "k1-r1-s0-00000000",
                 "--out", str(tmp_path / "z.nii")]) == 2
    err = capsys.readouterr().err
    assert "no bank 'k1-r1-s0-00000000'" in err and key in err
    with pytest.raises(ValueError, match="not with values"):
        export_map(store, tmp_path / "v.nii", values=bank[0], bank=key)


def test_export_refuses_an_unbuilt_grouping(tiny_store, tmp_path):
    from fgscale.store import open_bank

    key = _write_bank(tiny_store, 50, np.zeros((2, tiny_store.n_features), np.int32))
    bank = open_bank(tiny_store.path, key, mode="r+")
    bank.done[1] = False
    with pytest.raises(ValueError, match="not built"):
        export_map(tiny_store, tmp_path / "g.nii", grouping=1)
    with pytest.raises(ValueError, match="incomplete"):
        export_map(tiny_store, tmp_path / "o.nii", omega=True)


@pytest.mark.parametrize("load, suffix", [(load_img, ".nii"), (read_header, ".nii"),
                                          (read_header, ".nii.gz")])
def test_an_image_of_no_voxel_is_refused(tmp_path, load, suffix):
    nib.save(nib.Nifti1Image(np.zeros((4, 5, 3, 0), np.float32), np.eye(4)),
             tmp_path / f"empty{suffix}")
    with pytest.raises(ValueError, match=rf"empty{suffix}: image of shape \(4, 5, 3, 0\) "
                                         "holds no voxel"):
        load(tmp_path / f"empty{suffix}")


@pytest.mark.parametrize("name", ["a2.nii", "a2.nii.gz", "an.img", "an.hdr"])
def test_read_header_of_other_formats_logs_no_nibabel_error(tmp_path, rng, caplog, name):
    """The first bytes of a NIfTI-2 file or of an Analyze pair are not checked as a NIfTI-1
    header: nibabel's ERROR lines ("data code 0 not supported") in a conversion that works
    send users looking for a problem that is not there."""
    kind = nib.Nifti2Image if name.startswith("a2") else nib.AnalyzeImage
    nib.save(kind(rng.standard_normal((5, 6, 4)).astype(np.float32), np.eye(4)), tmp_path / name)
    with caplog.at_level("INFO"):
        assert read_header(tmp_path / name).shape == (5, 6, 4)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("nibabel")] == []


@pytest.mark.parametrize("load", [load_img, read_header])
def test_a_header_whose_data_file_is_missing_is_named(tmp_path, rng, load):
    nib.save(nib.Nifti1Pair(rng.standard_normal((5, 6, 4)).astype(np.float32), np.eye(4)),
             tmp_path / "pair.hdr")
    (tmp_path / "pair.img").unlink()  # copied without it
    with pytest.raises(ValueError, match=r"pair.hdr: not a readable NIfTI image \(.*pair.img"):
        load(tmp_path / "pair.hdr")


@pytest.mark.parametrize("name", ["cut.nii", "cut.nii.gz"])
def test_a_truncated_file_is_refused_on_one_line(tmp_path, rng, name):
    nib.save(nib.Nifti1Image(rng.standard_normal((20, 20, 20)).astype(np.float32), np.eye(4)),
             tmp_path / name)
    data = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(data[: len(data) // 2])
    for read in (read_data, read_array):
        with pytest.raises(ValueError, match=f"{name}: cannot read the image data") as info:
            read(tmp_path / name)
        assert "\n" not in str(info.value)


def test_images_at_zero_over_much_of_the_mask_are_named_in_one_warning(tmp_path):
    """A partial field of view (a third of the mask at 0): named with its share of zeros,
    since standardized those voxels sit far from every training image; an image covering the
    mask, or a few zeros, say nothing."""
    import warnings

    from fgscale.images import mask_images

    rng = np.random.default_rng(0)
    mask = np.ones((6, 5, 4), bool)
    full = rng.normal(5.0, 1.0, (6, 5, 4, 3)).astype(np.float32)
    cut = full.copy()
    cut[:2, :, :, 1] = 0  # volume 1: 2 slices of 6 at 0
    cut[0, 0, 0, 2] = 0  # volume 2: one voxel at 0
    nib.save(nib.Nifti1Image(cut, np.eye(4)), tmp_path / "cut.nii.gz")
    nib.save(nib.Nifti1Image(full, np.eye(4)), tmp_path / "full.nii.gz")
    m = save_mask(tmp_path / "m.nii.gz", mask)
    with pytest.warns(UserWarning, match=r"^1 of 3 image\(s\) are 0 at more than 10% of the "
                                         r"mask's 120 voxels \(.*cut\.nii\.gz.*1.*: 33%\): "
                                         r"outside their field of view\?") as caught:
        x = mask_images(tmp_path / "cut.nii.gz", m)
    assert len(caught) == 1 and (x[1] == 0).sum() == 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mask_images(tmp_path / "full.nii.gz", m)
