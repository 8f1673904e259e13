"""Appending new images to a complete converted store (``fgscale convert --append``).

A cohort grows: subjects scanned since the store was converted are added at the end of its
table. Converting only their rows keeps the store's rows where they are (their indices, and so
the rows of runs, banks and saved statistics, still name the same images) and leaves the store
that converting the whole table afresh gives. Hence what an append requires, each checked before
anything is written:

- the table's first rows are the store's (file, volume, label, group, split, target) and the
  arguments those it was converted with (its fingerprint, computed again on those rows); the
  store's files are unchanged since, and its last file has no volume more;
- the new labels are among the store's classes (a new class would renumber the rows' classes);
- the new images are on the store's grid and, where its mask was computed from the images,
  finite and non-zero on all of it (:func:`fgscale.store._grid.check_covered`): the whole
  table would compute the same mask.

An append is resumable as a conversion is. Before the store changes it is marked incomplete,
with an ``appending`` attribute (the fingerprint it had and the one it gets, and its row count):
an interrupted append is finished by the same command, and refused by any other conversion
rather than removed as an unfinished conversion of other inputs. The arrays are then grown and
the new rows' blocks flagged to do (and the store's last block if it was partial: its shard gets
the first new rows); the conversion then writes them as it resumes any store.
"""

from __future__ import annotations

import numpy as np

from fgscale.store._inputs import changed, describe, input_fingerprint
from fgscale.store._records import row_records, target_array
from fgscale.store._shards import StoreError, sync_node, sync_rows

__all__ = ["append_rows", "check_append"]


def check_append(out, g, *, rows, targets, counts, stats, mask, resample, block_rows,
                 intersect_mask, nan, classes, grid) -> int:
    """Check that the conversion asked for extends the store ``g`` (module docstring).

    Parameters
    ----------
    out : Path
        The store, as named in errors.
    g : zarr.Group
        The store, opened read-write.
    rows : list of tuple
        The table's rows now, (file, volume, label, group, split) each.
    targets : list of float or None
    counts : list of int
        Each entry's rows (the volumes of a file listed whole, else 1).
    stats : ndarray of shape (n_entries, 2)
        The entries' files' sizes and modification times now.
    mask, resample, block_rows, intersect_mask, nan, classes
        The conversion's arguments.
    grid : tuple
        The grid (shape, affine) the table's images give.

    Returns
    -------
    n_old : int
        The rows the store held before the append.
    """
    pending = g.attrs.get("appending")
    params = g.attrs.get("params", {})
    if pending is None and not g.attrs.get("complete"):
        raise StoreError(f"{out}: its own conversion is unfinished; finish it (re-run the "
                         "command that began it), then append")
    made = pending["from"] if pending else params.get("fingerprint")
    if made is None:
        raise StoreError(f"{out}: not made by fgscale convert (no record of its inputs); rows "
                         "can only be appended to a converted store")
    n_old = int(pending["n_old"] if pending else g["X"].shape[0])
    old_targets = None if targets is None else targets[:n_old]
    if len(rows) < n_old or input_fingerprint(rows[:n_old], mask, resample, block_rows,
                                              intersect_mask, old_targets) != made:
        hint = changed(g, rows[:n_old], old_targets, describe(mask), resample, intersect_mask,
                       block_rows) if not pending else ""
        raise StoreError(f"{out}: to append, the table must list the store's {n_old} rows first, "
                         "as they were converted, with the same --mask, --resample, "
                         f"--intersect-mask and --block-rows{hint}; nothing was changed")
    if params.get("nan") != nan:
        raise StoreError(f"{out}: converted with --nan {params.get('nan')}; append with the same")
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    n_entries = int(np.searchsorted(starts, n_old, side="right")) - 1
    paths = [r[0] for r in rows]
    if starts[n_entries] != n_old:
        raise StoreError(f"{out}: {paths[starts[n_entries]]} has more volumes than when the store "
                         "was converted; convert the table afresh into another --out")
    if "inputs" in g and g["inputs"].shape[0] >= n_entries:
        moved = np.flatnonzero((g["inputs"][:n_entries] != stats[:n_entries]).any(axis=1))
        if moved.size:
            raise StoreError(f"{out}: {paths[starts[moved[0]]]} changed (size or modification "
                             "time) since the store was converted: the store holds its former "
                             "rows, which an append would keep beside the new ones; convert the "
                             "table afresh into another --out")
    held = g["classes"][:].tolist()
    if classes is not None and held and list(classes) != held:
        raise StoreError(f"{out}: its classes are {held}, not {list(classes)} (--classes)")
    new = next((r for r in rows[n_old:] if held and r[2] not in held), None)
    if new is not None:
        raise StoreError(f"{out}: label {new[2]!r} of {new[0]} is not among the store's classes "
                         f"{held}: a new class would renumber its rows' classes; convert the "
                         "table afresh into another --out")
    shape, affine = tuple(g.attrs["grid_shape"]), g["affine"][:]
    if tuple(grid[0]) != shape or not np.allclose(np.asarray(grid[1]), affine):
        raise StoreError(f"{out}: the new images are on a grid of shape {tuple(grid[0])} and "
                         f"affine {np.asarray(grid[1]).tolist()}, the store's is {shape} and "
                         f"{affine.tolist()}: give --resample as the store was converted, or "
                         "convert afresh")
    return n_old


def append_rows(g, *, n_old: int, rows, targets, stats, fingerprint: str, params: dict,
                synthetic: bool) -> None:
    """Grow the store ``g`` to the table's ``rows`` (checked by :func:`check_append`): its
    arrays take every row's record, ``X`` the new rows' room, and the blocks to write are
    flagged; ``params`` (the new conversion's) and ``fingerprint`` replace the store's.
    Repeating it after an interruption gives the same store."""
    pending = g.attrs.get("appending") or {
        "from": g.attrs["params"]["fingerprint"], "to": fingerprint, "n_old": n_old}
    g.attrs.update({"complete": False, "appending": pending})
    sync_node(g)  # before the arrays grow: a machine's crash leaves the store still appending
    n, step = len(rows), int(g.attrs["block_rows"])
    if g["X"].shape[0] != n:
        g["X"].resize((n, g["X"].shape[1]))
    if g["done"].shape[0] != -(-n // step):
        g["done"].resize((-(-n // step),))  # the new flags read as 0: blocks to write
    if n_old % step:  # the store's last shard was partial: it takes the first new rows
        g["done"][n_old // step] = 0
    held = g["classes"][:].tolist()
    arrays = row_records(n, source=[r[0] for r in rows], volume=[r[1] for r in rows],
                         groups=[r[3] for r in rows], split=[r[4] for r in rows])
    if held:
        arrays["y"] = np.array([held.index(r[2]) for r in rows], np.int32)
    if targets is not None:
        arrays["target"] = target_array(targets, n)
    if "inputs" in g:  # the store's files keep their record (unchanged: check_append)
        old = g["inputs"][:]
        arrays["inputs"] = np.concatenate([old[:min(len(old), len(stats))],
                                           stats[len(old):]]).astype(np.int64)
    for name, data in arrays.items():
        if g[name].shape != data.shape:
            g[name].resize(data.shape)
        g[name][...] = data
    g.attrs.update({"params": {**params, "fingerprint": fingerprint},
                    "synthetic": bool(g.attrs.get("synthetic")) or synthetic})
    # on the disk before the new blocks are written: what this function changed, and only that
    # (the shards are flushed as written; a bank or statistics may be another user's files)
    for name in arrays:
        sync_node(g[name], whole=True)
    for name in ("X", "done"):
        sync_node(g[name])
    if n_old % step:
        sync_rows(g["done"], n_old // step)
    sync_node(g)
