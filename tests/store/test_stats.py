"""Per-feature statistics of a store's rows: a resumable Dask reduction (fgscale.store._stats)."""

import warnings

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster, get_task_stream

from fgscale.store import array_stats, compute_stats, load_stats, stats_key, write_store
from fgscale.store._stats import STATS, _block_task, _blocks, _prepare

SHAPE = (5, 6, 7)


def make_store(path, n=50, block_rows=7, seed=0, raw=False, constant=()):
    """A store of SYNTHETIC rows (features of different means and scales); returns (path, X)."""
    rng = np.random.default_rng(seed)
    mask = np.ones(SHAPE, bool)
    p = int(mask.sum())
    X = (rng.standard_normal((n, p)) * rng.uniform(0.1, 3, p) + rng.normal(0, 5, p))
    if raw:  # raw scanner units
        X = X * 1000 + 10000
    X = X.astype(np.float32)
    for j, value in constant:
        X[:, j] = value
    split = np.where(np.arange(n) % 4 == 0, "test", "train")
    write_store(path, X, rng.integers(0, 3, n), mask, np.eye(4), split=split,
                block_rows=block_rows, attrs={"synthetic": True})
    return path, X


def numpy_stats(X):
    X = X.astype(np.float64)
    return X.mean(0), X.std(0)


def assert_stats_close(got, X):
    mean, std = numpy_stats(X)
    scale = np.abs(X).max()
    np.testing.assert_allclose(got[0], mean, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(got[1], std, rtol=1e-6)


def n_block_tasks(stream) -> int:
    return sum(1 for t in stream.data if "_block_task" in str(t["key"]))


@pytest.mark.parametrize("block_rows", [1, 7, 16, 64])
def test_equals_numpy_for_any_block_size(tmp_path, client, block_rows):
    path, X = make_store(tmp_path / "s.zarr", block_rows=block_rows)
    train = np.flatnonzero(np.arange(len(X)) % 4 != 0)
    mean, std = compute_stats(path, client=client, progress=False)  # the training rows
    assert mean.dtype == std.dtype == np.float32 and mean.shape == (X.shape[1],)
    assert_stats_close((mean, std), X[train])
    # any rows, any order, duplicates: the statistics of the set
    rows = np.array([33, 2, 2, 40, 7, 8, 9, 49, 0, 33])
    got = compute_stats(path, rows, client=client, progress=False)
    assert_stats_close(got, X[np.unique(rows)])
    np.testing.assert_array_equal(load_stats(path, rows[::-1])[0], got[0])


def test_the_same_bits_whatever_the_workers(tmp_path, client):
    path, X = make_store(tmp_path / "s.zarr", n=90, block_rows=4)
    first = compute_stats(path, client=client, progress=False)
    group = zarr.open_group(str(path), mode="r+")
    del group[STATS]
    with LocalCluster(n_workers=3, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as threads:
        second = compute_stats(path, client=threads, progress=False)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_saved_in_the_store_and_reused(tmp_path, client):
    path, X = make_store(tmp_path / "s.zarr")
    assert load_stats(path) is None
    with get_task_stream(client) as stream:
        mean, std = compute_stats(path, client=client, progress=False)
    rows = np.flatnonzero(np.arange(len(X)) % 4 != 0)
    assert n_block_tasks(stream) == len(_blocks(rows, 7)) == 8
    sub = zarr.open_group(str(path), mode="r")[f"{STATS}/{stats_key(rows)}"]
    assert sub.attrs["complete"] and sub.attrs["n_rows"] == rows.size
    np.testing.assert_array_equal(sub["rows"][:], rows)
    assert sub["mean"].dtype == sub["std"].dtype == np.float64
    assert "partial_mean" not in sub and "partial_m2" not in sub  # dropped once merged
    np.testing.assert_array_equal(sub["mean"][:].astype(np.float32), mean)
    with get_task_stream(client) as stream:
        again = compute_stats(path, client=client, progress=False)
    assert n_block_tasks(stream) == 0
    np.testing.assert_array_equal(again[1], std)
    np.testing.assert_array_equal(load_stats(path)[1], std)


def test_a_killed_run_resumes_with_the_missing_blocks_only(tmp_path, client):
    path, X = make_store(tmp_path / "s.zarr", n=60, block_rows=5)
    whole = compute_stats(path, client=client, progress=False)
    group = zarr.open_group(str(path), mode="r+")
    del group[STATS]
    # the state a run killed after three of its blocks leaves behind
    rows = np.flatnonzero(np.arange(60) % 4 != 0)
    key, blocks = stats_key(rows), _blocks(rows, 5)
    sub = _prepare(group, key, rows, len(blocks), 5, X.shape[1])
    for i in (0, 4, 7):
        _block_task(str(path), str(path), key, i, blocks[i])
    assert np.flatnonzero(sub["done"][:]).tolist() == [0, 4, 7]
    assert load_stats(path) is None  # not complete: not served
    with get_task_stream(client) as stream:
        resumed = compute_stats(path, client=client, progress=False)
    assert n_block_tasks(stream) == len(blocks) - 3 == 9
    for a, b in zip(whole, resumed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_partials_of_another_layout_are_not_resumed(tmp_path, client):
    path, X = make_store(tmp_path / "s.zarr", n=40, block_rows=8)
    rows = np.flatnonzero(np.arange(40) % 4 != 0)
    group = zarr.open_group(str(path), mode="r+")
    sub = _prepare(group, stats_key(rows), rows, 2, 99, X.shape[1])  # a stale span
    sub["done"][:] = 1
    got = compute_stats(path, client=client, progress=False)
    assert_stats_close(got, X[rows])


def test_constant_features_get_std_one_without_warning(tmp_path, client):
    constant = [(0, 3.7), (5, 10000.5), (11, 0.0)]
    path, X = make_store(tmp_path / "s.zarr", raw=True, constant=constant)
    columns = [j for j, _ in constant]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, std = compute_stats(path, client=client, progress=False)
        in_memory = array_stats(X[np.arange(len(X)) % 4 != 0])
        standardized = (X - mean) * (1 / std)
    for got_mean, got_std in (mean, std), in_memory:
        np.testing.assert_array_equal(got_std[columns], 1.0)
        np.testing.assert_array_equal(got_mean[columns], X[0, columns])
        assert (np.delete(got_std, columns) > 10).all()  # raw units: nothing else is constant
    np.testing.assert_array_equal(standardized[:, columns], 0.0)


def test_raw_units_give_the_same_standardized_rows(tmp_path, client):
    path, X = make_store(tmp_path / "s.zarr")
    raw_path, raw = make_store(tmp_path / "raw.zarr", raw=True)
    np.testing.assert_allclose(raw, X * 1000 + 10000, rtol=1e-6, atol=5e-3)
    mean, std = compute_stats(path, client=client, progress=False)
    raw_mean, raw_std = compute_stats(raw_path, client=client, progress=False)
    np.testing.assert_allclose(raw_std, std * 1000, rtol=1e-4)
    np.testing.assert_allclose((raw - raw_mean) * (1 / raw_std), (X - mean) * (1 / std),
                               atol=2e-4)


def test_array_stats_equals_numpy_and_the_store(tmp_path, client, monkeypatch):
    path, X = make_store(tmp_path / "s.zarr", n=45, raw=True)
    monkeypatch.setattr("fgscale.store._stats._CHUNK_VALUES", 7 * X.shape[1])  # several chunks
    mean, std = array_stats(X)
    assert mean.dtype == std.dtype == np.float32
    assert_stats_close((mean, std), X)
    stored = compute_stats(path, np.arange(45), client=client, progress=False)
    np.testing.assert_allclose(stored[0], mean, rtol=1e-6)
    np.testing.assert_allclose(stored[1], std, rtol=1e-6)
    with pytest.raises(ValueError, match="2D"):
        array_stats(X[0])


def test_stats_key_names_the_set_of_rows():
    assert stats_key([3, 1, 2, 2]) == stats_key(np.array([1, 2, 3]))
    assert stats_key([1, 2]) != stats_key([1, 2, 3])
    assert len(stats_key([0])) == 40


def test_no_rows_is_an_error(tmp_path):
    path, _ = make_store(tmp_path / "s.zarr", n=8)
    with pytest.raises(ValueError, match="no rows"):
        compute_stats(path, [], progress=False)
    with pytest.raises(IndexError):
        compute_stats(path, [8], progress=False)
