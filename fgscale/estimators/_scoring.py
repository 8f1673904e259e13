"""Candidates' scores on validation rows, with scikit-learn's scorers (``scoring=``).

A scorer is called as ``scorer(estimator, X, y)``: here the estimator is :class:`_Outputs`,
which answers ``predict``, ``predict_proba`` and ``decision_function`` with the outputs the
candidate's model gave on the validation rows, so any scorer name that scikit-learn knows
(``get_scorer_names()``) scores a candidate as it would score a fitted scikit-learn estimator,
without predicting the rows again.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.metrics import accuracy_score, get_scorer, r2_score

__all__ = ["fold_score", "report_score_name"]


class _ClassifierOutputs(ClassifierMixin, BaseEstimator):
    """The logits of rows already predicted, as a fitted classifier of classes 0..C-1."""

    def __init__(self, logits=None):
        self.logits = logits

    def fit(self, X=None, y=None):  # pragma: no cover - scikit-learn's API; never refitted
        return self

    @property
    def classes_(self):
        return np.arange(self.logits.shape[1])

    def decision_function(self, X):
        # two classes: one column, the second's logit minus the first's, as scikit-learn's
        return self.logits[:, 1] - self.logits[:, 0] if self.logits.shape[1] == 2 else self.logits

    def predict_proba(self, X):
        z = self.logits - self.logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, X):
        return self.logits.argmax(axis=1)


class _RegressorOutputs(RegressorMixin, BaseEstimator):
    """The predictions of rows already predicted, as a fitted regressor."""

    def __init__(self, predictions=None):
        self.predictions = predictions

    def fit(self, X=None, y=None):  # pragma: no cover - scikit-learn's API; never refitted
        return self

    def predict(self, X):
        return self.predictions


def report_score_name(estimator) -> str:
    """The score in ``cv_scores_``: ``scoring``'s name, else accuracy (a classifier) or R²."""
    if estimator.scoring is not None:
        return estimator.scoring
    return "accuracy" if estimator._is_classifier() else "r2"


def fold_score(estimator, outputs: np.ndarray, y: np.ndarray) -> float:
    """The score of ``outputs`` (the model's, shape (n_rows, n_outputs)) against the targets
    ``y`` the model trains on (class indices, or the standardized target) of validation rows:
    ``scoring``'s scorer, else accuracy or R²; greater is better. A regressor's predictions
    and targets are put back in the target's units first (its mean absolute error is in them).
    """
    rows = np.arange(len(y))  # the scorer's X: the outputs stand for these rows
    if estimator._is_classifier():
        y = np.asarray(y, np.int64)
        if estimator.scoring is None:
            return float(accuracy_score(y, outputs.argmax(axis=1)))
        return float(get_scorer(estimator.scoring)(_ClassifierOutputs(outputs), rows, y))
    y = np.asarray(y, np.float64) * estimator.y_scale_ + estimator.y_mean_
    predictions = outputs[:, 0] * estimator.y_scale_ + estimator.y_mean_
    if estimator.scoring is None:
        return float(r2_score(y, predictions))
    return float(get_scorer(estimator.scoring)(_RegressorOutputs(predictions), rows, y))
