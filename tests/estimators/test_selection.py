"""Standardization, the default optimizer and model selection, against references."""

import gc
import warnings

import numpy as np
import pytest
import torch
from helpers import smooth_problem
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor, load_model, save_model
from fgscale.estimators._auto import AUTO_FALLBACK, AUTO_GRIDS
from fgscale.estimators._selection import candidates

SMALL = dict(n_groupings=5, n_bootstrap=20, random_state=0)


def _problem(rng, n=160):
    X, y, mask = smooth_problem(rng, n=n, noise=2.0)
    return X, y, mask


def test_raw_scanner_units_give_the_same_model_as_unit_scale(rng):
    X, y, mask = _problem(rng)
    raw = X * 1000 + 10000
    fitted = [FeatureGroupingClassifier(mask=mask, **SMALL).fit(data[:120], y[:120])
              for data in (X, raw)]
    assert fitted[0].score(X[120:], y[120:]) == fitted[1].score(raw[120:], y[120:])
    assert fitted[0].score(X[120:], y[120:]) > 0.8
    np.testing.assert_allclose(fitted[0].coef_, fitted[1].coef_, atol=2e-3)


def test_without_standardization_raw_units_still_train_with_the_auto_step(rng):
    X, y, mask = _problem(rng)
    raw = X * 1000 + 10000
    clf = FeatureGroupingClassifier(mask=mask, standardize=False, **SMALL).fit(raw[:120], y[:120])
    assert np.isfinite(clf.history_[-1]["train_loss"])
    assert clf.mean_ is None


def test_stops_on_a_criterion_and_reports_n_iter(rng):
    X, y, mask = _problem(rng)
    # one validation split (cv=None): the epoch kept is its best
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=400, cv=None, **SMALL).fit(X, y)
    search = [h for h in clf.history_ if "phase" not in h]
    refit = [h for h in clf.history_ if h.get("phase") == "refit"]
    assert len(search) < 400  # stopped by patience on the validation loss
    losses = [h["val_loss"] for h in search]
    assert clf.n_iter_ == int(np.argmin(losses)) + 1 == len(refit)
    # without a validation split: stopped on the training loss
    plain = FeatureGroupingClassifier(mask=mask, early_stopping=False, max_epochs=400,
                                      tol=1e-2, **SMALL).fit(X, y)
    assert len(plain.history_) < 400 and "val_loss" not in plain.history_[0]


def test_auto_alpha_searches_the_grid_on_validation_and_is_deterministic(rng):
    X, y, mask = _problem(rng)
    fits = [FeatureGroupingClassifier(mask=mask, regularizer="l2", **SMALL).fit(X, y)
            for _ in range(2)]
    clf = fits[0]
    assert [r["alpha"] for r in clf.cv_results_] == list(AUTO_GRIDS["alpha"])
    losses = [r["val_loss"] for r in clf.cv_results_]
    assert clf.alpha_ == AUTO_GRIDS["alpha"][int(np.argmin(losses))]
    assert fits[1].alpha_ == clf.alpha_ and fits[1].cv_results_ == clf.cv_results_
    np.testing.assert_array_equal(fits[1].coef_, clf.coef_)


def test_lists_and_auto_of_several_parameters_are_combined(rng):
    X, y, mask = _problem(rng)
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=[0.05, 0.3], alpha=[0.0, 0.1],
                                    **SMALL).fit(X, y)
    tried = {(r["n_clusters"], r["alpha"]) for r in clf.cv_results_}
    p = mask.sum()
    ks = {round(0.05 * p), round(0.3 * p)}
    assert tried == {(k, a) for k in ks for a in (0.0, 0.1)}
    assert clf.n_clusters_ in ks and clf.bank_.max() + 1 == clf.n_clusters_
    # dropout does not apply to logistic regression with feature grouping: not searched
    assert candidates(FeatureGroupingClassifier(dropout="auto", n_clusters=0.1), 1000) == [
        {"alpha": 0.0, "dropout": 0.0, "n_clusters": 100}]
    assert len(candidates(FeatureGroupingClassifier(regularizer="dropout", dropout="auto"),
                          1000)) == 4


def test_default_k_is_chosen_among_fractions_tried_once_each():
    clf = FeatureGroupingClassifier()
    assert [c["n_clusters"] for c in candidates(clf, 1000)] == [50, 100, 200, 400]
    # 2% joins where it leaves 256 clusters or more: a brain image's voxels, not 12,799 of them
    assert [c["n_clusters"] for c in candidates(clf, 33854)] == [677, 1693, 3385, 6771, 13542]
    assert [c["n_clusters"] for c in candidates(clf, 12799)] == [640, 1280, 2560, 5120]
    assert [c["n_clusters"] for c in candidates(clf, 12800)] == [256, 640, 1280, 2560, 5120]
    # not in regression, where it gained nothing on the dev seeds, and 80% only there
    assert [c["n_clusters"] for c in candidates(FeatureGroupingRegressor(), 33854)] == [
        1693, 3385, 6771, 13542, 27083]
    # the MLP and the CNN stop at 20%: their first layer grows with k (6 GB at 1 mm with 40%)
    assert [c["n_clusters"] for c in candidates(FeatureGroupingClassifier(model="mlp"), 33854)
            ] == [677, 1693, 3385, 6771]
    assert [c["n_clusters"] for c in candidates(FeatureGroupingRegressor(model="cnn"), 33854)
            ] == [1693, 3385, 6771]
    # no validation split: 10%, the fallback
    assert [c["n_clusters"] for c in candidates(clf, 1000, validation=False)] == [100]
    # 5%, 10% and 20% of 12 features are 1 (then 2: the least), 1 and 2 clusters, 40% is 5:
    # two fits, not four
    assert [c["n_clusters"] for c in candidates(clf, 12)] == [2, 5]
    assert [c["n_clusters"] for c in candidates(clf, 40)] == [2, 4, 8, 16]


def test_a_list_without_a_validation_split_is_refused_and_auto_takes_its_fallback(rng):
    X, y, mask = _problem(rng, n=40)
    with pytest.raises(ValueError, match=r"2 candidate hyper-parameters to choose from, but "
                                         r"early_stopping=False leaves no validation split to "
                                         r"choose on; give single values, or early_stopping='auto'"):
        FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=[0.0, 0.1],
                                  early_stopping=False, **SMALL).fit(X, y)
    # the number of rows as scikit-learn's check_fit2d_1sample looks for it
    with pytest.raises(ValueError, match=r"but n_samples=4 training rows leave no validation "
                                         r"split to choose on; give single values, or more rows"):
        FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=[0.0, 0.1],
                                  **SMALL).fit(X[:4], y[:4])
    with pytest.raises(ValueError, match=r"but n_samples=1 training rows leave"):
        FeatureGroupingRegressor(regularizer="l2", alpha=[0.0, 0.1], **SMALL).fit(X[:1], [1.0])
    clf = FeatureGroupingClassifier(mask=mask, regularizer="l2", early_stopping=False,
                                    **SMALL).fit(X, y)
    assert len(clf.cv_results_) == 1 and clf.alpha_ == AUTO_FALLBACK["alpha"]


def test_an_array_of_values_is_a_list_of_candidates(rng, tmp_path):
    X, y, mask = _problem(rng, n=90)
    alphas = np.logspace(-4, -2, 3)  # as scikit-learn's RidgeCV and LogisticRegressionCV take
    as_array = FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=alphas,
                                         **SMALL).fit(X, y)
    as_list = FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=alphas.tolist(),
                                        **SMALL).fit(X, y)
    assert [c["alpha"] for c in as_array.cv_results_] == alphas.tolist()
    assert as_array.alpha_ == as_list.alpha_
    np.testing.assert_array_equal(as_array.coef_, as_list.coef_)
    save_model(as_array, tmp_path / "m")  # the list of its values, read back as an array
    back = load_model(tmp_path / "m").get_params()["alpha"]
    assert isinstance(back, np.ndarray) and back.dtype == alphas.dtype
    np.testing.assert_array_equal(back, alphas)


@pytest.mark.parametrize("params, ignored", [
    (dict(regularizer="none", alpha=1.0), "alpha=1.0 has no effect with regularizer='none'"),
    (dict(regularizer="l2", dropout=[0.1, 0.3]), r"dropout=\[0.1, 0.3\] has no effect"),
    (dict(regularizer="dropout", n_clusters=0.2, hidden_layer_sizes=(8,)),
     r"n_clusters=0.2, hidden_layer_sizes=\(8,\) have no effect with regularizer='dropout' "
     "and model='logreg'"),
])
def test_a_parameter_with_no_effect_is_warned_of(params, ignored, rng):
    X, y, mask = _problem(rng, n=60)
    with pytest.warns(UserWarning, match=ignored):
        FeatureGroupingClassifier(mask=mask, max_epochs=2, **SMALL, **params).fit(X, y)
    # the defaults, and values that apply, warn of nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        for fine in (dict(), dict(regularizer="l2", alpha=0.1, dropout=0.5, n_clusters="auto"),
                     dict(model="mlp", hidden_layer_sizes=[8], dropout=np.float64(0.2))):
            FeatureGroupingClassifier(mask=mask, max_epochs=2, **SMALL, **fine).fit(X, y)


def test_works_inside_grid_search(rng):
    X, y, mask = _problem(rng, n=90)
    search = GridSearchCV(FeatureGroupingClassifier(mask=mask, **SMALL),
                          {"n_clusters": [0.1, 0.3]}, cv=3).fit(X, y)
    assert search.best_params_["n_clusters"] in (0.1, 0.3)
    assert search.score(X, y) > 0.7


def test_stopping_on_accuracy_keeps_the_first_epoch_of_best_validation_accuracy(rng):
    X, y, mask = _problem(rng)
    clf = FeatureGroupingClassifier(mask=mask, stop_on="accuracy", refit=False,
                                    **SMALL).fit(X, y)
    accuracy = [h["val_accuracy"] for h in clf.history_]
    assert clf.n_iter_ == int(np.argmax(accuracy)) + 1
    assert clf.cv_results_[0]["val_error"] == pytest.approx(1 - max(accuracy))


class _Spy(FeatureGroupingClassifier):
    """Counts, as each phase starts, the tensors alive shaped like the first layer's weights."""

    def _phase(self, *args, **kwargs):
        gc.collect()
        shape = (self._n_outputs(), self.n_features_in_)
        with warnings.catch_warnings():  # isinstance on every object touches deprecated ones
            warnings.simplefilter("ignore")
            live = sum(isinstance(t, torch.Tensor) and tuple(t.shape) == shape
                       for t in gc.get_objects())
        self.live_at_phase_ = [*getattr(self, "live_at_phase_", []), live]
        return super()._phase(*args, **kwargs)


@pytest.mark.parametrize("refit, expected", [(True, [0, 0, 0, 0]), (False, [0, 1, 1])])
def test_a_search_keeps_no_candidate_weights_it_does_not_need(rng, refit, expected):
    # a candidate's weights and best-epoch snapshot are each as large as the first layer
    # (1.9 GB for the MLP at 1 mm): with a refit none is kept while the next trains, without
    # one only the best candidate's weights (not its snapshot)
    X, y, mask = _problem(rng, n=90)
    params = dict(mask=mask, n_clusters=[0.05, 0.1, 0.2], refit=refit, cv=None, **SMALL)
    spy = _Spy(**params).fit(X, y)
    assert spy.live_at_phase_ == expected
    reference = FeatureGroupingClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(spy.coef_, reference.coef_)
    assert spy.n_clusters_ == reference.n_clusters_


@pytest.mark.parametrize("gap, dtype", [(np.nan, object), (None, object), ("pd.NA", "string")])
def test_groups_with_a_gap_are_refused_naming_the_sample(rng, gap, dtype):
    import pandas as pd

    X, y, mask = _problem(rng, n=40)
    groups = pd.Series([f"sub-{i // 4}" for i in range(40)], dtype=dtype)
    groups[5] = pd.NA if gap == "pd.NA" else gap  # a table's subject column with an empty cell
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=2, **SMALL)
    with pytest.raises(ValueError, match=r"groups has 1 missing value\(s\) \(NaN, None or NA\), "
                                         r"the first at sample 5: give every sample its subject"):
        clf.fit(X, y, groups=groups)
    numeric = np.arange(40) // 4.0
    numeric[7] = np.nan
    with pytest.raises(ValueError, match="first at sample 7"):
        clf.fit(X, y, groups=numeric)
    assert clf.fit(X, y, groups=groups.fillna("sub-1")).n_iter_ >= 1


@pytest.mark.parametrize("n, fraction, message", [
    (1, 0.2, r"early stopping needs a validation split: 1 sample\(s\) with "
             r"validation_fraction=0.2 leave 0 to train on; give more samples, a smaller "
             r"validation_fraction or early_stopping=False"),
    (6, 0.99, r"6 sample\(s\) with validation_fraction=0.99 leave 0 to train on"),
])
@pytest.mark.filterwarnings("ignore:the target is")  # one sample: a constant target
def test_a_split_with_no_training_rows_names_the_fraction(rng, n, fraction, message):
    X = rng.standard_normal((n, 4)).astype(np.float32)
    reg = FeatureGroupingRegressor(early_stopping=True, validation_fraction=fraction)
    with pytest.raises(ValueError, match=message):
        reg.fit(X, np.arange(n, dtype=float) + rng.standard_normal(n))


def test_a_split_by_group_keeps_every_class_on_both_sides_where_one_can(rng):
    """A few subjects of a rare class (3 patients of 15): a split drawn by group alone left
    every patient out of the validation rows for half the seeds, and early stopping judged the
    model without them. The first draw that holds every class is kept; where one holds them
    (most seeds), it is scikit-learn's own GroupShuffleSplit draw, unchanged."""
    from sklearn.model_selection import GroupShuffleSplit

    from fgscale.estimators._selection import validation_split

    groups = np.repeat(np.arange(15), 2)
    y = (groups < 3).astype(int)  # subjects 0-2 are patients
    kept = 0
    for seed in range(40):
        train, val = validation_split(y, 0.2, seed, groups)
        assert set(y[train]) == set(y[val]) == {0, 1}
        assert not set(groups[train]) & set(groups[val])
        plain = next(GroupShuffleSplit(1, test_size=0.2, random_state=seed).split(y, y, groups))
        if set(y[plain[1]]) == {0, 1}:
            kept += 1
            np.testing.assert_array_equal(val, plain[1])
    assert 5 <= kept <= 35  # both cases were met
    # a regressor's split is the plain draw
    np.testing.assert_array_equal(validation_split(y, 0.2, 3, groups, stratify=False)[1], next(
        GroupShuffleSplit(1, test_size=0.2, random_state=3).split(y, y, groups))[1])


def test_a_class_of_one_subject_is_named_in_a_warning(rng):
    """Two subjects, one class each: no split by subject can hold both classes on both sides."""
    X, y, mask = _problem(rng, n=24)
    labels = np.where(np.arange(24) < 12, "face", "house")
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=2, n_clusters=0.2, **SMALL)
    with pytest.warns(UserWarning, match=r"no split of the rows by group \(groups=\) keeps every "
                                         r"class on both sides: the training rows lack class "
                                         r"'(face|house)' \(its samples are in 1 group\(s\)\)"):
        clf.fit(X, labels, groups=np.arange(24) < 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        clf.fit(X, labels, groups=np.arange(24) // 3)  # 4 subjects of each class


def test_a_class_left_out_of_a_split_by_sample_is_named_in_a_warning(rng):
    """A class of one sample, which no split can put on both sides: named, as scikit-learn's
    SGDClassifier refuses it, and the warning points at the caller's fit, not at fgscale."""
    X, y, mask = _problem(rng, n=24)
    labels = np.where(np.arange(24) < 12, "face", "house")
    labels[0] = "cat"
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=2, n_clusters=0.2, early_stopping=True,
                                    **SMALL)
    with pytest.warns(UserWarning, match=r"the validation split of the rows cannot hold every "
                                         r"class on both sides: the (training|validation) rows "
                                         r"lack class 'cat' \(1 sample\(s\) of it in 24\)") as caught:
        clf.fit(X, labels)
    assert [w.filename for w in caught if w.category is not ConvergenceWarning] == [__file__]
    assert list(clf.classes_) == ["cat", "face", "house"]  # the refit sees every row
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        clf.fit(X, np.where(np.arange(24) < 12, "face", "house"))  # stratified: no warning


def test_early_stopping_auto_turned_off_by_a_class_of_one_sample_is_said(rng):
    """"auto" has no split when a class has one sample (a mistyped label): the class is
    named, where it silently trained on the training loss."""
    X, _, mask = _problem(rng, n=41)
    labels = np.array(["face"] * 20 + ["house"] * 20 + ["Face"])
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=2, n_clusters=0.2, **SMALL)
    with pytest.warns(UserWarning, match=r"early_stopping='auto' trains without a validation "
                                         r"split: class 'Face' has 1 sample\(s\) of 41") as caught:
        clf.fit(X, labels)
    assert caught[0].filename == __file__ and not any(h.get("val_loss") for h in clf.history_)
    with warnings.catch_warnings():  # too few rows for a split anyway: nothing to say
        warnings.filterwarnings("error", message="early_stopping")
        clf.fit(X[:3], ["a", "b", "c"])


@pytest.mark.parametrize("early_stopping", ["auto", False])
def test_a_fit_ended_by_max_epochs_before_its_criterion_warns_as_scikit_learns(
        rng, early_stopping):
    """scikit-learn's ConvergenceWarning, at the caller's line, where the chosen fit ran out of
    epochs while its criterion (the validation loss, else the training loss) still improved;
    none where the criterion ended it."""
    X, y, mask = _problem(rng, n=60)
    params = dict(mask=mask, early_stopping=early_stopping, **SMALL)
    loss = "validation loss" if early_stopping == "auto" else "training loss"
    with pytest.warns(ConvergenceWarning, match=rf"training reached max_epochs=2 while its {loss} "
                                                r"still improved") as caught:
        clf = FeatureGroupingClassifier(max_epochs=2, **params).fit(X, y)
    assert clf.n_iter_ == 2 and {w.filename for w in caught} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = FeatureGroupingClassifier(max_epochs=500, patience=3, **params).fit(X, y)
    assert clf.n_iter_ < 500


def test_feature_grouping_of_arrays_without_a_mask_is_warned_of_at_the_callers_line(rng):
    """Columns without mask= are clustered as a chain in their order: no layout for voxels, and
    none for a table's features (iris, clinical scores). Said, unless the chain is given as the
    layout or no grouping applies."""
    X, y, mask = _problem(rng, n=60)
    with pytest.warns(UserWarning, match=rf"feature grouping without mask= clusters the "
                                         rf"{X.shape[1]} features as a chain") as caught:
        FeatureGroupingClassifier(max_epochs=2, **SMALL).fit(X, y)
    assert [w.filename for w in caught if "chain" in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        for params in (dict(mask=mask), dict(mask=np.ones(X.shape[1], bool)),
                       dict(regularizer="l2"), dict(regularizer="dropout")):
            FeatureGroupingClassifier(max_epochs=2, **SMALL, **params).fit(X, y)
