"""Screening each grouping's clusters, against scikit-learn's F-tests and nilearn's percentile."""

import warnings

import numpy as np
import pytest
import torch
from helpers import mask_img, smooth_cohort
from sklearn.feature_selection import SelectPercentile, f_classif, f_regression

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.grouping._projection import project
from fgscale.training._screening import (
    BRAIN_VOLUME_MM3,
    adjusted_percentile,
    block_sums,
    f_scores,
    merge_sums,
    screen_bank,
)


def blocks_of(X, y, size):
    return [(X[i : i + size], y[i : i + size]) for i in range(0, len(X), size)]


def sums_of(blocks, bank, k, n_outputs, regression):
    return merge_sums(block_sums(x, y, bank, k, n_outputs, regression) for x, y in blocks)


def random_bank(rng, b, p, k):
    bank = np.stack([rng.permutation(np.arange(p) % k) for _ in range(b)]).astype(np.int32)
    return torch.from_numpy(bank)


@pytest.mark.parametrize("regression", [False, True], ids=["f_classif", "f_regression"])
def test_f_scores_merged_over_blocks_are_scikit_learns(rng, regression):
    X = rng.standard_normal((53, 40)).astype(np.float32)
    y = rng.standard_normal(53) if regression else rng.integers(0, 4, 53)
    X[:, :5] += (y[:, None] > 0.5 if regression else y[:, None] == 1) * 2.0
    bank = random_bank(rng, 3, 40, 9)
    scores = f_scores(sums_of(blocks_of(X, y, 7), bank, 9, 1 if regression else 4, regression),
                      regression)
    test = f_regression if regression else f_classif
    for g in range(3):
        expected = test(project(X.astype(np.float64), bank[g].numpy(), 9), y)[0]
        np.testing.assert_allclose(scores[g], expected, rtol=1e-4)


def test_one_vs_rest_f_scores_are_scikit_learns_for_each_class(rng):
    X = rng.standard_normal((61, 30)).astype(np.float32)
    y = rng.integers(0, 3, 61)  # of 4 classes: the last has no row
    X[:, :6] += (y[:, None] == 2) * 1.5
    bank = random_bank(rng, 2, 30, 8)
    scores = f_scores(sums_of(blocks_of(X, y, 9), bank, 8, 4, False), False, one_vs_rest=True)
    assert scores.shape == (2, 4, 8)
    for g in range(2):
        Z = project(X.astype(np.float64), bank[g].numpy(), 8)
        for c in range(3):
            np.testing.assert_allclose(scores[g, c], f_classif(Z, y == c)[0], rtol=1e-4)
    assert not scores[:, 3].any()
    keep = screen_bank(blocks_of(X, y, 9), bank, 8, 50, n_outputs=4, one_vs_rest=True)
    assert keep.shape == (2, 4, 8) and (keep.sum(-1) == 4).all()
    np.testing.assert_array_equal(keep[:, :3], np.argsort(np.argsort(-scores[:, :3], -1), -1) < 4)


def test_a_class_without_rows_and_a_constant_cluster(rng):
    X = rng.standard_normal((30, 12)).astype(np.float32)
    X[:, 0] = 3.0  # cluster 0 of the bank below is this one voxel
    y = rng.integers(0, 3, 30)  # of 5 classes: two have no row
    bank = torch.from_numpy(np.concatenate([[0], 1 + np.arange(11) % 4]).astype(np.int32))[None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = f_scores(sums_of(blocks_of(X, y, 8), bank, 5, 5, False), False)
    assert scores[0, 0] == 0
    expected = f_classif(project(X.astype(np.float64), bank[0].numpy(), 5), y)[0]
    np.testing.assert_allclose(scores[0, 1:], expected[1:], rtol=1e-4)


@pytest.mark.parametrize("percentile", [5.0, 30.0, 99.0])
def test_screen_bank_keeps_what_select_percentile_keeps(rng, percentile):
    X = rng.standard_normal((60, 50)).astype(np.float32)
    y = rng.integers(0, 3, 60)
    X[:, :10] += (y[:, None] == 2) * 1.5
    bank = random_bank(rng, 4, 50, 20)
    keep = screen_bank(blocks_of(X, y, 16), bank, 20, percentile, n_outputs=3)
    assert keep.shape == (4, 20) and keep.dtype == bool
    for g in range(4):
        Z = project(X.astype(np.float64), bank[g].numpy(), 20)
        support = SelectPercentile(f_classif, percentile=percentile).fit(Z, y).get_support()
        np.testing.assert_array_equal(keep[g], support)
    # at least one cluster, whatever the percentile
    assert (screen_bank(blocks_of(X, y, 16), bank, 20, 0.1, n_outputs=3).sum(1) == 1).all()


@pytest.mark.parametrize("voxel_mm", [1.0, 2.0, 4.0, 12.0, 30.0])
@pytest.mark.parametrize("percentile", [5.0, 20.0, 100.0])
def test_adjusted_percentile_is_nilearns(voxel_mm, percentile):
    from nilearn.decoding._utils import MNI152_BRAIN_VOLUME, adjust_screening_percentile

    assert BRAIN_VOLUME_MM3 == MNI152_BRAIN_VOLUME
    mask = np.zeros((30, 30, 30), bool)
    mask[2:28, 3:27, 1:29] = True
    img = mask_img(mask, np.diag([voxel_mm, -voxel_mm, voxel_mm, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nilearn warns of masks unlike a brain
        expected = adjust_screening_percentile(percentile, img)
    assert adjusted_percentile(percentile, img, int(mask.sum())) == pytest.approx(expected)
    # rows without a mask image: 1 mm3 a feature
    assert adjusted_percentile(percentile, None, 10**6) == pytest.approx(
        min(100.0, percentile * BRAIN_VOLUME_MM3 / 10**6))


def screened_fit(estimator, X, y, mask, share=51.5):
    """Fit with one grouping and no validation split, on voxels so large that the mask weighs
    ``100 * 20 / share`` percent of a brain: screening at 20% keeps ``share`` percent."""
    side = (BRAIN_VOLUME_MM3 * 20 / share / mask.sum()) ** (1 / 3)
    estimator.set_params(mask=mask_img(mask, np.diag([side, side, side, 1.0])), n_groupings=1,
                         n_clusters=30, early_stopping=False, max_epochs=5, random_state=0)
    return estimator.fit(X, y)


@pytest.mark.parametrize("make", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_weights_live_on_the_kept_clusters_only(make):
    X, y, mask, _ = smooth_cohort()
    if make is FeatureGroupingRegressor:
        y = X[:, :20].mean(1) + 0.1 * np.random.default_rng(1).standard_normal(len(X))
    est = screened_fit(make(), X, y, mask)
    assert est.screening_percentile_ == pytest.approx(51.5)  # 15.45 of the 30 clusters
    Z = project(((X - est.mean_) * est.scale_).astype(np.float64), est.bank_[0], 30)
    # the regressor tests the target; the (logistic) classifier each class against the others
    targets = [y] if make is FeatureGroupingRegressor else [y == c for c in est.classes_]
    test = f_regression if make is FeatureGroupingRegressor else f_classif
    for weights, target in zip(np.atleast_2d(est.coef_), targets, strict=True):
        select = SelectPercentile(test, percentile=est.screening_percentile_)
        support = select.fit(Z, target).get_support()
        assert support.sum() == 15
        # the weights start at zero and only kept clusters' get a gradient (no weight decay)
        trained = np.array([np.any(weights[est.bank_[0] == q] != 0) for q in range(30)])
        np.testing.assert_array_equal(trained, support)
    unscreened = screened_fit(make(screening_percentile=100), X, y, mask)
    assert unscreened.screening_percentile_ == 100
    assert np.all(np.atleast_2d(unscreened.coef_) != 0)


def test_screening_needs_feature_grouping():
    X, y, mask, _ = smooth_cohort()
    with pytest.warns(UserWarning, match=r"screening_percentile=10 have no effect"):
        est = screened_fit(FeatureGroupingClassifier(regularizer="l2", alpha=0.01,
                                                     screening_percentile=10), X, y, mask)
    assert est.screening_percentile_ == 100
