"""A fit on a store's rows through the estimator's public ``fit``: the store opened once and
each bank's key resolved once in the process that fits (workers open it for themselves), the
``rows`` of a fold and a ``checkpoint`` hook, and what applies to a store only refused
elsewhere."""

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from fgscale import FeatureGroupingClassifier
from fgscale.grouping import _dask_bank
from fgscale.store import Store, open_store
from fgscale.training import History

PARAMS = dict(n_groupings=3, n_bootstrap=8, n_clusters=[0.1, 0.2], batch_size=8,
              max_epochs=2, random_state=0)


def _counted(monkeypatch, owner, name):
    """Calls of ``owner.name`` in this process, counted; the real one still does the work."""
    calls = []
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.mark.parametrize("given", ["path", "store"])
def test_a_fit_opens_the_store_once_and_resolves_each_bank_key_once(
        given, tiny_store, client, monkeypatch, tmp_path):
    monkeypatch.setenv("FGSCALE_CACHE_DIR", str(tmp_path / "cache"))  # banks of its own
    store = open_store(tiny_store.path) if given == "store" else tiny_store.path
    opened = _counted(monkeypatch, Store, "__init__")
    keys = _counted(monkeypatch, _dask_bank, "bank_key_of")
    clf = FeatureGroupingClassifier(**PARAMS).fit(store, client=client)
    assert len(opened) == (0 if given == "store" else 1)
    # two candidate k, a bank each: each key resolved once, for the check and the build alike
    assert len(keys) == 2 and len({c[0]["n_clusters"] for c in keys}) == 2
    assert clf.n_clusters_ in {c[0]["n_clusters"] for c in keys}


def test_rows_and_checkpoint_of_a_store_fit(tiny_store, client):
    phases = []

    class Recorded(History):
        def epoch_end(self, metrics):
            super().epoch_end(metrics)
            phases.append(self.phase)

    rows = tiny_store.train_rows()[::2]
    clf = FeatureGroupingClassifier(**{**PARAMS, "n_clusters": 0.1})
    clf.fit(tiny_store, client=client, rows=rows, checkpoint=Recorded)
    assert phases and len(phases) == len(clf.history_)
    # the statistics are those of the rows given, not of all the training rows
    X = tiny_store.read_rows(np.unique(rows))
    np.testing.assert_allclose(clf.mean_, X.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_rows_and_checkpoint_apply_to_a_store_only(rng):
    X = rng.standard_normal((20, 5)).astype(np.float32)
    y = np.arange(20) % 2
    with pytest.raises(ValueError, match="rows applies to a fit on a store"):
        FeatureGroupingClassifier().fit(X, y, rows=[0, 1])
    with pytest.raises(ValueError, match="checkpoint applies to a fit on a store"):
        FeatureGroupingClassifier().fit(X, y, checkpoint=History)


def test_check_store_fit_refuses_what_the_fit_would_before_any_cluster(tiny_store, monkeypatch):
    monkeypatch.setattr("fgscale._dask.client.get_client", None)  # any cluster would fail here
    clf = FeatureGroupingClassifier(n_clusters=10**6)
    with pytest.raises(ValueError, match="n_clusters must be at most the number of features"):
        clf.check_store_fit(tiny_store)
    with pytest.raises(ValueError, match="no training rows"):
        FeatureGroupingClassifier().check_store_fit(tiny_store, rows=[])
    checked = FeatureGroupingClassifier()
    checked.check_store_fit(tiny_store)  # passes, and leaves the estimator unfitted
    with pytest.raises(NotFittedError):
        check_is_fitted(checked)
