"""What ``"auto"`` stands for in the searchable parameters (``alpha``, ``dropout``,
``n_clusters``): the grids chosen among on a validation split, and the values taken when the
training rows leave no split. Read by the parameter table (its help texts), the estimators'
selection and the ``bank`` command; it imports nothing heavy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AUTO_FALLBACK", "AUTO_GRIDS", "COARSEST_MIN_CLUSTERS", "auto_k_help", "searched_values"]

AUTO_GRIDS = {
    # down to 1e-6: on Fashion-MNIST a grid starting at 1e-4 chose its lower edge in every fit
    "alpha": tuple(float(a) for a in np.logspace(-6, 1, 8)),
    "dropout": (0.1, 0.3, 0.5, 0.7),
    # 2% in classification only, where it leaves COARSEST_MIN_CLUSTERS (see searched_values);
    # 40% for maps whose differences are structured, not white: around a real activation map
    # 20% was the finest and the one chosen in nearly every fit, and 40% gained there while
    # level elsewhere (scripts/results/accuracy_k_grid_dev.md)
    "n_clusters": (0.02, 0.05, 0.1, 0.2, 0.4),
}
# what "auto" means where the training rows leave no validation split to choose on
AUTO_FALLBACK = {"alpha": 1e-4, "dropout": 0.5, "n_clusters": 0.1}
# "auto"'s coarsest k is tried where it leaves at least this many clusters: a parcellation of a
# brain image (33,854 voxels at 4 mm give 677 clusters), where smooth noise favours large
# clusters (scripts/results/accuracy_k_grid_dev.md); not a small image's (Fashion-MNIST's 784
# pixels would give 16 clusters for 10 classes)
COARSEST_MIN_CLUSTERS = 256


def searched_values(name: str, value, validation: bool = True,
                    n_features: int | None = None, regression: bool = False) -> tuple:
    """The values ``value`` of a searchable parameter stands for: its ``"auto"`` grid (the
    fallback alone without a validation split), a list's values, or the value itself.
    ``n_features``: the features that ``n_clusters``'s fractions are of; "auto"'s coarsest
    fraction is left out where it gives fewer than :data:`COARSEST_MIN_CLUSTERS` clusters
    (kept where the number is not known), and in ``regression``, where it gained nothing on
    the dev seeds for up to twice the time (scripts/results/accuracy_k_grid_dev.md)."""
    if isinstance(value, str) and value == "auto":
        if not validation:
            return (AUTO_FALLBACK[name],)
        grid = AUTO_GRIDS[name]
        if name == "n_clusters" and (regression or (
                n_features is not None and grid[0] * n_features < COARSEST_MIN_CLUSTERS)):
            grid = grid[1:]
        return grid
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def auto_k_help() -> str:
    """What ``n_clusters="auto"`` means, in words, for the parameter's help."""
    grid = [f"{100 * k:g}" for k in AUTO_GRIDS["n_clusters"]]
    return (f"{', '.join(grid[:-1])} or {grid[-1]}% of them ({grid[0]}% in classification, where "
            f"it leaves {COARSEST_MIN_CLUSTERS} clusters or more), chosen on the validation split (one "
            f"bank each; {100 * AUTO_FALLBACK['n_clusters']:g}% when the rows leave no split)")
