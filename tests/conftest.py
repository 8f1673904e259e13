"""Shared fixtures: a real LocalCluster, small data."""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def client():
    """A real two-worker LocalCluster (processes), shared by the session's tests."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit="2GiB") as cluster:
        with Client(cluster) as c:
            yield c


@pytest.fixture
def rng():
    return np.random.default_rng(0)
