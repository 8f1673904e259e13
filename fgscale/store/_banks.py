"""Banks of groupings inside a store: their layout, keys, creation, listing and removal.

A store may hold several banks, each in its own subgroup beside ``X`` (or, for a store this
process may not write, in its cache store: :mod:`fgscale.store._derived`)::

    banks/<key>/labels  int32 (b, n_features)  row i is grouping i (labels 0 .. k-1), fill -1;
                                               one chunk per row
    banks/<key>/done    bool  (b,)             True once row i is written; one chunk per flag

with the attributes that define the bank on ``banks/<key>``: ``n_clusters`` (k, resolved to an
int), ``n_bootstrap`` (r), ``seed``, ``rows_sha1`` (SHA-1 of the sorted training-row indices as
little-endian int64) and ``n_rows`` (their count). The key is a readable, deterministic function
of those, ``k<k>-r<r>-s<seed>-<first 8 hex of rows_sha1>`` (:func:`bank_key`): asking for a
bank is asking for its key, and a bank of other parameters is never read in its place.

Writers never share a chunk: row i and flag i are written by the one task that builds
grouping i, the row first (:meth:`Bank.write`), so a flag never claims a half-written row.

Given a store (a path or a :class:`Store`), readers look at its banks, then at those of its
cache store; given a zarr group, at that group's only.

Stores of the first layout (one top-level ``bank`` array, ``bank_done`` and a ``bank``
attribute) are not read: their bank is ignored, and rebuilt under ``banks/`` when asked for.
"""

from __future__ import annotations

import hashlib
import numbers
from pathlib import Path

import numpy as np
import zarr

from fgscale._utils.checks import check_count
from fgscale.store._derived import read_locations
from fgscale.store._reader import Store, open_group_checked
from fgscale.store._shards import sync_node, sync_rows

__all__ = ["BANKS", "DONE", "LABELS", "PARAMS", "Bank", "BankError", "bank_key", "bank_key_of",
           "bank_params", "create_bank", "delete_bank", "find_banks", "list_banks", "open_bank", "rows_hash"]

BANKS = "banks"
"""The subgroup of the store that holds one subgroup per bank."""
LABELS, DONE, ROWS = "labels", "done", "rows"
PARAMS = ("n_clusters", "n_bootstrap", "seed", "rows_sha1", "n_rows")
"""The attributes of a bank's subgroup: what defines it (its key derives from them)."""
_OLD_LAYOUT = "bank"  # the top-level array of the first layout, no longer read


class BankError(ValueError):
    """A bank that a store does not hold, holds incomplete, or holds with other parameters."""


def rows_hash(rows) -> str:
    """SHA-1 (hex) of the sorted row indices, as little-endian int64 bytes."""
    rows = np.sort(np.asarray(rows, dtype=np.int64).reshape(-1))
    return hashlib.sha1(rows.astype("<i8").tobytes()).hexdigest()


def bank_params(n_clusters: int, n_bootstrap: int, seed: int, rows) -> dict:
    """The attributes that define a bank.

    Parameters
    ----------
    n_clusters : int
        k, already resolved (a fraction of the features is not a bank's parameter).
    n_bootstrap : int
        r, rows drawn with replacement per grouping.
    seed : int
    rows : array-like of int
        The rows the groupings are drawn from (the training rows), any order.

    Returns
    -------
    params : dict
        ``n_clusters``, ``n_bootstrap``, ``seed``, ``rows_sha1``, ``n_rows``.
    """
    check_count("n_clusters", n_clusters)
    check_count("n_bootstrap", n_bootstrap)
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ValueError(f"seed of a bank must be an integer, got {seed!r}")
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    return {"n_clusters": int(n_clusters), "n_bootstrap": int(n_bootstrap), "seed": int(seed),
            "rows_sha1": rows_hash(rows), "n_rows": int(rows.size)}


def bank_key_of(params: dict) -> str:
    """The key of a bank of parameters ``params`` (:func:`bank_params`)."""
    return (f"k{params['n_clusters']}-r{params['n_bootstrap']}-s{params['seed']}-"
            f"{params['rows_sha1'][:8]}")


def bank_key(n_clusters: int, n_bootstrap: int, seed: int, rows) -> str:
    """The key of a bank: ``k<k>-r<r>-s<seed>-<first 8 hex of the rows' SHA-1>``.

    Parameters
    ----------
    n_clusters : int
        k, resolved.
    n_bootstrap : int
    seed : int
    rows : array-like of int
        The training rows (any order).

    Returns
    -------
    key : str
        The same for the same parameters and set of rows, whoever computes it.
    """
    return bank_key_of(bank_params(n_clusters, n_bootstrap, seed, rows))


class Bank:
    """A bank inside a store; use :func:`open_bank` or :func:`create_bank` to get one.

    Attributes
    ----------
    key : str
    location : str
        The group holding it (the store's or its cache store's path; "" when not known).
    params : dict
        ``n_clusters``, ``n_bootstrap``, ``seed``, ``rows_sha1``, ``n_rows``.
    labels : zarr.Array of shape (n_groupings, n_features), int32
    done : zarr.Array of shape (n_groupings,), bool
    """

    def __init__(self, key: str, group: zarr.Group, location: str = ""):
        self.key = key
        self.location = location
        self.group = group
        self.labels = group[LABELS]
        self.done = group[DONE]
        self.params = {name: group.attrs[name] for name in PARAMS}

    def __repr__(self) -> str:
        return f"Bank({self.key!r}, built {self.n_built} of {self.n_groupings})"

    @property
    def n_groupings(self) -> int:
        """b, the rows of the bank (built or not)."""
        return int(self.labels.shape[0])

    @property
    def n_built(self) -> int:
        """Rows whose ``done`` flag is set."""
        return int(self.done[:].sum())

    def todo(self, n_groupings: int | None = None) -> np.ndarray:
        """Indices among the first ``n_groupings`` (default all) not built yet, int64."""
        n = self.n_groupings if n_groupings is None else min(n_groupings, self.n_groupings)
        return np.flatnonzero(~self.done[:n]).astype(np.int64)

    def rows(self) -> np.ndarray:
        """The rows the bank's bootstrap samples are drawn from, sorted, int64."""
        return self.group[ROWS][:]

    def read(self, n: int) -> tuple[np.ndarray, list[int]]:
        """The first ``n`` groupings, and those of them built but damaged: a chunk that no longer
        decodes (truncated) or labels outside ``[0, k)`` (a chunk file removed reads as the fill
        value, -1), which no grouping holds."""
        labels = np.full((n, self.labels.shape[1]), -1, np.int32)
        damaged = []
        for i in np.flatnonzero(self.done[:n]):
            try:
                labels[i] = self.labels[int(i)]
            except Exception:  # a codec's error on a damaged chunk
                damaged.append(int(i))
                continue
            if labels[i].min() < 0 or labels[i].max() >= self.params["n_clusters"]:
                damaged.append(int(i))
        return labels, damaged

    def write(self, index: int, labels) -> None:
        """Write grouping ``index``, then its flag (a flag never claims a half-written row)."""
        self.labels[index] = np.asarray(labels, dtype=np.int32)
        sync_rows(self.labels, index)
        self.done[index] = True
        sync_rows(self.done, index)

    def check(self, params: dict, n_features: int) -> None:
        """Raise a BankError unless the bank holds ``params`` on ``n_features`` features (a
        collision of the rows' hash prefix, or a bank copied from another store)."""
        params = {name: params[name] for name in PARAMS}
        if self.params != params or self.labels.shape[1] != n_features:
            raise BankError(f"bank {self.key!r} holds {self.params} on {self.labels.shape[1]} "
                            f"features, asked {params} on {n_features}; rebuild it with "
                            "overwrite")

    def info(self) -> dict:
        """``key``, the parameters, ``built``, ``total`` (b) and ``location``."""
        done = self.done[:]
        return {"key": self.key, **self.params, "built": int(done.sum()), "total": done.size,
                "location": self.location}


def _name(group: zarr.Group) -> str:
    return str(getattr(group.store, "root", group.store))


def _groups(store, mode: str = "r") -> tuple[list[tuple[zarr.Group, str]], str]:
    """The groups to look in, each with its path, and a name for messages: a store's root group
    then its cache store's (from a path or a Store), or the group given."""
    if isinstance(store, zarr.Group):
        return [(store, _name(store))], _name(store)
    if not isinstance(store, Store):
        group = open_group_checked(store, mode)
        if not group.attrs.get("complete", False):  # no cache: nothing is derived from it yet
            return [(group, str(Path(store).resolve()))], str(Path(store))
        store = Store(Path(store), group)
    first, *others = read_locations(store)
    return ([(store.group, first), *((zarr.open_group(o, mode=mode), o) for o in others)],
            str(store.path))


def _whole(sub: zarr.Group) -> bool:
    """Both arrays written (the attributes are written with the subgroup, before them)."""
    return LABELS in sub and DONE in sub and all(name in sub.attrs for name in PARAMS)


def _keys(group: zarr.Group) -> list[str]:
    """Keys of the banks of a store, sorted; a creation cut short is not a bank."""
    if BANKS not in group:
        return []
    banks = group[BANKS]
    return sorted(key for key, sub in banks.groups() if _whole(sub))


def _missing(where: str, key: str, groups: list[tuple[zarr.Group, str]]) -> BankError:
    keys = sorted({k for group, _ in groups for k in _keys(group)})
    present = ", ".join(keys) if keys else "none"
    old = (" (its bank of the first layout, a top-level 'bank' array, is no longer read)"
           if _OLD_LAYOUT in groups[0][0] else "")
    cache = " or its cache" if len(groups) > 1 else ""
    return BankError(f"{where}: no bank {key!r} in the store{cache}; banks present: {present}"
                     f"{old}; build it with 'fgscale bank {where}' and its parameters")


def find_banks(store, key: str, mode: str = "r") -> list[Bank]:
    """Every bank ``key`` of a store, in the order readers look: the store's, then its cache
    store's (:func:`open_bank` for the parameters); empty when none."""
    groups, _ = _groups(store, mode)
    name = f"{BANKS}/{key}"
    if not key or "/" in key:
        return []
    return [Bank(key, group[name], location) for group, location in groups
            if name in group and _whole(group[name])]


def open_bank(store, key: str, mode: str = "r") -> Bank:
    """Open the bank ``key`` of a store: the store's own, else its cache store's.

    Parameters
    ----------
    store : str or Path or Store or zarr.Group
        A store (complete or not); a Store or group is used in its own mode (a group: its
        banks only).
    key : str
        From :func:`bank_key` or :func:`list_banks`.
    mode : {"r", "r+"}
        With a path: "r+" to write rows.

    Returns
    -------
    bank : Bank

    Raises
    ------
    BankError
        If neither the store nor its cache holds a bank of that key; the message lists the
        keys present.
    """
    found = find_banks(store, key, mode)
    if not found:
        groups, where = _groups(store, mode)
        raise _missing(where, key, groups)
    return found[0]


def create_bank(group: zarr.Group, key: str, params: dict, n_groupings: int, n_features: int,
                *, rows=None, overwrite: bool = False) -> Bank:
    """Create the bank ``key``, or extend it to ``n_groupings`` rows, keeping the rows built.

    Parameters
    ----------
    group : zarr.Group
        The store's root group, opened read-write.
    key : str
        Must be the key of ``params`` (:func:`bank_key`).
    params : dict
        From :func:`bank_params`.
    n_groupings : int
        b. A stored bank with fewer rows is resized (new rows unbuilt); one with more is kept.
    n_features : int
    rows : array-like of int, optional
        The rows its bootstrap samples are drawn from (their hash is in ``params``), saved with
        the bank for its tasks to read; a bank created without them cannot be built on.
    overwrite : bool, default=False
        Delete the stored bank of that key first, built rows included.

    Returns
    -------
    bank : Bank

    Raises
    ------
    BankError
        If the stored bank of that key holds other parameters (a collision of the rows'
        hash prefix) or another number of features.
    """
    params = {name: params[name] for name in PARAMS}
    if key != bank_key_of(params):
        raise ValueError(f"key {key!r} is not the key of {params} ({bank_key_of(params)!r})")
    if n_groupings < 1:
        raise ValueError(f"n_groupings must be >= 1, got {n_groupings}")
    banks = group.require_group(BANKS)
    if overwrite or key not in _keys(group):  # a creation cut short is started again
        sub = banks.create_group(key, overwrite=True, attributes=params)
        sub.create_array(LABELS, shape=(n_groupings, n_features), dtype="int32",
                         chunks=(1, n_features), fill_value=-1)
        sub.create_array(DONE, shape=(n_groupings,), dtype="bool", chunks=(1,),
                         fill_value=False)
        if rows is not None:
            sub.create_array(ROWS, data=np.unique(np.asarray(rows, dtype=np.int64)))
        sync_node(sub, whole=True)  # before any task writes a grouping in it
        return Bank(key, sub, _name(group))
    bank = Bank(key, banks[key], _name(group))
    bank.check(params, n_features)
    if bank.n_groupings < n_groupings:
        bank.labels.resize((n_groupings, n_features))
        bank.done.resize((n_groupings,))
        sync_node(bank.labels)
        sync_node(bank.done)
    return bank


def delete_bank(store, key: str) -> None:
    """Remove the bank ``key`` from a store (path, Store opened "r+", or group): the one
    readers would open (:func:`open_bank`)."""
    groups, where = _groups(store, "r+")
    holder = next((group for group, _ in groups if key in _keys(group)), None)
    if holder is None:
        raise _missing(where, key, groups)  # the same error as reading a missing bank
    del holder[BANKS][key]


def list_banks(store) -> list[dict]:
    """The banks of a store and of its cache store.

    Parameters
    ----------
    store : str or Path or Store or zarr.Group
        A group: its banks only.

    Returns
    -------
    banks : list of dict
        One per bank, the store's first, each sorted by key: ``key``, ``n_clusters``,
        ``n_bootstrap``, ``seed``, ``rows_sha1``, ``n_rows``, ``built`` (rows written),
        ``total`` (b) and ``location`` (the path of the store or cache store holding it).
    """
    groups, _ = _groups(store)
    return [Bank(key, group[f"{BANKS}/{key}"], location).info() for group, location in groups
            for key in _keys(group)]
