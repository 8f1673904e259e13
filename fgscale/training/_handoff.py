"""Blocks handed from worker processes on this machine to the central process through shared
memory rather than through a socket.

A block that reaches the central process through Dask's socket costs it about as much CPU as
the step that consumes it: the kernel copies it and allocates, then frees, a fresh page for
every 4 KiB (10-14 ms for a 21.7 MB block of 200 rows x 27,080 clusters, against 10 ms for
logistic regression's forward and backward on it; ``scripts/bench_stream.py --feed``). A file
in ``/dev/shm`` made for each block costs as much, in allocating and freeing its pages.
So the central process keeps a few files there (:class:`Slots`), each allocated and mapped
once; each task is given one to write its block into (:func:`write_into`), and the central
process's model reads the block where it was written: the slot is given to another task only
once no array views it any more (:meth:`Slots.take`). A copy out into recycled memory would
cost the central process a pass over every block and hold the copies beside the slots: the
slots in use are then the window of tasks in flight plus the blocks the model still holds.
A worker that cannot see the file (another machine, another container) or that is a thread of
the central process returns its block as before.

The files live in a folder named after the central process's id; a folder whose process is
gone (killed before it could clean up) is removed by the next :class:`Slots` made. A source keeps
its slots from one pass to the next (making them costs about what the socket did), but only the
source that runs a pass holds any: starting one frees the others' (:meth:`Slots.start_pass`), so
that the candidates of a search, each with its source, hold no more than one of them does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import shutil
import threading
import uuid
import weakref
from collections import deque
from pathlib import Path

import numpy as np

__all__ = ["SHM_ROOT", "Handed", "Slot", "Slots", "write_into"]

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
_PREFIX = "fgscale-blocks-"
_ALL: weakref.WeakSet = weakref.WeakSet()  # every Slots of this process


class Slot:
    """Where a task writes its block: a file of ``nbytes`` bytes, named for the worker, with
    the central process's id (a worker that is a thread of that process keeps its block)."""

    def __init__(self, path: str, nbytes: int, pid: int):
        self.path, self.nbytes, self.pid = path, nbytes, pid

    def __repr__(self) -> str:
        return f"Slot({self.path!r}, {self.nbytes})"


class Handed:
    """What a task returns for a block written into its slot: the slot and the block's shape."""

    def __init__(self, slot: Slot, shape: tuple[int, ...]):
        self.slot, self.shape = slot, shape


def write_into(slot: Slot | None, shape: tuple[int, ...], zeros: bool) -> np.ndarray | None:
    """Worker side: a float32 array of ``shape`` in ``slot``'s file (of zeros with ``zeros``),
    or None where the block is better returned (no slot, a worker thread of the central
    process, a file this process cannot see or too small). The file is mapped only as long as
    the array lives."""
    if slot is None or slot.pid == os.getpid() or 4 * int(np.prod(shape)) > slot.nbytes:
        return None
    try:
        fd = os.open(slot.path, os.O_RDWR)
    except OSError:
        return None
    try:
        buffer = mmap.mmap(fd, slot.nbytes)
    finally:
        os.close(fd)
    out = np.frombuffer(buffer, np.float32, int(np.prod(shape))).reshape(shape)
    if zeros:  # the file holds the last block written into it
        out.fill(0.0)
    return out


class Slots:
    """The central process's files for blocks handed through shared memory, each mapped here
    once and reused, one per task in flight.

    Parameters
    ----------
    root : Path, default /dev/shm
        A tmpfs: its pages are memory, never written to a disk.
    """

    def __init__(self, root: Path = SHM_ROOT):
        self.folder: Path | None = None
        self._free: list[tuple[Slot, mmap.mmap]] = []
        self._busy: dict[str, tuple[Slot, mmap.mmap]] = {}
        self._viewed: set[str] = set()  # busy slots whose block an array still views
        # (path, clear count) of the slots whose block is no longer viewed: appended by the
        # blocks' finalizers, which may run in any thread, even one holding the lock, so they
        # take no lock; _settle frees or drops them
        self._unviewed: deque = deque()
        self._cleared = 0  # clear() calls so far
        self._lock = threading.Lock()  # another source's pass may free the free slots
        if root.is_dir() and os.access(root, os.W_OK):
            _remove_orphans(root)
            self.folder = root / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            self.folder.mkdir(mode=0o700)
            # the folder goes with this object, or with the process at the latest
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        _ALL.add(self)

    def start_pass(self) -> None:
        """Free the free slots of every other :class:`Slots` of this process."""
        for other in list(_ALL):
            if other is not self:
                other.clear()

    def clear(self) -> None:
        """Unmap and remove the free slots; a slot whose block is still viewed goes once it is
        no longer, not back to the free ones."""
        self._settle()
        with self._lock:
            free, self._free = self._free, []
            self._cleared += 1
        for slot, buffer in free:
            self._drop(slot, buffer)

    def close(self) -> None:
        """Unmap and remove every slot (a slot whose block is still viewed, once it is no
        longer), and the folder."""
        self._settle()
        with self._lock:
            self._free.extend(v for k, v in self._busy.items() if k not in self._viewed)
            self._busy = {k: v for k, v in self._busy.items() if k in self._viewed}
        self.clear()
        if self.folder is not None:
            self._cleanup()

    def acquire(self, nbytes: int) -> Slot | None:
        """A slot of ``nbytes`` for the next task, or None (no shared memory, or not enough
        of it left: the block then comes through the socket)."""
        if self.folder is None:
            return None
        self._settle()
        with self._lock:
            others = [f for f in self._free if f[0].nbytes != nbytes]  # not reused
            self._free = [f for f in self._free if f[0].nbytes == nbytes]
            reused = self._free.pop() if self._free else None
        for slot, buffer in others:
            self._drop(slot, buffer)
        made = reused or self._make(nbytes)
        if made is None:
            return None
        with self._lock:
            self._busy[made[0].path] = made
        return made[0]

    def _make(self, nbytes: int) -> tuple[Slot, mmap.mmap] | None:
        path = str(self.folder / uuid.uuid4().hex)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # reserved now: a write past what tmpfs has left would kill the worker (SIGBUS)
            os.posix_fallocate(fd, 0, nbytes)
            buffer = mmap.mmap(fd, nbytes)
        except OSError as exc:
            os.unlink(path)
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            log.info("shared memory full: blocks of %d bytes come through the socket", nbytes)
            return None
        finally:
            os.close(fd)
        return Slot(path, nbytes, os.getpid()), buffer

    def take(self, handed: Handed) -> np.ndarray:
        """The block a task wrote into its slot, as an array viewing the slot, not a copy:
        the slot is given to another task once that array and every view of it are gone."""
        with self._lock:
            _, buffer = self._busy[handed.slot.path]
            self._viewed.add(handed.slot.path)
            cleared = self._cleared
        flat = np.frombuffer(buffer, np.float32, int(np.prod(handed.shape)))
        # every view of the block keeps ``flat`` alive (numpy does not collapse a view's base
        # past an array that does not own its memory), as the block pool's arrays do
        weakref.finalize(flat, self._unviewed.append, (handed.slot.path, cleared))
        return flat.reshape(handed.shape)

    def _settle(self) -> None:
        """The slots whose block is no longer viewed: free again, or dropped where the free
        slots were cleared since the block was taken."""
        dropped = []
        with self._lock:
            while self._unviewed:
                path, cleared = self._unviewed.popleft()
                self._viewed.discard(path)
                made = self._busy.pop(path, None)
                if made is not None:
                    (self._free if cleared == self._cleared else dropped).append(made)
        for made in dropped:
            self._drop(*made)

    def release(self, slot: Slot | None) -> None:
        """A slot whose task returned its block itself: free again."""
        with self._lock:
            if slot is not None and slot.path in self._busy:
                self._free.append(self._busy.pop(slot.path))

    def abandon(self, slot: Slot | None) -> None:
        """A slot whose task was cancelled: its worker may still write into it, so it is never
        given to another task."""
        with self._lock:
            dropped = self._busy.pop(slot.path, None) if slot is not None else None
        if dropped is not None:
            self._drop(*dropped)

    def _drop(self, slot: Slot, buffer: mmap.mmap) -> None:
        with contextlib.suppress(BufferError):  # still viewed: unmapped with its last view
            buffer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.path)


def _remove_orphans(root: Path) -> None:
    """Remove the folders of central processes that are gone."""
    for folder in root.glob(f"{_PREFIX}*"):
        pid = folder.name[len(_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
