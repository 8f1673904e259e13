"""model="cnn": the paper's CNN baseline on the mask's grid, with every regularizer."""

import numpy as np
import pytest
import torch
from helpers import dense_phi, random_labels
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from fgscale import FeatureGroupingClassifier
from fgscale.estimators._persist import load_model, save_model
from fgscale.grouping._projection import project
from fgscale.training._models import CNN, build_model


def _grid(rng, shape):
    grid = rng.random(shape) < 0.8
    grid.flat[0] = True
    return grid


@pytest.mark.parametrize("shape", [(9,), (8, 10), (6, 7, 5)])
def test_cnn_places_the_rows_on_the_grid_in_c_order(shape, rng):
    grid = _grid(rng, shape)
    torch.manual_seed(0)
    model = CNN(grid, 3, hidden=16).eval()
    x = rng.standard_normal((4, int(grid.sum()))).astype(np.float32)
    volumes = np.zeros((4, *shape), np.float32)
    volumes[:, grid] = x  # numpy's boolean indexing: C order, as the store's rows
    expected = model.classifier(model.features(torch.from_numpy(volumes)[:, None]).flatten(1))
    torch.testing.assert_close(model(torch.from_numpy(x)), expected)


def test_cnn_on_a_grouping_is_the_cnn_on_the_cluster_means_image(rng):
    """Phi x expanded back is Phi^T Phi x: one SGD step of feature grouping is plain SGD on
    the loss of f(Phi^T Phi x), gradients included (autograd against the dense formula)."""
    grid = _grid(rng, (8, 9))
    p = int(grid.sum())
    labels = random_labels(rng, p, 12)
    x = rng.standard_normal((5, p))
    phi = dense_phi(labels)
    torch.manual_seed(0)
    model = CNN(grid, 4, hidden=8).double()
    y = torch.tensor([0, 1, 2, 3, 0])

    def grads(out):
        model.zero_grad()
        torch.nn.functional.cross_entropy(out, y).backward()
        return [p.grad.clone() for p in model.parameters()]

    reduced = model(torch.from_numpy(project(x, labels, 12)), torch.from_numpy(labels))
    dense = model(torch.from_numpy(x @ phi.T @ phi))
    torch.testing.assert_close(reduced, dense)
    for g_reduced, g_dense in zip(grads(model(torch.from_numpy(project(x, labels, 12)),
                                              torch.from_numpy(labels))),
                                  grads(model(torch.from_numpy(x @ phi.T @ phi))), strict=True):
        torch.testing.assert_close(g_reduced, g_dense)


def test_build_model_refuses_a_cnn_without_a_usable_grid():
    with pytest.raises(ValueError, match="needs the features' grid"):
        build_model("cnn", 10, 2)
    with pytest.raises(ValueError, match="at least 4 long"):
        build_model("cnn", 6, 2, grid=np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        build_model("cnn", 256, 2,
                    grid=np.ones((4, 4, 4, 4), bool))


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return train_test_split(X.astype(np.float32), y, test_size=0.5, random_state=0, stratify=y)


@pytest.mark.parametrize("regularizer", ["none", "dropout", "feature_grouping"])
def test_cnn_classifier_learns_digits(digits, regularizer):
    """Real 8x8 images: the CNN on its grid reaches what a convolutional net should there."""
    X_tr, X_te, y_tr, y_te = digits
    clf = FeatureGroupingClassifier(model="cnn", regularizer=regularizer, n_clusters=0.5,
                                    n_groupings=10, hidden_layer_sizes=(64,),
                                    mask=np.ones((8, 8), bool), max_epochs=40, random_state=0)
    clf.fit(X_tr, y_tr)
    assert clf.score(X_te, y_te) > 0.9
    assert not hasattr(clf, "coef_")


def test_saved_cnn_predicts_as_the_fitted_one(digits, tmp_path):
    X_tr, X_te, y_tr, _ = digits
    mask = np.ones((4, 4, 4), bool)  # the 64 pixels on a 3D grid
    mask[0, 0, 0] = False  # a grid that is not full: the saved grid must be this one
    clf = FeatureGroupingClassifier(model="cnn", regularizer="dropout", mask=mask,
                                    hidden_layer_sizes=(16,), max_epochs=3, random_state=0)
    clf.fit(X_tr[:, 1:], y_tr)
    save_model(clf, tmp_path / "run")
    loaded = load_model(tmp_path / "run")
    np.testing.assert_allclose(loaded.predict_proba(X_te[:, 1:]), clf.predict_proba(X_te[:, 1:]),
                               rtol=1e-5, atol=1e-6)


def test_cnn_runs_on_a_store_as_conv3d_without_maps(tiny_store, tmp_path, client):
    """A store's 3D mask gives a 3D CNN; the run folder has the model but no weight maps."""
    from fgscale.runs import load_run, train_run

    summary = train_run(tiny_store.path, tmp_path / "run", client=client,
                        params={"model": "cnn", "regularizer": "feature_grouping",
                                "hidden_layer_sizes": (8,), "n_groupings": 4, "max_epochs": 2,
                                "early_stopping": False, "random_state": 0})
    assert summary["maps"] is None and not (tmp_path / "run" / "maps.nii.gz").exists()
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0
    clf = load_run(tmp_path / "run")
    assert isinstance(clf.model_.features[0], torch.nn.Conv3d)
