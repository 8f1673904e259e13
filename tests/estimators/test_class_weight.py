"""``class_weight``: the weighted loss against duplicated rows and scikit-learn's logistic
regression, the weighted validation metrics, the step size, and the parameter's round trips."""

import json

import numpy as np
import pytest
import torch
from helpers import smooth_cohort
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, balanced_accuracy_score, log_loss
from sklearn.utils.class_weight import compute_class_weight

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor, load_model, save_model
from fgscale._utils.constraints import InvalidParameterError
from fgscale.training import LogisticRegression as TorchLogReg
from fgscale.training import evaluate, lipschitz

FULL_BATCH = dict(standardize=False, early_stopping=False, batch_size=1000, random_state=0)


def _imbalanced(rng, counts=(30, 10), p=5, shift=0.8):
    y = np.repeat(np.arange(len(counts)), counts)
    X = rng.standard_normal((len(y), p)) + shift * rng.standard_normal((len(counts), p))[y]
    return X.astype(np.float32), y


def test_class_weights_train_as_duplicated_rows(rng):
    """Weight 3 on a class is its rows three times over: the same full-batch steps (the
    step size too), so the same weights to float rounding."""
    X, y = _imbalanced(rng)
    params = dict(FULL_BATCH, regularizer="none", max_epochs=60)
    weighted = FeatureGroupingClassifier(class_weight={1: 3.0}, **params).fit(X, y)
    again = np.concatenate([np.arange(len(y))] + [np.flatnonzero(y == 1)] * 2)
    duplicated = FeatureGroupingClassifier(**params).fit(X[again], y[again])
    assert weighted.n_iter_ == duplicated.n_iter_  # the same training losses stop both
    np.testing.assert_allclose(weighted.coef_, duplicated.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weighted.intercept_, duplicated.intercept_, rtol=1e-4, atol=1e-6)
    # rescaled to average 1 over the training rows: 30 rows of 1, 10 of 3, over 40 rows
    np.testing.assert_allclose(weighted.class_weight_, np.array([1.0, 3.0]) * 40 / 60)
    assert not np.allclose(weighted.coef_, FeatureGroupingClassifier(**params).fit(X, y).coef_,
                           atol=1e-3)


@pytest.mark.parametrize("class_weight", ["balanced", {"b": 0.5, "c": 4.0}])
def test_l2_with_class_weights_reaches_scikit_learns_logistic_regression(rng, class_weight):
    """Mean weighted cross-entropy + alpha/2 |W|², weights averaging 1, is scikit-learn's
    C * sum_i w_i loss_i + |W|²/2 with C = 1 / (alpha n): the same minimum, three classes."""
    X, y_idx = _imbalanced(rng, counts=(50, 20, 10), p=6, shift=1.5)
    y = np.array(["a", "b", "c"])[y_idx]
    alpha = 0.05
    clf = FeatureGroupingClassifier(class_weight=class_weight, regularizer="l2", alpha=alpha,
                                    max_epochs=5000, tol=0.0, **FULL_BATCH).fit(X, y)
    weights = compute_class_weight(class_weight, classes=clf.classes_, y=y)
    weights = weights * len(y) / weights[y_idx].sum()  # scikit-learn's, rescaled as fgscale's
    np.testing.assert_allclose(clf.class_weight_, weights, rtol=1e-12)
    ref = LogisticRegression(C=1.0 / (alpha * len(y)), class_weight=dict(zip("abc", weights, strict=True)),
                             solver="newton-cg", tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(clf.coef_, ref.coef_, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(clf.predict_proba(X), ref.predict_proba(X), atol=1e-4)


def test_balanced_weights_raise_the_balanced_accuracy_as_scikit_learns_do(rng):
    """Two overlapping Gaussian classes, 10 times as many training rows of one: unweighted,
    the model favours it; balanced, it gains what scikit-learn's balanced model gains."""
    shift = 0.25 * rng.standard_normal(20)

    def draw(counts, seed):
        y = np.repeat([0, 1], counts)
        noise = np.random.default_rng(seed).standard_normal((len(y), 20))
        return (noise + np.where(y[:, None] == 1, shift, -shift)).astype(np.float32), y

    (X, y), (X_test, y_test) = draw((400, 40), 1), draw((2000, 2000), 2)

    def score(model):
        return balanced_accuracy_score(y_test, model.fit(X, y).predict(X_test))

    ours = {cw: score(FeatureGroupingClassifier(class_weight=cw, regularizer="l2",
                                                random_state=0)) for cw in (None, "balanced")}
    theirs = {cw: score(LogisticRegression(class_weight=cw)) for cw in (None, "balanced")}
    assert ours["balanced"] > ours[None] + 0.05, (ours, theirs)
    assert ours["balanced"] > theirs["balanced"] - 0.02, (ours, theirs)


def test_validation_loss_and_accuracy_are_weighted_as_scikit_learns_metrics(rng):
    X, y = _imbalanced(rng, counts=(25, 15, 8), p=4)
    model = TorchLogReg(4, 3)
    with torch.no_grad():
        model.first.weight.copy_(torch.as_tensor(rng.standard_normal((3, 4)), dtype=torch.float32))
    weights = np.array([0.5, 1.0, 3.0])
    blocks = [(X[:20], y[:20]), (X[20:], y[20:])]  # any split into blocks: the same means
    got = evaluate(model, blocks, class_weight=torch.as_tensor(weights, dtype=torch.float32))
    proba = torch.softmax(model(torch.as_tensor(X)), 1).detach().numpy()
    w = weights[y]
    assert got["loss"] == pytest.approx(log_loss(y, proba, sample_weight=w), rel=1e-5)
    assert got["accuracy"] == pytest.approx(accuracy_score(y, proba.argmax(1), sample_weight=w))
    assert got["n"] == len(y)
    plain = evaluate(model, blocks)
    assert plain["loss"] == pytest.approx(log_loss(y, proba), rel=1e-5)


@pytest.mark.parametrize("m", [40, 300])  # the Gram matrix's way, then power iterations
def test_the_step_of_weighted_rows_is_that_of_the_rows_repeated(rng, m):
    x = torch.as_tensor(rng.standard_normal((m, 7)) + 2.0, dtype=torch.float32)
    counts = rng.integers(1, 4, m)
    weights = torch.as_tensor(counts * m / counts.sum(), dtype=torch.float32)  # mean 1
    repeated = x.repeat_interleave(torch.as_tensor(counts), dim=0)
    # power iterations from another start: within their tolerance
    assert lipschitz(x, weights=weights) == pytest.approx(lipschitz(repeated, n_iter=50),
                                                          rel=1e-4 if m <= 64 else 1e-2)
    assert lipschitz(x, weights=torch.ones(m)) == pytest.approx(lipschitz(x), rel=1e-6)


def test_streamed_training_with_class_weights_equals_in_memory(tmp_path, client):
    from fgscale.store import write_store

    X, y, mask, split = smooth_cohort()
    path = tmp_path / "s.zarr"
    write_store(path, X, y, mask, np.eye(4), split=split, block_rows=16)
    params = dict(class_weight={"c": 3.0}, n_clusters=0.1, n_groupings=6, n_bootstrap=12,
                  max_epochs=8, batch_size=16, random_state=5)
    train = split == "train"
    memory = FeatureGroupingClassifier(mask=mask, **params).fit(X[train], y[train])
    streamed = FeatureGroupingClassifier(**params).fit(path, client=client)
    np.testing.assert_allclose(streamed.class_weight_, memory.class_weight_)
    assert [h["val_loss"] for h in streamed.history_ if "val_loss" in h] == pytest.approx(
        [h["val_loss"] for h in memory.history_ if "val_loss" in h], rel=1e-5)
    np.testing.assert_allclose(streamed.coef_, memory.coef_, rtol=1e-5, atol=1e-6)


def test_bad_class_weights_are_refused_naming_what_is_wrong(rng):
    X, y = _imbalanced(rng)
    with pytest.raises(ValueError, match=r"class_weight names \[2\], which are not classes.*\[0, 1\]"):
        FeatureGroupingClassifier(class_weight={2: 1.0}, **FULL_BATCH).fit(X, y)
    for bad in ("balance", {0: -1.0}, {0: np.nan}, {}):
        with pytest.raises(InvalidParameterError, match="'class_weight' parameter"):
            FeatureGroupingClassifier(class_weight=bad).fit(X, y)
    with pytest.raises(TypeError, match=r"unexpected parameter\(s\) \['class_weight'\]"):
        FeatureGroupingRegressor(class_weight="balanced")
    assert "class_weight" not in FeatureGroupingRegressor().get_params()


@pytest.mark.parametrize("labels", [np.array([3, 7]), np.array(["no", "yes"])])
def test_class_weights_come_back_from_a_saved_model(rng, tmp_path, labels):
    X, y_idx = _imbalanced(rng)
    y = labels[y_idx]
    clf = FeatureGroupingClassifier(class_weight={labels[1].item(): 2.5}, **FULL_BATCH,
                                    max_epochs=5).fit(X, y)
    save_model(clf, tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["params"]["class_weight"] == {str(labels[1]): 2.5}
    back = load_model(tmp_path / "m")
    assert back.get_params() == clf.get_params()
    assert type(next(iter(back.class_weight))) is type(labels[1].item())
    np.testing.assert_array_equal(back.class_weight_, clf.class_weight_)
    np.testing.assert_array_equal(back.predict(X), clf.predict(X))


def test_a_saved_regressor_has_no_class_weights(rng, tmp_path):
    """A regressor has no classes to weigh: its model.json says nothing of class weights, and
    it loads back without them."""
    X = rng.standard_normal((40, 16)).astype(np.float32)
    reg = FeatureGroupingRegressor(**FULL_BATCH, max_epochs=3).fit(X, X[:, 0])
    save_model(reg, tmp_path / "m")
    assert "class_weight_" not in json.loads((tmp_path / "m" / "model.json").read_text())
    assert not hasattr(load_model(tmp_path / "m"), "class_weight_")
