"""Checks of the estimators' parameters that need no torch, zarr or scikit-learn."""

from __future__ import annotations

import numbers

__all__ = ["check_device", "check_prefetch"]


def check_device(device) -> None:
    """A device torch can use here; checked before any work, so that a run asking for a GPU
    on a machine without one stops at once, not after its bank is built."""
    import torch  # here: checking the other parameters imports no torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), "
                         f"got {device!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={str(device)!r}: this torch {torch.__version__} sees no "
                             "CUDA GPU (use device='cpu')")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={str(device)!r}: this machine has {count} CUDA GPU(s)")


def check_prefetch(prefetch):
    """``prefetch`` itself, if it is "auto" or an integer >= 1; else a ValueError."""
    if isinstance(prefetch, str) and prefetch == "auto":
        return prefetch
    if not isinstance(prefetch, numbers.Integral) or isinstance(prefetch, bool) or prefetch < 1:
        raise ValueError(f"prefetch must be 'auto' or an integer >= 1, got {prefetch!r}")
    return int(prefetch)
