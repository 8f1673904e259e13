"""Reading a complete fgscale store: :class:`Store` and :func:`open_store`."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import nibabel as nib
import numpy as np
import zarr

from fgscale.store._buffers import POOL
from fgscale.store._shards import ShardRowReader, StoreError

__all__ = ["Store", "open_group_checked", "open_store"]

FORMAT_VERSION = 1


def _read_str(array: zarr.Array) -> np.ndarray:
    return np.asarray(array[:].tolist(), dtype=str)


class Store:
    """Read view over a complete fgscale store; use :func:`open_store` to build one.

    Attributes
    ----------
    path : Path
    X : zarr.Array of shape (n_samples, n_features), float32
    y : ndarray of shape (n_samples,), int32
        Class indices; all 0 when the store has no class labels.
    classes : ndarray of shape (n_classes,), str
        Empty when the store has no class labels.
    has_labels : bool
        Whether the rows carry class labels (``classes`` is not empty).
    target : ndarray of shape (n_samples,), float64, or None
        The numeric target per row; None when the store has none (as every store written
        before targets existed).
    split, groups, source : ndarray of shape (n_samples,), str
    volume : ndarray of shape (n_samples,), int32
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    n_samples, n_features, block_rows : int
    attrs : dict
        Group attributes: ``params`` of the conversion, ``synthetic``, ``summary``...
    """

    def __init__(self, path: Path, group: zarr.Group):
        self.path = path
        self.group = group
        self.X = group["X"]
        if self.X.ndim != 2 or self.X.dtype != np.float32:  # a foreign X is never decoded
            raise StoreError(f"{path}: array X has dtype {self.X.dtype} and shape "
                             f"{self.X.shape}; expected float32 of shape (n_samples, n_features)")
        self.y = _read(path, group, "y")
        self.classes = _read(path, group, "classes", _read_str)
        self.has_labels = bool(self.classes.size)
        self.target = _read(path, group, "target") if "target" in group else None
        self.split = _read(path, group, "split", _read_str)
        self.groups = _read(path, group, "group", _read_str)
        self.source = _read(path, group, "source", _read_str)
        self.volume = _read(path, group, "volume")
        self.mask = _read(path, group, "mask")
        self.affine = _read(path, group, "affine")
        self.attrs = dict(group.attrs)
        self.n_samples, self.n_features = self.X.shape
        _check_shapes(self)
        if not isinstance(self.attrs.get("block_rows"), int):
            raise StoreError(f"{path}: attribute 'block_rows' is missing; {_DAMAGED}")
        self.block_rows = self.attrs["block_rows"]
        self._reader = ShardRowReader.from_array(self.X)

    def __repr__(self) -> str:
        return (f"Store({str(self.path)!r}, n_samples={self.n_samples}, "
                f"n_features={self.n_features}, classes={len(self.classes)}, "
                f"target={self.target is not None})")

    def _check_rows(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_samples):
            raise IndexError(f"{self.path}: rows must be in [0, {self.n_samples}), "
                             f"got {rows.min()}..{rows.max()}")
        return rows

    def read_rows(self, rows, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``X`` in the order given (duplicates allowed).

        Parameters
        ----------
        rows : array-like of shape (m,), int
        out : ndarray of shape (m, n_features), float32, optional
            A C-contiguous array to read into (e.g. from :data:`fgscale.store.POOL`, whose
            recycled memory skips the page faults that a fresh array pays on every block of
            a sequential read); default a new array.

        Returns
        -------
        X_rows : ndarray of shape (m, n_features), float32
            ``out`` when given.
        """
        rows = self._check_rows(rows)
        shape = (rows.size, self.n_features)
        if out is None:
            out = np.empty(shape, np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}, "
                             f"got {out.dtype} {out.shape}")
        if rows.size == 0:
            return out
        # Each row is read once, shard by shard in storage order, straight to its place in
        # ``out``; a row asked for again is copied from its first place.
        uniq, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        if self._reader is not None:
            self._reader.read(uniq, out, first)
        else:
            out[first] = np.stack([self.X[int(r)] for r in uniq])
        again = np.flatnonzero(first[inverse] != np.arange(rows.size))
        out[again] = out[first[inverse[again]]]
        return out

    def iter_rows(self, rows) -> Iterator[tuple[int, np.ndarray]]:
        """Visit rows one at a time, each read into the same small buffer.

        Rows are visited in storage order, each shard once, which is what makes this cheaper
        than :meth:`read_rows` for work that reduces each row at once (projecting it with a
        grouping): the batch is never gathered whole in memory, and the row being reduced stays
        in the CPU cache.

        Parameters
        ----------
        rows : array-like of shape (m,), int
            Any order, duplicates allowed.

        Yields
        ------
        i : int
            Position in ``rows``.
        row : ndarray of shape (n_features,), float32
            Valid only until the next item is yielded: copy it to keep it.
        """
        rows = self._check_rows(rows)
        uniq, inverse = np.unique(rows, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        first = np.searchsorted(inverse[order], np.arange(uniq.size + 1))
        if self._reader is not None:
            views = self._reader.each_row(uniq, POOL.empty((self.n_features,)))
        else:
            views = ((j, row) for start in range(0, uniq.size, self.block_rows)
                     for j, row in enumerate(self.read_rows(uniq[start:start + self.block_rows]),
                                             start))
        for j, row in views:
            for i in order[first[j]:first[j + 1]]:
                yield int(i), row

    def iter_blocks(self, rows=None, block_size: int | None = None
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Iterate over rows in sequential, shard-aligned blocks.

        Parameters
        ----------
        rows : array-like of int, optional
            Rows to visit (sorted and deduplicated); default all rows.
        block_size : int, optional
            Rows per block, rounded up to whole shards; default one shard.

        Yields
        ------
        row_indices : ndarray of shape (m,), int64
        X_block : ndarray of shape (m, n_features), float32
        """
        span = self.block_rows * max(1, -(-(block_size or self.block_rows) // self.block_rows))
        rows = (np.arange(self.n_samples, dtype=np.int64) if rows is None
                else np.unique(np.asarray(rows, dtype=np.int64)))
        for part in np.split(rows, np.flatnonzero(np.diff(rows // span)) + 1):
            if part.size:  # recycled memory: no page faults per block (fgscale.store._buffers)
                yield part, self.read_rows(part, out=POOL.empty((part.size, self.n_features)))

    def train_rows(self) -> np.ndarray:
        """Rows whose split is "train" or unassigned, shape (n_train,), int64."""
        return np.flatnonzero(self.split != "test").astype(np.int64)

    def test_rows(self) -> np.ndarray:
        """Rows whose split is "test", shape (n_test,), int64."""
        return np.flatnonzero(self.split == "test").astype(np.int64)

    def identity(self) -> str:
        """A digest of what a run trains on: the shape, labels, targets, splits, groups, mask
        and the conversion's fingerprint of its inputs, not the rows' values (a moved or
        copied store keeps it; a store of other rows or another split does not)."""
        digest = hashlib.sha256(repr((self.X.shape, self.classes.tolist(), self.attrs.get(
            "params", {}).get("fingerprint"))).encode())
        for array in (self.y, self.target, self.split, self.groups, self.mask):
            if array is not None:
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()

    @property
    def smoothing_fwhm(self) -> float | None:
        """The FWHM in mm its images were smoothed by when converted (None: not smoothed)."""
        return self.attrs.get("params", {}).get("smoothing_fwhm")

    @property
    def space_codes(self) -> list[int] | None:
        """``[qform_code, sform_code]`` of the converted images (MNI: 4), or None (a store
        written from arrays, or by an older fgscale)."""
        return self.attrs.get("space_codes")

    def mask_img(self) -> nib.Nifti1Image:
        """The mask as a uint8 NIfTI image on the store's grid, in the images' space."""
        from fgscale.images._nifti import with_space_codes

        return with_space_codes(nib.Nifti1Image(self.mask.astype(np.uint8), self.affine),
                                self.space_codes)


def holds_images(folder) -> bool:
    """Whether ``folder`` holds NIfTI files (among its first thousand entries: a hint is not
    worth more)."""
    with os.scandir(folder) as entries:
        return any(e.name.lower().endswith((".nii", ".nii.gz"))
                   for e in itertools.islice(entries, 1000))


_DAMAGED = ("a damaged store: convert the cohort again into a new store (remove this one, or "
            "another --out)")


def _read(path: Path, group: zarr.Group, name: str, decode=None) -> np.ndarray:
    """A metadata array of the store, read whole; one missing or undecodable (a chunk file
    truncated or removed by hand) is named, never a codec's traceback."""
    try:  # zarr parses the metadata of every member to tell whether one is there
        present = name in group
        data = (decode(group[name]) if decode is not None else group[name][:]) if present else None
    except Exception as exc:  # a codec's error (zstd, crc32c, json) of a damaged chunk, a
        # data type zarr refuses (a Zarr v2 array of pickled objects: never decoded)
        raise StoreError(f"{path / name}: cannot be read ({type(exc).__name__}: {exc}); "
                         f"{_DAMAGED}") from None
    if not present:
        raise StoreError(f"{path}: array {name!r} is missing; {_DAMAGED}")
    return data


def _check_shapes(store: Store) -> None:
    """The metadata arrays agree with X (a zarr.json edited, an array of another store copied
    in): a row count, a mask or an affine that does not match is refused by name."""
    n, p = store.n_samples, store.n_features
    for name in ("y", "target", "split", "groups", "source", "volume"):
        array = getattr(store, name)
        if array is not None and array.shape != (n,):
            raise StoreError(f"{store.path}: array {name.rstrip('s')!r} has shape {array.shape}, "
                             f"X has {n} rows; {_DAMAGED}")
    if store.mask.ndim != 3 or int(np.count_nonzero(store.mask)) != p:
        raise StoreError(f"{store.path}: array 'mask' of shape {store.mask.shape} holds "
                         f"{int(np.count_nonzero(store.mask))} voxels, X has {p} columns; "
                         f"{_DAMAGED}")
    if store.affine.shape != (4, 4) or not np.isfinite(store.affine).all():
        raise StoreError(f"{store.path}: array 'affine' is not a finite 4x4 matrix; {_DAMAGED}")
    if store.has_labels and store.y.size and (store.y.min() < 0
                                              or store.y.max() >= store.classes.size):
        raise StoreError(f"{store.path}: array 'y' holds class indices outside [0, "
                         f"{store.classes.size}); {_DAMAGED}")


def _images_hint(folder: Path) -> str:
    """What to do with a folder of NIfTI images given where a store was expected."""
    if not holds_images(folder):
        return ""
    return (f"; it holds NIfTI images: give them to fit as paths or a pattern such as "
            f"'{folder / '*.nii.gz'}', or convert them to a store (fgscale convert)")


def _run_store(run: Path) -> str:
    """Where the run folder ``run`` says its store is, for a message (nothing if it says not)."""
    import json

    try:
        store = json.loads((run / "config.json").read_text())["store"]
    except (OSError, ValueError, TypeError, KeyError):
        return "; give the store it was trained on"
    return f"; give a store, such as the one it was trained on: {store}"


def open_group_checked(path, mode: str = "r") -> zarr.Group:
    """Open an fgscale store group and check its format version (complete or not)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise StoreError(f"{path}: no such store (create one with fgscale convert)")
    if path.is_file():
        raise StoreError(f"{path}: a file, not a store folder" + (
            "; a cohort table is converted to a store first (fgscale convert, or "
            "fgscale.convert in Python)" if path.suffix.lower() in (".csv", ".tsv") else ""))
    if not (path / "zarr.json").is_file() and (path / "config.json").is_file():
        raise StoreError(f"{path}: a run folder of fgscale train, not a store{_run_store(path)}")
    try:
        g = zarr.open_group(str(path), mode=mode)
    except Exception as exc:  # zarr raises several types for a foreign directory
        raise StoreError(f"{path}: not a Zarr group ({exc}){_images_hint(path)}") from exc
    version = g.attrs.get("fgscale_format_version")
    if version is None or "X" not in g:
        raise StoreError(f"{path}: not an fgscale store (no fgscale_format_version attribute)")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise StoreError(f"{path}: store format version {version} was written by a newer "
                         f"fgscale; this one reads version {FORMAT_VERSION}: upgrade fgscale")
    if version != FORMAT_VERSION:
        raise StoreError(f"{path}: store format version {version}, this fgscale reads "
                         f"version {FORMAT_VERSION}; re-run fgscale convert")
    return g


def open_store(path, mode: str = "r") -> Store:
    """Open a complete store.

    Parameters
    ----------
    path : str, Path or Store
        A Store already open is returned as it is (in mode "r"), so that the library
        functions a fit calls with its Store do not open the store again.
    mode : {"r", "r+"}
        "r+" lets a caller add arrays (the bank) to the group.

    Returns
    -------
    store : Store

    Raises
    ------
    StoreError
        If the path is missing, not an fgscale store, of another format version, or not
        marked complete.
    """
    if mode not in ("r", "r+"):
        raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
    if isinstance(path, Store) and mode == "r":
        return path
    path = Path(path).expanduser()
    g = open_group_checked(path, mode)
    if not g.attrs.get("complete", False):
        done = g["done"][:]
        raise StoreError(f"{path}: store is not complete ({int(done.sum())} of {done.size} "
                         "blocks written); re-run fgscale convert to finish it")
    return Store(path, g)
