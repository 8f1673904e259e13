"""Build banks of groupings on a Dask cluster, straight into the store (or, for a store this
process may not write, into its cache store: :mod:`fgscale.store._derived`).

A store holds any number of banks, each under the key of its parameters (k, r, seed and the
training rows; the layout is :mod:`fgscale.store._banks`), so asking for a bank never reads
another: a run with k = 50% does not get the bank built with k = 10%.

The client draws every grouping's seed up front (:func:`fgscale.grouping.grouping_seed`); each
task gets only ``(store path, path of the group holding the bank, bank key, i, seed_i, k, r)``,
reads its r bootstrap rows from the training rows, runs ReNA and writes row i of that bank, then
flag i. Tasks never share a chunk, and a task that runs twice (a worker died, Dask retried it)
writes the same bytes again, so the result is the in-memory :func:`fgscale.grouping.make_bank`
exactly, whatever the number of workers or failures. A bank is resumable (only rows whose flag is
unset are computed) and extensible (a larger b resizes the arrays and computes the new rows only),
where new derived data of the store go.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from distributed import Client

from fgscale._dask.client import get_client, run_tasks
from fgscale._utils.checks import check_count, resolve_n_clusters
from fgscale._utils.files import exclusive
from fgscale.grouping._bank import build_grouping, grouping_seed
from fgscale.store._banks import (
    BANKS,
    DONE,
    Bank,
    BankError,
    bank_key_of,
    bank_params,
    create_bank,
    find_banks,
    open_bank,
)
from fgscale.store._derived import DERIVED_ENV, write_location
from fgscale.store._reader import Store, open_store
from fgscale.store._shards import resumable_write

log = logging.getLogger(__name__)

__all__ = ["BankSpec", "bank_ready", "bank_spec", "build_bank", "ensure_bank", "load_bank"]


def _grouping_task(path: str, derived: str, key: str, index: int, seed: int, n_clusters: int,
                   n_bootstrap: int) -> int:
    """Build grouping ``index`` of bank ``key`` from the rows of the store ``path`` and write it
    into the group ``derived`` (the store or its cache store; runs on a worker)."""
    store = open_store(path)
    bank = open_bank(zarr.open_group(derived, mode="r+"), key)
    labels = build_grouping(store.read_rows, bank.rows(), store.mask, n_clusters, n_bootstrap,
                            seed)
    with resumable_write(derived, f"grouping {index} of bank {key}"):
        bank.write(index, labels)
    return index


@dataclass(frozen=True)
class BankSpec:
    """A bank asked for, its key resolved once: what a fit or a command passes to
    :func:`bank_ready`, :func:`ensure_bank` and the readers, so that none computes it again.

    Attributes
    ----------
    key : str
        :func:`fgscale.store.bank_key` of the parameters and rows.
    params : dict
        The bank's parameters (:func:`fgscale.store.bank_params`): k resolved to a count.
    rows : ndarray of int64
        The sorted rows the bootstrap samples are drawn from.
    n_groupings : int or None
        The groupings wanted; None: all of a stored bank's (readers only).
    """

    key: str
    params: dict
    rows: np.ndarray
    n_groupings: int | None


def bank_spec(store, *, n_clusters, n_bootstrap: int, seed: int, rows=None,
              n_groupings: int | None = None) -> BankSpec:
    """The bank of these parameters on ``rows`` of ``store`` (default its training rows).

    Parameters
    ----------
    store : str, Path or Store
    n_clusters : int or float
        k, or a float in (0, 1) taken as a fraction of the number of features.
    n_bootstrap : int
    seed : int
    rows : array-like of int, optional
    n_groupings : int, optional

    Returns
    -------
    spec : BankSpec
    """
    store = open_store(store)
    check_count("n_bootstrap", n_bootstrap)
    if n_groupings is not None:
        check_count("n_groupings", n_groupings)
    rows = store.train_rows() if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
    if rows.size == 0:
        raise ValueError(f"{store.path}: no training rows to draw the bootstrap samples from")
    if rows[0] < 0 or rows[-1] >= store.n_samples:
        raise ValueError(f"{store.path}: rows must lie in [0, {store.n_samples})")
    params = bank_params(resolve_n_clusters(n_clusters, store.n_features), int(n_bootstrap),
                         seed, rows)
    return BankSpec(bank_key_of(params), params, rows,
                    None if n_groupings is None else int(n_groupings))


def _complete(banks: list[Bank], n_groupings: int | None) -> Bank | None:
    """The first of ``banks`` whose first ``n_groupings`` (default all its) groupings are
    built, or None."""
    return next((b for b in banks if b.n_groupings >= (n_groupings or 0)
                 and not b.todo(n_groupings).size), None)


def _reopen_damaged(store: Store, banks: list[Bank], n_groupings: int) -> None:
    """Clear the flags of the groupings that read back damaged, in a copy of the bank where this
    process writes, so that they are built again (a copy it may not write is left: readers
    refuse it by name)."""
    for bank in banks:
        damaged = bank.read(min(n_groupings, bank.n_groupings))[1]
        if damaged and bank.location == write_location(store):
            log.warning("%s: groupings %s of bank %s are damaged; building them again",
                        bank.location, damaged[:10], bank.key)
            done = zarr.open_group(bank.location, mode="r+")[f"{BANKS}/{bank.key}/{DONE}"]
            for i in damaged:
                done[i] = False


def _build_location(store: Store, key: str, found: list[Bank], overwrite: bool) -> str:
    """Where to build bank ``key``: where new derived data of the store go (a copy there is
    resumed or extended; one elsewhere is left as it is)."""
    where = write_location(store)
    path = str(store.path.resolve())
    if overwrite and found and found[0].location == path != where:
        # a copy rebuilt in the cache would never be read: readers look in the store first
        raise BankError(f"{path}: bank {key!r} lies in the store, and new banks go to its cache "
                        f"store {where} (the store is read-only, or {DERIVED_ENV}=cache): it "
                        "cannot be rebuilt; make the store writable, or use a copy of it")
    return where


def build_bank(store_path, *, n_groupings: int = 100, n_bootstrap: int = 50,
               n_clusters: int | float = 0.1, seed: int = 0, rows=None,
               client: Client | None = None, progress: bool = True, overwrite: bool = False,
               return_info: bool = False):
    """Build (or complete, or extend) the bank of these parameters in a store, on Dask.

    The store keeps its other banks; the bank is the one of key
    :func:`fgscale.store.bank_key` of ``(k, r, seed, training rows)``.

    Parameters
    ----------
    store_path : str or Path
        A complete fgscale store; the bank is written into it, or into its cache store when
        the store is not writable (:mod:`fgscale.store._derived`). A complete bank found in
        either is reused.
    n_groupings : int, default=100
        b, groupings wanted. A stored bank with fewer rows is extended; one with more keeps them
        (the first ``n_groupings`` are built if need be, and returned).
    n_bootstrap : int, default=50
        r, training rows drawn with replacement for each grouping.
    n_clusters : int or float, default=0.1
        k, or a float in (0, 1) taken as a fraction of the number of features.
    seed : int, default=0
    rows : array-like of int, optional
        The rows the bootstrap samples are drawn from (part of the bank's key); default the
        store's training rows.
        Grouping i depends only on ``(seed, i)``.
    client : distributed.Client, optional
        Default: an embedded LocalCluster for the duration of the call (only when some
        grouping is left to build).
    progress : bool, default=True
        Show a progress bar (tqdm, on stderr).
    overwrite : bool, default=False
        Rebuild the bank of these parameters from scratch (other banks are kept).
    return_info : bool, default=False
        Also return a dict: ``key``, the bank parameters, ``n_groupings``, ``built``,
        ``reused``, ``seconds`` and ``location`` (the path of the store or cache store
        holding the bank).

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    info : dict
        Only when ``return_info`` is True.

    Raises
    ------
    ValueError
        On bad parameters or a store without training rows.
    fgscale.store.BankError
        With ``overwrite``, if the bank lies in the store and new banks go to its cache.
    fgscale.store.StoreError
        If groupings are to be built and neither the store nor the cache dir is writable.
    """
    start = time.perf_counter()
    store = open_store(store_path)
    spec = bank_spec(store, n_clusters=n_clusters, n_bootstrap=n_bootstrap, seed=seed, rows=rows,
                     n_groupings=n_groupings)
    bank, built = _built(store, spec, overwrite=overwrite, client=client, progress=progress)
    labels = bank.labels[:spec.n_groupings]
    if not return_info:
        return labels
    info = {"key": spec.key, **spec.params, "n_groupings": spec.n_groupings, "built": built,
            "reused": spec.n_groupings - built, "seconds": time.perf_counter() - start,
            "location": bank.location}
    return labels, info


def _built(store: Store, spec: BankSpec, *, overwrite: bool = False, client=None,
           progress: bool = False) -> tuple[Bank, int]:
    """The bank of ``spec``, its groupings built where missing or damaged (all of them with
    ``overwrite``); and the number built."""
    key, n_groupings = spec.key, spec.n_groupings
    found = find_banks(store, key)
    if not overwrite:
        _reopen_damaged(store, found, n_groupings)
    bank = None if overwrite else _complete(found, n_groupings)
    if bank is None:
        return _build(store, key, spec.params, spec.rows, n_groupings, found,
                      overwrite=overwrite, client=client, progress=progress)
    bank.check(spec.params, store.n_features)
    log.info("bank %s of %s: all %d groupings built (in %s)", key, store.path.resolve(),
             n_groupings, bank.location)
    return bank, 0


def _build(store: Store, key: str, params: dict, rows, n_groupings: int, found: list[Bank], *,
           overwrite: bool, client, progress: bool) -> tuple[Bank, int]:
    """Create (or extend) bank ``key`` where this process writes and build its missing
    groupings; returns the bank and the number of groupings built."""
    where = _build_location(store, key, found, overwrite)
    root = zarr.open_group(where, mode="r+")
    try:
        root.require_group(BANKS)
    except zarr.errors.ContainsGroupError:  # made meanwhile by another command building a bank
        pass
    # another command building this bank (two jobs on one cohort) finishes first: both would
    # build every grouping, and a creation could wipe the rows the other had written
    with exclusive(Path(where) / BANKS):
        bank = None if overwrite else _complete(find_banks(store, key), n_groupings)
        if bank is None:
            bank = create_bank(root, key, params, n_groupings, store.n_features, rows=rows,
                               overwrite=overwrite)
        else:  # built meanwhile by the command that held the lock
            bank.check(params, store.n_features)
        todo = bank.todo(n_groupings)
        path = str(store.path.resolve())
        log.info("bank %s of %s: %d of %d groupings to build (in %s)", key, path, todo.size,
                 n_groupings, bank.location)
        if todo.size:
            seeds = [grouping_seed(params["seed"], i) for i in todo]
            with get_client(client=client) as c:
                run_tasks(c, _grouping_task,
                          [(path, bank.location, key, int(i), s, params["n_clusters"],
                            params["n_bootstrap"]) for i, s in zip(todo, seeds, strict=True)],
                          # named by k: "auto" builds a bank per k, one bar after another
                          progress=progress, desc=f"groupings (k {params['n_clusters']})",
                          unit="grouping")
    return bank, int(todo.size)


def load_bank(store_path, *, n_clusters: int | float, n_bootstrap: int, seed: int, rows=None,
              n_groupings: int | None = None) -> tuple[np.ndarray, dict]:
    """Read the bank of these parameters from a store or its cache store, and never another.

    Parameters
    ----------
    store_path : str or Path
    n_clusters : int or float
        k, or a fraction of the features (resolved as :func:`build_bank` does).
    n_bootstrap : int
    seed : int
    rows : array-like of int, optional
        As :func:`build_bank`'s.
    n_groupings : int, optional
        Read only the first ``n_groupings`` groupings (they must be built); default all of the
        bank's, which must all be built.

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    info : dict
        ``key``, ``n_groupings``, ``n_clusters``, ``n_bootstrap``, ``seed``, ``rows_sha1``,
        ``n_rows``, ``location`` (the path of the store or cache store it was read from).

    Raises
    ------
    fgscale.store.BankError
        (a ValueError) If neither the store nor its cache holds a bank of that key (the
        message names the store, the key asked and the keys present), or too few of its
        groupings are built.
    """
    store = open_store(store_path)
    return _read(store, bank_spec(store, n_clusters=n_clusters, n_bootstrap=n_bootstrap, seed=seed,
                                  rows=rows, n_groupings=n_groupings))


def _read(store: Store, spec: BankSpec) -> tuple[np.ndarray, dict]:
    """:func:`load_bank` of ``spec``."""
    key, params, n = spec.key, spec.params, spec.n_groupings
    # the first copy with every grouping asked for (the store's, then the cache's), else the
    # errors of the first copy found
    bank = _complete(find_banks(store, key), n) or open_bank(store, key)
    bank.check(params, store.n_features)
    n = bank.n_groupings if n is None else n
    if n > bank.n_groupings:
        raise BankError(f"{store.path}: bank {key!r} holds {bank.n_groupings} groupings, "
                        f"{n} asked; re-run 'fgscale bank' with --n-groupings {n} to extend it")
    todo = bank.todo(n)
    if todo.size:
        raise BankError(f"{store.path}: bank {key!r} is incomplete ({n - todo.size} of {n} "
                        "groupings built); re-run 'fgscale bank' to finish it")
    labels, damaged = bank.read(n)
    if damaged:
        raise BankError(f"{bank.location}: groupings {damaged[:10]} of bank {key!r} are damaged "
                        "(a chunk file removed or truncated); re-run 'fgscale bank' to build "
                        "them again")
    return labels, {"key": key, "n_groupings": n, **params, "location": bank.location}


def bank_ready(store, spec: BankSpec) -> bool:
    """Whether the bank of ``spec`` is built (in the store or its cache store), its first
    ``spec.n_groupings`` groupings at least; reads their flags, not the groupings.

    Parameters
    ----------
    store : str, Path or Store
    spec : BankSpec
        From :func:`bank_spec`.
    """
    return _complete(find_banks(open_store(store), spec.key), spec.n_groupings) is not None


def ensure_bank(store, spec: BankSpec, *, client: Client | None = None,
                progress: bool = False) -> tuple[np.ndarray, dict]:
    """The bank of ``spec``: read from the store or its cache store, or built, finished or
    extended first on the cluster, as :func:`build_bank` does (the estimator's way to a bank).

    Parameters
    ----------
    store : str, Path or Store
    spec : BankSpec
        From :func:`bank_spec`, with ``n_groupings``.
    client : distributed.Client, optional
        Used only when groupings are left to build; default an embedded LocalCluster then.
    progress : bool, default=False

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    info : dict
        As :func:`load_bank`'s, plus ``built``: the groupings this call computed.
    """
    store = open_store(store)
    found = _complete(find_banks(store, spec.key), spec.n_groupings)
    built = 0
    # built and whole: read as it is; else missing, short, unfinished or damaged: build what
    # is left first
    if found is None or found.read(spec.n_groupings)[1]:
        _, built = _built(store, spec, client=client, progress=progress)
    bank, info = _read(store, spec)
    return bank, {**info, "built": built}
