"""Files written whole or not at all (:func:`atomic_path`), shared by every writer of a run
folder or a saved model; JSON read back with the file named in its errors (:func:`read_json`);
whether a folder takes a new file, tried for real (:func:`can_write`, :func:`check_writable`);
one command at a time on a folder (:func:`exclusive`) or on a name that comes and goes
(:func:`exclusive_name`); a folder replaced whole (:func:`replaced_folder`); the tag that names
a temporary file's writer, its machine when another, and whether that writer is gone
(:func:`owner_tag`, :func:`owner_elsewhere`, :func:`owner_gone`); what was written made to
survive a crash of the machine, not only of the process (:func:`fsync_file`, :func:`fsync_dir`,
:func:`fsync_fd`, :func:`fsync_tree`); Ctrl-C and SIGTERM held back while a writer that cannot be
interrupted cleanly runs (:func:`signals_deferred`)."""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "can_write", "check_writable", "exclusive", "exclusive_name",
           "fsync_dir", "fsync_fd", "fsync_file", "fsync_tree", "owner_elsewhere", "owner_gone", "owner_tag",
           "pid_alive", "read_json", "replaced_folder", "signals_deferred"]

log = logging.getLogger(__name__)
# letters, digits and "_" only: a tag splits from the name around it at "-" or "."
_HOST = re.sub(r"\W", "_", socket.gethostname()) or "localhost"


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs, then act on the first that came, as
    its handler would have (Ctrl-C's KeyboardInterrupt, the command line's SIGTERM).

    For writers that an exception raised mid-write turns into another error: torch.save,
    interrupted inside its zip writer, fails closing the archive with a RuntimeError that hides
    the KeyboardInterrupt, so Ctrl-C during a checkpoint ended a command with a traceback.
    In a thread other than the main one (which receives no signal) the block simply runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[tuple[int, object]] = []
    kept = {signum: signal.signal(signum, lambda n, frame: came.append((n, frame)))
            for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
    if came:
        signum, frame = came[0]
        handler = kept[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:  # as the default would have: end the process
            signal.raise_signal(signum)


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    A crash mid-write leaves the previous file intact. The temporary name keeps the file's
    suffixes (``.nii.gz``, ``.json``) so that writers that look at them still work, and holds
    the process id: two processes writing one file at once (two ``predict --out`` of one CSV)
    each write their own, and the file is the whole of one of them, never a mix. The
    temporary files of writers killed before they renamed them are removed. The file's bytes
    reach the disk before the rename, and the rename before the function returns: a machine
    that crashes (power lost, kernel panic) keeps the previous file or the new one, whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".tmp-*-{glob.escape(path.name)}"):
        if owner_gone(stale.name[len(".tmp-"):].partition("-")[0]) and stale.is_file():
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f".tmp-{owner_tag()}-{path.name}")
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:  # a full or read-only disk: say which file, and what is kept
        if exc.filename2 is None and _as_path(exc.filename) == path:
            raise  # names the file already, and not by its temporary name
        raise OSError(exc.errno, f"{path}: not written ({exc.strerror or exc}); the previous "
                                 "version, if any, is kept") from exc
    finally:
        tmp.unlink(missing_ok=True)


def owner_tag() -> str:
    """This process's tag in the names of its temporary files, ``<pid>@<host>``: on a file
    system that several machines share (a cluster's), two writers of one file on two nodes
    have two names even with the same process id, and none takes the other's for its own."""
    return f"{os.getpid()}@{_HOST}"


def owner_elsewhere(tag: str) -> str | None:
    """The machine that ``tag`` (:func:`owner_tag`) names when it is another one; None for
    this machine, and for a bare process id (earlier versions' names)."""
    host = tag.partition("@")[2]
    return None if host in ("", _HOST) else host


def owner_gone(tag: str) -> bool:
    """Whether the writer that ``tag`` (:func:`owner_tag`) names has ended, so that its
    temporary file may be removed: a process of this machine that no longer runs. Another
    machine's (:func:`owner_elsewhere`) is never taken for gone."""
    pid = tag.partition("@")[0]
    return pid.isdigit() and owner_elsewhere(tag) is None and not pid_alive(int(pid))


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (the owner of a temporary file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@contextmanager
def replaced_folder(folder) -> Iterator[Path]:
    """Yield a new empty folder beside ``folder``; on success it takes the place of ``folder``,
    whose files are then removed.

    A failure while writing leaves ``folder`` as it was and removes the new one. The old folder
    is renamed away (``.old-<name>-...``, beside it) before the new one is renamed into place,
    so a process killed between the two renames loses nothing.
    """
    folder = Path(folder).resolve()  # "." or "run/..": a folder with a name and a parent
    new = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        os.chmod(new, folder.stat().st_mode & 0o7777)  # mkdtemp's 0700 would hide it
        yield new
        old = new.with_name(new.name.replace(".tmp-", ".old-", 1))
        os.rename(folder, old)
        try:
            os.rename(new, folder)
        except OSError:
            os.rename(old, folder)
            raise
        shutil.rmtree(old, ignore_errors=True)
        fsync_dir(folder.parent)  # after the old one is gone: a failed flush leaves no .old- folder
    finally:
        shutil.rmtree(new, ignore_errors=True)


def fsync_file(path) -> None:
    """Wait until the bytes written to file ``path`` are on the disk, not only in the OS's
    cache (``fsync``): before a rename or a flag claims them whole."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """Wait until folder ``path``'s entries (a file created or renamed into it) are on the
    disk. Passed over where a folder cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (PermissionError, IsADirectoryError):
        return
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


# what a file system that cannot flush this descriptor answers: there the order of the writes
# and renames is all there is, as before any flush
_CANNOT_FLUSH = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def fsync_fd(fd: int) -> None:
    """``os.fsync(fd)``; an error that says the file system cannot flush it is passed over, any
    other (EIO: the bytes are lost; ENOSPC on a network file system) is raised."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_FLUSH:
            raise


def fsync_tree(path, skip=()) -> None:
    """:func:`fsync_file` every file below folder ``path`` (bar the folders named in ``skip``,
    relative to ``path``), then :func:`fsync_dir` every folder: a tree written through a
    library that does not flush (zarr's metadata and small arrays) before a rename or a flag
    claims it."""
    path = Path(path)
    skipped = {path / name for name in skip}
    for top, folders, files in os.walk(path, topdown=True):
        folders[:] = [f for f in folders if Path(top, f) not in skipped]
        for name in files:
            fsync_file(Path(top, name))
        fsync_dir(top)


def can_write(folder) -> bool:
    """Whether this process can create a file in ``folder``, found by creating (and removing)
    one: mode bits, ACLs, a read-only mount, root's rights and a server's squashing of them
    all say their word, which :func:`os.access` does not always hear."""
    try:
        fd, name = tempfile.mkstemp(prefix=".fgscale-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def check_writable(path, consequence: str) -> None:
    """Refuse, before the work whose result goes there, a file ``path`` that could not be
    written once that work is done: a folder of that name, or a folder for it that cannot be
    made or written. ``consequence`` ends the message: what is not done, what to do."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a file name{consequence}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writable = can_write(path.parent)
    except OSError:
        writable = False
    if not writable:
        raise ValueError(f"{path}: its folder {path.parent} cannot be created or written"
                         f"{consequence}")


def _as_path(name) -> Path | None:
    return None if name is None else Path(os.fsdecode(name))


def read_json(path, what: str = "JSON file", keys: tuple[str, ...] = ()):
    """The JSON document in ``path``; a ValueError naming the file when it is not valid JSON,
    or not an object holding ``keys``.

    Parameters
    ----------
    path : str or Path
    what : str, default="JSON file"
        What the file should be, for the message ("run configuration").
    keys : tuple of str, default=()
        Fields the document must have (it is then a JSON object).
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a valid {what} ({exc}); it was cut short or is not "
                         "fgscale's: move it away, or choose another folder") from exc
    missing = [k for k in keys if not isinstance(document, dict) or k not in document]
    if missing:
        raise ValueError(f"{path}: not a valid {what} (no field {missing[0]!r}); it was edited "
                         "or is not fgscale's: move it away, or choose another folder")
    return document


@contextmanager
def exclusive(folder) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (``flock`` on the folder itself, released when the
    process ends, even killed): a second command doing the same work on the same store waits
    for the first, then finds its result. Where locks are not supported (some network file
    systems), it proceeds unlocked."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        fcntl = None
    fd = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
        yield
    finally:
        os.close(fd)


@contextmanager
def exclusive_name(path, *, waiting: str | None = None,
                   busy: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the name ``path``: a folder that may not exist yet, or be
    removed and made again while the lock is held (a store being converted), so that no lock
    on the folder itself would last. The lock is a ``flock`` on the file ``.<name>.lock``
    beside it, removed on release; a killed holder's lock ends with it, and the next holder
    takes its file over. Where locks are not supported, or the folder beside cannot be
    written, it proceeds unlocked, as :func:`exclusive` does.

    Parameters
    ----------
    path : str or Path
    waiting : str, optional
        Logged (a warning) when another process holds the lock, which is then waited for;
        default "<path>: in use by another process; waiting for it".
    busy : str, optional
        Instead, the message of the ValueError raised at once when another process holds it:
        for work too long to wait for (a training run).
    """
    path = Path(path).expanduser().resolve()  # "." has no name to put beside it; "run/.." another
    lock = path.with_name(f".{path.name}.lock") if path.name else None  # "/": no lock
    waiting = waiting or f"{path}: in use by another process; waiting for it"
    fd = None if lock is None else _lock(lock, waiting, busy)
    try:
        yield
    finally:
        if fd is not None:
            # removed while still held: a process waiting on it then finds its file gone
            # (:func:`_lock`) and locks a new one, never this one after the next holder's
            try:
                lock.unlink(missing_ok=True)
            except OSError:  # a disk gone read-only: the command says what it could not write
                pass
            os.close(fd)


def _lock(lock: Path, waiting: str, busy: str | None) -> int | None:
    """A descriptor of ``lock`` holding its ``flock``, once the file it locks is still the one
    at that name; None where there is no lock to take."""
    try:
        import fcntl
    except ImportError:
        return None
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)  # the folder's parent, made anyway
            # read-only: an open file for writing would keep its file system from a remount
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o666)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if busy is not None:
                    os.close(fd)
                    raise ValueError(busy) from None
                log.warning("%s", waiting)
                fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                return fd
        except FileNotFoundError:  # its holder removed it as it let go: lock the next one
            pass
        except OSError:  # no locks on this file system
            os.close(fd)
            lock.unlink(missing_ok=True)
            return None
        os.close(fd)
