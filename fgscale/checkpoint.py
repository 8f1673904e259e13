"""Atomic checkpoints of a training run: a killed run resumes where its last epoch ended."""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(state: dict, path) -> None:
    """Write ``state`` with ``torch.save`` under a temporary name, then rename it into place.

    A crash mid-write leaves the previous checkpoint intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path) -> dict | None:
    """The state saved at ``path``, or None when there is none yet."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
