"""Images at the estimators' edges: NIfTI paths, images and 4D series in ``fit``, ``predict`` and
``score``, masked as nilearn's NiftiMasker masks them, and weights back as one map per class."""

import os
import warnings

import nibabel as nib
import numpy as np
import pytest
from helpers import TINY_GRID, cohort_rows
from sklearn.exceptions import ConvergenceWarning

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
        np.testing.assert_allclose(mask_images(img, clf.mask_img_)[0],
                                   clf.model_.first.weight.detach().numpy()[k], rtol=1e-6)
    if len(maps) == 2:  # coef_: the difference of the two classes' maps, as scikit-learn's
        first, second = (mask_images(img, clf.mask_img_)[0] for img in maps.values())
        np.testing.assert_allclose(clf.coef_[0], second - first, rtol=1e-5, atol=1e-7)


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
    # without a mask the images must share the first one's grid, or be resampled to it
    with pytest.raises(ValueError, match=r"moved\.nii\.gz: grid .* first image's grid \([^)]*\) "
                                          r"with affine .*resample=True"):
        compute_mask([paths[0], str(moved)])
    # the first image alone on another grid: it is the one named, not the good one after it
    with pytest.raises(ValueError, match=r"moved\.nii\.gz: grid .* majority's grid .*\(2 of 3 "
                                          r"images, e\.g\. .*; resample=True"):
        compute_mask([str(moved), paths[0], paths[1]])
    resampled = np.asarray(compute_mask([paths[0], str(moved)], resample=True).dataobj) != 0
    alone = np.asarray(compute_mask([paths[0]]).dataobj) != 0
    assert resampled.sum() < alone.sum()  # the shifted image's edge leaves the mask
    assert not (resampled & ~alone).any()
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
    # a store in predict or score is refused by name, with the two ways that read its rows
    from fgscale.runs._reports import predict_inputs

    for method in (clf.predict, clf.predict_proba, clf.decision_function):
        with pytest.raises(ValueError, match=r"c\.zarr: a folder; predict and score take arrays "
                                             r"or NIfTI images, not a store: .*read_rows"):
            method(str(store.path))
    with pytest.raises(ValueError, match=r"predict_inputs\(estimator, path\)"):
        clf.score(store.path, store.classes[store.y])
    with pytest.raises(ValueError, match=r"x\.mgz: not a NIfTI file \(\.nii, \.nii\.gz"):
        clf.predict(str(tmp_path / "x.mgz"))
    table = predict_inputs(clf, str(store.path))
    np.testing.assert_array_equal(table["prediction"], clf.predict(store.read_rows(rows)))


def test_a_column_of_paths_or_a_pattern_fits_as_the_list_does(cohort, tmp_path):
    """A table's column of paths (an array, a pandas Series) and a shell pattern are images,
    as nilearn's maskers take them."""
    import pandas as pd

    paths, y, _ = cohort
    as_list = FeatureGroupingClassifier(**FAST).fit(paths, y)
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, path in enumerate(paths):  # names that sort in the list's order
        (folder / f"img{i:03d}.nii.gz").symlink_to(path)
    for X in (np.array(paths), np.array(paths, dtype=object), pd.Series(paths),
              str(folder / "img*.nii.gz"), folder / "img*"):
        assert is_images(X)
        clf = FeatureGroupingClassifier(**FAST).fit(X, y)
        np.testing.assert_array_equal(clf.coef_, as_list.coef_)
        np.testing.assert_array_equal(clf.predict(X), as_list.predict(paths))
    with pytest.raises(FileNotFoundError, match=r"nothing\*\.nii\.gz: no file matches this "
                                                r"pattern"):
        FeatureGroupingClassifier(**FAST).fit(str(folder / "nothing*.nii.gz"), y)


def test_a_table_or_a_folder_of_images_given_as_X_says_what_to_give(cohort, tiny_cohort,
                                                                     tmp_path):
    paths, y, _ = cohort
    clf = FeatureGroupingClassifier(**FAST)
    with pytest.raises(ValueError, match=r"cohort\.csv: a file, not a store folder; a cohort "
                                         r"table is converted to a store first"):
        clf.fit(str(tiny_cohort), y)
    with pytest.raises(ValueError, match=r"not a Zarr group .*; it holds NIfTI images: give them "
                                         r"to fit as paths or a pattern such as '.*\*\.nii\.gz'"):
        clf.fit(str(tiny_cohort.parent), y)
    # predict and score: the same inputs are named for what they are, not taken for a store
    fitted = FeatureGroupingClassifier(**FAST).fit(paths, y)
    with pytest.raises(ValueError, match=r"cohort\.csv: a cohort table, not images; give its "
                                         r"path column"):
        fitted.predict(str(tiny_cohort))
    with pytest.raises(ValueError, match=r"a folder of NIfTI images; give them to predict as "
                                         r"paths or a pattern such as '.*\*\.nii\.gz'") as info:
        fitted.score(str(tiny_cohort.parent), y)
    assert "open_store" not in str(info.value)
    four_d = nib.concat_images(paths[:6])
    with pytest.raises(ValueError, match=r"the images hold 6 volumes but y has 1 targets: give "
                                         r"one target per volume \(a 4D image gives one row"):
        clf.fit([four_d], y[:1])


def test_a_whole_table_of_paths_given_as_X_names_the_column_to_give(cohort):
    """A cohort DataFrame given whole, as X (its path column among others), is named as such
    rather than reaching numpy, which fails to read its first path as a float."""
    import pandas as pd

    paths, y, _ = cohort
    table = pd.DataFrame({"subject": [f"s{i}" for i in range(len(y))], "path": paths,
                          "label": y})
    message = (r"X is a table whose column 'path' holds NIfTI paths: give that column, "
               r"X\['path'\], for the images it names")
    with pytest.raises(ValueError, match=message):
        FeatureGroupingClassifier(**FAST).fit(table, table.label)
    fitted = FeatureGroupingClassifier(**FAST).fit(table.path, table.label)
    for method in (fitted.predict, fitted.predict_proba):
        with pytest.raises(ValueError, match=message):
            method(table)
    with pytest.raises(ValueError, match=message):
        fitted.score(table[["path"]], y)


def test_errors_name_the_in_memory_image_by_its_place_in_the_list(cohort):
    paths, y, _ = cohort
    imgs = [nib.load(p) for p in paths[:4]]
    data = np.asarray(imgs[2].dataobj, dtype=np.float32).copy()
    data[data != 0] = np.where(np.arange((data != 0).sum()) == 0, np.nan, 1.0)
    imgs[2] = nib.Nifti1Image(data, imgs[2].affine)
    mask = compute_mask(paths)
    with pytest.raises(ValueError, match=r"<in-memory image 2 of the list>: 1 non-finite value"):
        mask_images(imgs, mask)
    with pytest.raises(ValueError, match=r"^<in-memory image>: 1 non-finite"):
        mask_images(imgs[2], mask)
    empty = nib.Nifti1Image(np.zeros(TINY_GRID, np.uint8), mask.affine)
    with pytest.raises(ValueError, match=r"the mask is empty"):
        mask_images(paths[:2], empty)


@pytest.mark.parametrize("resample", [False, True])
def test_a_mask_array_of_another_shape_than_the_images_is_refused(cohort, resample):
    """A boolean array has no affine of its own: it takes the images', so it must have their
    shape; resampling the images to it would crop them to a corner, not align them."""
    paths, y, _ = cohort
    mask = np.ones(tuple(n - 1 for n in TINY_GRID), bool)
    clf = FeatureGroupingClassifier(mask=mask, resample=resample, **FAST)
    with pytest.raises(ValueError, match=(
            rf"mask is a boolean array of shape \({', '.join(map(str, mask.shape))}\) but "
            rf"{paths[0]} has the grid \({', '.join(map(str, TINY_GRID))}\).*give the mask as "
            r"an image")) as info:
        clf.fit(paths, y)
    assert "resamples the images to the mask's grid" not in str(info.value)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # nilearn 0.14 on standardize=False
def test_a_mask_with_nans_outside_or_one_volume_masks_as_nilearns_masker(cohort):
    """Masks as other tools write them: NaN outside the brain, or a 4D image of one volume
    (which nilearn takes as 3D). The features, mask_img_ (uint8, 0/1, on the mask's affine)
    and the maps are those of the plain 0/1 mask."""
    from nilearn.maskers import NiftiMasker

    paths, y, _ = cohort
    plain = compute_mask(paths)
    data = np.asarray(plain.dataobj).astype(np.float32)
    with_nans = nib.Nifti1Image(np.where(data > 0, 0.7, np.nan).astype(np.float32), plain.affine)
    one_volume = nib.Nifti1Image(data[..., None], plain.affine)
    reference = FeatureGroupingClassifier(mask=plain, **FAST).fit(paths, y)
    expected = NiftiMasker(mask_img=plain).fit().transform(paths)
    for mask in (with_nans, one_volume):
        np.testing.assert_array_equal(NiftiMasker(mask_img=mask).fit().transform(paths),
                                      expected)
        np.testing.assert_array_equal(mask_images(paths, mask), expected)
        clf = FeatureGroupingClassifier(mask=mask, **FAST).fit(paths, y)
        assert clf.mask_img_.shape == TINY_GRID and clf.mask_img_.get_data_dtype() == np.uint8
        np.testing.assert_array_equal(clf.mask_img_.get_fdata(), plain.get_fdata())
        np.testing.assert_array_equal(clf.mask_img_.affine, plain.affine)
        np.testing.assert_array_equal(clf.coef_, reference.coef_)
        for name, img in reference.coef_img_.items():
            np.testing.assert_array_equal(clf.coef_img_[name].get_fdata(), img.get_fdata())
        np.testing.assert_array_equal(clf.predict(paths), reference.predict(paths))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_nilearn_masker_as_mask_is_refused_saying_what_to_give(cohort):
    """nilearn's decoders take a masker as mask=; here it would bring its own smoothing and
    standardization, which fgscale does not apply: refused before any work, naming mask_img_."""
    from nilearn.maskers import NiftiMasker

    paths, y, _ = cohort
    masker = NiftiMasker(mask_img=compute_mask(paths)).fit()
    with pytest.raises(ValueError, match=r"The 'mask' parameter of FeatureGroupingClassifier must "
                                         r"be .*for a nilearn masker.*mask_img_.*Got NiftiMasker"):
        FeatureGroupingClassifier(mask=masker, **FAST).fit(paths, y)
    clf = FeatureGroupingClassifier(mask=masker.mask_img_, **FAST).fit(paths, y)
    np.testing.assert_array_equal(mask_images(paths, clf.mask_img_), masker.transform(paths))


def test_an_empty_list_of_images_is_named_as_such(cohort, tmp_path):
    """sorted(glob(...)) of a wrong folder gives []: fit and predict say that no image came,
    not scikit-learn's 'Expected 2D array, got 1D array'."""
    paths, y, _ = cohort
    clf = FeatureGroupingClassifier(**FAST)
    with pytest.raises(ValueError, match=r"^X is an empty list: no image or row to fit on"):
        clf.fit([], [])
    clf.fit(paths, y)
    for method in (clf.predict, clf.predict_proba, clf.decision_function):
        with pytest.raises(ValueError, match=r"^X is an empty list: no image or row to predict"):
            method([])
    with pytest.raises(ValueError, match=r"^X is an empty tuple"):
        clf.score((), [])


def test_a_mask_given_with_a_store_is_warned_of_unless_it_is_the_stores(tiny_cohort, tmp_path,
                                                                        client):
    """A store's features are its own mask's voxels: another mask= cannot apply, and says so;
    the store's own mask (a user passing the mask the store was converted with) is silent."""
    import warnings

    store = convert(tiny_cohort, tmp_path / "c.zarr", client=client, progress=False)
    other = store.mask.copy()
    other[tuple(np.argwhere(other)[0])] = False
    fast = dict(FAST, max_epochs=2)
    for mask in (other, nib.Nifti1Image(other.astype(np.uint8), store.affine)):
        with pytest.warns(UserWarning, match=rf"mask= is not used with a store: the features are "
                                             rf"the store's {int(store.mask.sum())} voxels"):
            clf = FeatureGroupingClassifier(mask=mask, **fast).fit(str(store.path), client=client)
        assert clf.n_features_in_ == store.mask.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        FeatureGroupingClassifier(mask=store.mask_img(), **fast).fit(str(store.path),
                                                                     client=client)


@pytest.mark.parametrize("scale", [0.5, 256])
def test_a_mask_array_not_of_0_and_1_is_refused_with_images_as_with_arrays(cohort, scale):
    """An array of 0 and 0.5, or of atlas labels (256 wraps to 0 in uint8), was cast to uint8
    with images and then called empty; it is refused as the arrays' path refuses it."""
    paths, y, _ = cohort
    mask = (np.asarray(compute_mask(paths).dataobj) != 0) * scale
    X = mask_images(paths, compute_mask(paths))
    message = (r"^mask must be a boolean array \(or one of 0s and 1s\), got dtype "
               rf"{mask.dtype} with values \[0(\.0)?, {scale}(\.0)?\]")
    for data in (paths, X):
        with pytest.raises(ValueError, match=message):
            FeatureGroupingClassifier(mask=mask, **FAST).fit(data, y)


def test_paths_from_the_home_folder_are_read_as_nilearn_reads_them(cohort, tmp_path,
                                                                   monkeypatch):
    """'~/betas/x.nii.gz' is the user's file, as for a pattern and for nilearn's maskers."""
    import shutil

    paths, y, _ = cohort
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "betas").mkdir()
    for p in paths:
        shutil.copy(p, tmp_path / "betas")
    compute_mask(paths).to_filename(tmp_path / "mask.nii.gz")
    home = [f"~/betas/{os.path.basename(p)}" for p in paths]
    clf = FeatureGroupingClassifier(mask="~/mask.nii.gz", **FAST).fit(home, y)
    reference = FeatureGroupingClassifier(mask=compute_mask(paths), **FAST).fit(paths, y)
    np.testing.assert_array_equal(clf.coef_, reference.coef_)
    np.testing.assert_array_equal(clf.predict(home[0]), reference.predict(paths[0]))
    from fgscale import load_model, save_model

    save_model(clf, tmp_path / "model")  # the mask's path saved as the file it names
    assert load_model(tmp_path / "model").mask == str(tmp_path / "mask.nii.gz")


def test_an_empty_image_that_empties_the_computed_mask_is_named(cohort, tmp_path):
    """One failed contrast (all zeros, or NaN) among many: the error names it, not only 'the
    images share no voxel'."""
    paths, y, _ = cohort
    imgs = [nib.load(p) for p in paths]
    imgs[3] = nib.Nifti1Image(np.full(TINY_GRID, np.nan, np.float32), imgs[3].affine)
    with pytest.raises(ValueError, match=r"<in-memory image 3 of the list>: no voxel is finite "
                                         r"and non-zero \(all zero or NaN\)"):
        FeatureGroupingClassifier(**FAST).fit(imgs, y)
    zero = tmp_path / "zero.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros(TINY_GRID, np.float32), imgs[0].affine), zero)
    with pytest.raises(ValueError, match=r"zero\.nii\.gz: no voxel is finite and non-zero"):
        compute_mask([paths[0], str(zero), paths[1]])


def test_an_item_that_is_no_image_in_a_list_of_images_is_named(cohort, tmp_path):
    """A mistyped suffix or another format among paths was read as an array: numpy's "could not
    convert string to float" named the first file, a good one."""
    paths, y, _ = cohort
    clf = FeatureGroupingClassifier(**FAST).fit(paths, y)
    for X, message in [
            (paths[:3] + [str(tmp_path / "typo.nii.gzz")], r"^X\[3\]: '.*typo\.nii\.gzz' is not "
                                                           r"a NIfTI path \(\.nii, \.nii\.gz"),
            (np.array(paths[:2] + ["scan.mgz"]), r"^X\[2\]: 'scan\.mgz' is not a NIfTI path"),
            (["a.mgz", "b.mgz"], r"^X\[0\]: 'a\.mgz' is not a NIfTI path"),
            (paths[:2] + [np.zeros(3)], r"^X\[2\]: an object of type ndarray among NIfTI images")]:
        with pytest.raises(ValueError, match=message):
            clf.predict(X)
        with pytest.raises(ValueError, match=message):
            FeatureGroupingClassifier(**FAST).fit(X, y[:len(X)])
    np.testing.assert_array_equal(clf.predict(paths[:3]), clf.predict(mask_images(
        paths[:3], clf.mask_img_)))


def test_an_unreadable_image_read_with_a_mask_is_named_by_its_file(cohort, tmp_path):
    """Read from its bytes (the fast path of a .nii.gz file), the image was named
    "<in-memory image>" in the errors of its shape and voxel type."""
    paths, y, _ = cohort
    img = nib.load(paths[0])
    odd = {"complex.nii.gz": (np.asarray(img.dataobj).astype(np.complex64), "voxels of type "
                              r"complex64"),
           "empty.nii.gz": (np.zeros((*TINY_GRID, 0), np.float32), r"image of shape .* holds no "
                                                                   "voxel")}
    clf = FeatureGroupingClassifier(mask=compute_mask(paths), **FAST)
    for name, (data, message) in odd.items():
        nib.save(nib.Nifti1Image(data, img.affine), tmp_path / name)
        with pytest.raises(ValueError, match=rf"^{tmp_path / name}: {message}"):
            clf.fit([*paths[:-1], str(tmp_path / name)], y)


def test_images_with_bids_names_are_split_by_their_subjects_without_groups(tiny_cohort,
                                                                            tmp_path):
    """Maps of several conditions per subject, given without groups=: a split by volume put
    each validation map beside its subject's other maps in training and stopped training too
    early (10 points lost on the real-map benchmark's dev seeds). BIDS names carry the
    subjects, so the split keeps them apart, and says so."""
    import shutil

    from fgscale.images import image_subjects

    rows = cohort_rows(tiny_cohort)
    paths = [str(tiny_cohort.parent / r["path"]) for r in rows]
    y = np.array([r["label"] for r in rows])
    groups = np.array([r["group"] for r in rows])
    named = []
    for i, (path, subject) in enumerate(zip(paths, groups, strict=True)):
        named.append(tmp_path / f"{subject}_run-{i + 1}_stat-effect_statmap.nii.gz")
        shutil.copy(path, named[-1])
    np.testing.assert_array_equal(image_subjects(named), groups)
    with pytest.warns(UserWarning, match=r"^groups=None: the images' BIDS names give 4 subjects "
                                         r"\(sub-000, sub-001, sub-002, \.\.\.\), so the "
                                         r"validation split keeps each subject's volumes"):
        by_names = FeatureGroupingClassifier(**FAST).fit(named, y)
    by_groups = FeatureGroupingClassifier(**FAST).fit(paths, y, groups=groups)
    np.testing.assert_array_equal(by_names.coef_, by_groups.coef_)

    def losses(clf):  # each candidate's loss on the validation rows: the split's signature
        return [row["val_loss"] for row in clf.cv_results_]

    assert losses(by_names) == losses(by_groups)
    by_rows = FeatureGroupingClassifier(**FAST).fit(paths, y)  # names without subjects
    assert not np.allclose(losses(by_rows), losses(by_groups))
    # groups given, or no validation split, leave the names unread and unsaid
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)  # 8 epochs: said, and no matter
        FeatureGroupingClassifier(**FAST).fit(named, y, groups=np.arange(len(y)))
        FeatureGroupingClassifier(**FAST, early_stopping=False).fit(named, y)
    # a 4D file gives each of its volumes its subject; a name that is no BIDS name, none
    series = tmp_path / "sub-01_task-a_bold.nii.gz"
    nib.save(nib.concat_images(paths[:3]), series)
    np.testing.assert_array_equal(image_subjects([series, named[0]]),
                                  ["sub-01"] * 3 + [groups[0]])
    assert image_subjects([series, paths[0]]) is None
    assert image_subjects([nib.load(paths[0]), named[0]]) is None
