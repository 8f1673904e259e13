import numpy as np
import pytest
from helpers import mask_img, smooth_problem
from sklearn.utils.estimator_checks import parametrize_with_checks

from fgscale import FeatureGroupingClassifier
from fgscale.grouping._bank import make_bank
from fgscale.grouping._projection import cluster_sizes

FAST = dict(n_groupings=5, n_bootstrap=10, max_epochs=30, learning_rate=0.1, batch_size=50)


@parametrize_with_checks([
    FeatureGroupingClassifier(random_state=0),  # the defaults, with no expected failure
    FeatureGroupingClassifier(model="mlp", hidden_layer_sizes=(16,), random_state=0, **FAST),
    FeatureGroupingClassifier(regularizer="none", random_state=0, **FAST),
    # the other choices a user has: alpha="auto" falls back without a validation split
    FeatureGroupingClassifier(regularizer="l2", early_stopping=False, random_state=0, **FAST),
    FeatureGroupingClassifier(regularizer="dropout", random_state=0, **FAST),
    FeatureGroupingClassifier(n_clusters=[0.3, 0.6], random_state=0, **FAST),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_fit_attributes_and_bank(rng, tmp_path):
    X, y, mask = smooth_problem(rng)
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=0.2, random_state=0, **FAST).fit(X, y)
    p = mask.sum()
    # two classes: one row, the second class's logit weights minus the first's, as
    # scikit-learn's LogisticRegression; decision_function is that linear function of the
    # standardized rows
    assert clf.coef_.shape == (1, p) and clf.intercept_.shape == (1,)
    weight = clf.model_.first.weight.detach().numpy()
    np.testing.assert_allclose(clf.coef_[0], weight[1] - weight[0], rtol=1e-6)
    np.testing.assert_allclose(((X - clf.mean_) * clf.scale_) @ clf.coef_.T + clf.intercept_,
                               clf.decision_function(X)[:, None], rtol=1e-4, atol=1e-4)
    three = FeatureGroupingClassifier(mask=mask, n_clusters=0.2, random_state=0, **FAST).fit(
        X, np.arange(len(y)) % 3)
    assert three.coef_.shape == (3, p) and three.intercept_.shape == (3,)
    np.testing.assert_allclose(((X - three.mean_) * three.scale_) @ three.coef_.T
                               + three.intercept_, three.decision_function(X), rtol=1e-4,
                               atol=1e-4)
    assert clf.n_features_in_ == p and list(clf.classes_) == ["face", "house"]
    assert clf.bank_.shape == (5, p) and clf.bank_.dtype == np.int32
    k = clf.n_clusters_
    assert k == round(0.2 * p)
    for labels in clf.bank_:
        assert (cluster_sizes(labels, k) > 0).all() and labels.max() == k - 1
    # the bank is the in-memory oracle on the training rows, drawn from the fit's seed
    assert clf.predict_proba(X).shape == (len(X), 2)
    np.testing.assert_allclose(clf.predict_proba(X).sum(1), 1.0)
    # float64 throughout, as scikit-learn's classifiers give them
    assert clf.predict_proba(X).dtype == clf.decision_function(X).dtype == np.float64
    assert clf.score(X, y) > 0.9


def test_bank_is_make_bank_on_training_rows(rng):
    X, y, mask = smooth_problem(rng, n=40)
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=10, random_state=3, **FAST).fit(X, y)
    expected = make_bank(X, mask, 10, n_groupings=5, n_bootstrap=10, seed=3)  # an int seed as is
    np.testing.assert_array_equal(clf.bank_, expected)


def test_mask_as_image_or_path_gives_same_model(rng, tmp_path):
    X, y, mask = smooth_problem(rng, n=60)
    img = mask_img(mask)
    img.to_filename(tmp_path / "mask.nii.gz")
    coefs = [FeatureGroupingClassifier(mask=m, random_state=0, **FAST).fit(X, y).coef_
             for m in (mask, img, str(tmp_path / "mask.nii.gz"))]
    np.testing.assert_array_equal(coefs[0], coefs[1])
    np.testing.assert_array_equal(coefs[0], coefs[2])


def test_row_layout_and_dtype_do_not_change_the_model(rng):
    # the defaults (standardized, "auto" k): F-ordered float64 rows give the same model
    X, y, mask = smooth_problem(rng, n=60)
    C = FeatureGroupingClassifier(mask=mask, random_state=0).fit(X, y)
    F = FeatureGroupingClassifier(mask=mask, random_state=0).fit(
        np.asfortranarray(X, dtype=np.float64), y)
    np.testing.assert_array_equal(C.coef_, F.coef_)
    np.testing.assert_array_equal(C.bank_, F.bank_)


def test_reproducible_from_seed_and_seed_matters(rng):
    X, y, mask = smooth_problem(rng, n=60)
    def fit(seed):
        return FeatureGroupingClassifier(mask=mask, random_state=seed, **FAST).fit(X, y)

    np.testing.assert_array_equal(fit(1).coef_, fit(1).coef_)
    assert not np.array_equal(fit(1).coef_, fit(2).coef_)


@pytest.mark.parametrize("regularizer", ["none", "l2", "dropout", "feature_grouping"])
@pytest.mark.parametrize("model", ["logreg", "mlp"])
def test_every_model_and_regularizer_learns(rng, model, regularizer):
    X, y, mask = smooth_problem(rng, noise=0.5)
    clf = FeatureGroupingClassifier(mask=mask, model=model, regularizer=regularizer,
                                    hidden_layer_sizes=(16,), random_state=0, **FAST).fit(X, y)
    assert clf.score(X, y) > 0.85
    assert bool(clf.bank_ is not None) == (regularizer == "feature_grouping")
    if model == "mlp":  # early stopping ("auto") held out a validation split
        assert "val_loss" in clf.history_[0]


def test_l2_shrinks_weights(rng):
    X, y, mask = smooth_problem(rng, noise=2.0)
    def norm(alpha):
        clf = FeatureGroupingClassifier(mask=mask, regularizer="l2", alpha=alpha, random_state=0, **FAST)
        return np.linalg.norm(clf.fit(X, y).coef_)

    assert norm(1.0) < 0.5 * norm(0.0)


def test_feature_grouping_helps_on_noisy_smooth_data():
    """The method's premise on synthetic data: smooth signal, heavy noise, few samples."""
    rng = np.random.default_rng(0)
    X, y, mask = smooth_problem(rng, shape=(10, 10, 8), n=440, noise=6.0, width=30.0)
    train, test = slice(0, 40), slice(40, None)
    params = dict(mask=mask, n_clusters=0.05, n_groupings=20, max_epochs=60, batch_size=20,
                  learning_rate=0.05, random_state=0)
    acc = {reg: FeatureGroupingClassifier(regularizer=reg, **params).fit(X[train], y[train])
           .score(X[test], y[test]) for reg in ("none", "feature_grouping")}
    assert acc["feature_grouping"] > acc["none"] + 0.05, acc


@pytest.mark.parametrize("params, match", [
    (dict(model="svm"), "'model' parameter of FeatureGroupingClassifier must be"),
    (dict(regularizer="l1"), "'regularizer' parameter"),
    (dict(n_clusters=1.5), "n_clusters"),
    (dict(n_clusters=10_000), "n_clusters"),
    (dict(dropout=1.0), "dropout"),
    (dict(mask=np.ones(7, bool)), "mask has 7 voxels"),
    (dict(device="gpu"), "device must name a torch device"),
    (dict(device="cuda:99"), "'cuda:99'"),  # no GPU here, or fewer than 100
    (dict(prefetch=0), "'prefetch' parameter .* must be a str among 'auto' or an int in the "
                       r"range \[1, inf\). Got 0"),
    (dict(prefetch="all"), "'prefetch' parameter"),
])
def test_bad_parameters_are_named(rng, params, match):
    X, y, _ = smooth_problem(rng, n=20)
    with pytest.raises(ValueError, match=match):
        FeatureGroupingClassifier(**params).fit(X, y)


def test_one_class_a_mask_of_ones_and_zeros_and_maps_before_fit(rng):
    from sklearn.exceptions import NotFittedError

    X, y, mask = smooth_problem(rng, n=40)
    with pytest.raises(ValueError, match=r"y holds 1 class \(\[0\]\); classification needs "
                                         "samples of at least 2 classes"):
        FeatureGroupingClassifier(mask=mask).fit(X, np.zeros(len(X), int))
    fast = dict(n_groupings=3, n_bootstrap=10, max_epochs=3, random_state=0)
    as_bool = FeatureGroupingClassifier(mask=mask, **fast).fit(X, y)
    as_int = FeatureGroupingClassifier(mask=mask.astype(np.int8), **fast).fit(X, y)
    np.testing.assert_array_equal(as_int.coef_, as_bool.coef_)
    with pytest.raises(ValueError, match=r"mask must be a boolean array \(or one of 0s and 1s\), "
                                         r"got dtype int64 with values \[0, 2\]"):
        FeatureGroupingClassifier(mask=mask.astype(np.int64) * 2, **fast).fit(X, y)
    with pytest.raises(NotFittedError):
        FeatureGroupingClassifier(mask=mask).coef_img_  # noqa: B018


def test_a_refit_keeps_nothing_of_the_previous_fit(rng):
    import pandas as pd

    X, y, mask = smooth_problem(rng, n=40)
    fast = dict(n_groupings=3, n_bootstrap=10, max_epochs=3, random_state=0)
    named = pd.DataFrame(X, columns=[f"v{i}" for i in range(X.shape[1])])
    clf = FeatureGroupingClassifier(mask=mask, **fast).fit(named, y)
    assert hasattr(clf, "coef_") and hasattr(clf, "feature_names_in_")
    # an MLP has no linear weights: the logistic model's must not be reported as its own
    clf.set_params(model="mlp", hidden_layer_sizes=(4,)).fit(X, y)
    assert not hasattr(clf, "coef_") and not hasattr(clf, "intercept_")
    assert not hasattr(clf, "feature_names_in_")


def test_public_names_resolve():
    import fgscale

    for name in fgscale.__all__:
        assert getattr(fgscale, name) is not None
    with pytest.raises(AttributeError):
        fgscale.not_a_name  # noqa: B018


def test_the_docstring_example_runs():
    import doctest

    import fgscale.estimators._classifier as module

    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("train_classes, message", [
    ([0], r"the training rows hold 1 class \(\['class_0'\]\); classification needs at least 2"),
    ([0, 1, 2], r"no training row of class\(es\) \['class_3'\], which the store has"),
])
def test_a_store_whose_training_rows_lack_classes_is_refused(tmp_path, client, train_classes,
                                                             message):
    from helpers import synthetic_store

    from fgscale.store import open_store

    y = np.arange(40) % 4
    split = np.where(np.isin(y, train_classes), "train", "test")
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, split=split,
                            classes=[f"class_{k}" for k in range(4)])
    assert list(open_store(store.path).y) == list(y)
    with pytest.raises(ValueError, match=message):
        FeatureGroupingClassifier(n_groupings=2).fit(str(store.path), client=client)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_predict_log_proba_is_the_log_of_predict_proba(rng, n_classes):
    """As scikit-learn's probabilistic classifiers: log probabilities in classes_'s order,
    finite where a probability underflows to 0 (computed from the logits, not log(0))."""
    X, _, mask = smooth_problem(rng, n=60)
    y = np.arange(len(X)) % n_classes
    clf = FeatureGroupingClassifier(mask=mask, random_state=0, **FAST).fit(X, y)
    log_p = clf.predict_log_proba(X)
    assert log_p.shape == (len(X), n_classes) and log_p.dtype == np.float64
    np.testing.assert_allclose(np.exp(log_p), clf.predict_proba(X), rtol=1e-12, atol=1e-15)
    far = 1e4 * X[:3]  # logits hundreds apart: a probability of exactly 0 in float64
    assert np.isfinite(clf.predict_log_proba(far)).all()


def test_a_failed_fit_leaves_the_fitted_estimator_as_it_was(rng):
    """A refit refused (NaN in X, or a choice with no validation split, found once the new
    rows are in) keeps the previous model whole: coef_, n_features_in_ and predict agree."""
    X, y, mask = smooth_problem(rng, n=60)
    clf = FeatureGroupingClassifier(mask=mask, random_state=0, **FAST).fit(X, y)
    before = {name: getattr(clf, name) for name in ("coef_", "classes_", "n_features_in_")}
    proba = clf.predict_proba(X)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(bad, y)
    with pytest.raises(ValueError, match="no validation split"):
        clf.set_params(mask=None, n_clusters=[2, 3], early_stopping=False).fit(X[:, :10], y)
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(clf, name), value)
    np.testing.assert_array_equal(clf.predict_proba(X), proba)


def test_hidden_layer_sizes_as_scikit_learns_mlp_takes_them(rng, tmp_path):
    """One int is one layer, a 1-D array of ints the layers: each trains the model of the
    tuple, and comes back from a save as it was given."""
    from fgscale import load_model, save_model

    X, y, mask = smooth_problem(rng)
    params = dict(model="mlp", mask=mask, random_state=0, **FAST)
    as_tuple = FeatureGroupingClassifier(hidden_layer_sizes=(16, 8), **params).fit(X, y)
    as_array = FeatureGroupingClassifier(hidden_layer_sizes=np.array([16, 8]), **params).fit(X, y)
    np.testing.assert_array_equal(as_array.predict_proba(X), as_tuple.predict_proba(X))
    one = FeatureGroupingClassifier(hidden_layer_sizes=16, **params).fit(X, y)
    np.testing.assert_array_equal(
        one.predict_proba(X),
        FeatureGroupingClassifier(hidden_layer_sizes=(16,), **params).fit(X, y).predict_proba(X))
    save_model(one, tmp_path / "m")
    assert load_model(tmp_path / "m").hidden_layer_sizes == 16
    for bad in (0, (16, 0), np.array([[16]]), 2.5):
        with pytest.raises(ValueError, match="'hidden_layer_sizes' parameter .* an int >= 1 or"):
            FeatureGroupingClassifier(hidden_layer_sizes=bad, **params).fit(X, y)
