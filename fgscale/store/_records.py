"""The arrays that record each row of a store, checked before they are written: its class
index and the classes, its target, and where it comes from (file, volume, group, split)."""

from __future__ import annotations

import numpy as np

__all__ = ["labels_array", "row_records", "str_array", "target_array"]


def str_array(values, n: int | None, name: str) -> np.ndarray:
    # Variable-length strings: the one string type with a Zarr v3 specification.
    if values is None:
        values = [""] * n
    out = np.asarray(values).astype(str).astype(np.dtypes.StringDType())
    if n is None:
        return out
    if out.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {out.shape}")
    return out


def row_records(n: int, *, source=None, volume=None, groups=None, split=None) -> dict:
    """The arrays that record where each of ``n`` rows comes from (``source``, ``volume``,
    ``group``, ``split``), checked; None gives "" (volume 0) for every row."""
    split = str_array(split, n, "split")
    bad = sorted(set(split) - {"train", "test", ""})
    if bad:
        raise ValueError(f"split values must be 'train', 'test' or '', got {bad[:5]}")
    return {"source": str_array(source, n, "source"),
            "volume": np.zeros(n, np.int32) if volume is None else np.asarray(volume, np.int32),
            "group": str_array(groups, n, "groups"), "split": split}


def labels_array(y, classes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``y`` as int32 class indices into ``classes``, checked; both None: no class labels, written
    as ``y`` all 0 and ``classes`` empty, so that every store has the same arrays."""
    if y is None:
        if classes is not None and len(classes):
            raise ValueError("classes were given without y; give both, or neither for a store "
                             "without class labels")
        return np.zeros(n, np.int32), str_array([], None, "classes")
    if classes is None:
        raise ValueError("y was given without classes; give both, or neither for a store "
                         "without class labels")
    y = np.asarray(y)
    classes = str_array(classes, None, "classes")
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {y.shape}")
    if n and (y.min() < 0 or y.max() >= len(classes)):
        raise ValueError(f"y must hold class indices in [0, {len(classes)}), "
                         f"got {y.min()}..{y.max()}")
    return y.astype(np.int32), classes


def target_array(target, n: int) -> np.ndarray | None:
    """``target`` as float64 of shape (n,), checked finite; None stays None."""
    if target is None:
        return None
    try:
        out = np.asarray(target, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("target must hold numbers") from None
    if out.shape != (n,):
        raise ValueError(f"target must have shape ({n},), got {out.shape}")
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        raise ValueError(f"target must be finite, got {out[bad[0]]} at row {bad[0]} "
                         f"({bad.size} non-finite)")
    return out
