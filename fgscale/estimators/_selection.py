"""Hyper-parameters chosen on validation data: the candidates of ``"auto"`` and of lists.

``alpha``, ``dropout`` and ``n_clusters`` each take a value, a list of values or ``"auto"``
(the grid below). The candidates are every combination of the values that apply to the
estimator's regularizer; all are trained on the same training rows with early stopping on the
same validation rows, and the one of least validation loss (or error, ``stop_on="accuracy"``)
is kept (ties: the first, in the order of the lists). Nothing here touches the test rows.

Rows too few for a validation split leave nothing to choose on: ``"auto"`` then takes the
value of ``AUTO_FALLBACK``, and an explicit list of several values is refused by the caller.
"""

from __future__ import annotations

import itertools

import numpy as np

from fgscale.grouping._bank import resolve_n_clusters

__all__ = ["AUTO_FALLBACK", "AUTO_GRIDS", "candidates", "resolved"]

AUTO_GRIDS = {
    # down to 1e-6: on Fashion-MNIST a grid starting at 1e-4 chose its lower edge in every fit
    "alpha": tuple(float(a) for a in np.logspace(-6, 1, 8)),
    "dropout": (0.1, 0.3, 0.5, 0.7),
    "n_clusters": (0.05, 0.1, 0.2),
}
AUTO_FALLBACK = {"alpha": 1e-4, "dropout": 0.5, "n_clusters": 0.1}


def _values(name: str, value, validation: bool) -> tuple:
    if isinstance(value, str) and value == "auto":
        return AUTO_GRIDS[name] if validation else (AUTO_FALLBACK[name],)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def resolved(estimator) -> dict:
    """The parameters that may be searched, as the estimator gives them (None resolved)."""
    alpha = estimator.alpha
    if alpha is None:  # "auto" with L2, else no weight decay
        alpha = "auto" if estimator.regularizer == "l2" else 0.0
    elif estimator.regularizer not in ("l2", "feature_grouping"):
        alpha = 0.0  # weight decay applies to L2, and combined with feature grouping
    dropout = estimator.dropout
    uses_dropout = (estimator.regularizer == "dropout"
                    or (estimator.regularizer == "feature_grouping" and estimator.model != "logreg"))
    if not uses_dropout:
        dropout = 0.0
    n_clusters = estimator.n_clusters if estimator.regularizer == "feature_grouping" else None
    return {"alpha": alpha, "dropout": dropout, "n_clusters": n_clusters}


def candidates(estimator, n_features: int, validation: bool = True) -> list[dict]:
    """Every combination to try, in a fixed order: one dict per candidate, ``n_clusters`` as
    a count of clusters for ``n_features`` (None without feature grouping). Values that give
    the same candidate (fractions of a few features that round to one k) are tried once.
    ``validation``: whether the rows leave a validation split to choose on."""
    params = resolved(estimator)
    names = list(params)
    grids = [_values(name, params[name], validation) for name in names]
    out = []
    for combo in itertools.product(*grids):
        candidate = dict(zip(names, combo, strict=True))
        if candidate["n_clusters"] is not None:
            candidate["n_clusters"] = resolve_n_clusters(candidate["n_clusters"], n_features)
        if candidate not in out:
            out.append(candidate)
    return out
