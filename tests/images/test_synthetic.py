"""SYNTHETIC cohorts: shapes, exact voxel counts, files on disk equal to the in-memory data."""

import json

import nibabel as nib
import numpy as np
import pytest
from helpers import TINY_GRID, cohort_rows
from scipy import ndimage

from fgscale.images._synthetic import brain_mask, grid_geometry, make_classification_volumes, make_cohort


@pytest.mark.parametrize("grid, shape, p", [("2mm", (91, 109, 91), 270_806),
                                           ("4mm", (46, 55, 46), 33_854),
                                           ("1mm", (182, 218, 182), 1_827_243),
                                           (TINY_GRID, TINY_GRID, 605)])
def test_brain_mask_matches_hcp_grids(grid, shape, p):
    grid_shape, affine, n_voxels = grid_geometry(grid)
    mask = brain_mask(grid_shape, n_voxels)
    assert mask.shape == shape and mask.sum() == p
    assert ndimage.label(mask)[1] == 1  # one connected brain
    for axis in range(3):  # does not touch the field of view
        assert not mask.take(0, axis=axis).any() and not mask.take(-1, axis=axis).any()
    assert affine[0, 0] < 0 and np.linalg.det(affine[:3, :3]) != 0


def test_bad_grid():
    with pytest.raises(ValueError, match="grid must be"):
        grid_geometry("3mm")


def test_files_equal_in_memory_data(tmp_path):
    csv_path = make_cohort(tmp_path, n_samples=9, n_classes=3, grid=TINY_GRID, seed=3)
    X, y, mask, affine = make_classification_volumes(9, 3, grid=TINY_GRID, seed=3)
    rows = cohort_rows(csv_path)
    assert list(rows[0]) == ["path", "label", "group", "split"]
    assert [r["label"] for r in rows] == [f"class_{k}" for k in y]
    for i, r in enumerate(rows):
        img = nib.load(tmp_path / r["path"])
        assert "synthetic" in r["path"]
        assert b"synthetic" in img.header["descrip"].tobytes()
        vol = img.get_fdata(dtype=np.float32)
        np.testing.assert_array_equal(vol[mask], X[i])
        assert (vol[~mask] == 0).all() and (vol[mask] != 0).all()
        np.testing.assert_array_equal(img.affine, affine)
    text = (tmp_path / "cohort.json").read_text()
    meta = json.loads(text)
    assert meta["synthetic"] is True and meta["n_voxels"] == mask.sum()
    assert text.endswith("}\n")  # a text file, as the run folder's JSON: cat ends its line


def test_subjects_split_by_subject(tmp_path):
    csv_path = make_cohort(tmp_path, n_samples=24, n_classes=3, grid=TINY_GRID,
                           n_subjects=4, test_fraction=0.25)
    rows = cohort_rows(csv_path)
    test_groups = {r["group"] for r in rows if r["split"] == "test"}
    train_groups = {r["group"] for r in rows if r["split"] == "train"}
    assert len(test_groups) == 1 and len(train_groups) == 3 and not test_groups & train_groups


def test_in_memory_cohort_returns_the_tables_groups_and_split(tmp_path):
    kwargs = dict(n_samples=24, n_classes=3, grid=TINY_GRID, n_subjects=4, seed=2)
    rows = cohort_rows(make_cohort(tmp_path, **kwargs))
    X, y, mask, affine, groups, split = make_classification_volumes(**kwargs, return_groups=True)
    assert groups.tolist() == [r["group"] for r in rows]
    assert split.tolist() == [r["split"] for r in rows]
    np.testing.assert_array_equal(X, make_classification_volumes(**kwargs)[0])


def test_stratified_split_without_subjects():
    from fgscale.images._synthetic import _design

    y, _, groups, split = _design(40, 4, None, 0.25, np.random.default_rng(0))
    for k in range(4):
        assert (split[y == k] == "test").sum() == 2  # round(0.25 * 10)
    assert (groups == "").all()


def test_four_d_series(tmp_path):
    csv_path = make_cohort(tmp_path, n_samples=12, n_classes=2, grid=TINY_GRID,
                           n_subjects=2, four_d=True, compress=False)
    rows = cohort_rows(csv_path)
    shapes = [nib.load(tmp_path / r["path"]).shape for r in rows]
    assert all(len(s) == 4 and s[:3] == TINY_GRID for s in shapes)
    assert sum(s[3] for s in shapes) == 12
    assert rows[0]["path"].endswith(".nii")


def test_snr_controls_separability():
    def held_out_centroid_accuracy(snr_db):
        X, y, _, _ = make_classification_volumes(80, 4, grid=TINY_GRID, snr_db=snr_db, seed=0)
        train = (np.arange(80) // 4) % 2 == 0
        centroids = np.stack([X[train & (y == k)].mean(0) for k in range(4)])
        pred = np.argmin(((X[~train][:, None] - centroids) ** 2).sum(-1), axis=1)
        return (pred == y[~train]).mean()

    assert held_out_centroid_accuracy(20.0) == 1.0
    assert held_out_centroid_accuracy(-20.0) < 0.6


def test_bad_design():
    with pytest.raises(ValueError, match="n_classes"):
        make_classification_volumes(3, 4, grid=TINY_GRID)
    with pytest.raises(ValueError, match="test_fraction"):
        make_classification_volumes(8, 2, grid=TINY_GRID, test_fraction=1.0)
    # 5 subjects of 4 classes in 12 samples gave 3 subjects, and cohort.json said 5
    with pytest.raises(ValueError, match=r"n_subjects=5 needs n_samples >= n_subjects x "
                                         r"n_classes = 20 \(each subject has a sample of every "
                                         r"class\), got n_samples=12"):
        make_classification_volumes(12, 4, grid=TINY_GRID, n_subjects=5)
    _, _, _, _, groups, _ = make_classification_volumes(20, 4, grid=TINY_GRID, n_subjects=5,
                                                        return_groups=True)
    assert len(set(groups)) == 5


@pytest.mark.parametrize("bad", [dict(snr_db=float("nan")), dict(snr_db=float("-inf")),
                                 dict(n_samples=2), dict(smooth_noise=2.0), dict(n_subjects=3)])
def test_a_refused_cohort_writes_nothing(tmp_path, bad):
    """A NaN SNR would write images of NaN only (and NaN into cohort.json, not JSON); every
    refusal comes before the folder is made."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_cohort(tmp_path / "c", **{"n_samples": 8, "grid": TINY_GRID, **bad})
    assert not (tmp_path / "c").exists()


def test_a_cohort_with_a_target_adds_one_pattern_times_the_target_and_nothing_else(tmp_path):
    """target=True: the same labels, subjects, split and noise; each volume gains t_i times one
    smooth pattern, t_i in the table's target column; and the target is learnable from the
    images (SYNTHETIC, in memory, R² on the held-out subjects)."""
    from sklearn.linear_model import RidgeCV

    from fgscale.images import read_cohort

    kw = dict(n_samples=80, n_classes=2, grid=(12, 12, 12), snr_db=0.0, n_subjects=10, seed=4)
    plain = make_cohort(tmp_path / "plain", **kw)
    with_t = make_cohort(tmp_path / "t", target=True, **kw)
    a, b = cohort_rows(plain), cohort_rows(with_t)
    assert list(b[0]) == ["path", "label", "target", "group", "split"]
    assert [(r["label"], r["group"], r["split"]) for r in a] == [
        (r["label"], r["group"], r["split"]) for r in b]
    t = np.array([e["target"] for e in read_cohort(with_t)])
    assert abs(t.mean()) < 0.4 and 0.7 < t.std() < 1.3
    mask = np.asarray(nib.load(tmp_path / "plain" / a[0]["path"]).dataobj) != 0
    X = {name: np.stack([np.asarray(nib.load(tmp_path / name / r["path"]).dataobj)[mask]
                         for r in rows]) for name, rows in (("plain", a), ("t", b))}
    diff = (X["t"] - X["plain"]).astype(np.float64)
    pattern = diff[np.argmax(np.abs(t))] / t[np.argmax(np.abs(t))]
    np.testing.assert_allclose(diff, np.outer(t, pattern), rtol=1e-5, atol=1e-4)  # float32
    assert json.loads((tmp_path / "t" / "cohort.json").read_text())["target"] is True
    train = np.array([r["split"] == "train" for r in b])
    ridge = RidgeCV(alphas=np.logspace(-2, 4, 13)).fit(X["t"][train], t[train])
    assert ridge.score(X["t"][~train], t[~train]) > 0.5
    with pytest.raises(ValueError, match="four_d groups volumes by class"):
        make_cohort(tmp_path / "4d", target=True, four_d=True, **kw)
    assert not (tmp_path / "4d").exists()
