"""Reusable memory for the big blocks that workers hand to the model.

Every minibatch is a fresh (m x k) block (21.6 MB at HCP resolution) and every evaluation block
a fresh (m x p) one (66 MB). Fresh memory costs a page fault per 4 KiB page on first touch,
several times what zeroing a block already mapped costs. So blocks come from a
:class:`BlockPool`: each lives in its own anonymous memory map, and goes back to the pool when
the last array viewing it is freed, wherever that happens (the training thread frees what
worker threads filled). Separate maps also keep glibc's per-thread arenas out of it: plain
``np.zeros`` blocks come from those arenas, and the memory of a process with thread workers
then grows over its first batches. The figures are in the README's performance section.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

__all__ = ["BlockPool", "POOL"]


class BlockPool:
    """Float32 arrays in anonymous memory maps, recycled once freed.

    Parameters
    ----------
    max_bytes : int
        Free maps kept at most, in bytes; beyond that the maps freed longest ago are unmapped
        (so that blocks of a size no longer asked for do not hold the space). The default
        keeps five minibatch blocks at HCP resolution (21.6 MB each) or one evaluation block
        (66 MB), and never a 200-row batch of full rows (216 MB): memory kept here counts
        against a Dask worker's memory limit, and a worker paused near its limit must see
        its memory fall once its blocks are freed.
    """

    def __init__(self, max_bytes: int = 128 << 20):
        self.max_bytes = max_bytes
        self._free: list[mmap.mmap] = []  # oldest first
        self._free_bytes = 0
        self.fresh = 0  # maps made so far (the rest of the blocks were recycled)
        # re-entrant: a block may be freed (and given back) while this thread holds the lock
        self._lock = threading.RLock()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised C-contiguous float32 array of ``shape``."""
        return self._take(shape)[0]

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous float32 array of zeros of ``shape``."""
        out, recycled = self._take(shape)
        if recycled:  # a fresh map is zero already
            out.fill(0.0)
        return out

    def _take(self, shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
        size = int(np.prod(shape))
        nbytes = max(4 * size, 1)
        with self._lock:
            buffer = next((b for b in reversed(self._free) if len(b) == nbytes), None)
            if buffer is not None:
                self._free.remove(buffer)
                self._free_bytes -= nbytes
            else:
                self.fresh += 1
        recycled = buffer is not None
        if not recycled:
            buffer = mmap.mmap(-1, nbytes)  # anonymous: zero-filled by the kernel
            if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux: fault it in by 2 MiB pages if it can
                buffer.madvise(mmap.MADV_HUGEPAGE)
        flat = np.frombuffer(buffer, np.float32, size)
        # Every view of the result keeps ``flat`` alive (numpy does not collapse a view's base
        # past an array that does not own its memory), so the map is reused only once no
        # array can see it any more.
        weakref.finalize(flat, self._give_back, buffer)
        return flat.reshape(shape), recycled

    def _give_back(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buffer)
            self._free_bytes += len(buffer)
            while self._free_bytes > self.max_bytes:  # dropped: unmapped once unreferenced
                self._free_bytes -= len(self._free.pop(0))


# The process's pool, shared by its worker threads.
POOL = BlockPool()
