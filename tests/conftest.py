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


# --- store fixtures (fgscale.images._synthetic / fgscale.store) ---
TINY_GRID = (12, 14, 12)  # 605 in-mask voxels: a whole synthetic cohort in milliseconds


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
    from fgscale.images._synthetic import make_classification_volumes
    from fgscale.store import write_store

    X, y, mask, affine = make_classification_volumes(40, 4, grid=TINY_GRID, n_subjects=5, seed=0)
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    return write_store(tmp_path / "tiny.zarr", X, y, mask, affine,
                       classes=[f"class_{k}" for k in range(4)], split=split,
                       attrs={"synthetic": True}, block_rows=8)
