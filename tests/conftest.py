"""Shared fixtures (a real LocalCluster, small data) and the ``cuda`` marker; shared helpers
that are not fixtures live in tests/helpers.py."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

# tests/ has no __init__.py and pyproject.toml sets no pythonpath: a test file in a subfolder
# gets its own folder on sys.path, not tests/. pytest's default import mode happens to add
# tests/ when it imports this file, --import-mode=importlib does not: add it here, so that
# every test file can `from helpers import ...` whatever the import mode.
sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("helpers")  # its asserts explain their failures, as a test's do

from helpers import TINY_GRID, synthetic_store  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped where torch sees none)")


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where there is no GPU (torch is imported only if any)."""
    cuda_tests = [item for item in items if item.get_closest_marker("cuda") is not None]
    if cuda_tests:
        import torch

        if not torch.cuda.is_available():
            for item in cuda_tests:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def client():
    """A real two-worker LocalCluster (processes), shared by the session's tests; not made the
    default client, so that calls given no client start their own cluster, as in a script."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit="2GiB") as cluster:
        with Client(cluster, set_as_default=False) as c:
            yield c


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Point the cache of derived data (fgscale.store._derived) at a folder of the session's, so
    that no test reads or writes the user's own; a test that writes into a cache gives itself
    one of its own (``monkeypatch.setenv("FGSCALE_CACHE_DIR", ...)``), so that another test's
    store of the same identity never finds its banks there."""
    from fgscale.store._derived import CACHE_DIR_ENV

    before = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("fgscale-cache"))
    yield os.environ[CACHE_DIR_ENV]
    if before is None:
        del os.environ[CACHE_DIR_ENV]
    else:
        os.environ[CACHE_DIR_ENV] = before


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# --- store fixtures (fgscale.images._synthetic / fgscale.store) ---


@pytest.fixture(scope="session")
def tiny_cohort(tmp_path_factory):
    """A SYNTHETIC NIfTI cohort on a tiny grid: 24 3D files, 3 classes, 4 subjects.

    Returns the cohort.csv path; treat the folder as read-only (copy it to modify files).
    """
    from fgscale.images._synthetic import make_cohort

    return make_cohort(tmp_path_factory.mktemp("tiny_cohort"), n_samples=24, n_classes=3,
                       grid=TINY_GRID, n_subjects=4, snr_db=0.0, seed=0)


@pytest.fixture
def tiny_store(tmp_path):
    """A complete store written from a SYNTHETIC in-memory cohort (40 rows, 4 classes)."""
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    return synthetic_store(tmp_path / "tiny.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                           classes=[f"class_{k}" for k in range(4)], attrs={"synthetic": True},
                           block_rows=8)


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, client):
    """Two finished run folders on one SYNTHETIC store whose class names need escaping in file
    names ("house/home", "Face" beside "face", "chair b"); treat them as read-only.

    Returns a dict: "logreg" (one candidate, 5 epochs: checkpointed, with metrics.jsonl) and
    "mlp" (two candidate alphas: a search, then a refit), both Paths; "store", the Store.
    """
    from fgscale.runs import train_run

    root = tmp_path_factory.mktemp("tiny_runs")
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    store = synthetic_store(root / "tiny.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            classes=["face", "house/home", "Face", "chair b"],
                            attrs={"synthetic": True}, block_rows=8)
    # one validation split (cv=None): the run folders' phases are a search and a refit
    params = dict(n_groupings=4, n_bootstrap=10, n_clusters=0.1, batch_size=8,
                  learning_rate=0.05, random_state=3, max_epochs=5, cv=None)
    runs = {"logreg": params, "mlp": dict(params, model="mlp", hidden_layer_sizes=(8, 6),
                                          alpha=[0.0, 0.1])}
    for name, run_params in runs.items():
        train_run(store.path, root / name, params=run_params, client=client)
    return {name: root / name for name in runs} | {"store": store}
