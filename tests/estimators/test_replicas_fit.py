"""``replicas=R`` of the estimators: a fit streamed from a store whose epochs train on R worker
processes of a real LocalCluster (the session's, two processes) equals the fit of one process
with R times the batch, validation, early stopping, screening and the refit included; and
what the replicas cannot train is refused before any work."""

import re

import numpy as np
import pytest
from distributed import get_task_stream
from helpers import assert_replicas_leave, smooth_cohort

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.store import write_store

# validation (early stopping, then a refit) and screening are the defaults: at 20 mm voxels
# the mask is a larger volume than a brain's 20%, so screening keeps a part of the clusters
# one validation split (cv=None): a phase of early stopping, then the refit
PARAMS = dict(n_groupings=3, n_bootstrap=6, n_clusters=0.1, max_epochs=5, patience=2,
              random_state=0, cv=None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SYNTHETIC store of 150 rows (3 classes, and a numeric target), its voxels 20 mm."""
    X, y, mask, split = smooth_cohort(n=150)
    target = X[:, :40].mean(axis=1) * 3.0 + 5.0
    path = tmp_path_factory.mktemp("replicas_fit") / "cohort.zarr"
    return write_store(path, X, y, mask, np.diag([20.0, 20.0, 20.0, 1.0]), target=target,
                       split=split, block_rows=16, attrs={"synthetic": True})


def assert_same_fit(replicated, single):
    assert replicated.screening_percentile_ < 100  # screening was on
    assert replicated.n_iter_ == single.n_iter_
    assert [h.get("phase") for h in replicated.history_] == [
        h.get("phase") for h in single.history_]
    assert any(h.get("phase") == "refit" for h in single.history_)
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose([h.get(key, np.nan) for h in replicated.history_],
                                   [h.get(key, np.nan) for h in single.history_], rtol=1e-4,
                                   err_msg=key)
    np.testing.assert_allclose(replicated.coef_, single.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(replicated.intercept_, single.intercept_, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("Estimator", [FeatureGroupingClassifier, FeatureGroupingRegressor])
def test_two_replicas_fit_as_one_process_with_twice_the_batch(Estimator, store, client):
    single = Estimator(**PARAMS, batch_size=32).fit(store.path, client=client)
    with get_task_stream(client) as stream:
        replicated = Estimator(**PARAMS, batch_size=16, replicas=2).fit(store.path,
                                                                         client=client)
    assert replicated.batch_size_ == 16
    assert_same_fit(replicated, single)
    # the replicas start once a phase (early stopping's, then the refit), not once an epoch
    started = [t for t in stream.data if str(t["key"]).startswith("serve_replica")]
    assert len(started) == 2 * 2 < 2 * len(replicated.history_)


def test_auto_batch_size_shares_the_step_among_the_replicas():
    clf = FeatureGroupingClassifier(replicas=3)
    assert clf._batch_size(1000) == 34  # a step of 100 rows, in 3 shares rounded up
    assert FeatureGroupingClassifier()._batch_size(1000) == 100
    assert FeatureGroupingClassifier(replicas=3, batch_size=10)._batch_size(1000) == 10


@pytest.mark.parametrize(("params", "message"), [
    (dict(replicas=0), r"'replicas' parameter of FeatureGroupingClassifier must be an int "),
    (dict(replicas=2, regularizer="l2"),
     r"^replicas=2 needs feature grouping, regularizer='feature_grouping': with "
     r"regularizer='l2' .* give replicas=1 to train it$"),
    (dict(replicas=2, regularizer="dropout"), r"^replicas=2 needs feature grouping"),
    (dict(replicas=2, model="cnn"), r"^replicas=2 needs model='logreg' or 'mlp'"),
    pytest.param(dict(replicas=2, device="cuda"), r"^replicas=2 trains on the CPUs of the "
                 r"cluster's worker processes: device must be 'cpu'", marks=pytest.mark.cuda),
])
def test_what_replicas_cannot_train_is_refused_at_fit_start(params, message, store):
    # no client: a refusal that came later would start a cluster first
    with pytest.raises(ValueError, match=message):
        FeatureGroupingClassifier(**params).fit(store.path)


def test_replicas_refuse_arrays_and_a_cluster_of_too_few_processes(store, client, rng):
    X = rng.standard_normal((30, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^replicas=2: replicas apply to a fit streamed from "
                                         r"a store \(X a store's path or Store\); with arrays "
                                         r"or images, give replicas=1$"):
        FeatureGroupingRegressor(replicas=2).fit(X, X[:, 0])
    clf = FeatureGroupingClassifier(**PARAMS, replicas=3)
    with pytest.raises(ValueError, match=r"^replicas=3 needs as many worker processes; the "
                                         r"cluster has 2 \("):
        clf.fit(store.path, client=client)
    assert not hasattr(clf, "mean_")  # refused before the statistics, left unfitted


def test_a_replicas_worker_lost_between_two_epochs_stops_the_fit_as_a_lost_replica(store):
    """The worker of a replica gone after an epoch ended (the replicas waiting for the next
    one): the next epoch stops the fit with a ReplicaLost that names the replica and its
    worker (the command line's one line and its --resume hint), not with the refusal of a
    cluster too small from the start."""
    from distributed import Client, LocalCluster

    from fgscale.training import History
    from fgscale.training._replicas import ReplicaLost

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as own:
        first = sorted(own.nthreads())[0]  # replica 0's: the ranks follow the sorted addresses

        class LoseAWorker(History):
            """After the first epoch, one of the two worker processes is closed."""

            def epoch_end(self, metrics):
                super().epoch_end(metrics)
                if len(self.history) == 1:
                    own.retire_workers([first], close_workers=True)

        fit = FeatureGroupingClassifier(**dict(PARAMS, n_clusters=0.1), batch_size=16,
                                        replicas=2, early_stopping=False)
        with pytest.raises(ReplicaLost, match=rf"^replica 0 of 2 was lost: its worker "
                                              rf"{re.escape(first)} left the Dask cluster \("):
            fit.fit(store.path, client=own, checkpoint=LoseAWorker)
        assert_replicas_leave(own)  # the other replica left too, its process group torn down
