"""Atomic writes of a run's files; checkpoints that a killed run resumes from."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["atomic_path", "load_checkpoint", "save_checkpoint"]


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
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(state: dict, path) -> None:
    """Write ``state`` with ``torch.save``, atomically."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path) -> dict | None:
    """The state saved at ``path``, or None when there is none yet."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
