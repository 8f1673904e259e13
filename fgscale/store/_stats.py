"""Per-feature mean and standard deviation of a store's rows, as a resumable Dask reduction.

Training on raw scanner units (values near 10,000 that vary by a few hundred) sends a model to
chance; standardizing each feature, ``(x - mean) / std``, fixes it. The statistics of a set of
rows live in the store (or, for a store this process may not write, in its cache store:
:mod:`fgscale.store._derived`), under a key that names the rows::

    stats/<key>/               key: sha1 of the sorted, distinct row indices (int64 bytes)
        rows           int64   (n_rows,)         the rows described
        partial_count  int64   (n_blocks,)       rows of block i            one chunk per block
        partial_mean   float64 (n_blocks, p)     mean of block i            one chunk per block
        partial_m2     float64 (n_blocks, p)     sum of squared deviations  one chunk per block
        done           uint8   (n_blocks,)       1 once block i's partials are written
        mean, std      float64 (p,)              the result, once every block is done

with the attributes ``n_rows``, ``n_blocks``, ``span`` (rows per block, a multiple of the store's
``block_rows``) and ``complete`` (set after ``mean`` and ``std``). The partials of size p are
deleted once the result is saved.

Blocks are those of :meth:`fgscale.store.Store.iter_blocks` (one shard of rows each). Task i gets
the store path, the path of the group to write into (the store or its cache store), the key, i and
its rows; it reads them, computes float64 partial statistics (count, mean, M2) with two passes
over the block in memory, writes them to row i of the partial arrays, then flag i. The client
merges the partials in block order with Chan et al.'s parallel update, so the result does not
depend on the number of workers, nor on which blocks a killed run left behind: a re-run computes
only the blocks whose flag is unset. ``std`` uses ``ddof=0``; a constant feature gets ``std = 1``
(the criterion of scikit-learn's ``StandardScaler``), so that ``(x - mean) / std`` is 0 there and
never divides by zero.

Nothing here imports torch or scikit-learn: workers import this module.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import zarr

from fgscale._dask.client import get_client, run_tasks
from fgscale._utils.files import exclusive
from fgscale.store._derived import read_locations, write_location
from fgscale.store._reader import Store, open_store
from fgscale.store._shards import resumable_write, sync_node, sync_rows

log = logging.getLogger(__name__)

__all__ = ["array_stats", "compute_stats", "load_stats", "stats_key", "stats_location",
           "stats_ready"]

STATS = "stats"
_PARTIALS = ("partial_count", "partial_mean", "partial_m2", "done")
_CHUNK_VALUES = 1 << 21  # float64 temporaries of a pass over a block: 16 MiB at most


def _unique_rows(rows) -> np.ndarray:
    return np.unique(np.asarray(rows, dtype=np.int64).reshape(-1))


def stats_key(rows) -> str:
    """The key of a set of rows in ``stats/``: sha1 of its sorted, distinct int64 indices
    (little-endian bytes), in hex. Order and duplicates do not change it."""
    return hashlib.sha1(_unique_rows(rows).astype("<i8").tobytes()).hexdigest()


# ---------------------------------------------------------------- the arithmetic

def _partials(X: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Float64 ``(count, mean, M2)`` of the rows of ``X`` (2D), by two passes in row chunks."""
    n, p = X.shape
    step = max(1, _CHUNK_VALUES // max(p, 1))
    total = np.zeros(p)
    for i in range(0, n, step):
        total += X[i : i + step].sum(axis=0, dtype=np.float64)
    mean = total / max(n, 1)
    m2 = np.zeros(p)
    for i in range(0, n, step):
        d = X[i : i + step].astype(np.float64)
        d -= mean
        m2 += np.einsum("ij,ij->j", d, d)
    return n, mean, m2


def _merge(a: tuple, b: tuple) -> tuple[int, np.ndarray, np.ndarray]:
    """Chan et al.'s update: the partials of the union of two disjoint sets of rows."""
    na, ma, m2a = a
    nb, mb, m2b = b
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta * delta * (na * nb / n)


def _finish(n: int, mean: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 mean and std (ddof=0), std set to 1 where the feature is constant."""
    var = m2 / max(n, 1)
    eps = np.finfo(np.float64).eps
    # constant up to float64 rounding: StandardScaler's bound (sklearn.preprocessing._data)
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    std = np.sqrt(var)
    std[constant] = 1.0
    return mean, std


def array_stats(X) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and standard deviation of an in-memory array, as :func:`compute_stats`.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)

    Returns
    -------
    mean, std : ndarray of shape (n_features,), float32
        Accumulated in float64, ``ddof=0``; ``std`` is 1 for a constant feature.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be 2D with at least one row, got shape {X.shape}")
    mean, std = _finish(*_partials(X))
    return mean.astype(np.float32), std.astype(np.float32)


# ---------------------------------------------------------------- the store

def _blocks(rows: np.ndarray, span: int) -> list[np.ndarray]:
    """The sorted rows cut at multiples of ``span``, as :meth:`Store.iter_blocks` does."""
    parts = np.split(rows, np.flatnonzero(np.diff(rows // span)) + 1)
    return [part for part in parts if part.size]


def _block_task(path: str, derived: str, key: str, index: int, rows: np.ndarray) -> int:
    """Worker task: the partial statistics of one block of the store ``path``, written to row
    ``index`` of ``stats/<key>`` in the group ``derived`` (the store or its cache store)."""
    store = open_store(path)
    (part, X), = store.iter_blocks(rows, block_size=store.block_rows)
    n, mean, m2 = _partials(X)
    with resumable_write(derived, f"the statistics of block {index}"):
        group = zarr.open_group(derived, mode="r+")[f"{STATS}/{key}"]
        for name, value in (("partial_count", n), ("partial_mean", mean), ("partial_m2", m2)):
            group[name][index] = value
            sync_rows(group[name], index)
        group["done"][index] = 1  # after the partials: a flag never claims a half-written block
        sync_rows(group["done"], index)
    return index


def _complete(group: zarr.Group, key: str, rows: np.ndarray | None = None):
    """The subgroup ``stats/<key>`` when its result is saved, else None (nothing of size p
    is read)."""
    if STATS not in group or key not in group[STATS]:
        return None
    sub = group[STATS][key]
    if not sub.attrs.get("complete", False) or "mean" not in sub or "std" not in sub:
        return None
    if rows is not None and not np.array_equal(sub["rows"][:], rows):
        raise ValueError(f"stats/{key}: saved for other rows than asked (sha1 collision?)")
    return sub


def _saved(group: zarr.Group, key: str, rows: np.ndarray | None = None):
    """Float64 ``(mean, std)`` saved under ``stats/<key>``, or None when not complete."""
    sub = _complete(group, key, rows)
    return None if sub is None else (sub["mean"][:], sub["std"][:])


def _find_saved(store: Store, key: str, rows: np.ndarray | None = None):
    """``(location, subgroup)`` of the first place holding complete statistics under
    ``stats/<key>`` (the store, then its cache), or None."""
    for location in read_locations(store):
        sub = _complete(zarr.open_group(location, mode="r"), key, rows)
        if sub is not None:
            return location, sub
    return None


def _load_found(store: Store, key: str, rows: np.ndarray):
    """Float64 ``(mean, std)`` from the first place holding them complete
    (:func:`_find_saved`), or None."""
    found = _find_saved(store, key, rows)
    return None if found is None else (found[1]["mean"][:], found[1]["std"][:])


def stats_ready(store_path, rows) -> bool:
    """Whether the statistics of ``rows`` are saved in a store (a path or a Store) or its
    cache (without reading them)."""
    rows = _unique_rows(rows)
    return _find_saved(open_store(store_path), stats_key(rows), rows) is not None


def stats_location(store: Store, rows) -> str:
    """The path of the group holding the complete statistics of ``rows`` of ``store``: the
    store, or its cache store (what workers read them from).

    Raises
    ------
    ValueError
        If neither holds them (compute them first with :func:`compute_stats`).
    """
    rows = _unique_rows(rows)
    found = _find_saved(store, stats_key(rows), rows)
    if found is None:
        raise ValueError(f"{store.path}: no feature statistics saved under {STATS}/"
                         f"{stats_key(rows)} of the store or its cache; compute them first "
                         "with fgscale.store.compute_stats")
    return found[0]


def read_saved(group: zarr.Group, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Float32 ``(mean, std)`` saved under ``stats/<key>`` of an open group (workers): the
    store's, or its cache store's.

    Raises
    ------
    ValueError
        If no complete statistics are saved under that key.
    """
    saved = _saved(group, key)
    if saved is None:
        raise ValueError(f"no feature statistics saved under {STATS}/{key} of the store; "
                         "compute them first with fgscale.store.compute_stats")
    return saved[0].astype(np.float32), saved[1].astype(np.float32)


def load_stats(store_path, rows=None) -> tuple[np.ndarray, np.ndarray] | None:
    """The statistics of ``rows`` saved in a store or its cache, or None when they are not
    (all) computed.

    Parameters
    ----------
    store_path : str or Path
    rows : array-like of int, optional
        Default the store's training rows (split "train" or unassigned).

    Returns
    -------
    (mean, std) : ndarrays of shape (n_features,), float32, or None
    """
    store = open_store(store_path)
    rows = store.train_rows() if rows is None else _unique_rows(rows)
    saved = _load_found(store, stats_key(rows), rows)
    return None if saved is None else (saved[0].astype(np.float32), saved[1].astype(np.float32))


def _prepare(group: zarr.Group, key: str, rows: np.ndarray, n_blocks: int, span: int,
             n_features: int) -> zarr.Group:
    """Create ``stats/<key>`` or check that the one there can be resumed; return it."""
    stats = group.require_group(STATS)
    if key in stats:
        sub = stats[key]
        attrs = sub.attrs.asdict()
        if (attrs.get("n_blocks") == n_blocks and attrs.get("span") == span
                and all(name in sub for name in (*_PARTIALS, "rows"))
                and np.array_equal(sub["rows"][:], rows)):
            return sub
        log.info("%s/%s: partial statistics of another layout, starting afresh", STATS, key)
        del stats[key]
    sub = stats.create_group(key)
    sub.create_array("rows", data=rows, chunks=(max(rows.size, 1),))
    sub.create_array("partial_count", shape=(n_blocks,), dtype="int64", chunks=(1,),
                     fill_value=0)
    for name in ("partial_mean", "partial_m2"):
        sub.create_array(name, shape=(n_blocks, n_features), dtype="float64",
                         chunks=(1, n_features), fill_value=0.0, compressors=None)
    sub.create_array("done", shape=(n_blocks,), dtype="uint8", chunks=(1,), fill_value=0)
    sub.attrs.update({"n_rows": int(rows.size), "n_blocks": n_blocks, "span": span,
                      "complete": False})
    sync_node(sub, whole=True)  # before any task writes a partial in it
    return sub


def compute_stats(store_path, rows=None, *, client=None, progress: bool = True
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and standard deviation of rows of a store, on a Dask cluster.

    One task per shard-aligned block of the rows (:meth:`Store.iter_blocks`); each writes its
    float64 partial statistics into the store (``stats/<key>/``, see the module's docstring), and
    the client merges them in block order. Saved results are reused; a killed run resumes with
    the blocks it had not finished. A store this process may not write gets them in its cache
    store (:func:`fgscale.store._derived.write_location`).

    Parameters
    ----------
    store_path : str, Path or Store
        A complete store; the statistics are written into it, or into its cache store.
    rows : array-like of int, optional
        Rows to describe (order and duplicates ignored); default the store's training rows.
    client : distributed.Client, optional
        Default: an embedded LocalCluster for the duration of the call (only when some block is
        still to compute).
    progress : bool, default=True
        Show a progress bar (tqdm, on stderr).

    Returns
    -------
    mean, std : ndarray of shape (n_features,), float32
        ``ddof=0``; ``std`` is 1 for a constant feature. Standardize with
        ``(x - mean) * (1 / std)``.

    Raises
    ------
    ValueError
        If there is no row to describe.
    StoreError
        If they are to be computed and neither the store nor the cache dir is writable.
    """
    store = open_store(store_path)
    path = str(Path(store.path).resolve())
    rows = store.train_rows() if rows is None else store._check_rows(_unique_rows(rows))
    if rows.size == 0:
        raise ValueError(f"{path}: no rows to compute feature statistics of")
    key = stats_key(rows)
    saved = _load_found(store, key, rows)
    if saved is None:
        derived = write_location(store)
        # another command computing them on the same store (two jobs on one cohort) finishes
        # first: it would drop its partials under this one's tasks
        with exclusive(derived):
            saved = _load_found(store, key, rows)
            if saved is None:
                saved = _compute(store, path, derived, key, rows, client, progress)
    return saved[0].astype(np.float32), saved[1].astype(np.float32)


def _compute(store: Store, path: str, derived: str, key: str, rows: np.ndarray, client,
             progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Compute (or finish) the statistics of ``rows`` into ``derived``, as tasks."""
    span = store.block_rows
    blocks = _blocks(rows, span)
    sub = _prepare(zarr.open_group(derived, mode="r+"), key, rows, len(blocks), span,
                   store.n_features)
    todo = np.flatnonzero(sub["done"][:] == 0)
    log.info("feature statistics of %d rows of %s: %d of %d blocks to compute (in %s)",
             rows.size, path, todo.size, len(blocks), derived)
    if todo.size:
        with get_client(client=client) as c:
            run_tasks(c, _block_task, [(path, derived, key, int(i), blocks[i]) for i in todo],
                      progress=progress, desc="feature stats", unit="block")
    return _save_result(sub, len(blocks))


def _save_result(sub: zarr.Group, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge the partials in block order, save ``mean`` and ``std``, drop the partials."""
    if not sub["done"][:].all():
        raise RuntimeError(f"{sub.path}: some blocks have no partial statistics")
    counts = sub["partial_count"][:]
    acc = (0, None, None)
    for i in range(n_blocks):  # in block order: the same float64 sums whatever the workers
        acc = _merge(acc, (int(counts[i]), sub["partial_mean"][i], sub["partial_m2"][i]))
    mean, std = _finish(*acc)
    for name, value in (("mean", mean), ("std", std)):
        if name in sub:
            del sub[name]
        sub.create_array(name, data=value, chunks=value.shape, compressors=None)
        sync_node(sub[name], whole=True)
    sub.attrs["complete"] = True  # after the result: a flag never claims a half-written one
    sync_node(sub)
    for name in ("partial_mean", "partial_m2"):
        del sub[name]
    return mean, std
