"""The fgscale Zarr v3 store: its layout, and the writers of a masked NIfTI cohort into it.

Layout of a store (a directory ``STORE.zarr``, one Zarr v3 group)::

    X        float32 (n_samples, n_features)  rows are ``vol[mask]`` in C order (as nilearn)
    y        int32   (n_samples,)             class index per row (all 0 without labels)
    classes  str     (n_classes,)             class names, ``classes[y]`` is the label;
                                              empty when the cohort has no labels
    target   float64 (n_samples,)             optional: numeric target per row (regression)
    mask     bool    grid_shape               the 3D mask on the store's grid
    affine   float64 (4, 4)                   voxel -> world of the grid
    source   str     (n_samples,)             provenance: file each row came from
    volume   int32   (n_samples,)             volume index inside that file (0 for 3D)
    group    str     (n_samples,)             subject / study ("" when none)
    split    str     (n_samples,)             "train", "test" or "" (unassigned)
    done     uint8   (n_blocks,)              1 once row block i of X is written
    inputs   int64   (n_entries, 2)           of a converted store: the size and modification
                                              time (ns) of each table row's file, as converted
    bank     int32   (b, n_features)          added later by the bank step (not written here)

A store carries class labels, a target, or both: one without labels (a regression cohort) keeps
``y`` and ``classes`` so that every store reads the same way, with ``classes`` empty and ``y``
all 0 (:attr:`fgscale.store.Store.has_labels` tells). ``target`` is absent from stores without
a target, including those written before it existed (:attr:`fgscale.store.Store.target` is
None then), hence no new format version.

Group attributes: ``fgscale_format_version``, ``complete`` (set last), ``grid_shape``,
``block_rows``, ``synthetic``, ``params`` (conversion parameters), ``summary`` and
``space_codes`` (the images' qform and sform codes; absent in stores of arrays or of older
versions, read as nibabel's defaults, hence no new format version).

Why this layout of ``X``: training reads random minibatches of whole rows, so every row is its
own chunk of shape (1, p), rows are packed into shards of shape (block_rows, p) (one file per
shard, about 64 MiB), and nothing is compressed. ``scripts/bench_store.py`` compares the
layouts; the README's performance section has the figures.

- 64-row zstd chunks (the obvious layout): the rows of a random batch fall in almost every
  chunk, and each chunk is decoded whole for the one or two rows used from it, so a batch
  reads at a small fraction of the raw read speed of the same bytes.
- (1, p) chunks in shards read through :class:`fgscale.store.ShardRowReader` (the shard index,
  then one byte range per row): a batch reads its own rows' bytes and nothing else, near the
  raw read speed. Zarr's own orthogonal selection on this layout is slower than on the first
  (zarr 3.1 fetches the whole shard for each inner chunk), hence the direct reader, which
  follows the sharding spec.
- zstd on top saves little space on noise-like float32 maps, and makes every batch decode what
  it reads; raw wins.

Shards also keep the number of files small and give writers whole, independent units:
conversion block i writes shard i and nothing else, so no two tasks write the same object.

Atomicity and resumability: :func:`write_store` writes under a temporary name and renames it at
the end. :mod:`fgscale.store._convert` writes in place instead, block by block, setting ``done[i]``
(its own chunk) after shard i is fully written, and sets ``complete`` only when every block is
done; :func:`open_store` refuses a store that is not complete.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import zarr

from fgscale._utils.files import fsync_dir, fsync_tree, owner_elsewhere, owner_gone, owner_tag
from fgscale.store._reader import FORMAT_VERSION, Store, open_group_checked, open_store
from fgscale.store._records import labels_array, row_records, target_array
from fgscale.store._shards import ShardRowReader, StoreError, sync_node, sync_rows

__all__ = ["block_range", "create_store", "create_whole", "damaged_blocks", "default_block_rows",
           "mark_complete", "remove_aside", "reopen_damaged", "write_block", "write_block_rows",
           "write_store"]

log = logging.getLogger(__name__)

_TARGET_SHARD_BYTES = 64 * 2**20  # one shard of X is one conversion task's output
_MAX_BLOCK_ROWS = 1024


def default_block_rows(n_features: int) -> int:
    """Rows per shard of ``X`` (and per conversion task): about 64 MiB, at most 1024 rows."""
    return int(np.clip(_TARGET_SHARD_BYTES // (4 * max(n_features, 1)), 1, _MAX_BLOCK_ROWS))


def create_store(path, *, n_samples: int, mask: np.ndarray, affine: np.ndarray, y=None,
                 classes: Sequence[str] | None = None, target=None, source=None, volume=None,
                 groups=None, split=None, attrs: dict | None = None,
                 block_rows: int | None = None, extra: dict | None = None) -> zarr.Group:
    """Create an empty, not yet complete store: all metadata arrays, ``X`` unwritten.

    Parameters
    ----------
    path : str or Path
        Store directory; overwritten if it exists.
    n_samples : int
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    y : ndarray of shape (n_samples,), int, default=None
        Class indices into ``classes``; None (with ``classes`` None) for a store without class
        labels: ``y`` is then written as zeros and ``classes`` empty.
    classes : sequence of str of length n_classes, default=None
    target : array-like of shape (n_samples,), float, default=None
        A finite numeric target per row (regression); None writes no ``target`` array.
    source, groups, split : array-like of shape (n_samples,) of str, optional
    volume : array-like of shape (n_samples,) of int, optional
    attrs : dict, optional
        Extra group attributes (``params``, ``synthetic``...).
    block_rows : int, optional
        Rows per shard of ``X``; default :func:`default_block_rows`.
    extra : dict of str to ndarray, optional
        Further small arrays, each one chunk (a conversion's record of its files).

    Returns
    -------
    group : zarr.Group
        Opened read-write.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 3:
        raise ValueError(f"mask must be 3D, got shape {mask.shape}")
    n_features = int(mask.sum())
    if n_features == 0:
        raise ValueError("mask is empty: no voxel to store")
    affine = np.asarray(affine, dtype=np.float64)
    if affine.shape != (4, 4):
        raise ValueError(f"affine must have shape (4, 4), got {affine.shape}")
    y, classes = labels_array(y, classes, n_samples)
    target = target_array(target, n_samples)
    records = row_records(n_samples, source=source, volume=volume, groups=groups, split=split)
    block_rows = int(block_rows or default_block_rows(n_features))
    n_blocks = -(-n_samples // block_rows)

    g = zarr.open_group(str(path), mode="w")
    g.create_array("X", shape=(n_samples, n_features), dtype="float32",
                   chunks=(1, n_features), shards=(block_rows, n_features),
                   compressors=None, fill_value=0.0)
    small = {"y": y, "classes": classes, "mask": mask, "affine": affine, **records,
             "done": np.zeros(n_blocks, np.uint8)}
    if target is not None:
        small["target"] = target
    small.update(extra or {})
    for name, data in small.items():
        chunks = (1,) if name == "done" else data.shape  # one flag per chunk: writers never share
        g.create_array(name, data=data, chunks=tuple(max(c, 1) for c in chunks))
    g.attrs.update({
        "fgscale_format_version": FORMAT_VERSION, "complete": False,
        "grid_shape": list(mask.shape), "block_rows": block_rows, "synthetic": False,
        **(attrs or {}),
    })
    return g


def create_whole(out: Path, **kwargs) -> zarr.Group:
    """:func:`create_store` under a temporary name, renamed to ``out`` once whole (conversion):
    a run killed while the empty store is written (its metadata comes last) leaves no store that
    the re-run would refuse as foreign, only the temporary folder, which the re-run removes. Two
    conversions started at once each write their own; the second to rename uses the first's
    store when it has the same inputs (``attrs["params"]["fingerprint"]``)."""
    for stale in [*out.parent.glob(glob.escape(out.name) + ".creating*"),  # of a killed run
                  *out.parent.glob(glob.escape(out.name) + ".removing*")]:
        tag = stale.name.rpartition(".")[2]
        if owner_gone(tag):
            shutil.rmtree(stale, ignore_errors=True)
        elif host := owner_elsewhere(tag):  # whether it still runs is not known here
            log.warning("%s: left by a process on %s; remove it once no conversion runs there",
                        stale, host)
    tmp = out.with_name(f"{out.name}.creating.{owner_tag()}")  # a conversion at once has its own
    create_store(tmp, **kwargs)
    fsync_tree(tmp)  # on the disk before the rename: a machine's crash leaves it whole or absent
    try:
        os.replace(tmp, out)
    except OSError:  # the other conversion renamed its own first: resumed, as a re-run would
        shutil.rmtree(tmp, ignore_errors=True)
        if kwargs["attrs"]["params"]["fingerprint"] != open_group_checked(out).attrs.get(
                "params", {}).get("fingerprint"):
            raise StoreError(f"{out}: another conversion, of other inputs, created it "
                             "meanwhile; remove it or choose another --out") from None
    # outside the try: a failed flush (EIO) is not the other conversion's rename, and is raised
    fsync_dir(out.parent)
    return open_group_checked(out, "r+")


def remove_aside(path: Path) -> None:
    """Remove the folder ``path``, renamed aside first (``<name>.removing.<pid>@<host>``, one atomic
    step) then deleted: an interruption leaves either the whole folder at ``path`` or none,
    never a part that the next command would refuse as not a store; the next conversion
    removes what a killed removal left aside (:func:`create_whole`)."""
    aside = path.with_name(f"{path.name}.removing.{owner_tag()}")
    shutil.rmtree(aside, ignore_errors=True)  # this process's own, interrupted earlier
    os.replace(path, aside)
    shutil.rmtree(aside)


def block_range(block: int, block_rows: int, n_samples: int) -> tuple[int, int]:
    """Row range ``[start, stop)`` of block (shard) ``block``."""
    return block * block_rows, min((block + 1) * block_rows, n_samples)


def write_block(path, block: int, X_block: np.ndarray) -> None:
    """Write one whole shard of ``X`` then set its ``done`` flag.

    Parameters
    ----------
    path : str or Path
    block : int
    X_block : ndarray of shape (stop - start, n_features)
    """
    g = zarr.open_group(str(path), mode="r+")
    X = g["X"]
    start, stop = block_range(block, g.attrs["block_rows"], X.shape[0])
    X_block = np.asarray(X_block, dtype=np.float32)
    if X_block.shape != (stop - start, X.shape[1]):
        raise ValueError(f"{path}: block {block} holds rows [{start}, {stop}) of "
                         f"{X.shape[1]} voxels, got an array of shape {X_block.shape}")
    _write_rows(path, g, X, block, X_block)


def write_block_rows(path, block: int, rows: Iterable[np.ndarray]) -> None:
    """Write one whole shard of ``X`` from its rows, then set its ``done`` flag (conversion).

    Each row is written before the next is asked for, so ``rows`` may yield the same buffer
    every time: a conversion task holds one row, not its block (a fresh 64 MiB block costs a
    page fault per 4 KiB page on first touch and stays out of the CPU cache, where one reused
    row stays in it).

    Parameters
    ----------
    path : str or Path
    block : int
    rows : iterable of ndarray of shape (n_features,)
        Exactly the block's ``stop - start`` rows, in order.
    """
    g = zarr.open_group(str(path), mode="r+")
    _write_rows(path, g, g["X"], block, rows)


def _write_rows(path, g: zarr.Group, X: zarr.Array, block: int,
                rows: Iterable[np.ndarray]) -> None:
    """The shared half of :func:`write_block` and :func:`write_block_rows`."""
    block_rows = g.attrs["block_rows"]
    start, stop = block_range(block, block_rows, X.shape[0])
    direct = ShardRowReader.from_array(X)
    if direct is not None and direct.shard_rows == block_rows:
        direct.write(block, rows, stop - start)
    else:  # another layout: through zarr
        X_block = np.array([np.array(row, dtype=np.float32) for row in rows])
        if X_block.shape != (stop - start, X.shape[1]):
            raise ValueError(f"{path}: block {block} holds {stop - start} rows of "
                             f"{X.shape[1]} voxels, got {X_block.shape}")
        X[start:stop] = X_block
        sync_rows(X, start, stop)
    g["done"][block] = 1  # after the data: a flag never claims a half-written shard
    sync_rows(g["done"], block)


def reopen_damaged(path) -> list[int]:
    """Clear the ``done`` flag of every written block whose shard of ``X`` is missing or damaged
    (deleted, truncated, overwritten since), and the store's ``complete`` flag with them, so that
    conversion resumed with the same inputs writes those blocks again; remove the temporary
    shard files that killed conversions left.

    Returns
    -------
    blocks : list of int
        The blocks reopened (none for a store of another layout, which is not checked).
    """
    # the temporary shard files (ShardRowReader.write's: a shard's bytes each) of killed runs
    for tmp in (Path(path) / "X" / "c").glob("*/.*.tmp"):
        if owner_gone(tmp.name.rpartition(".")[0].rpartition(".")[2]):
            tmp.unlink(missing_ok=True)
    blocks = damaged_blocks(path)
    if blocks:
        g = zarr.open_group(str(path), mode="r+")
        log.warning("%s: shards %s of X are missing or damaged; converting them again", path,
                    blocks[:10])
        for b in blocks:
            g["done"][b] = 0
        g.attrs["complete"] = False
    return blocks


def damaged_blocks(path) -> list[int]:
    """The blocks flagged as written whose shard of ``X`` is missing or damaged (none for a store
    of another layout, which is not checked); reads each shard's index only."""
    g = zarr.open_group(str(path), mode="r")
    direct = ShardRowReader.from_array(g["X"])
    if direct is None or direct.shard_rows != g.attrs.get("block_rows"):
        return []
    n_shards = -(-g["X"].shape[0] // direct.shard_rows)
    if "done" not in g or g["done"].shape != (n_shards,):  # edited by hand: no block to reopen,
        return []  # the reader's own checks of a complete store say what else is wrong
    done = g["done"][:]
    return [b for b in direct.damaged_shards() if done[b]]


def mark_complete(path, **attrs) -> None:
    """Mark a store complete (after checking every block is done) and record ``attrs``."""
    g = zarr.open_group(str(path), mode="r+")
    missing = np.flatnonzero(g["done"][:] == 0)
    if missing.size:
        raise StoreError(f"{path}: cannot mark complete, blocks {missing[:10].tolist()} "
                         "are not written")
    g.attrs.update({**attrs, "complete": True})
    sync_node(g)


def write_store(path, X, y, mask, affine, *, classes=None, target=None, split=None, groups=None,
                attrs: dict | None = None, block_rows: int | None = None) -> Store:
    """Write a complete store from in-memory arrays, atomically (temporary name, then rename).

    Parameters
    ----------
    path : str or Path
        Store directory; replaced if it exists.
    X : ndarray of shape (n_samples, n_features)
        Rows in mask order, ``n_features == mask.sum()``.
    y : array-like of shape (n_samples,) or None
        Class labels: indices into ``classes`` if given, else any labels (sorted to classes).
        None for a store without class labels (then ``target`` is needed).
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    classes : sequence of str, optional
    target : array-like of shape (n_samples,), float, optional
        A finite numeric target per row (regression).
    split, groups : array-like of shape (n_samples,) of str, optional
    attrs : dict, optional
    block_rows : int, optional

    Returns
    -------
    store : Store
    """
    path = Path(path)
    X = np.asarray(X, dtype=np.float32)
    mask = np.asarray(mask, dtype=bool)
    if X.ndim != 2 or X.shape[1] != mask.sum():
        raise ValueError(f"X must have shape (n_samples, {int(mask.sum())}), got {X.shape}")
    if y is None and target is None:
        raise ValueError("a store needs class labels y, a target, or both; got neither")
    if y is not None and classes is None:
        classes, y = np.unique(np.asarray(y).astype(str), return_inverse=True)
    tmp = path.with_name(path.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    g = create_store(tmp, n_samples=X.shape[0], mask=mask, affine=affine,
                     y=None if y is None else np.asarray(y), classes=classes, target=target,
                     groups=groups, split=split,
                     attrs=attrs, block_rows=block_rows)
    rows = g.attrs["block_rows"]
    for b in range(g["done"].shape[0]):
        start, stop = block_range(b, rows, X.shape[0])
        write_block(tmp, b, X[start:stop])
    mark_complete(tmp)
    fsync_tree(tmp, skip=("X/c",))  # the shards are flushed as written
    if path.exists():
        remove_aside(path)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return open_store(path)
