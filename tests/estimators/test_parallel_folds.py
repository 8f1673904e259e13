"""fit(X, y, client=...) on arrays with several phases to train (the folds of cv=, several
candidates): the phases train as tasks on the cluster's workers, with the numbers of the fit
that trains them one after the other in this process."""

import logging
import time

import numpy as np
import pytest
from helpers import assert_same_search, smooth_cohort

from fgscale import FeatureGroupingClassifier, FeatureGroupingRegressor

SMALL = dict(n_groupings=4, n_bootstrap=10, max_epochs=12, patience=3, random_state=0)


@pytest.fixture(scope="module")
def problem():
    X, y, mask, _ = smooth_cohort(n=60)
    return X, y, mask


def _scheduler_tasks(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def _assert_same_fit(parallel, sequential):
    assert_same_search(parallel, sequential, rtol=1e-6)


@pytest.mark.parametrize("refit", [True, False])
def test_a_classifier_cv_on_the_cluster_equals_the_one_in_this_process(problem, client, refit,
                                                                      caplog):
    X, y, mask = problem
    params = dict(mask=mask, n_clusters=[0.05, 0.2], cv=3, refit=refit, **SMALL)
    sequential = FeatureGroupingClassifier(**params).fit(X, y)
    before = _scheduler_tasks(client)
    with caplog.at_level(logging.INFO, logger="fgscale.estimators._parallel"):
        parallel = FeatureGroupingClassifier(**params).fit(X, y, client=client)
    assert "training 6 phases (2 candidate(s) x 3 fold(s)) on 2 Dask worker(s)" in caplog.text
    _assert_same_fit(parallel, sequential)
    assert parallel.score(X, y) == sequential.score(X, y)
    # the rows, banks and phases are released once the fit is done
    deadline = time.monotonic() + 5
    while _scheduler_tasks(client) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _scheduler_tasks(client) <= before


def test_a_regressor_cv_on_the_cluster_equals_the_one_in_this_process(problem, client):
    X, _, mask = problem
    y = X[:, :40].mean(axis=1) * 3 + np.random.default_rng(0).normal(0, 0.1, len(X))
    params = dict(mask=mask, n_clusters=[0.05, 0.2], alpha=[0.0, 0.1], cv=3, **SMALL)
    sequential = FeatureGroupingRegressor(**params).fit(X, y)
    parallel = FeatureGroupingRegressor(**params).fit(X, y, client=client)
    assert len(parallel.cv_results_) == 4
    _assert_same_fit(parallel, sequential)


def test_a_client_given_to_a_fit_of_one_phase_is_said_unused(problem, client):
    X, y, mask = problem
    # one candidate (not n_clusters="auto", a grid), one validation split
    clf = FeatureGroupingClassifier(mask=mask, n_clusters=0.1, cv=None, **SMALL)
    with pytest.warns(UserWarning, match=r"client is used by a fit on a store, and by a fit on "
                      r"arrays .* this fit trains one phase, in this process") as caught:
        clf.fit(X, y, client=client)
    assert __file__ in [w.filename for w in caught if "client" in str(w.message)]


def test_an_error_in_a_workers_phase_is_raised_as_the_fit_in_this_process_raises_it(problem,
                                                                                    client):
    X, _, mask = problem
    # targets below -1: the mean squared log error refuses them when a fold is scored
    y = np.linspace(-5.0, 5.0, len(X))
    params = dict(mask=mask, scoring="neg_mean_squared_log_error", cv=3, **SMALL)
    with pytest.raises(ValueError, match="Mean Squared Logarithmic Error cannot be used") as here:
        FeatureGroupingRegressor(**params).fit(X, y)
    with pytest.raises(ValueError, match="Mean Squared Logarithmic Error cannot be used") as there:
        FeatureGroupingRegressor(**params).fit(X, y, client=client)
    assert type(there.value) is type(here.value)
