"""Direct reads and writes of the shard files of a store's ``X``, following the Zarr v3 spec.

The lowest layer of :mod:`fgscale.store`: it knows the byte layout of a shard (rows back to
back, then an index of (offset, nbytes) per row and its crc32c), not what the rows mean.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import zarr

__all__ = ["ShardRowReader", "StoreError"]


class StoreError(ValueError):
    """A path that is not a usable fgscale store (missing, foreign, wrong version, incomplete)."""


class ShardRowReader:
    """Read rows of X straight from its shard files, following the Zarr v3 sharding spec.

    Why not zarr's own reader: with zarr 3.1 an orthogonal selection of rows in a sharded array
    fetches the whole shard for every inner chunk it needs (5 s for a random 200-row batch at
    p = 270,806), and a loop of one-row reads pays ~1.5 ms of overhead per row; reading the
    shard index and then each row's byte range is 4x faster again (scripts/bench_store.py).
    Used only for the layout this module writes (uncompressed little-endian (1, p) inner
    chunks, index at the end, local files); :meth:`from_array` returns None otherwise and the
    store falls back to zarr.
    """

    _MISSING = 2**64 - 1  # index entry of an inner chunk never written (fill value)

    def __init__(self, root: Path, array: zarr.Array, shard_rows: int):
        self.root, self.array, self.shard_rows = root, array, shard_rows
        self.n_features = array.shape[1]

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

    def _shards(self, rows: np.ndarray):
        """Per shard touched by ``rows`` (sorted, unique): its file, the positions in ``rows``
        of its rows and their (offset, nbytes) entries; the file is None if never written."""
        shard_of = rows // self.shard_rows
        index_bytes = 16 * self.shard_rows + 4  # (offset, nbytes) uint64 per row, then crc32c
        for shard in np.unique(shard_of):
            path = self.root / self.array.metadata.encode_chunk_key((int(shard), 0))
            picked = np.flatnonzero(shard_of == shard)
            try:
                fh = open(path, "rb")
            except FileNotFoundError:  # shard never written: fill value
                yield None, picked, None
                continue
            with fh:
                fh.seek(-index_bytes, os.SEEK_END)
                index = np.frombuffer(fh.read(index_bytes - 4), "<u8").reshape(-1, 2)
                entries = index[rows[picked] - shard * self.shard_rows]
                bad = (entries[:, 0] != self._MISSING) & (entries[:, 1] != 4 * self.n_features)
                if bad.any():
                    raise StoreError(f"{path}: row chunk of {entries[bad][0, 1]} bytes, "
                                     f"expected {4 * self.n_features}")
                yield fh, picked, entries

    def read(self, rows: np.ndarray) -> np.ndarray:
        """Rows (sorted, unique), shape (len(rows), n_features), float32."""
        out = np.empty((rows.size, self.n_features), np.float32)
        for fh, picked, entries in self._shards(rows):
            if fh is None:
                out[picked] = 0.0
                continue
            missing = entries[:, 0] == self._MISSING
            out[picked[missing]] = 0.0
            # runs of rows stored back to back (a sequential block) are read in one call
            picked, offsets = picked[~missing], entries[~missing, 0].astype(np.int64)
            nbytes = 4 * self.n_features
            cuts = np.flatnonzero((np.diff(picked) != 1) | (np.diff(offsets) != nbytes)) + 1
            for run in np.split(np.arange(picked.size), cuts):
                if run.size:
                    first, last = picked[run[0]], picked[run[-1]]
                    fh.seek(int(offsets[run[0]]))
                    if fh.readinto(memoryview(out[first:last + 1]).cast("B")) != run.size * nbytes:
                        raise StoreError(f"{fh.name}: truncated, {run.size} rows from byte "
                                         f"{offsets[run[0]]} are not all there")
        return out

    def write(self, shard: int, rows: Iterable[np.ndarray], n_rows: int) -> None:
        """Write a whole shard: its ``n_rows`` rows (``shard_rows``, or fewer in the array's
        last shard, the others marked missing as the spec says), then the index, its crc32c.

        4x faster than zarr's sharding encoder for these raw rows (conversion spends its time
        decompressing NIfTI files, not encoding shards). Written to a temporary name, then
        renamed, so that a shard is never seen half-written; read back by zarr in the tests.
        """
        import google_crc32c  # zarr's own dependency for the crc32c codec

        nbytes = 4 * self.n_features
        index = np.full((self.shard_rows, 2), self._MISSING, dtype="<u8")
        index[:n_rows, 0] = np.arange(n_rows, dtype="<u8") * nbytes
        index[:n_rows, 1] = nbytes
        index = index.tobytes()
        path = self.root / self.array.metadata.encode_chunk_key((int(shard), 0))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed task leaves no partial file behind
            raise

    def each_row(self, rows: np.ndarray):
        """Yield ``(i, row)`` for rows (sorted, unique), all read into one buffer, valid until
        the next row is read. The buffer stays in the CPU cache for the work on the row, and no
        shard is memory-mapped: mapping and unmapping in a process whose other threads run
        (thread workers) flushes every core's TLB (mapped rows streamed 4% slower)."""
        buffer = np.empty(self.n_features, np.float32)
        zeros = np.zeros(self.n_features, np.float32)
        for fh, picked, entries in self._shards(rows):
            if fh is None:
                yield from ((i, zeros) for i in picked)
                continue
            for i, (offset, nbytes) in zip(picked, entries, strict=True):
                if offset == self._MISSING:
                    yield i, zeros
                    continue
                if os.preadv(fh.fileno(), [buffer], int(offset)) != nbytes:
                    raise StoreError(f"{fh.name}: truncated, row chunk at byte {offset} is "
                                     f"shorter than {nbytes} bytes")
                yield i, buffer
