"""Cross-validation on a store's training rows, each fold trained by streaming
(``fgscale cv``)."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone, is_classifier

from fgscale.cluster import get_client
from fgscale.estimators._factory import make_estimator
from fgscale.reports import score_store
from fgscale.store._reader import open_store

__all__ = ["cross_validate"]


def cross_validate(store_path, *, params: dict | None = None, n_folds: int = 5, client=None,
                   echo=None, task: str = "auto") -> dict:
    """K-fold cross-validation on a store's training rows, each fold trained by streaming.

    Folds are grouped by the store's ``group`` column when the rows have one (rows of a
    subject never straddle folds; a store where only some rows have a group is refused), else
    stratified by class (shuffled for regression). Each
    fold standardizes with, and builds its banks from, its own training rows; the store's test
    rows are never read.

    Parameters
    ----------
    store_path : str or Path
    params : dict, optional
        Estimator parameters.
    n_folds : int, default=5
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster of threads.
    echo : callable, optional
        Called with a line of text after each fold.
    task : {"auto", "classification", "regression"}, default="auto"
        As :func:`fgscale.runs.train_run`.

    Returns
    -------
    scores : dict
        ``folds`` (a dict per fold: its report, as :func:`fgscale.reports.classification_report`
        or ``regression_report``, its training rows, the chosen hyper-parameters),
        ``score`` (``"accuracy"`` or ``"r2"``), ``mean_score``, ``std_score``, ``grouped``;
        for classification also ``mean_accuracy`` and ``std_accuracy``.
    """
    from sklearn.model_selection import GroupKFold, KFold, StratifiedKFold

    store = open_store(store_path)
    clf = make_estimator(store, params, task)
    clf._check_params(warn_level=3)
    name = "accuracy" if is_classifier(clf) else "r2"
    rows = store.train_rows()
    groups = store.groups[rows]
    has_group = groups != ""
    grouped = bool(has_group.any())
    if grouped and not has_group.all():
        raise ValueError(f"{store.path}: {int((~has_group).sum())} of the {rows.size} training "
                         "rows have no group: give each row its subject, or none of them")
    most = len(set(groups)) if grouped else rows.size
    if not 2 <= n_folds <= most:
        unit = "subjects (rows of a subject never straddle folds)" if grouped else "rows"
        raise ValueError(f"{store.path}: {n_folds} folds; give 2 or more, and at most the "
                         f"{most} training {unit}")
    if grouped:
        splits = GroupKFold(n_splits=n_folds).split(rows, groups=groups)
    elif name == "accuracy":
        splits = StratifiedKFold(n_splits=n_folds, shuffle=True,
                                 random_state=clf._seed()).split(rows, store.y[rows])
    else:
        splits = KFold(n_splits=n_folds, shuffle=True, random_state=clf._seed()).split(rows)
    folds = []
    with get_client(client, processes=False) as client:
        for fold, (train, test) in enumerate(splits):
            model = clone(clf)
            model._fit_store(store.path, client, rows=rows[train])
            metrics, _ = score_store(model, store, client, rows[test],
                                     progress=bool(model.verbose))
            folds.append({"fold": fold, "n_train": int(train.size), **metrics,
                          "selected": {"alpha": model.alpha_, "dropout": model.dropout_,
                                       "n_clusters": model.n_clusters_}})
            if echo is not None:
                echo(f"fold {fold}: {name} {metrics[name]:.4f} on {metrics['n']} rows "
                     f"(trained on {train.size}; {folds[-1]['selected']})")
    score = np.array([f[name] for f in folds], float)
    scores = {"folds": folds, "score": name, "mean_score": float(score.mean()),
              "std_score": float(score.std()), "grouped": grouped}
    if name == "accuracy":
        scores.update(mean_accuracy=scores["mean_score"], std_accuracy=scores["std_score"])
    return scores
