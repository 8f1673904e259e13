"""The parameter table drives the estimator's signature, docstring, validation and CLI."""

import inspect

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.cli import build_parser, main
from fgscale.estimators._params import PARAMS, params_to_json

BAD = [
    ("model", "svm"), ("regularizer", "lasso"), ("alpha", -1.0), ("alpha", float("nan")),
    ("dropout", 1.0), ("dropout", -0.1), ("n_clusters", 0), ("n_clusters", 1.5),
    ("n_clusters", True), ("n_groupings", 0), ("n_bootstrap", 0), ("n_bootstrap", 2.5),
    ("hidden_layer_sizes", ()), ("hidden_layer_sizes", (0,)), ("learning_rate", 0.0),
    ("batch_size", 0), ("max_epochs", 0), ("replicas", 0), ("replicas", 1.5), ("early_stopping", "sometimes"),
    ("validation_fraction", 1.0), ("patience", 0), ("device", "gpu-please"), ("prefetch", 0),
    ("verbose", -1), ("random_state", -3),
]


def test_signature_and_docstring_come_from_the_table():
    signature = inspect.signature(FeatureGroupingClassifier)
    assert [(n, p.default) for n, p in signature.parameters.items()] == [
        (p.name, p.default) for p in PARAMS]
    assert FeatureGroupingClassifier().get_params() == {p.name: p.default for p in PARAMS}
    for p in PARAMS:
        assert f"    {p.name} : {p.type_doc}, default={p.default!r}\n" in (
            FeatureGroupingClassifier.__doc__)
    with pytest.raises(TypeError, match="unexpected parameter"):
        FeatureGroupingClassifier(n_cluster=3)
    # by position, as a user may try: the estimator named, not the base class
    with pytest.raises(TypeError, match=r"^FeatureGroupingRegressor takes keyword arguments "
                                        r"only, as scikit-learn's estimators: got 'l2' by"):
        FeatureGroupingRegressor("l2")


@pytest.mark.parametrize(("name", "value"), BAD)
def test_in_memory_and_store_fits_refuse_the_same_values(name, value, tiny_store, rng):
    X = rng.standard_normal((20, 5)).astype(np.float32)
    y = np.arange(20) % 2
    clf = FeatureGroupingClassifier(**{name: value})
    with pytest.raises(ValueError, match=name) as in_memory:
        clf.fit(X, y)
    with pytest.raises(ValueError, match=name) as on_store:  # before any cluster starts
        clf.fit(tiny_store.path)
    assert str(in_memory.value) == str(on_store.value)


def test_good_values_pass():
    for params in ({"n_clusters": 3}, {"n_clusters": 0.5}, {"early_stopping": False},
                   {"prefetch": 2}, {"hidden_layer_sizes": [8, 4]},
                   {"random_state": np.random.RandomState(0)}, {"alpha": 0},
                   {"verbose": True}, {"verbose": False}, {"verbose": 2}):
        FeatureGroupingClassifier(**params)._check_params()


def test_verbose_true_draws_the_progress_bar_as_verbose_1(rng, capfd):
    """verbose=True, as scikit-learn's estimators take it, is verbose=1: a bar over epochs."""
    X = rng.standard_normal((40, 6)).astype(np.float32)
    FeatureGroupingClassifier(verbose=True, regularizer="none", max_epochs=3,
                              random_state=0).fit(X, np.arange(40) % 2)
    assert "epoch" in capfd.readouterr().err


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_a_client_given_with_arrays_is_warned_of_at_the_callers_line(Estimator, rng, client):
    """fit(X, y, client=client) on arrays trained in this process with no word of it: the
    cluster is used for a store only."""
    X = rng.standard_normal((40, 6)).astype(np.float32)
    # one phase (cv=None, one candidate): nothing for the cluster to train
    estimator = Estimator(regularizer="none", max_epochs=2, random_state=0, cv=None)
    with pytest.warns(UserWarning, match="client is used by a fit on a store") as caught:
        estimator.fit(X, np.arange(40) % 2, client=client)
    assert [w.filename for w in caught if w.category is not ConvergenceWarning] == [__file__]


def test_cli_options_come_from_the_table():
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    options = {a.dest: a for a in train._actions}
    for p in PARAMS:
        if p.cli:
            assert p.name in options, p.name
            assert "(default: " in options[p.name].help
    args = parser.parse_args(["train", "s.zarr", "--out", "r", "--n-clusters", "500",
                              "--early-stopping", "off", "--prefetch", "3",
                              "--hidden-layer-sizes", "32", "16"])
    assert (args.n_clusters, args.early_stopping, args.prefetch) == (500, False, 3)
    assert args.hidden_layer_sizes == [32, 16]
    defaults = parser.parse_args(["train", "s.zarr", "--out", "r"])
    for p in PARAMS:
        if p.cli and p.name != "hidden_layer_sizes":
            assert getattr(defaults, p.name) == p.default


def test_cli_refuses_a_bad_value_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "run"),
              "--dropout", "1.5"])
    assert exc.value.code == 2
    assert "--dropout" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"fgscale {version('fgscale')}"


def test_params_to_json_keeps_plain_values():
    params = params_to_json(FeatureGroupingClassifier(hidden_layer_sizes=(8,)).get_params())
    assert params["hidden_layer_sizes"] == [8] and params["mask"] is None
    assert params["early_stopping"] == "auto"
