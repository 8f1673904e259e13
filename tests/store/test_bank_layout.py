"""Several banks per store: keys, creation and extension, listing, and the Dask builder on them."""

import re

import numpy as np
import pytest
import zarr

from fgscale.cli import main
from fgscale.grouping import make_bank
from fgscale.grouping._dask_bank import build_bank, load_bank
from fgscale.store import (
    BankError,
    bank_key,
    bank_params,
    create_bank,
    delete_bank,
    list_banks,
    open_bank,
    open_store,
    rows_hash,
)

R = 6  # bootstrap rows per grouping; the tiny store has 32 training rows of 605 voxels


def _oracle(store, k, b, seed=0):
    return make_bank(store.X[:], store.mask, k, n_groupings=b, n_bootstrap=R,
                     rows=store.train_rows(), seed=seed)


def _create(store, k, b, seed=0):
    """An unbuilt bank of ``b`` rows, created without a cluster."""
    rows = store.train_rows()
    group = zarr.open_group(str(store.path), mode="r+")
    return create_bank(group, bank_key(k, R, seed, rows), bank_params(k, R, seed, rows), b,
                       store.n_features, rows=rows)


def test_cli_remove_folds_removes_the_banks_of_other_rows_only(tiny_store, capsys):
    store = tiny_store
    assert main(["bank", str(store.path), "--remove", "folds"]) == 0
    assert "no bank of a fold" in capsys.readouterr().out
    whole = _create(store, 20, 2)
    group = zarr.open_group(str(store.path), mode="r+")
    folds = []
    for fold in (store.train_rows()[::2], store.train_rows()[1::2]):  # as cv's training rows
        folds.append(create_bank(group, bank_key(20, R, 0, fold), bank_params(20, R, 0, fold), 2,
                                 store.n_features, rows=fold))
    assert main(["bank", str(store.path), "--remove", "folds"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[2] for line in lines) == sorted(f.key for f in folds)
    assert [b["key"] for b in list_banks(store.path)] == [whole.key]


def test_key_is_readable_and_depends_on_the_set_of_rows_only():
    rows = np.arange(0, 40, 2)
    key = bank_key(3385, 50, 0, rows)
    assert re.fullmatch(r"k3385-r50-s0-[0-9a-f]{8}", key)
    assert key.endswith(rows_hash(rows)[:8])
    assert bank_key(3385, 50, 0, rows[::-1].tolist()) == key  # any order, any int type
    assert bank_key(3385, 50, 0, rows[1:]) != key
    assert bank_key(3385, 50, 1, rows) != key
    params = bank_params(np.int64(3385), 50, 0, rows)
    assert params == {"n_clusters": 3385, "n_bootstrap": 50, "seed": 0,
                      "rows_sha1": rows_hash(rows), "n_rows": 20}
    for bad in ({"n_clusters": 0.1}, {"n_bootstrap": 0}, {"seed": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            bank_params(**{"n_clusters": 10, "n_bootstrap": 5, "seed": 0, **bad}, rows=rows)


def test_create_extend_list_and_delete(tiny_store):
    store = tiny_store
    assert list_banks(store.path) == []
    bank = _create(store, 20, 3)
    assert bank.labels.shape == (3, store.n_features) and bank.labels.dtype == np.int32
    assert bank.labels.chunks == (1, store.n_features) and bank.done.chunks == (1,)
    assert (bank.labels[:] == -1).all() and not bank.done[:].any()
    rows = np.arange(3 * store.n_features, dtype=np.int32).reshape(3, -1) % 20
    for i in range(3):
        bank.write(i, rows[i])
    bank = _create(store, 20, 5)  # extended: the rows built are kept, the new ones unbuilt
    np.testing.assert_array_equal(bank.labels[:3], rows)
    assert (bank.labels[3:] == -1).all()
    np.testing.assert_array_equal(bank.done[:], [True] * 3 + [False] * 2)
    np.testing.assert_array_equal(bank.todo(), [3, 4])
    np.testing.assert_array_equal(bank.todo(2), [])
    assert _create(store, 20, 2).n_groupings == 5  # a smaller b keeps them all
    other = _create(store, 30, 2)
    listed = list_banks(store.path)
    assert [b["key"] for b in listed] == sorted([bank.key, other.key])
    first = next(b for b in listed if b["key"] == bank.key)
    assert (first["n_clusters"], first["n_bootstrap"], first["seed"], first["n_rows"],
            first["built"], first["total"]) == (20, R, 0, 32, 3, 5)
    delete_bank(store.path, other.key)
    assert [b["key"] for b in list_banks(store)] == [bank.key]
    with pytest.raises(BankError, match="no bank"):
        delete_bank(store.path, other.key)


def test_a_creation_cut_short_is_no_bank_and_is_started_again(tiny_store):
    store = tiny_store
    bank = _create(store, 20, 2)
    group = zarr.open_group(str(store.path), mode="r+")
    del group[f"banks/{bank.key}/done"]  # as if the client died between the two arrays
    assert list_banks(store.path) == []
    with pytest.raises(BankError):
        open_bank(store.path, bank.key)
    again = _create(store, 20, 2)
    assert again.done.shape == (2,) and [b["key"] for b in list_banks(store)] == [bank.key]


def test_a_key_of_other_parameters_is_refused(tiny_store):
    store = tiny_store
    rows = store.train_rows()
    group = zarr.open_group(str(store.path), mode="r+")
    with pytest.raises(ValueError, match="is not the key"):
        create_bank(group, bank_key(20, R, 0, rows), bank_params(21, R, 0, rows), 2,
                    store.n_features)


def test_two_banks_of_different_k_both_load(tiny_store, client):
    store = tiny_store
    for k in (20, 60):
        build_bank(store.path, n_groupings=3, n_bootstrap=R, n_clusters=k, client=client,
                   progress=False)
    assert len(list_banks(store.path)) == 2
    for k in (20, 60):
        bank, info = load_bank(store.path, n_clusters=k, n_bootstrap=R, seed=0)
        assert info["n_clusters"] == k and info["key"] == bank_key(k, R, 0, store.train_rows())
        np.testing.assert_array_equal(bank, _oracle(store, k, 3))
        assert bank.max() == k - 1


def test_a_missing_bank_names_the_store_the_key_and_the_keys_present(tiny_store):
    store = tiny_store
    present = [_create(store, k, 2).key for k in (20, 60)]
    asked = bank_key(30, R, 0, store.train_rows())
    with pytest.raises(BankError) as error:
        load_bank(store.path, n_clusters=30, n_bootstrap=R, seed=0)
    message = str(error.value)
    assert str(store.path) in message and asked in message
    assert all(key in message for key in present)
    # a present but unbuilt bank is not read either
    with pytest.raises(BankError, match="incomplete"):
        load_bank(store.path, n_clusters=20, n_bootstrap=R, seed=0)
    with pytest.raises(BankError, match="holds 2 groupings, 3 asked"):
        load_bank(store.path, n_clusters=20, n_bootstrap=R, seed=0, n_groupings=3)


def test_a_bank_of_the_first_layout_is_not_read(tiny_store):
    store = tiny_store
    zarr.open_group(str(store.path), mode="r+").create_array(
        "bank", data=np.zeros((2, store.n_features), np.int32))
    assert list_banks(store.path) == []
    with pytest.raises(BankError, match="first layout"):
        load_bank(store.path, n_clusters=20, n_bootstrap=R, seed=0)


def test_resume_computes_only_the_missing_rows(tiny_store, client):
    store = tiny_store
    bank = _create(store, 20, 4)
    sentinel = np.arange(store.n_features, dtype=np.int32) % 20  # no ReNA grouping of these data
    for i in (0, 2):  # a partial build: rows 0 and 2 written, flagged
        bank.write(i, sentinel)
    built, info = build_bank(store.path, n_groupings=4, n_bootstrap=R, n_clusters=20,
                             client=client, progress=False, return_info=True)
    assert (info["built"], info["reused"]) == (2, 2)
    expected = _oracle(store, 20, 4)
    for i in (0, 2):  # kept as they were: not recomputed
        np.testing.assert_array_equal(built[i], sentinel)
    np.testing.assert_array_equal(built[[1, 3]], expected[[1, 3]])
    assert open_bank(store.path, bank.key).done[:].all()


def test_extension_from_3_to_5_keeps_the_first_3(tiny_store, client):
    store = tiny_store
    kw = dict(n_bootstrap=R, n_clusters=20, client=client, progress=False, return_info=True)
    first, info = build_bank(store.path, n_groupings=3, **kw)
    expected = _oracle(store, 20, 5)
    np.testing.assert_array_equal(first, expected[:3])
    sentinel = np.arange(store.n_features, dtype=np.int32) % 20
    open_bank(store.path, info["key"], mode="r+").write(2, sentinel)  # marks row 2 as kept
    bank, info = build_bank(store.path, n_groupings=5, **kw)
    assert (info["built"], info["reused"]) == (2, 3) and bank.shape == (5, store.n_features)
    np.testing.assert_array_equal(bank[:2], expected[:2])
    np.testing.assert_array_equal(bank[2], sentinel)
    np.testing.assert_array_equal(bank[3:], expected[3:])
    assert len(list_banks(store.path)) == 1


def test_cli_list(tiny_store, capsys):
    store = tiny_store
    assert main(["bank", str(store.path), "--list"]) == 0
    assert "no bank" in capsys.readouterr().out
    a, b = _create(store, 20, 3), _create(store, 60, 2)
    a.write(0, np.zeros(store.n_features, np.int32))
    assert main(["bank", str(store.path), "--list", "--n-clusters", "0.5"]) == 0  # builds nothing
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["key", "k", "r", "seed", "rows", "built", "in"]
    assert [line.split() for line in lines[1:]] == [
        [a.key, "20", str(R), "0", "32", "1/3", "store"],
        [b.key, "60", str(R), "0", "32", "0/2", "store"]]
    assert len(list_banks(store.path)) == 2
    assert open_store(store.path).n_samples == 40
    # an unknown key among them: nothing removed, the banks present named
    assert main(["bank", str(store.path), "--remove", a.key, "nope"]) == 2
    assert f"no bank nope; banks present: {', '.join(sorted([a.key, b.key]))}" in (
        capsys.readouterr().err)
    assert len(list_banks(store.path)) == 2
    assert main(["bank", str(store.path), "--remove", a.key]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"removed bank {a.key} (k=20, 1/3 groupings) from the store ")
    assert re.search(r": [0-9.]+ kB freed$", out.strip()) and " 0.0 " not in out, out  # not 0.0 MB
    assert [x["key"] for x in list_banks(store.path)] == [b.key]
    assert not (store.path / "banks" / a.key).exists()
    with pytest.raises(SystemExit):
        main(["bank", str(store.path), "--remove", b.key, "--list"])
