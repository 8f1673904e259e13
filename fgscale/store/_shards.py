"""Direct reads and writes of the shard files of a store's ``X``, following the Zarr v3 spec.

The lowest layer of :mod:`fgscale.store`: it knows the byte layout of a shard (rows back to
back, then an index of (offset, nbytes) per row and its crc32c), not what the rows mean; and
where zarr keeps an array's chunks and a node's attributes, to flush them to the disk before a
flag claims them (:func:`sync_rows`, :func:`sync_node`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import zarr

from fgscale._utils.files import fsync_dir, fsync_fd, fsync_file, fsync_tree, owner_tag

__all__ = ["ShardRowReader", "StoreError", "resumable_write", "sync_node", "sync_rows"]


class StoreError(ValueError):
    """A path that is not a usable fgscale store (missing, foreign, wrong version, incomplete)."""


@contextmanager
def resumable_write(store, what: str) -> Iterator[None]:
    """Name the store (or the cache store being written: fgscale.store._derived) and the part
    being written in an OSError of a resumable job's task (a full disk, a folder made
    read-only): a bare "[Errno 28] No space left on device" raised on
    a Dask worker says neither which disk (the store's, or the worker's scratch space) nor what
    to do. The errno is kept; the parts written before stay, and a re-run resumes."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, f"{store}: {what} could not be written ({exc.strerror}); the "
                      "parts written before are kept: free space or make it writable, "
                      "then re-run to resume") from exc


class ShardRowReader:
    """Read rows of X straight from its shard files, following the Zarr v3 sharding spec.

    Why not zarr's own reader: with zarr 3.1 an orthogonal selection of rows in a sharded array
    fetches the whole shard for every inner chunk it needs, and a loop of one-row reads pays
    zarr's fixed cost of a call for every row; reading the shard index once, then each row's
    byte range with one system call, reads the bytes asked for and nothing else
    (scripts/bench_store.py compares them).
    Used only for the layout this module writes (uncompressed little-endian (1, p) inner
    chunks, index at the end, local files); :meth:`from_array` returns None otherwise and the
    store falls back to zarr.
    """

    _MISSING = 2**64 - 1  # index entry of an inner chunk never written (fill value)

    def __init__(self, root: Path, array: zarr.Array, shard_rows: int):
        self.root, self.array, self.shard_rows = root, array, shard_rows
        self.n_features = array.shape[1]
        self._indexes: dict[Path, tuple[tuple[int, int, int], np.ndarray]] = {}

    @classmethod
    def from_array(cls, array: zarr.Array) -> ShardRowReader | None:
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
        from zarr.storage import LocalStore

        codecs = array.metadata.codecs
        store = array.store_path.store
        if not (isinstance(store, LocalStore) and len(codecs) == 1
                and isinstance(codecs[0], ShardingCodec)):
            return None
        shard = codecs[0]
        inner_ok = (len(shard.codecs) == 1 and isinstance(shard.codecs[0], BytesCodec)
                    and shard.codecs[0].endian.value == "little")
        index_ok = (len(shard.index_codecs) == 2 and isinstance(shard.index_codecs[1], Crc32cCodec)
                    and shard.index_location.value == "end")
        if not (inner_ok and index_ok and shard.chunk_shape == (1, array.shape[1])
                and array.dtype == np.float32):
            return None
        root = Path(store.root) / array.store_path.path
        return cls(root, array, array.shards[0])

    def _shards(self, rows: np.ndarray) -> Iterator[tuple[int, Path, np.ndarray, np.ndarray]]:
        """Per shard touched by ``rows`` (sorted, unique): an open file descriptor, the file's
        path, the positions in ``rows`` of its rows, and their byte offsets (-1 for a row the
        index says holds the fill value). The descriptor is closed once the caller moves on to
        the next shard. A shard file missing is a damaged store (every shard of a complete
        store is written): a StoreError naming the file, never rows of zeros trained on."""
        shard_of = rows // self.shard_rows
        for picked in np.split(np.arange(rows.size), np.flatnonzero(np.diff(shard_of)) + 1):
            if not picked.size:
                continue
            shard = int(shard_of[picked[0]])
            path = self.root / self.array.metadata.encode_chunk_key((shard, 0))
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # a complete store has every shard: it was deleted
                raise StoreError(self._lost(path, "the shard file is missing")) from None
            try:
                entries = self._index(fd, path)[rows[picked] - shard * self.shard_rows]
                # a row of the fill value that zarr's own encoder wrote is left out of its shard
                missing = entries[:, 0] == self._MISSING
                bad = ~missing & (entries[:, 1] != 4 * self.n_features)
                if bad.any():
                    raise StoreError(f"{path}: row chunk of {entries[bad][0, 1]} bytes, "
                                     f"expected {4 * self.n_features}")
                yield fd, path, picked, np.where(missing, -1, entries[:, 0].astype(np.int64))
            finally:
                os.close(fd)

    @staticmethod
    def _lost(path: Path, what: str) -> str:
        return (f"{path}: {what}, so some rows of X are lost (a damaged store); run the "
                "fgscale convert that made the store again: it rewrites the damaged shards")

    def damaged_shards(self) -> list[int]:
        """The shards of X that are missing, or not what :meth:`write` leaves (another size,
        another index, a bad checksum): a complete store's damage, which conversion redoes.
        Reads each shard's index only."""
        import google_crc32c

        n_samples, nbytes = self.array.shape[0], 4 * self.n_features
        damaged = []
        for shard in range(-(-n_samples // self.shard_rows)):
            n_rows = min(self.shard_rows, n_samples - shard * self.shard_rows)
            path = self.root / self.array.metadata.encode_chunk_key((shard, 0))
            index_bytes = 16 * self.shard_rows
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    f.seek(n_rows * nbytes)
                    tail = f.read(index_bytes + 4)
            except FileNotFoundError:
                damaged.append(shard)
                continue
            if size != n_rows * nbytes + index_bytes + 4 or len(tail) != index_bytes + 4:
                damaged.append(shard)
                continue
            index = np.frombuffer(tail[:index_bytes], "<u8").reshape(-1, 2)
            if (google_crc32c.value(tail[:index_bytes]) != int.from_bytes(tail[-4:], "little")
                    or not np.array_equal(index[:n_rows, 0], np.arange(n_rows) * nbytes)
                    or np.any(index[:n_rows, 1] != nbytes)):
                damaged.append(shard)
        return damaged

    def _index(self, fd: int, path: Path) -> np.ndarray:
        """The shard's index, (offset, nbytes) per row, read once while the file is unchanged
        (same inode, size and mtime): an epoch visits each shard many times."""
        stat = os.fstat(fd)
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        cached = self._indexes.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        index_bytes = 16 * self.shard_rows  # then its crc32c, 4 bytes, at the very end
        if stat.st_size < index_bytes + 4:
            raise StoreError(f"{path}: truncated, {stat.st_size} bytes cannot hold the shard "
                             f"index of {index_bytes + 4} bytes")
        raw = os.pread(fd, index_bytes, stat.st_size - index_bytes - 4)
        index = np.frombuffer(raw, "<u8").reshape(-1, 2)
        self._indexes[path] = (stamp, index)
        return index

    def read(self, rows: np.ndarray, out: np.ndarray, dest: np.ndarray) -> None:
        """Read rows (sorted, unique) into ``out[dest]``.

        Runs of rows stored back to back whose places in ``out`` are consecutive too (a
        sequential block) are read with one call.
        """
        nbytes = 4 * self.n_features
        for fd, path, picked, offsets in self._shards(rows):
            missing = offsets < 0
            out[dest[picked[missing]]] = 0.0
            picked, offsets = picked[~missing], offsets[~missing]
            places = dest[picked]
            cuts = np.flatnonzero((np.diff(places) != 1) | (np.diff(offsets) != nbytes)) + 1
            for run in np.split(np.arange(picked.size), cuts):
                if run.size:
                    first, last = places[run[0]], places[run[-1]]
                    view = memoryview(out[first:last + 1]).cast("B")
                    if os.preadv(fd, [view], int(offsets[run[0]])) != run.size * nbytes:
                        raise StoreError(f"{path}: truncated, {run.size} rows from byte "
                                         f"{offsets[run[0]]} are not all there")

    def write(self, shard: int, rows: Iterable[np.ndarray], n_rows: int) -> None:
        """Write a whole shard: its ``n_rows`` rows (``shard_rows``, or fewer in the array's
        last shard, the others marked missing as the spec says), then the index, its crc32c.

        Written here rather than by zarr's sharding encoder, which takes the whole shard as
        one array: rows go to the file as they come, with no shard-sized buffer and no codec
        call per inner chunk, so conversion spends its time decompressing NIfTI files, not
        encoding shards. Written to a temporary name, then renamed, so that a shard is never
        seen half-written; read back by zarr in the tests.
        """
        import google_crc32c  # zarr's own dependency for the crc32c codec

        nbytes = 4 * self.n_features
        index = np.full((self.shard_rows, 2), self._MISSING, dtype="<u8")
        index[:n_rows, 0] = np.arange(n_rows, dtype="<u8") * nbytes
        index[:n_rows, 1] = nbytes
        index = index.tobytes()
        path = self.root / self.array.metadata.encode_chunk_key((int(shard), 0))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{owner_tag()}.tmp")
        try:
            with open(tmp, "wb") as f:
                written = 0
                for row in rows:
                    row = np.ascontiguousarray(row, dtype="<f4")
                    if written == n_rows or row.shape != (self.n_features,):
                        raise ValueError(f"{path}: shard {shard} holds {n_rows} rows of "
                                         f"{self.n_features} voxels, got row {written} of "
                                         f"shape {row.shape}")
                    f.write(row.data)
                    written += 1
                if written != n_rows:
                    raise ValueError(f"{path}: shard {shard} holds {n_rows} rows, got {written}")
                f.write(index)
                f.write(np.uint32(google_crc32c.value(index)).astype("<u4").tobytes())
                f.flush()
                fsync_fd(f.fileno())  # on the disk before the rename, and the flag, claim it
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed task leaves no partial file behind
            raise

    def each_row(self, rows: np.ndarray, buffer: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(i, row)`` for rows (sorted, unique), each read into ``buffer`` (float32,
        n_features) and valid until the next row is read. The buffer stays in the CPU cache for
        the work on the row, and no shard is memory-mapped: mapping and unmapping in a process
        whose other threads run (thread workers) flushes every core's TLB, which costs more
        than the copy into the buffer that mapping would save."""
        nbytes = 4 * self.n_features
        for fd, path, picked, offsets in self._shards(rows):
            for i, offset in zip(picked.tolist(), offsets.tolist(), strict=True):
                if offset < 0:
                    buffer.fill(0.0)
                elif os.preadv(fd, [buffer], offset) != nbytes:
                    raise StoreError(f"{path}: truncated, row chunk at byte {offset} is "
                                     f"shorter than {nbytes} bytes")
                yield i, buffer


def _local_root(node) -> Path | None:
    """The folder of a zarr array or group in a store of local files; None for other stores."""
    from zarr.storage import LocalStore

    store = node.store_path.store
    return Path(store.root) / node.store_path.path if isinstance(store, LocalStore) else None


def sync_rows(array: zarr.Array, start: int, stop: int | None = None) -> None:
    """Flush to the disk what zarr wrote of rows ``start:stop`` of ``array`` (default row
    ``start`` alone): the chunk files that hold them, and their folders.

    zarr writes each chunk to a temporary name and renames it, but does not flush it: after a
    crash of the machine (power lost, kernel panic, not only of the process) a flag written
    later could say done over rows that never reached the disk. Called after the rows and after
    their flag. Nothing to do for a store that is not local files.
    """
    root = _local_root(array)
    if root is None:
        return
    stop = start + 1 if stop is None else stop
    grid = array.shards or array.chunks
    others = list(itertools.product(*(range(-(-n // c)) for n, c in zip(array.shape[1:], grid[1:],
                                                                          strict=True))))
    _sync([root / array.metadata.encode_chunk_key((i, *rest))
           for i in range(start // grid[0], -(-stop // grid[0])) for rest in others])


def sync_node(node, *, whole: bool = False, skip: tuple[str, ...] = ()) -> None:
    """Flush to the disk a zarr group's or array's ``zarr.json`` (its attributes, an array's
    shape), or with ``whole`` every file below it bar the folders in ``skip`` (a store or a
    bank just created, before it is renamed into place or written to). Nothing to do for a
    store that is not local files."""
    root = _local_root(node)
    if root is None:
        return
    if whole:
        fsync_tree(root, skip)
    else:
        _sync([root / "zarr.json"])


def _sync(paths: list[Path]) -> None:
    """Flush each file of ``paths`` that exists, then each of their folders."""
    folders = set()
    for path in paths:
        try:
            fsync_file(path)
        except FileNotFoundError:  # a chunk of fill values only: zarr removed its file
            pass
        folders.add(path.parent)
    for folder in folders:
        if folder.is_dir():
            fsync_dir(folder)
