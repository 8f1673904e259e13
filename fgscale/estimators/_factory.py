"""The estimator of a task: classification on a store's labels, regression on its target."""

from __future__ import annotations

import logging

from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.estimators._params import PARAMS
from fgscale.estimators._regressor import FeatureGroupingRegressor

__all__ = ["TASKS", "make_estimator"]

log = logging.getLogger(__name__)

TASKS = ("auto", "classification", "regression")


def make_estimator(store, params: dict | None = None, task: str = "auto"):
    """The estimator of ``task`` for ``store``, its parameters checked.

    Parameters
    ----------
    store : Store
    params : dict, optional
        Estimator parameters; those of the other task are dropped at their default.
    task : {"auto", "classification", "regression"}, default="auto"
        ``"auto"`` is classification when the store has class labels, regression when it has
        only a target. A store without what the task needs is refused here, before any run
        folder is written.

    Returns
    -------
    estimator : FeatureGroupingClassifier or FeatureGroupingRegressor
        Not fitted; a bad parameter (or a GPU this machine lacks) is refused here. The
        parameters that would have no effect are said by its ``fit``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "auto":
        task = "classification" if store.has_labels else "regression"
        log.info("%s: %s (task='auto')", store.path, task)
    if task == "regression" and store.target is None:
        raise ValueError(f"{store.path}: the store has no target (its cohort table had no "
                         "'target' column): regression needs one")
    if task == "classification" and not store.has_labels:
        raise ValueError(f"{store.path}: the store has no class labels (its cohort had a "
                         "target column only): classification needs them")
    cls = FeatureGroupingClassifier if task == "classification" else FeatureGroupingRegressor
    params = dict(params or {})
    # the command line has every option of both tasks: another task's is dropped at its default
    for p in PARAMS:
        if p.task not in (None, task) and p.name in params:
            if params[p.name] != p.default:
                raise ValueError(f"{p.name}={params.pop(p.name)!r} applies to {p.task} only, and "
                                 f"{store.path} is fitted by {task}")
            del params[p.name]
    estimator = cls(**params)
    estimator._check_params()
    return estimator
