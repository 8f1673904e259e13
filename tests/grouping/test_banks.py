"""The distributed bank against the in-memory oracle, and its resume / failure behaviour."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import zarr

from fgscale._dask.client import get_client
from fgscale.cli import main
from fgscale.grouping import bank_ready, bank_spec, build_bank, ensure_bank, load_bank
from fgscale.grouping._bank import bootstrap_rows, grouping_seed, make_bank, omega_diagonal
from fgscale.images._synthetic import make_classification_volumes
from fgscale.store import BankError, bank_key, list_banks, open_bank, open_store, write_store

R, K = 8, 36  # r bootstrap rows, k clusters (10% of the 360 voxels of the tiny grid)


def _write(path, grid=(10, 12, 10), n_test=10, test_offset=0.0):
    """A 40-row store whose last ``n_test`` rows are the test split (optionally shifted)."""
    X, y, mask, affine = make_classification_volumes(40, 4, grid=grid, seed=0)
    split = ["train"] * (40 - n_test) + ["test"] * n_test
    if n_test:
        X[-n_test:] += test_offset * np.random.default_rng(1).standard_normal(X[-n_test:].shape)
    return write_store(path, X, y, mask, affine, split=split)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    # Test rows made very different: a bank that drew any of them would not match the oracle.
    return _write(tmp_path_factory.mktemp("bank") / "tiny.zarr", test_offset=50.0).path


def _oracle(path, b, seed=0, rows=None):
    store = open_store(path)
    rows = store.train_rows() if rows is None else rows
    return make_bank(store.X[:], store.mask, K, n_groupings=b, n_bootstrap=R, rows=rows,
                     seed=seed)


def _copy(path, tmp_path):
    store = open_store(path)
    return write_store(tmp_path / "copy.zarr", store.X[:], store.y, store.mask, store.affine,
                       classes=store.classes, split=store.split).path


def test_matches_in_memory_oracle_and_uses_train_rows_only(store_path, tmp_path, client):
    path = _copy(store_path, tmp_path)
    bank = build_bank(path, n_groupings=5, n_bootstrap=R, n_clusters=0.1, seed=3,
                      client=client, progress=False)
    assert bank.dtype == np.int32 and bank.shape == (5, 360)
    np.testing.assert_array_equal(bank, _oracle(path, 5, seed=3))
    # Drawing from all rows (test rows included) would give another bank.
    all_rows = np.arange(40)
    assert not np.array_equal(bank, _oracle(path, 5, seed=3, rows=all_rows))
    stored, info = load_bank(path, n_clusters=0.1, n_bootstrap=R, seed=3)
    np.testing.assert_array_equal(stored, bank)
    train = open_store(path).train_rows()
    key = bank_key(K, R, 3, train)
    assert info == {"key": key, "n_groupings": 5, "n_clusters": K, "n_bootstrap": R, "seed": 3,
                    "rows_sha1": info["rows_sha1"], "n_rows": 30, "location": str(path.resolve())}
    assert key.startswith(f"k{K}-r{R}-s3-") and info["rows_sha1"].startswith(key[-8:])


def test_bootstrap_rows_are_train_rows(store_path):
    store = open_store(store_path)
    train = store.train_rows()
    assert np.intersect1d(train, store.test_rows()).size == 0
    for i in range(20):
        assert np.isin(bootstrap_rows(grouping_seed(0, i), train, R), train).all()


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
def test_same_bank_with_one_and_two_workers(store_path, tmp_path, client):
    path = _copy(store_path, tmp_path)
    two = build_bank(path, n_groupings=4, n_bootstrap=R, n_clusters=K, client=client,
                     progress=False)
    with get_client(n_workers=1, memory_limit="1GiB") as single:
        assert len(single.scheduler_info()["workers"]) == 1
        one = build_bank(path, n_groupings=4, n_bootstrap=R, n_clusters=K, client=single,
                         progress=False, overwrite=True)
    np.testing.assert_array_equal(one, two)


def test_resume_and_extend(store_path, tmp_path, client):
    path = _copy(store_path, tmp_path)
    kw = dict(n_bootstrap=R, n_clusters=K, seed=1, client=client, progress=False,
              return_info=True)
    first, info = build_bank(path, n_groupings=3, **kw)
    assert (info["built"], info["reused"]) == (3, 0)
    bank, info = build_bank(path, n_groupings=6, **kw)
    assert (info["built"], info["reused"]) == (3, 3)
    expected = _oracle(path, 6, seed=1)
    np.testing.assert_array_equal(bank, expected)
    np.testing.assert_array_equal(bank[:3], first)

    stored = open_bank(path, info["key"], mode="r+")
    stored.done[4] = False  # as if the task for grouping 4 had died before its flag
    stored.labels[4] = -1
    with pytest.raises(BankError, match="incomplete"):
        load_bank(path, n_clusters=K, n_bootstrap=R, seed=1)
    bank, info = build_bank(path, n_groupings=6, **kw)
    assert (info["built"], info["reused"]) == (1, 5)
    np.testing.assert_array_equal(bank, expected)
    # Asking for fewer groupings reuses the stored ones and computes nothing.
    bank, info = build_bank(path, n_groupings=2, **kw)
    assert info["built"] == 0
    np.testing.assert_array_equal(bank, expected[:2])
    assert load_bank(path, n_clusters=K, n_bootstrap=R, seed=1)[0].shape == (6, 360)
    assert load_bank(path, n_clusters=K, n_bootstrap=R, seed=1, n_groupings=4)[0].shape == (4, 360)


def test_other_parameters_make_other_banks_and_overwrite_rebuilds_one(store_path, tmp_path,
                                                                      client):
    path = _copy(store_path, tmp_path)
    kw = dict(n_groupings=2, client=client, progress=False, return_info=True)
    _, first = build_bank(path, n_bootstrap=R, n_clusters=K, seed=0, **kw)
    keys = {first["key"]}
    for change in ({"n_bootstrap": R + 1}, {"n_clusters": K + 1}, {"seed": 1}):
        args = {"n_bootstrap": R, "n_clusters": K, "seed": 0, **change}
        _, info = build_bank(path, **args, **kw)
        assert info["built"] == 2 and info["key"] not in keys
        keys.add(info["key"])
    assert [b["key"] for b in list_banks(path)] == sorted(keys)
    # overwrite rebuilds that key only, from scratch
    open_bank(path, first["key"], mode="r+").labels[0] = 0
    bank, info = build_bank(path, n_bootstrap=R, n_clusters=K, seed=0, overwrite=True, **kw)
    assert (info["built"], info["key"]) == (2, first["key"])
    np.testing.assert_array_equal(bank, _oracle(path, 2, seed=0))
    assert len(list_banks(path)) == 4


def test_ensure_bank_builds_only_what_is_missing(store_path, tmp_path, client):
    path = _copy(store_path, tmp_path)
    store = open_store(path)
    kw = dict(n_bootstrap=R, n_clusters=K, seed=4)
    two, three = bank_spec(store, n_groupings=2, **kw), bank_spec(store, n_groupings=3, **kw)
    assert two.key == three.key == bank_key(K, R, 4, store.train_rows())
    assert not bank_ready(store, two)
    bank, info = ensure_bank(store, two, client=client)
    assert info["built"] == 2 and info["n_groupings"] == 2 and bank_ready(store, two)
    np.testing.assert_array_equal(bank, _oracle(path, 2, seed=4))
    again, info = ensure_bank(path, two, client=client)  # read, nothing built
    assert info["built"] == 0
    np.testing.assert_array_equal(again, bank)
    assert not bank_ready(store, three)
    more, info = ensure_bank(store, three, client=client)  # extended by one
    assert info["built"] == 1 and info["key"] == two.key
    np.testing.assert_array_equal(more, _oracle(path, 3, seed=4))


def test_bad_inputs(store_path, tmp_path, client):
    with pytest.raises(ValueError, match="n_groupings"):
        build_bank(store_path, n_groupings=0, client=client)
    with pytest.raises(ValueError, match="n_clusters"):
        build_bank(_copy(store_path, tmp_path), n_clusters=1.5, client=client)
    with pytest.raises(ValueError, match="no such store"):
        build_bank(tmp_path / "missing.zarr", client=client)
    with pytest.raises(BankError, match="no bank"):
        load_bank(_copy(store_path, tmp_path), n_clusters=K, n_bootstrap=R, seed=0)
    with pytest.raises(ValueError, match="seed"):
        build_bank(_copy(store_path, tmp_path), seed=1.5, client=client)
    only_test = _write(tmp_path / "only_test.zarr", n_test=40).path
    with pytest.raises(ValueError, match="no training rows"):
        build_bank(only_test, client=client)


def test_killed_worker_does_not_change_the_bank(tmp_path, client):
    # A larger grid (23k voxels) makes each task long enough to kill a worker mid-run.
    path = _write(tmp_path / "big.zarr", grid=(40, 48, 40)).path
    b, r, k = 24, 20, 2304
    result = {}

    def run():
        result["bank"] = build_bank(path, n_groupings=b, n_bootstrap=r, n_clusters=k,
                                    client=client, progress=False)

    key = bank_key(k, r, 0, open_store(path).train_rows())
    pids = client.run(os.getpid)
    thread = threading.Thread(target=run)
    thread.start()
    done = np.zeros(b, bool)
    while done.sum() < 2 and thread.is_alive():  # however long a loaded machine takes
        time.sleep(0.005)
        try:
            done = zarr.open_group(str(path), mode="r")[f"banks/{key}/done"][:]
        except Exception:  # the arrays are not created yet, or a flag is being written
            continue
    os.kill(next(iter(pids.values())), signal.SIGKILL)
    n_done_at_kill = int(done.sum())
    thread.join()
    client.wait_for_workers(2)  # the nanny's new worker, for the tests after this one
    assert 2 <= n_done_at_kill < b, "the worker was not killed while groupings were pending"
    store = open_store(path)
    expected = make_bank(store.X[:], store.mask, k, n_groupings=b, n_bootstrap=r,
                         rows=store.train_rows(), seed=0)
    np.testing.assert_array_equal(result["bank"], expected)


def test_omega_diagonal():
    bank = np.array([[0, 0, 1, 2], [0, 1, 1, 1]])
    np.testing.assert_allclose(omega_diagonal(bank), [(0.5 + 1) / 2, (0.5 + 1 / 3) / 2,
                                                      (1 + 1 / 3) / 2, (1 + 1 / 3) / 2])
    with pytest.raises(ValueError, match="negative"):
        omega_diagonal(np.array([[0, -1]]))
    # Against the dense formula: mean over groupings of diag(Phi^T Phi).
    rng = np.random.default_rng(0)
    bank = rng.integers(0, 5, size=(3, 30))
    bank = np.stack([np.unique(row, return_inverse=True)[1] for row in bank])
    dense = np.mean([np.diag(_phi(row).T @ _phi(row)) for row in bank], axis=0)
    np.testing.assert_allclose(omega_diagonal(bank), dense)


def _phi(labels):
    k = labels.max() + 1
    phi = np.zeros((k, labels.size))
    phi[labels, np.arange(labels.size)] = 1.0
    return phi / np.sqrt(phi.sum(axis=1, keepdims=True))


def test_cli_bank_joins_a_running_scheduler(store_path, tmp_path, client, capsys):
    path = _copy(store_path, tmp_path)
    argv = ["bank", str(path), "--n-groupings", "3", "--n-bootstrap", str(R), "--n-clusters",
            "0.1", "--seed", "2", "--scheduler", client.scheduler.address]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 groupings built, 0 reused" in out
    loaded, info = load_bank(path, n_clusters=0.1, n_bootstrap=R, seed=2)
    assert f"bank {info['key']} of" in out
    np.testing.assert_array_equal(loaded, _oracle(path, 3, seed=2))
    assert main(argv) == 0  # again: nothing to build, and said so
    assert "already complete (3 groupings, k=36), nothing to do" in capsys.readouterr().out
    # other parameters: another bank beside the first, which stays
    assert main(argv[:-4] + ["--seed", "5", "--scheduler", client.scheduler.address]) == 0
    assert "3 groupings built, 0 reused" in capsys.readouterr().out
    assert len(list_banks(path)) == 2
    np.testing.assert_array_equal(load_bank(path, n_clusters=K, n_bootstrap=R, seed=2)[0],
                                  loaded)
