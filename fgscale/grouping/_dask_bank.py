"""Build the bank of groupings on a Dask cluster, straight into the store.

The bank lives in the store's Zarr group, beside ``X``::

    bank       int32 (b, n_features)  row i is grouping i (labels 0 .. k-1); one chunk per row
    bank_done  bool  (b,)             True once row i is written; one chunk per flag

and the group attribute ``bank`` = ``{"n_clusters": k, "n_bootstrap": r, "seed": s}``.

The client draws every grouping's seed up front (:func:`fgscale.grouping.grouping_seed`); each task
gets only ``(store path, i, seed_i, k, r)``, reads its r bootstrap rows from the training rows,
runs ReNA and writes row i, then flag i. Tasks never share a chunk, and a task that runs twice
(a worker died, Dask retried it) writes the same bytes again, so the result is the in-memory
:func:`fgscale.grouping.make_bank` exactly, whatever the number of workers or failures. A bank is
resumable (only rows whose flag is unset are computed) and extensible (a larger b resizes the
arrays and computes the new rows only).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import zarr
from distributed import Client, as_completed
from tqdm.auto import tqdm

from fgscale.cluster import get_client
from fgscale.grouping._bank import build_grouping, grouping_seed, resolve_n_clusters
from fgscale.store._reader import open_store

log = logging.getLogger(__name__)

__all__ = ["build_bank", "load_bank"]

BANK, DONE, ATTR = "bank", "bank_done", "bank"
_PARAMS = ("n_clusters", "n_bootstrap", "seed")


def _grouping_task(path: str, index: int, seed: int, n_clusters: int, n_bootstrap: int) -> int:
    """Build grouping ``index`` and write it into the store (runs on a worker)."""
    store = open_store(path, mode="r+")
    labels = build_grouping(store.read_rows, store.train_rows(), store.mask, n_clusters,
                            n_bootstrap, seed)
    store.group[BANK][index] = labels
    store.group[DONE][index] = True  # after the labels: a flag never claims a half-written row
    return index


def _prepare(group: zarr.Group, path: Path, params: dict, n_groupings: int, n_features: int,
             overwrite: bool) -> np.ndarray:
    """Create, check or extend the bank arrays; return the indices still to compute."""
    stored = group.attrs.get(ATTR)
    if stored is not None and not overwrite:
        diff = {name: (stored.get(name), params[name]) for name in _PARAMS
                if stored.get(name) != params[name]}
        if diff:
            detail = ", ".join(f"{name}: stored {old!r}, asked {new!r}"
                               for name, (old, new) in diff.items())
            raise ValueError(f"{path}: the stored bank was built with other parameters "
                             f"({detail}); pass overwrite=True (--overwrite) to rebuild it")
    if stored is None or overwrite or BANK not in group or DONE not in group:
        for name in (BANK, DONE):
            if name in group:
                del group[name]
        group.create_array(BANK, shape=(n_groupings, n_features), dtype="int32",
                           chunks=(1, n_features), fill_value=-1)
        group.create_array(DONE, shape=(n_groupings,), dtype="bool", chunks=(1,),
                           fill_value=False)
        group.attrs[ATTR] = params
    elif group[BANK].shape[0] < n_groupings:
        log.info("extending the bank of %s from %d to %d groupings", path,
                 group[BANK].shape[0], n_groupings)
        group[BANK].resize((n_groupings, n_features))
        group[DONE].resize((n_groupings,))
    return np.flatnonzero(~group[DONE][:n_groupings])


def build_bank(store_path, *, n_groupings: int = 100, n_bootstrap: int = 50,
               n_clusters: int | float = 0.1, seed: int = 0, client: Client | None = None,
               progress: bool = True, overwrite: bool = False, return_info: bool = False):
    """Build (or complete, or extend) the bank of a store on a Dask cluster.

    Parameters
    ----------
    store_path : str or Path
        A complete fgscale store; the bank is written into it.
    n_groupings : int, default=100
        b, groupings wanted. A stored bank with fewer rows is extended; one with more keeps them
        (the first ``n_groupings`` are returned).
    n_bootstrap : int, default=50
        r, training rows drawn with replacement for each grouping.
    n_clusters : int or float, default=0.1
        k, or a float in (0, 1) taken as a fraction of the number of features.
    seed : int, default=0
        Grouping i depends only on ``(seed, i)``.
    client : distributed.Client, optional
        Default: an embedded LocalCluster for the duration of the call.
    progress : bool, default=True
        Show a progress bar (tqdm, on stderr).
    overwrite : bool, default=False
        Rebuild from scratch, even when a bank with other parameters is stored.
    return_info : bool, default=False
        Also return a dict: the bank parameters and ``built``, ``reused``, ``seconds``.

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    info : dict
        Only when ``return_info`` is True.

    Raises
    ------
    ValueError
        On bad parameters, a store without training rows, or a stored bank built with other
        ``n_clusters``/``n_bootstrap``/``seed`` (unless ``overwrite``).
    """
    start = time.perf_counter()
    for name, value in (("n_groupings", n_groupings), ("n_bootstrap", n_bootstrap)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    store = open_store(store_path, mode="r+")
    path = store.path
    if store.train_rows().size == 0:
        raise ValueError(f"{path}: no training rows to draw the bootstrap samples from")
    params = {"n_clusters": resolve_n_clusters(n_clusters, store.n_features),
              "n_bootstrap": int(n_bootstrap), "seed": int(seed)}
    todo = _prepare(store.group, path, params, int(n_groupings), store.n_features, overwrite)
    log.info("bank of %s: %d of %d groupings to build (k=%d, r=%d, seed=%d)", path, todo.size,
             n_groupings, params["n_clusters"], params["n_bootstrap"], params["seed"])
    if todo.size:
        seeds = [grouping_seed(params["seed"], i) for i in todo]
        with get_client(client=client) as c:
            _run_tasks(c, str(path), todo, seeds, params, progress)
    bank = store.group[BANK][:n_groupings]
    if not return_info:
        return bank
    info = {**params, "n_groupings": int(n_groupings), "built": int(todo.size),
            "reused": int(n_groupings - todo.size), "seconds": time.perf_counter() - start}
    return bank, info


def _run_tasks(client: Client, path: str, todo: np.ndarray, seeds: list[int], params: dict,
               progress: bool) -> None:
    futures = [client.submit(_grouping_task, path, int(i), s, params["n_clusters"],
                             params["n_bootstrap"], pure=False)
               for i, s in zip(todo, seeds, strict=True)]
    try:
        with tqdm(total=len(futures), desc="groupings", unit="grouping",
                  disable=not progress) as bar:
            for future in as_completed(futures):
                future.result()  # re-raises a task's error here
                bar.update()
    finally:
        client.cancel(futures)  # no-op when all are done; stops the rest after an error


def load_bank(store_path) -> tuple[np.ndarray, dict]:
    """Read a store's complete bank.

    Parameters
    ----------
    store_path : str or Path

    Returns
    -------
    bank : ndarray of shape (n_groupings, n_features), int32
    info : dict
        ``n_groupings``, ``n_clusters``, ``n_bootstrap``, ``seed``.

    Raises
    ------
    ValueError
        If the store holds no bank, or some of its groupings are not built yet.
    """
    store = open_store(store_path)
    group = store.group
    if group.attrs.get(ATTR) is None or BANK not in group or DONE not in group:
        raise ValueError(f"{store.path}: the store holds no bank; build one with "
                         f"'fgscale bank {store.path}'")
    done = group[DONE][:]
    if not done.all():
        raise ValueError(f"{store.path}: the bank is incomplete ({int(done.sum())} of "
                         f"{done.size} groupings built); re-run 'fgscale bank' to finish it")
    info = {"n_groupings": int(done.size), **dict(group.attrs[ATTR])}
    return group[BANK][:], info
