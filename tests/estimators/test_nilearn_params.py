"""cv=, scoring=, smoothing_fwhm= and nilearn's parameter values: what a nilearn decoder's user
passes, against scikit-learn's splitters and scorers and nilearn's masker."""

import numpy as np
import pytest
import torch
from helpers import mask_img, smooth_cohort
from sklearn.metrics import accuracy_score, roc_auc_score

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.estimators._persist import load_model, save_model
from fgscale.estimators._scoring import fold_score
from fgscale.estimators._selection import fold_splits
from fgscale.store import write_store

SMALL = dict(n_groupings=4, n_bootstrap=10, max_epochs=30, patience=5, random_state=0)


class Folds:
    """A splitter of fixed folds (positions among the rows fitted on), as a user may write."""

    def __init__(self, folds):
        self.folds = folds

    def get_n_splits(self, X=None, y=None, groups=None):
        return len(self.folds)

    def split(self, X, y=None, groups=None):
        yield from self.folds


@pytest.fixture(scope="module")
def problem():
    X, y, mask, _ = smooth_cohort()
    groups = np.arange(len(y)) // 4  # 4 rows a subject
    return X, y, mask, groups


def test_int_cv_folds_keep_subjects_apart_or_stratify(problem):
    X, labels, mask, groups = problem
    y = np.unique(labels, return_inverse=True)[1]  # class indices, as the fit passes them
    rows = np.arange(len(y))
    clf = FeatureGroupingClassifier(cv=4)
    grouped = fold_splits(clf, y, rows, 0, groups, validation=True, n_candidates=1)
    assert len(grouped) == 4
    assert np.array_equal(np.sort(np.concatenate([v for _, v in grouped])), rows)
    for fit_rows, val_rows in grouped:
        assert not set(groups[fit_rows]) & set(groups[val_rows])
    stratified = fold_splits(clf, y, rows, 0, None, validation=True, n_candidates=1)
    share = np.bincount(y) / len(y)
    for _, val_rows in stratified:
        np.testing.assert_allclose(np.bincount(y[val_rows], minlength=len(share)) / len(val_rows),
                                   share, atol=1.5 / len(val_rows))


def test_auto_cv_is_three_folds_where_the_rows_are_few_and_one_split_elsewhere(problem):
    """cv="auto" gives the splits of cv=3 below 250 training rows, for the linear model with a
    refit, the default validation_fraction and every class in three rows (with groups, three
    subjects); else those of cv=None."""
    from fgscale.estimators._selection import AUTO_FOLDS_BELOW

    X, labels, mask, groups = problem
    y = np.unique(labels, return_inverse=True)[1]

    def splits(params, rows, groups=None, estimator=FeatureGroupingClassifier):
        return fold_splits(estimator(**params), y, rows, 0, groups, validation=True,
                           n_candidates=1)

    def same(a, b):
        return len(a) == len(b) and all(np.array_equal(p, q) for s, t in zip(a, b, strict=True)
                                        for p, q in zip(s, t, strict=True))

    few = np.arange(len(y))
    assert len(few) < AUTO_FOLDS_BELOW
    many = np.resize(few, AUTO_FOLDS_BELOW)  # rows may repeat: the splits only count them
    assert same(splits({}, few), splits(dict(cv=3), few))
    assert len(splits({}, few)) == 3
    assert same(splits({}, few, groups), splits(dict(cv=3), few, groups))
    assert same(splits({}, few, estimator=FeatureGroupingRegressor),
                splits(dict(cv=3), few, estimator=FeatureGroupingRegressor))
    with pytest.warns(UserWarning, match="cannot hold every class on both sides"):
        lone = splits({}, few[(y == 0) | (np.arange(len(y)) < 2)])  # a class of one row
    for one in [splits({}, many), splits(dict(refit=False), few), lone,
                splits(dict(model="mlp"), few), splits(dict(validation_fraction=0.3), few),
                splits({}, few, groups % 2)]:  # two subjects: no three folds by subject
        assert len(one) == 1
    assert same(splits({}, many), splits(dict(cv=None), many))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_folds_score_is_its_models_score_on_its_validation_rows(problem, task):
    """The fold score (taken from validation's record at the kept epoch) is the fold model's
    accuracy or R² on the fold's validation rows, as scikit-learn computes it."""
    from sklearn.metrics import r2_score

    X, y, mask, _ = problem
    val = np.arange(len(y)) % 4 == 0
    one_fold = Folds([(np.flatnonzero(~val), np.flatnonzero(val))])
    if task == "classification":
        est, target, metric = FeatureGroupingClassifier, y, accuracy_score
    else:  # a target that follows the rows
        est, target, metric = FeatureGroupingRegressor, X[:, :50].mean(axis=1), r2_score
    # refit=False: the model is the fold's (the average of one)
    model = est(mask=mask, cv=one_fold, refit=False, n_clusters=0.1, **SMALL).fit(X, target)
    (row,) = model.cv_results_
    assert row["val_score"] == pytest.approx(metric(target[val], model.predict(X[val])),
                                             rel=1e-5, abs=1e-6)


def test_cv_chooses_on_the_mean_over_folds_and_refits_for_their_mean_epochs(problem):
    X, y, mask, groups = problem
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=[0.05, 0.2], cv=3, **SMALL)
    clf.fit(X, y, groups=groups)
    assert len(clf.cv_results_) == 2
    for row in clf.cv_results_:
        assert len(row["fold_val_loss"]) == 3
        assert row["val_loss"] == pytest.approx(np.mean(row["fold_val_loss"]))
        assert row["val_score"] == pytest.approx(np.mean(row["fold_val_score"]))
    chosen = min(clf.cv_results_, key=lambda r: r["val_loss"])
    assert clf.n_clusters_ == chosen["n_clusters"]
    assert clf.n_iter_ == round(np.mean(chosen["fold_epochs"]))
    refit = [h for h in clf.history_ if h.get("phase") == "refit"]
    assert len(refit) == clf.n_iter_
    # nilearn's attributes: per class, the chosen candidate's fold scores and parameters
    assert sorted(clf.cv_scores_) == sorted(clf.classes_.tolist())
    assert clf.cv_scores_[clf.classes_[0]] == chosen["fold_val_score"]
    assert clf.cv_params_[clf.classes_[0]]["n_clusters"] == [clf.n_clusters_] * 3
    assert clf.cv_params_[clf.classes_[0]]["n_epochs"] == chosen["fold_epochs"]


def test_refit_false_averages_the_fold_models_weights(problem):
    """The model of two folds is the mean of the models of each fold alone (one candidate:
    each fold trains as it would alone, from the same seed and bank)."""
    X, y, mask, _ = problem
    rows = np.arange(len(y))
    halves = [(rows[rows % 2 == 0], rows[rows % 2 == 1]), (rows[rows % 2 == 1], rows[rows % 2 == 0])]
    params = dict(mask=mask, n_clusters=0.1, refit=False, **SMALL)
    alone = [FeatureGroupingClassifier(cv=Folds([fold]), **params).fit(X, y) for fold in halves]
    both = FeatureGroupingClassifier(cv=Folds(halves), **params).fit(X, y)
    for name, value in both.model_.state_dict().items():
        expected = (alone[0].model_.state_dict()[name] + alone[1].model_.state_dict()[name]) / 2
        torch.testing.assert_close(value, expected, msg=name)
    np.testing.assert_allclose(both.coef_, (alone[0].coef_ + alone[1].coef_) / 2, rtol=1e-5,
                               atol=1e-6)


def test_scoring_chooses_the_candidate_of_best_mean_score(problem):
    X, y, mask, groups = problem
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=[0.05, 0.1, 0.2], cv=3,
                                    scoring="balanced_accuracy", **SMALL).fit(X, y, groups=groups)
    best = max(clf.cv_results_, key=lambda r: r["val_score"])
    assert clf.n_clusters_ == best["n_clusters"]


def test_fold_scores_are_scikit_learns():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((40, 2))
    y = rng.integers(0, 2, 40)
    clf = FeatureGroupingClassifier(scoring="roc_auc")
    assert fold_score(clf, logits, y) == pytest.approx(roc_auc_score(y, logits[:, 1] - logits[:, 0]))
    assert fold_score(FeatureGroupingClassifier(), logits, y) == pytest.approx(
        accuracy_score(y, logits.argmax(1)))
    reg = FeatureGroupingRegressor(scoring="neg_mean_absolute_error")
    reg.y_mean_, reg.y_scale_ = 10.0, 2.0  # predictions and targets back in the target's units
    out, target = rng.standard_normal((30, 1)), rng.standard_normal(30)
    assert fold_score(reg, out, target) == pytest.approx(-np.mean(np.abs(2 * out[:, 0] - 2 * target)))


@pytest.mark.parametrize("params, match", [
    (dict(cv=1), "one fold leaves nothing to validate on"),
    (dict(scoring="acuracy"), "did you mean 'accuracy'"),
    (dict(cv=3, early_stopping=False), "early_stopping=False turns off"),
    (dict(cv=3, refit=False, model="mlp"), "defined for model='logreg' only"),
    (dict(standardize="psc"), "give 'zscore_sample'"),
])
def test_what_cv_and_nilearns_values_cannot_do_is_refused_before_any_work(problem, params, match):
    X, y, mask, _ = problem
    with pytest.raises(ValueError, match=match):
        FeatureGroupingClassifier(mask=mask, **params).fit(X, y)


def test_nilearns_parameter_names_say_what_to_give_here():
    with pytest.raises(TypeError, match=r"clustering_percentile=10 is n_clusters=0\.1"):
        FeatureGroupingClassifier(clustering_percentile=10)


def test_nilearns_standardize_values_standardize(problem):
    X, y, mask, _ = problem
    fits = [FeatureGroupingClassifier(mask=mask, standardize=value, **SMALL).fit(X, y)
            for value in (True, "zscore_sample", None)]
    np.testing.assert_array_equal(fits[1].coef_, fits[0].coef_)
    assert fits[2].scale_ is None


def test_smoothing_fwhm_gives_nilearns_masker_rows_and_predicts_alike(tmp_path):
    import nibabel as nib
    from nilearn.maskers import NiftiMasker

    rng = np.random.default_rng(0)
    affine = np.diag([2.0, 3.0, 2.5, 1.0])
    imgs = [nib.Nifti1Image(rng.standard_normal((8, 9, 7)).astype(np.float32) + 5, affine)
            for _ in range(24)]
    mask = nib.Nifti1Image(np.ones((8, 9, 7), np.uint8), affine)
    y = np.arange(24) % 2
    reference = NiftiMasker(mask, smoothing_fwhm=6, standardize=None).fit().transform(imgs)
    smoothed = FeatureGroupingClassifier(mask=mask, smoothing_fwhm=6.0, regularizer="l2",
                                         alpha=1.0, max_epochs=5, random_state=0).fit(imgs, y)
    on_rows = FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=1.0, max_epochs=5,
                                        random_state=0).fit(reference, y)
    np.testing.assert_allclose(smoothed.mean_, on_rows.mean_, rtol=1e-5)
    np.testing.assert_array_equal(smoothed.coef_, on_rows.coef_)
    np.testing.assert_array_equal(smoothed.decision_function(imgs),
                                  on_rows.decision_function(reference))
    with pytest.raises(ValueError, match="no volume to smooth"):
        FeatureGroupingClassifier(smoothing_fwhm=6.0).fit(reference, y)


def test_cv_streamed_from_a_store_equals_in_memory(client, tmp_path):
    X, y, mask, split = smooth_cohort()
    path = tmp_path / "s.zarr"
    write_store(path, X, y, mask, np.eye(4), split=split, block_rows=16)
    train = split == "train"
    params = dict(n_clusters=[0.05, 0.1], cv=3, batch_size=16, learning_rate=0.05, **SMALL)
    memory = FeatureGroupingClassifier(mask=mask_img(mask), **params).fit(X[train], y[train])
    streamed = FeatureGroupingClassifier(**params).fit(path, client=client)
    assert [r["fold_epochs"] for r in streamed.cv_results_] == \
        [r["fold_epochs"] for r in memory.cv_results_]
    np.testing.assert_allclose(streamed.coef_, memory.coef_, rtol=1e-5, atol=1e-6)


def test_cv_attributes_survive_a_save(problem, tmp_path):
    X, y, mask, groups = problem
    clf = FeatureGroupingClassifier(mask=mask_img(mask), cv=3, **SMALL).fit(X, y, groups=groups)
    save_model(clf, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.cv_scores_ == clf.cv_scores_
    assert loaded.cv_params_ == clf.cv_params_


def test_a_store_converted_with_smoothing_trains_and_predicts_images_smoothed_alike(tmp_path):
    """convert --smoothing-fwhm gives nilearn's masker's rows; a model trained on the store
    predicts images smoothed as the store's were; another FWHM is refused, naming both."""
    import nibabel as nib
    from nilearn.maskers import NiftiMasker

    from fgscale.store import convert, open_store

    rng = np.random.default_rng(1)
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    paths, rows = [], []
    for i in range(24):
        vol = rng.standard_normal((7, 8, 6)).astype(np.float32) + 3 + (i % 2)
        paths.append(tmp_path / f"v{i}.nii.gz")
        nib.save(nib.Nifti1Image(vol, affine), paths[-1])
        rows.append(f"{paths[-1]},{'ab'[i % 2]},s{i // 2}")
    table = tmp_path / "cohort.csv"
    table.write_text("path,label,group\n" + "\n".join(rows) + "\n")
    store = convert(table, tmp_path / "s.zarr", smoothing_fwhm=5.0, progress=False)
    assert store.smoothing_fwhm == 5.0
    mask = store.mask_img()
    reference = NiftiMasker(mask, smoothing_fwhm=5.0, standardize=None).fit().transform(
        [str(p) for p in paths])
    np.testing.assert_allclose(open_store(store.path).read_rows(np.arange(24)), reference,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match=r"--smoothing-fwhm 5.0 there, none now"):
        convert(table, tmp_path / "s.zarr", progress=False)
    params = dict(regularizer="l2", alpha=1.0, max_epochs=5, random_state=0)
    with pytest.raises(ValueError, match="smoothed by 5 mm .* smoothing_fwhm=6.0 cannot apply"):
        FeatureGroupingClassifier(smoothing_fwhm=6.0, **params).fit(store.path)
    clf = FeatureGroupingClassifier(**params).fit(store.path)
    assert clf.smoothing_fwhm_ == 5.0
    np.testing.assert_allclose(clf.decision_function([str(p) for p in paths]),
                               clf.decision_function(reference), rtol=1e-4, atol=1e-5)
