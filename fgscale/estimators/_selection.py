"""Hyper-parameters chosen on validation data: the candidates of ``"auto"`` and of lists.

``alpha``, ``dropout`` and ``n_clusters`` each take a value, a list of values or ``"auto"``
(``fgscale._auto.AUTO_GRIDS``). The candidates are every combination of the values that
apply to the estimator's regularizer; all are trained on the same training rows with early
stopping on the same validation rows, and the one of least validation loss (or error,
``stop_on="accuracy"``) is kept (ties: the first, in the order of the lists). Nothing here
touches the test rows.

Rows too few for a validation split leave nothing to choose on: ``"auto"`` then takes its
value in ``fgscale._auto.AUTO_FALLBACK``, and an explicit list of several values is refused
by the caller.
"""

from __future__ import annotations

import itertools

from fgscale._auto import searched_values
from fgscale.grouping._bank import resolve_n_clusters

__all__ = ["candidates", "resolved"]


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
    grids = [searched_values(name, params[name], validation) for name in names]
    out = []
    for combo in itertools.product(*grids):
        candidate = dict(zip(names, combo, strict=True))
        if candidate["n_clusters"] is not None:
            candidate["n_clusters"] = resolve_n_clusters(candidate["n_clusters"], n_features)
        if candidate not in out:
            out.append(candidate)
    return out
