"""Images at the estimators' edges: NIfTI paths, images and 4D series in ``fit``, ``predict`` and
``score``, masked as nilearn's NiftiMasker masks them, and weights back as one map per class."""

import nibabel as nib
import numpy as np
import pytest
from helpers import TINY_GRID, cohort_rows

from fgscale import FeatureGroupingClassifier
from fgscale.images import compute_mask, is_images, mask_images
from fgscale.store import open_store
from fgscale.store._convert import convert

FAST = dict(n_groupings=4, n_bootstrap=8, max_epochs=8, random_state=0)


@pytest.fixture(scope="module")
def cohort(tiny_cohort):
    rows = cohort_rows(tiny_cohort)
    paths = [str(tiny_cohort.parent / r["path"]) for r in rows]
    return paths, np.array([r["label"] for r in rows]), np.array([r["split"] for r in rows])


@pytest.mark.filterwarnings("ignore::FutureWarning")  # nilearn 0.14 on standardize=False
def test_masking_equals_nilearns_masker(cohort):
    from nilearn.maskers import NiftiMasker

    paths, _, _ = cohort
    mask = compute_mask(paths)
    expected = NiftiMasker(mask_img=mask).fit().transform(paths)
    X = mask_images(paths, mask)
    assert X.dtype == np.float32 and X.shape == expected.shape
    np.testing.assert_allclose(X, expected, rtol=1e-6)
    # a 4D series gives one row per volume, in order; a mask path reads as the image
    series = nib.concat_images(paths[:5])
    np.testing.assert_array_equal(mask_images(series, mask), X[:5])
    np.testing.assert_array_equal(mask_images([series, paths[5]], mask), X[:6])


def test_is_images_tells_images_from_arrays_and_stores(cohort, tmp_path):
    paths, _, _ = cohort
    assert is_images(paths) and is_images(paths[0]) and is_images(nib.load(paths[0]))
    assert not is_images(np.zeros((3, 4))) and not is_images(str(tmp_path / "x.zarr"))
    assert not is_images([]) and not is_images([paths[0], np.zeros(3)])


def test_fit_and_predict_on_images_equal_the_same_on_masked_arrays(cohort):
    paths, y, split = cohort
    train, test = split == "train", split == "test"
    train_paths = [p for p, t in zip(paths, train, strict=True) if t]
    test_paths = [p for p, t in zip(paths, test, strict=True) if t]
    on_images = FeatureGroupingClassifier(**FAST).fit(train_paths, y[train])
    mask = np.asarray(on_images.mask_img_.dataobj) != 0
    np.testing.assert_array_equal(mask, np.asarray(compute_mask(train_paths).dataobj) != 0)
    X = mask_images(paths, on_images.mask_img_)
    on_arrays = FeatureGroupingClassifier(mask=mask, **FAST).fit(X[train], y[train])
    np.testing.assert_allclose(on_images.coef_, on_arrays.coef_, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(on_images.predict_proba(test_paths),
                               on_arrays.predict_proba(X[test]), rtol=1e-5, atol=1e-7)
    series = nib.concat_images(test_paths)
    np.testing.assert_array_equal(on_images.predict(series), on_arrays.predict(X[test]))
    assert on_images.score(test_paths, y[test]) == on_arrays.score(X[test], y[test])


def test_coef_img_holds_one_map_per_class_that_masks_back_to_coef(cohort):
    paths, y, _ = cohort
    clf = FeatureGroupingClassifier(**FAST).fit(paths, y)
    maps = clf.coef_img_
    assert list(maps) == list(clf.classes_)
    for k, img in enumerate(maps.values()):
        assert img.shape == TINY_GRID
        np.testing.assert_array_equal(img.affine, nib.load(paths[0]).affine)
        np.testing.assert_allclose(mask_images(img, clf.mask_img_)[0], clf.coef_[k], rtol=1e-6)


def test_images_on_another_grid_are_refused_naming_the_file(cohort, tmp_path):
    paths, y, _ = cohort
    clf = FeatureGroupingClassifier(**FAST).fit(paths, y)
    img = nib.load(paths[0])
    moved = tmp_path / "moved.nii.gz"
    affine = img.affine.copy()
    affine[0, 3] += 4.0
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), moved)
    with pytest.raises(ValueError, match=r"moved\.nii\.gz: grid .* does not match the mask.*"
                                          r"resample=True"):
        clf.predict([paths[1], str(moved)])
    # without a mask there is nothing to resample to: the images must share the first one's grid
    with pytest.raises(ValueError, match=r"moved\.nii\.gz: grid .* first image's grid \([^)]*\) "
                                          r"with affine [^(]*$"):
        compute_mask([paths[0], str(moved)])
    # resample=True: the image is resampled to the mask's grid, as nilearn's resample_to_img
    from nilearn.image import resample_to_img

    clf.set_params(resample=True)
    on_grid = resample_to_img(str(moved), clf.mask_img_, interpolation="linear",
                              force_resample=True, copy_header=True)
    np.testing.assert_allclose(clf.predict_proba([str(moved)]), clf.predict_proba([on_grid]),
                               rtol=1e-4, atol=1e-5)


def test_images_need_a_mask_image_after_a_fit_on_arrays(cohort):
    paths, y, _ = cohort
    X = mask_images(paths, compute_mask(paths))
    clf = FeatureGroupingClassifier(**FAST).fit(X, y)
    assert clf.mask_img_ is None
    with pytest.raises(ValueError, match="fitted on arrays without a mask image"):
        clf.predict(paths)
    with pytest.raises(AttributeError, match="coef_img_ needs"):
        clf.coef_img_  # noqa: B018


def test_a_run_on_a_store_predicts_the_cohorts_images(tiny_cohort, tmp_path, client):
    store = convert(tiny_cohort, tmp_path / "c.zarr", client=client, progress=False)
    clf = FeatureGroupingClassifier(**FAST).fit(str(store.path), client=client)
    np.testing.assert_array_equal(np.asarray(clf.mask_img_.dataobj) != 0, store.mask)
    paths = [str(tiny_cohort.parent / r["path"]) for r in cohort_rows(tiny_cohort)]
    store = open_store(store.path)
    rows = np.arange(store.n_samples)
    np.testing.assert_allclose(clf.predict_proba(paths), clf.predict_proba(store.read_rows(rows)),
                               rtol=1e-6)
