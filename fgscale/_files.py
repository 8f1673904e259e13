"""Files written whole or not at all: :func:`atomic_path`, shared by every writer of a run
folder or a saved model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path"]


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    A crash mid-write leaves the previous file intact. The temporary name keeps the file's
    suffixes (``.nii.gz``, ``.json``) so that writers that look at them still work.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:  # a full or read-only disk: say which file, and what is kept
        if exc.filename is not None and str(path) in str(exc):
            raise
        raise OSError(exc.errno, f"{path}: not written ({exc.strerror or exc}); the previous "
                                 "version, if any, is kept") from exc
    finally:
        tmp.unlink(missing_ok=True)
