"""fit(store, client=...) with several phases to train (the folds of cv=, several candidates)
on a cluster of worker processes: each phase trains as a task on a worker, which reads its
fold's rows from the store itself, with the numbers of the fit that trains the phases one
after the other in this process (its batches streamed from a cluster of one thread worker)."""

import logging

import numpy as np
import pytest
from helpers import assert_same_search, smooth_cohort

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor
from fgscale.store import write_store
from fgscale.training import History

# screening is on by default: at 20 mm voxels the mask is a larger volume than a brain's 20%,
# so it keeps a part of each grouping's clusters
SMALL = dict(n_groupings=3, n_bootstrap=6, n_clusters=[0.05, 0.2], cv=2, batch_size=8,
             max_epochs=4, patience=2, random_state=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SYNTHETIC store of 60 rows (3 classes, and a numeric target), its voxels 20 mm."""
    X, y, mask, split = smooth_cohort(n=60)
    # below -1 for some rows: the mean squared log error refuses them
    target = X[:, :40].mean(axis=1) * 3.0 - 1.0
    path = tmp_path_factory.mktemp("parallel_store_folds") / "cohort.zarr"
    return write_store(path, X, y, mask, np.diag([20.0, 20.0, 20.0, 1.0]), target=target,
                       split=split, block_rows=8, attrs={"synthetic": True})


@pytest.fixture(scope="module")
def threads():
    """One thread worker in this process: no room for phases side by side, so the fit
    trains them here, one after the other (the oracle)."""
    from distributed import Client, LocalCluster

    # a dashboard on a free port: None would still take 8787, perhaps another cluster's
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:
        with Client(cluster, set_as_default=False) as c:
            yield c


def test_a_source_in_process_reads_the_blocks_that_the_cluster_reads(store, client):
    import pickle

    from fgscale.training import StoreSource, build_model, epoch_plan, evaluate

    source = StoreSource(client, store, lipschitz=True)
    # what a phase's task carries: no client, so that it pickles
    local = pickle.loads(pickle.dumps(source.in_process()))
    assert local.prefetcher.client is None and source.prefetcher.client is client
    plan = epoch_plan(store.train_rows(), batch_size=8, epoch=0, seed=0)
    for here, there in zip(local.batches(plan), source.batches(plan), strict=True):
        np.testing.assert_array_equal(here.x, there.x)
        np.testing.assert_array_equal(here.y, there.y)
        assert here.lipschitz == pytest.approx(there.lipschitz, rel=1e-6)
    assert local.prefetcher.max_seen == 1  # one block at a time
    model = build_model("logreg", store.n_features, len(store.classes))
    rows = store.test_rows()
    assert evaluate(model, local.blocks(rows)) == pytest.approx(
        evaluate(model, source.blocks(rows)), rel=1e-6)


def _fit_recorded(estimator, store, client, **fit_kw):
    """``estimator`` fitted on ``store``, and the names (key prefixes) and workers of the tasks
    that ran on ``client`` meanwhile."""
    from distributed import get_task_stream

    with get_task_stream(client=client) as stream:
        estimator.fit(store.path, client=client, **fit_kw)
    return estimator, [(t["key"].split("-")[0], t["worker"]) for t in stream.data]


def _phases(tasks):
    return [worker for name, worker in tasks if name == "train_phase"]


def _assert_same_fit(parallel, sequential):
    assert parallel.screening_percentile_ < 100  # screening was on
    assert_same_search(parallel, sequential, rtol=1e-5)


@pytest.mark.parametrize("refit", [True, False])
def test_a_classifier_cv_on_a_store_trains_its_phases_on_the_workers(store, client, threads,
                                                                     refit, caplog):
    params = dict(SMALL, refit=refit)
    sequential, here = _fit_recorded(FeatureGroupingClassifier(**params), store, threads)
    assert not _phases(here) and any(name == "load_step" for name, _ in here)
    with caplog.at_level(logging.INFO, logger="fgscale.estimators._parallel"):
        parallel, there = _fit_recorded(FeatureGroupingClassifier(**params), store, client)
    assert ("training 4 phases (2 candidate(s) x 2 fold(s)) on 2 Dask worker(s), 2 thread(s), "
            "each phase reading its rows from the store") in caplog.text
    # every phase a task, on both worker processes, each reading its own rows: the cluster
    # reads blocks for the refit alone
    assert len(_phases(there)) == 4 and len(set(_phases(there))) == 2
    assert any(name == "load_step" for name, _ in there) == refit
    _assert_same_fit(parallel, sequential)
    X = store.read_rows(np.arange(store.n_samples))
    labels = store.classes[store.y]
    assert parallel.score(X, labels) == pytest.approx(sequential.score(X, labels))


def test_a_regressor_cv_on_a_store_trains_its_phases_on_the_workers(store, client, threads):
    params = dict(SMALL, alpha=[0.0, 0.1])
    sequential, _ = _fit_recorded(FeatureGroupingRegressor(**params), store, threads)
    parallel, there = _fit_recorded(FeatureGroupingRegressor(**params), store, client)
    assert len(parallel.cv_results_) == 4 and len(_phases(there)) == 8
    _assert_same_fit(parallel, sequential)


def test_a_store_search_with_a_checkpoint_hook_trains_here(store, client):
    class Recorded(History):
        """A run folder's hook stand-in: its checkpoints are written by this process."""

    _, there = _fit_recorded(FeatureGroupingClassifier(**SMALL), store, client,
                             checkpoint=Recorded)
    assert not _phases(there)


def test_an_error_in_a_workers_store_phase_is_raised_as_the_fit_here_raises_it(store, client,
                                                                              threads):
    # the store's targets below -1: the mean squared log error refuses them when a fold is
    # scored
    params = dict(SMALL, scoring="neg_mean_squared_log_error")
    with pytest.raises(ValueError, match="Mean Squared Logarithmic Error cannot be used") as here:
        FeatureGroupingRegressor(**params).fit(store.path, client=threads)
    with pytest.raises(ValueError, match="Mean Squared Logarithmic Error cannot be used") as there:
        FeatureGroupingRegressor(**params).fit(store.path, client=client)
    assert type(there.value) is type(here.value)


def test_phases_whose_model_outgrows_half_a_workers_memory_limit_train_here(client):
    from fgscale.estimators._parallel import PHASE_COPIES, fits_on_workers

    # the session's cluster: 2 GiB a worker
    assert fits_on_workers(client, 2**30) and not fits_on_workers(client, 2**30 + 1)
    mlp = FeatureGroupingClassifier(model="mlp", hidden_layer_sizes=(256,))
    mlp.classes_ = np.arange(3)
    mlp.n_features_in_ = 2**30 // (PHASE_COPIES * 4 * 256)  # a phase's layer: half the limit
    assert mlp._search_client(client, 4, History, streamed=True) is client
    mlp.n_features_in_ += 1
    assert mlp._search_client(client, 4, History, streamed=True) is None
