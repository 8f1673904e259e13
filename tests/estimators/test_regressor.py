"""``FeatureGroupingRegressor``: scikit-learn's checks, least squares and ridge reached as their
closed forms give them, feature grouping on smooth maps, images at the edges."""

import numpy as np
import pytest
from helpers import mask_img, smooth_cohort
from scipy import ndimage
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, Ridge, RidgeCV
from sklearn.metrics import r2_score
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.images import mask_images, unmask
from fgscale.store import write_store

# Small and fast. The checks' regression problem has one informative feature among ten
# independent ones, no spatial structure: the MLP groups them into k = 8 (not "auto"'s 2, which
# averages that feature with four of noise), with the default 1/L step.
FAST = dict(n_groupings=5, n_bootstrap=10, max_epochs=30, batch_size=50)


@parametrize_with_checks([
    FeatureGroupingRegressor(random_state=0),
    FeatureGroupingRegressor(regularizer="none", random_state=0),
    FeatureGroupingRegressor(model="mlp", hidden_layer_sizes=(16,), n_clusters=0.8, random_state=0,
                             **FAST),
    FeatureGroupingRegressor(regularizer="l2", alpha=1e-3, random_state=0, **FAST),
    FeatureGroupingRegressor(regularizer="dropout", early_stopping=False, random_state=0, **FAST),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def _linear_problem(rng, n=400, p=12, noise=0.5):
    X = (rng.standard_normal((n, p)) * rng.uniform(0.5, 20.0, p) + rng.uniform(-5, 5, p))
    y = X @ rng.standard_normal(p) + 3.0 + noise * rng.standard_normal(n)
    return X.astype(np.float32), y


@pytest.mark.parametrize("batch_size, atol", [(400, 1e-5), ("auto", 1e-2)])
def test_no_regularizer_reaches_least_squares(rng, batch_size, atol):
    """Whatever the features' units; full batches exactly, minibatches within 1% of y's
    standard deviation (averaged SGD with a constant step)."""
    X, y = _linear_problem(rng)
    reg = FeatureGroupingRegressor(regularizer="none", early_stopping=False, max_epochs=300,
                                   batch_size=batch_size, random_state=0).fit(X, y)
    ols = LinearRegression().fit(X, y)
    np.testing.assert_allclose(reg.predict(X), ols.predict(X), rtol=0, atol=atol * y.std())
    assert reg.score(X, y) == pytest.approx(r2_score(y, reg.predict(X)))


def test_l2_reaches_ridge_on_standardized_features(rng):
    X, y = _linear_problem(rng, n=300)
    alpha = 0.05
    reg = FeatureGroupingRegressor(regularizer="l2", alpha=alpha, early_stopping=False,
                                   max_epochs=300, batch_size=len(y), random_state=0).fit(X, y)
    Xs = StandardScaler().fit_transform(X.astype(np.float64))
    # mean half squared error + alpha/2 |w|² on the standardized target is Ridge(n alpha)
    ridge = Ridge(alpha=alpha * len(y)).fit(Xs, y)
    np.testing.assert_allclose(reg.coef_, ridge.coef_, rtol=1e-4, atol=1e-5 * y.std())
    assert reg.intercept_ == pytest.approx(ridge.intercept_, abs=1e-5 * y.std())


def _smooth_maps(rng, shape=(14, 16, 14), n=240):
    """SYNTHETIC: the target scales a smooth pattern, hidden in white noise 20x its size."""
    pattern = ndimage.gaussian_filter(rng.standard_normal(shape), 2.5)
    pattern /= pattern.std()
    t = rng.standard_normal(n)
    X = 0.05 * t[:, None] * pattern.ravel() + rng.standard_normal((n, pattern.size))
    return X.astype(np.float32), t, np.ones(shape, bool)


def test_feature_grouping_beats_ridge_on_smooth_maps_in_white_noise(rng):
    X, y, mask = _smooth_maps(rng)
    train, test = slice(0, 160), slice(160, None)
    fg = FeatureGroupingRegressor(mask=mask, n_groupings=20, random_state=0).fit(X[train],
                                                                                y[train])
    ridge = RidgeCV(alphas=np.logspace(-2, 6, 17)).fit(X[train], y[train])
    assert fg.score(X[test], y[test]) > ridge.score(X[test], y[test]) + 0.1


def test_images_in_and_a_map_out(rng):
    X, y, mask = _smooth_maps(rng, shape=(8, 9, 7), n=60)
    img = mask_img(mask)
    imgs = [unmask(x, mask, img.affine) for x in X]
    reg = FeatureGroupingRegressor(n_groupings=4, max_epochs=10, random_state=0).fit(imgs, y)
    on_arrays = FeatureGroupingRegressor(mask=mask, n_groupings=4, max_epochs=10,
                                         random_state=0).fit(X, y)
    np.testing.assert_allclose(reg.predict(imgs), on_arrays.predict(X), rtol=1e-5, atol=1e-6)
    assert reg.coef_img_.shape == mask.shape
    np.testing.assert_allclose(mask_images(reg.coef_img_, reg.mask_img_)[0], reg.coef_,
                               rtol=1e-6)


@pytest.mark.parametrize("regularizer", ["feature_grouping", "l2"])
def test_streamed_regression_equals_in_memory(client, tmp_path, regularizer):
    X, _, mask, split = smooth_cohort()
    rng = np.random.default_rng(0)
    target = X @ rng.standard_normal(X.shape[1]) * 3.0 + 50.0  # in units far from 0 and 1
    store = write_store(tmp_path / "r.zarr", X, None, mask, np.eye(4), target=target,
                        split=split, block_rows=16)
    assert not store.has_labels
    train = split == "train"
    params = dict(regularizer=regularizer, n_groupings=4, n_bootstrap=10, max_epochs=15,
                  random_state=0)
    memory = FeatureGroupingRegressor(mask=mask, **params).fit(X[train], target[train])
    streamed = FeatureGroupingRegressor(**params).fit(str(store.path), client=client)
    assert streamed.y_mean_ == pytest.approx(memory.y_mean_)
    assert streamed.y_scale_ == pytest.approx(memory.y_scale_)
    np.testing.assert_allclose(streamed.predict(X), memory.predict(X), rtol=1e-5,
                               atol=1e-5 * target.std())
    with pytest.raises(ValueError, match="has no class labels"):
        FeatureGroupingClassifier(**params).fit(str(store.path), client=client)


def test_a_store_without_targets_is_refused_with_a_message(tiny_store, client):
    with pytest.raises(ValueError, match="has no target"):
        FeatureGroupingRegressor().fit(str(tiny_store.path), client=client)


def test_class_labels_given_to_the_regressor_are_refused_naming_y(rng):
    X = rng.standard_normal((30, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"y must be numeric targets, got 'old' \(sample 0\); "
                                         "for class labels use FeatureGroupingClassifier"):
        FeatureGroupingRegressor().fit(X, np.array(["old", "young"] * 15))
    # a table's column of numbers with one gap: the gap is named, not the first number
    ages = [f"{20 + i}.5" for i in range(29)] + [""]
    with pytest.raises(ValueError, match=r"got '' \(sample 29\)"):
        FeatureGroupingRegressor().fit(X, ages)
    as_text = FeatureGroupingRegressor(max_epochs=3, random_state=0).fit(X, [str(v) for v in
                                                                           range(30)])
    as_numbers = FeatureGroupingRegressor(max_epochs=3, random_state=0).fit(X, np.arange(30.0))
    np.testing.assert_array_equal(as_text.coef_, as_numbers.coef_)


def test_a_constant_target_is_warned_of_and_scored_as_undefined(rng, tmp_path, client):
    from fgscale.runs._scores import regression_report

    X = rng.standard_normal((30, 8)).astype(np.float32)
    with pytest.warns(UserWarning, match="the target is 50 for all 30 training samples") as seen:
        reg = FeatureGroupingRegressor(max_epochs=3, random_state=0).fit(X, np.full(30, 50.0))
    # the warning names the line that called fit, here, not a line of fgscale
    assert [w.filename for w in seen if "the target is" in str(w.message)] == [__file__]
    store = write_store(tmp_path / "s.zarr", X, np.zeros(30, int), np.ones((2, 4, 1), bool),
                        np.eye(4), target=np.full(30, 50.0))
    with pytest.warns(UserWarning, match="the target is 50 for all 30") as seen:
        FeatureGroupingRegressor(max_epochs=3, n_groupings=2, random_state=0).fit(
            str(store.path), client=client)
    assert [w.filename for w in seen if w.category is not ConvergenceWarning] == [__file__]
    np.testing.assert_allclose(reg.predict(X), 50.0, atol=1e-4)
    # r2_score says 1 (or 0) where the targets do not vary; the report says undefined
    report = regression_report(np.full(4, 50.0), [50.0, 50.0, 50.0, 50.0])
    assert report["r2"] is None and report["mae"] == 0.0
    assert regression_report([1.0, 2.0], [1.0, 2.0])["r2"] == 1.0


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_the_attributes_section_lists_every_fitted_attribute_with_its_shape(rng, Estimator):
    """Every public attribute a fit sets is in the docstring's Attributes section, every one
    listed there is set, and each "ndarray of shape (...)" has that shape."""
    import re

    import pandas as pd

    X, _, mask = _smooth_maps(rng, shape=(5, 6, 4), n=60)
    y = np.arange(60) % 3 if Estimator is FeatureGroupingClassifier else X[:, 0]
    named = pd.DataFrame(X, columns=[f"v{i}" for i in range(X.shape[1])])
    est = Estimator(mask=mask_img(mask), n_groupings=3, n_bootstrap=10, max_epochs=3,
                    random_state=0).fit(named, y)
    section = Estimator.__doc__.split("    Attributes\n")[1].split("    Examples\n")[0]
    entries = dict(re.findall(r"^    (\w[\w, ]*) : (.*)$", section, re.M))
    documented = {name.strip(): kind for names, kind in entries.items()
                  for name in names.split(",")}
    fitted = {name for name in vars(est) if name.endswith("_") and not name.startswith("_")}
    assert fitted <= set(documented), fitted - set(documented)
    sizes = dict(n_features=X.shape[1], n_classes=3, n_groupings=3)
    for name, kind in documented.items():
        value = getattr(est, name)  # properties (coef_img_) too
        shape = re.search(r"of shape \(([\w, ]+)\)", kind)
        if shape and value is not None:
            expected = tuple(sizes[s.strip()] for s in shape.group(1).split(",") if s.strip())
            assert np.shape(value) == expected, (name, kind)


@pytest.mark.parametrize("Estimator, wrapper", [
    (FeatureGroupingRegressor, "MultiOutputRegressor"),
    (FeatureGroupingClassifier, "MultiOutputClassifier"),
])
def test_several_targets_are_refused_naming_the_wrapper_that_fits_them(rng, Estimator, wrapper):
    import pandas as pd
    from sklearn.multioutput import MultiOutputClassifier, MultiOutputRegressor

    X = rng.standard_normal((40, 8)).astype(np.float32)
    Y = np.c_[X[:, 0], X[:, 1]] if Estimator is FeatureGroupingRegressor else (
        np.c_[X[:, 0] > 0, X[:, 1] > 0].astype(int))
    message = (rf"^{Estimator.__name__} fits one column of y, got y of shape \(40, 2\): wrap it "
               rf"in sklearn.multioutput.{wrapper}")
    for y in (Y, pd.DataFrame(Y, columns=["a", "b"])):
        with pytest.raises(ValueError, match=message):
            Estimator().fit(X, y)
    wrapped = {"MultiOutputRegressor": MultiOutputRegressor,
               "MultiOutputClassifier": MultiOutputClassifier}[wrapper]
    fitted = wrapped(Estimator(max_epochs=3, random_state=0)).fit(X, Y)
    assert fitted.predict(X).shape == (40, 2)
    # a single column is one target, as scikit-learn takes it (with its warning)
    with pytest.warns(UserWarning, match="column-vector y"):
        Estimator(max_epochs=3, random_state=0).fit(X, Y[:, :1])


def test_a_fixed_step_that_diverges_is_an_error_not_a_model_of_nans(rng):
    """As scikit-learn's SGD and MLP estimators refuse non-finite weights: a fit whose weights
    overflow says so, naming the step, and the estimator keeps its previous model."""
    X = rng.standard_normal((200, 10)).astype(np.float32)
    y = X[:, 0] * 1e3
    est = FeatureGroupingRegressor(regularizer="none", max_epochs=5, random_state=0).fit(X, y)
    before = est.predict(X)
    with pytest.raises(ValueError, match=r"training diverged: the model's weights are not "
                                         r"finite after \d+ epochs? with learning_rate=1e\+30; "
                                         r"use learning_rate='auto'"):
        est.set_params(learning_rate=1e30).fit(X, y)
    np.testing.assert_array_equal(est.predict(X), before)
