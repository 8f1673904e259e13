"""The scikit-learn API contract of both estimators beyond the defaults that
``parametrize_with_checks`` runs in test_classifier.py and test_regressor.py: predictions that
do not depend on the batch, warnings a search does not trigger, pickling, feature names,
``score`` with weights, input dtypes."""

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor

FAST = dict(n_groupings=5, n_bootstrap=10, max_epochs=30, learning_rate=0.1, batch_size=50)


def _problem(rng, n=120, p=40):
    X = rng.standard_normal((n, p)) * 3.0 + 1.0
    return X, (X[:, :5].sum(1) > 5.0).astype(int)


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
@pytest.mark.parametrize("model, mask", [("logreg", None), ("mlp", None), ("cnn", None),
                                         ("cnn", np.ones((4, 10), bool))])
def test_a_row_is_predicted_the_same_whatever_rows_come_with_it(rng, Estimator, model, mask):
    """As scikit-learn's check_methods_subset_invariance: a row alone, in a half, or in the
    whole set gets the same prediction (float32 products sum in an order that depends on the
    number of rows: their rounding would reach the outputs). The CNN without a mask lays the
    features on a line (1D convolutions), with one on a 2D grid."""
    X, y = _problem(rng)
    est = Estimator(model=model, mask=mask, hidden_layer_sizes=(256,), random_state=0,
                    **dict(FAST, max_epochs=5)).fit(X, y)
    method = est.predict if Estimator is FeatureGroupingRegressor else est.decision_function
    full = method(X)
    alone = np.concatenate([method(X[i:i + 1]) for i in range(20)])
    halves = np.concatenate([method(X[:50]), method(X[50:])])
    scale = np.abs(full).max()
    np.testing.assert_allclose(alone, full[:20], rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(halves, full, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_search_over_the_regularizer_warns_only_of_what_the_user_set(rng, Estimator):
    """As scikit-learn's LogisticRegression warns of an l1_ratio without elastic net only when
    it was given: a GridSearchCV over the regularizer from the defaults warns of nothing; a
    dropout rate the user gave warns where the candidate's regularizer does not use it, and
    hidden layer sizes where the candidate's model has none."""
    import warnings

    from sklearn.model_selection import GridSearchCV

    X, y = _problem(rng, n=90)
    grid = {"regularizer": ["none", "l2", "dropout", "feature_grouping"],
            "model": ["logreg", "mlp"]}
    fast = dict(FAST, max_epochs=3, random_state=0, mask=np.ones(40, bool))  # a chain, said
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
        search = GridSearchCV(Estimator(**fast), grid, cv=2, error_score="raise").fit(X, y)
    assert len(search.cv_results_["params"]) == 8
    assert [str(w.message) for w in seen] == []
    with pytest.warns(UserWarning, match="dropout=0.2 has no effect with regularizer='l2'"):
        GridSearchCV(Estimator(dropout=0.2, **fast), {"regularizer": ["l2", "dropout"]},
                     cv=2).fit(X, y)
    with pytest.warns(UserWarning, match=r"hidden_layer_sizes=\(4,\) has no effect with "
                                         "regularizer='feature_grouping' and model='logreg'"):
        GridSearchCV(Estimator(hidden_layer_sizes=(4,), **fast), {"model": ["logreg", "mlp"]},
                     cv=2).fit(X, y)


def _with_gap(values, gap, at=3):
    out = np.asarray(values, dtype=object).copy()
    out[at] = gap
    return out


@pytest.mark.parametrize("gap", [np.nan, None, "pd.NA"])
@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_target_missing_is_named_with_its_sample(rng, Estimator, gap):
    """A table's column with a gap (NaN, None, pandas' NA; labels as strings, a categorical,
    numbers) is refused naming the first sample without a target, not by numpy's sort nor
    as a class label given to the regressor."""
    import pandas as pd

    X, y = _problem(rng, n=40)
    values = np.array(["a", "b"])[y] if Estimator is FeatureGroupingClassifier else X[:, 0]
    gap = pd.NA if gap == "pd.NA" else gap
    columns = [_with_gap(values, gap), pd.Series(_with_gap(values, gap))]
    if Estimator is FeatureGroupingClassifier:
        columns.append(pd.Series(values, dtype="string").where(np.arange(40) != 3, gap))
        columns.append(pd.Categorical(_with_gap(values, gap)))
    else:
        columns.append(pd.array(_with_gap(values, gap), dtype="Float64"))
    kind = "label" if Estimator is FeatureGroupingClassifier else "target"
    for column in columns:
        with pytest.raises(ValueError, match=rf"^y has 1 missing value \(NaN, None or NA\), at "
                                             rf"sample 3: give every sample its {kind}"):
            Estimator(max_epochs=2).fit(X, column)


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_cnn_without_a_mask_on_too_few_features_says_so(rng, Estimator):
    """No mask lays the features on a line: too few of them for two poolings by 2 is said in
    terms of the features, as scikit-learn's check_fit2d_1feature expects, not of a mask the
    user never gave."""
    X, y = _problem(rng, n=40, p=3)
    with pytest.raises(ValueError, match=r"^model='cnn' without a mask lays the n_features=3 "
                                         "features on a line, which it pools twice by 2: it "
                                         "needs at least 4 features, or a mask"):
        Estimator(model="cnn", max_epochs=2).fit(X, y)
    assert Estimator(model="cnn", hidden_layer_sizes=(4,), max_epochs=2).fit(
        *_problem(rng, n=40, p=4)).n_features_in_ == 4


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_pickle_names_weights_and_dtypes_as_scikit_learn_has_them(rng, Estimator):
    """A fitted estimator pickled and loaded predicts the same numbers; feature names are
    checked as scikit-learn's validate_data checks them; score weighs samples; integer, bool
    and float16 X fit as their float32 values."""
    import pickle
    import warnings

    import pandas as pd
    from sklearn.metrics import accuracy_score, r2_score

    X, y = _problem(rng, n=80, p=12)
    target = y if Estimator is FeatureGroupingClassifier else X[:, 0] * 2.0 + 1.0
    fast = dict(FAST, max_epochs=5, random_state=0, mask=np.ones(12, bool))  # a chain, said
    named = pd.DataFrame(X, columns=[f"v{i}" for i in range(12)])
    est = Estimator(**fast).fit(named, target)
    loaded = pickle.loads(pickle.dumps(est))
    methods = ["predict"] + (["predict_proba", "decision_function"]
                             if Estimator is FeatureGroupingClassifier else [])
    for method in methods:
        np.testing.assert_array_equal(getattr(loaded, method)(named), getattr(est, method)(named))
    assert list(est.feature_names_in_) == list(named.columns)
    with pytest.raises(ValueError, match="Feature names must be in the same order"):
        est.predict(named[named.columns[::-1]])
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        est.predict(X)
    unnamed = Estimator(**fast).fit(X, target)
    assert not hasattr(unnamed, "feature_names_in_")
    with pytest.warns(UserWarning, match="X has feature names, but"):
        unnamed.predict(named)
    with pytest.raises(ValueError, match=f"X has 5 features, but {Estimator.__name__} is "
                                         "expecting 12 features as input"):
        unnamed.predict(X[:, :5])
    weights = np.r_[np.ones(30), np.zeros(50)]
    metric = accuracy_score if Estimator is FeatureGroupingClassifier else r2_score
    assert unnamed.score(X, target, sample_weight=weights) == pytest.approx(
        metric(target[:30], unnamed.predict(X[:30])))
    for kind in (np.int16, bool, np.float16):
        values = (X * 10).astype(kind) if kind is np.int16 else X.astype(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit
            as_is = Estimator(**fast).fit(values, target).predict(values)
        as_float = Estimator(**fast).fit(values.astype(np.float32), target).predict(
            values.astype(np.float32))
        np.testing.assert_array_equal(as_is, as_float)


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_parameter_set_after_fit_does_not_change_the_fitted_maps(rng, Estimator):
    """As every fitted attribute of a scikit-learn estimator: coef_img_ is the fitted model's
    until the next fit, whatever set_params changed since (model= names the next fit's)."""
    from helpers import mask_img

    X, y = _problem(rng, n=60, p=4 * 5 * 3)
    mask = mask_img(np.ones((4, 5, 3), bool))
    est = Estimator(mask=mask, **dict(FAST, max_epochs=3, random_state=0)).fit(X, y)
    maps = est.coef_img_
    first = next(iter(maps.values())) if isinstance(maps, dict) else maps
    est.set_params(model="mlp")
    again = est.coef_img_
    again = next(iter(again.values())) if isinstance(again, dict) else again
    np.testing.assert_array_equal(again.get_fdata(), first.get_fdata())
    mlp = Estimator(mask=mask, model="mlp", hidden_layer_sizes=(4,), max_epochs=2).fit(X, y)
    mlp.set_params(model="logreg")
    with pytest.raises(AttributeError, match="coef_img_ needs model='logreg'"):
        mlp.coef_img_  # noqa: B018


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_device_set_after_fit_is_checked_when_predicting(rng, Estimator):
    """The device is a runtime parameter (a pickle of a GPU fit predicts on the CPU once told
    so): one this machine lacks, set after the fit, is named as fit names it, not as torch's
    AssertionError "Torch not compiled with CUDA enabled"."""
    import pickle

    X, y = _problem(rng, n=60)
    est = Estimator(**dict(FAST, max_epochs=2, random_state=0)).fit(X, y)
    expected = est.predict(X)
    loaded = pickle.loads(pickle.dumps(est.set_params(device="cuda:99")))
    with pytest.raises(ValueError, match=r"^device='cuda:99': this (torch .* sees no CUDA GPU|"
                                         r"machine has \d+ CUDA GPU)"):
        loaded.predict(X)
    with pytest.raises(ValueError, match="device must name a torch device"):
        loaded.set_params(device="gpu").predict(X)
    np.testing.assert_array_equal(loaded.set_params(device="cpu").predict(X), expected)
