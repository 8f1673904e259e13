"""Where a store's derived data live: its feature statistics (``stats/``) and banks of groupings
(``banks/``), in the store itself or in a cache store of their own.

A cohort is converted once, often onto a shared filesystem that its users may only read. The
data derived from it for training go into the store when this process may write there, else
into a Zarr group of the cache::

    <cache dir>/<store identity>.zarr/    attributes: fgscale_derived_of (the store's path)
        stats/<key>/   as in the store (fgscale.store._stats)
        banks/<key>/   as in the store (fgscale.store._banks)

under the same keys (they name the rows and parameters, not the place), so a killed run
resumes in the cache as it would in the store. The identity is :meth:`Store.identity`, what
the rows are rather than where they lie: a moved or copied store finds the same cache. It
leaves the rows' values out, so the cache store also records a digest of the store's first and
last rows (``rows_sample``), and is neither read nor written for a store whose rows differ (one
written from other arrays with the same labels, split and mask, or re-converted from changed
files at the same paths). The
cache dir is ``$FGSCALE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fgscale``, else
``~/.cache/fgscale``. ``FGSCALE_DERIVED=cache`` sends new derived data to the cache even for a
store this process may write: a shared store that should stay as converted, or a process whose
permissions do not say what it should write (root ignores a folder's mode bits).

Readers look in the store first, then in the cache, so the banks of a store that holds them
are used wherever new ones would go. Workers get a location as a plain path string.

Nothing here imports torch or scikit-learn: workers import this module.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import zarr

from fgscale._utils.files import can_write
from fgscale.store._reader import Store
from fgscale.store._shards import StoreError, sync_node

__all__ = ["CACHE_DIR_ENV", "DERIVED_ENV", "cache_dir", "cache_path", "derived_mode",
           "read_locations", "writable", "write_location"]

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "FGSCALE_CACHE_DIR"
"""The environment variable that names the cache dir."""
DERIVED_ENV = "FGSCALE_DERIVED"
"""The environment variable that chooses where new derived data go: "auto" or "cache"."""
_SUBGROUPS = ("stats", "banks")  # the names of fgscale.store._stats and _banks, which import this
_ANNOUNCED: set[tuple[str, str]] = set()  # (store, location) already logged by this process
_SAMPLES: dict[tuple, str] = {}  # _rows_sample's digests, by identity and row files' stamps


def cache_dir() -> Path:
    """The folder of the cache stores: ``$FGSCALE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fgscale``,
    else ``~/.cache/fgscale`` (absolute: workers may run elsewhere)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return (Path(base).expanduser() / "fgscale").resolve()


def cache_path(store: Store) -> Path:
    """The cache store of ``store``: ``<cache dir>/<store identity>.zarr`` (may not exist)."""
    return cache_dir() / f"{store.identity()}.zarr"


def writable(location) -> bool:
    """Whether derived data can be written at ``location`` (a store or a cache store): the
    folder exists, and files can be created in it and in its ``stats/`` and ``banks/`` folders
    where they exist."""
    root = Path(location)
    return root.is_dir() and all(can_write(d) for d in (root, *(root / s for s in _SUBGROUPS))
                                 if d.is_dir())


def _rows_files(store: Store) -> tuple | None:
    """(path, inode, size, mtime) of the files that hold the store's first and last rows, or
    None where they are not local files: what changes when those rows are rewritten (shards
    are written under a temporary name, then renamed)."""
    from zarr.storage import LocalStore

    X = store.X
    if not isinstance(X.store_path.store, LocalStore):
        return None
    root = Path(X.store_path.store.root) / X.store_path.path
    per_file = (X.shards or X.chunks)[0]
    stamps = []
    for row in (0, store.n_samples - 1):
        path = root / X.metadata.encode_chunk_key((row // per_file, 0))
        try:
            stat = path.stat()
        except OSError:
            return None
        stamps.append((str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)


def _rows_sample(store: Store) -> str:
    """SHA-256 of the store's first and last rows: a cheap check of what the identity leaves
    out. Kept per process while the files holding those rows are unchanged, since every
    reader of derived data asks (a 1 mm row is 7 MB)."""
    files = _rows_files(store)
    key = None if files is None else (store.identity(), files)
    if key is not None and key in _SAMPLES:
        return _SAMPLES[key]
    sample = hashlib.sha256(store.read_rows([0, store.n_samples - 1]).tobytes()).hexdigest()
    if key is not None:
        _SAMPLES[key] = sample
    return sample


def _other_rows(store: Store, cache: Path) -> str | None:
    """The store a cache store was made for, when its rows differ from ``store``'s; else None."""
    attrs = zarr.open_group(str(cache), mode="r").attrs
    if attrs.get("rows_sample") in (None, _rows_sample(store)):
        return None
    return str(attrs.get("fgscale_derived_of", "another store"))


def read_locations(store: Store) -> list[str]:
    """The places that may hold derived data of ``store``, in the order readers look: the
    store, then its cache store when there is one (and it was made for these rows); absolute
    paths."""
    path, cache = str(Path(store.path).resolve()), cache_path(store)
    if not (cache / "zarr.json").is_file():
        return [path]
    other = _other_rows(store, cache)
    if other is not None:
        log.warning("%s: the cache store %s was made for %s, of the same identity but other "
                    "rows; not read", path, cache, other)
        return [path]
    return [path, str(cache)]


def derived_mode() -> str:
    """``$FGSCALE_DERIVED``: "auto" (the default) or "cache"; a ValueError for anything else."""
    mode = os.environ.get(DERIVED_ENV) or "auto"
    if mode not in ("auto", "cache"):
        raise ValueError(f"{DERIVED_ENV}={mode!r}: expected 'auto' (the store when writable, "
                         "else the cache) or 'cache'")
    return mode


def write_location(store: Store) -> str:
    """Where new derived data of ``store`` go: the store when it is writable (and
    ``FGSCALE_DERIVED`` is not "cache"), else its cache store, created if need be.

    Parameters
    ----------
    store : Store

    Returns
    -------
    location : str
        Absolute path of a Zarr group to write ``stats/`` and ``banks/`` into. Logged at INFO,
        once per store and place in a process.

    Raises
    ------
    StoreError
        If neither the store nor the cache dir is writable: the message names both and
        ``FGSCALE_CACHE_DIR``; or if the cache store was made for other rows.
    ValueError
        If ``FGSCALE_DERIVED`` is neither "auto" nor "cache".
    """
    path = str(Path(store.path).resolve())
    mode = derived_mode()
    if mode == "auto" and writable(path):
        _announce(path, path, "store writable: stats and banks go into it")
        return path
    cache = cache_path(store)
    why = "store read-only" if mode == "auto" else f"{DERIVED_ENV}=cache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # said below, with the store
    if not writable(cache):
        blocked = next((p for p in (cache.parent, *cache.parent.parents) if p.exists()), None)
        state = (f"cannot be made ({blocked} is a file, not a folder)"
                 if blocked is not None and not blocked.is_dir()
                 else "is not writable" + (" either" if mode == "auto" else ""))
        raise StoreError(
            f"{path}: {why}, and the cache dir {cache.parent} {state}: the feature statistics "
            f"and banks of groupings have nowhere to go; set {CACHE_DIR_ENV} to a writable "
            "folder" + (", or make the store writable" if mode == "auto" else ""))
    group = zarr.open_group(str(cache), mode="a")
    if "rows_sample" not in group.attrs:  # the store's path: for a person looking at the cache
        group.attrs.update({"fgscale_derived_of": path, "rows_sample": _rows_sample(store)})
        sync_node(group)
    elif (other := _other_rows(store, cache)) is not None:
        raise StoreError(f"{path}: its cache store {cache} was made for {other}, of the same "
                         "identity but other rows; remove that folder, or set "
                         f"{CACHE_DIR_ENV} to another one")
    # a read-only store's statistics and banks land in a home folder (quotas on a cluster): said
    _announce(path, str(cache), f"{why}: stats and banks go to its cache store (set "
              f"{CACHE_DIR_ENV} for another folder)",
              logging.WARNING if mode == "auto" else logging.INFO)
    return str(cache)


def _announce(store: str, location: str, why: str, level: int = logging.INFO) -> None:
    if (store, location) not in _ANNOUNCED:
        _ANNOUNCED.add((store, location))
        log.log(level, "%s: %s, %s", store, why, location)
