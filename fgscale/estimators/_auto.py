"""What ``"auto"`` stands for in the searchable parameters (``alpha``, ``dropout``,
``n_clusters``): the grids chosen among on a validation split, and the values taken when the
training rows leave no split. Read by the parameter table (its help texts), the estimators'
selection and the ``bank`` command; it imports nothing heavy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AUTO_FALLBACK", "AUTO_GRIDS", "COARSEST_MIN_CLUSTERS", "NONLINEAR_FINEST", "auto_k_help",
           "searched_values"]

AUTO_GRIDS = {
    # down to 1e-6: on Fashion-MNIST a grid starting at 1e-4 chose its lower edge in every fit
    "alpha": tuple(float(a) for a in np.logspace(-6, 1, 8)),
    "dropout": (0.1, 0.3, 0.5, 0.7),
    # the coarsest (2%) in classification only, where it leaves COARSEST_MIN_CLUSTERS, and the
    # finest (80%) in regression only (see searched_values). 40% and 80% are for maps whose
    # differences are structured, not white: around a real activation map the finest k was
    # chosen in nearly every fit, and the finer grids gained there while level elsewhere
    # (scripts/results/accuracy_k_grid_dev.md). The MLP and the CNN stop at NONLINEAR_FINEST
    "n_clusters": (0.02, 0.05, 0.1, 0.2, 0.4, 0.8),
}
# what "auto" means where the training rows leave no validation split to choose on
AUTO_FALLBACK = {"alpha": 1e-4, "dropout": 0.5, "n_clusters": 0.1}
# "auto"'s coarsest k is tried where it leaves at least this many clusters: a parcellation of a
# brain image (33,854 voxels at 4 mm give 677 clusters), where smooth noise favours large
# clusters (scripts/results/accuracy_k_grid_dev.md); not a small image's (Fashion-MNIST's 784
# pixels would give 16 clusters for 10 classes)
COARSEST_MIN_CLUSTERS = 256
# "auto"'s finest k for the MLP and the CNN: their first layer in the reduced space (hidden
# units x k) and its copies grow with k, and at 1 mm 40% put the MLP's training above 6 GB
# (scripts/results/bench_1mm.md); the finer candidates were measured with the linear model only
NONLINEAR_FINEST = 0.2


def searched_values(name: str, value, validation: bool = True, n_features: int | None = None,
                    regression: bool = False, linear: bool = True) -> tuple:
    """The values ``value`` of a searchable parameter stands for: its ``"auto"`` grid (the
    fallback alone without a validation split), a list's values, or the value itself.
    ``n_features``: the features that ``n_clusters``'s fractions are of. "auto"'s coarsest
    fraction is left out where it gives fewer than :data:`COARSEST_MIN_CLUSTERS` clusters
    (kept where the number is not known) and in ``regression``, where it gained nothing on the
    dev seeds for up to twice the time; its finest is tried in regression only, where it gained
    on the dev seeds, while in classification it was level at best
    (scripts/results/accuracy_k_grid_dev.md). Without ``linear`` (the MLP, the CNN) the grid
    stops at :data:`NONLINEAR_FINEST`."""
    if isinstance(value, str) and value == "auto":
        if not validation:
            return (AUTO_FALLBACK[name],)
        grid = AUTO_GRIDS[name]
        if name == "n_clusters":
            if regression:
                grid = grid[1:]
            else:
                grid = grid[:-1]
                if n_features is not None and grid[0] * n_features < COARSEST_MIN_CLUSTERS:
                    grid = grid[1:]
            if not linear:
                grid = tuple(k for k in grid if k <= NONLINEAR_FINEST)
        return grid
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def auto_k_help() -> str:
    """What ``n_clusters="auto"`` means, in words, for the parameter's help."""
    grid = [f"{100 * k:g}" for k in AUTO_GRIDS["n_clusters"]]
    return (f"{', '.join(grid[1:-2])} or {grid[-2]}% of them ({grid[0]}% too in classification, "
            f"where it leaves {COARSEST_MIN_CLUSTERS} clusters or more, and {grid[-1]}% in "
            f"regression; up to {100 * NONLINEAR_FINEST:g}% for the MLP and the CNN), chosen on "
            f"the validation split (one bank each; {100 * AUTO_FALLBACK['n_clusters']:g}% when "
            "the rows leave no split)")
