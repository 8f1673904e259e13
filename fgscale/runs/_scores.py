"""Scores of predictions against the truth, and the text ``fgscale evaluate`` prints of them:
a classification report (accuracy, balanced accuracy, per-class figures, confusion matrix) or a
regression's (R², MAE, RMSE, correlation), each beside what a model that learnt nothing scores
on the same rows, with :mod:`sklearn.metrics`. A figure the rows leave undefined is None
(``n/a`` in text), never a 0 that reads as a failure.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["classification_report", "format_report", "regression_report"]


def classification_report(labels, proba: np.ndarray, classes) -> dict:
    """Scores of predictions against true labels.

    Parameters
    ----------
    labels : array-like of shape (n_rows,)
        True labels (compared to ``classes`` as strings).
    proba : ndarray of shape (n_rows, n_classes)
        Predicted probabilities, columns in the order of ``classes``.
    classes : array-like of shape (n_classes,)

    Returns
    -------
    report : dict
        ``n``, ``loss`` (mean cross-entropy), ``accuracy``, ``chance`` (the accuracy of
        always predicting the most frequent class of these rows), ``balanced_accuracy``,
        ``classes`` (as strings), ``per_class`` (class -> precision, recall, f1, support)
        and ``confusion_matrix`` (rows: true class, columns: predicted, in class order);
        the scores are None without rows. A class's recall is None when it has no true row,
        its precision when it is never predicted, its F1 (2 TP / (2 TP + FP + FN)) when
        neither: undefined, where scikit-learn's ``zero_division=0`` would say 0.
    """
    from sklearn import metrics

    names = [str(c) for c in classes]
    y_true = np.asarray(labels).astype(str)
    if y_true.size == 0:
        return {"n": 0, "loss": None, "accuracy": None, "chance": None, "balanced_accuracy": None,
                "classes": names, "per_class": None, "confusion_matrix": None}
    index = {c: i for i, c in enumerate(names)}
    unknown = sorted(set(y_true) - set(index))
    if unknown:
        raise ValueError(f"label(s) {unknown} are not among the classes {names}")
    true_idx = np.array([index[c] for c in y_true])
    pred = np.asarray(names)[proba.argmax(axis=1)]
    # the probability of the true class, floored where float64 rounds it to 0
    picked = np.maximum(proba[np.arange(len(true_idx)), true_idx], np.finfo(float).tiny)
    confusion = metrics.confusion_matrix(y_true, pred, labels=names)
    hits, support, predicted = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
    with warnings.catch_warnings():  # a class predicted but absent from the labels
        warnings.simplefilter("ignore", UserWarning)
        balanced = metrics.balanced_accuracy_score(y_true, pred)
    return {"n": int(y_true.size), "loss": float(-np.log(picked).mean()),
            "accuracy": float(metrics.accuracy_score(y_true, pred)),
            "chance": float(support.max() / y_true.size),
            "balanced_accuracy": float(balanced), "classes": names,
            # F1 = 2 TP / (2 TP + FP + FN) = 2 TP / (support + predicted)
            "per_class": {c: {"precision": _ratio(hits[i], predicted[i]),
                              "recall": _ratio(hits[i], support[i]),
                              "f1": _ratio(2 * hits[i], support[i] + predicted[i]),
                              "support": int(support[i])}
                          for i, c in enumerate(names)},
            "confusion_matrix": confusion.tolist()}


def _ratio(part, whole) -> float | None:
    """``part / whole``, None when there is nothing to divide by: a recall without true rows,
    a precision without predicted rows is undefined, not 0 (a model failing on the class)."""
    return float(part / whole) if whole else None


def regression_report(targets, predictions, target: str = "target") -> dict:
    """Scores of predicted against true targets: ``n``, ``r2`` (as scikit-learn's
    ``r2_score``), ``mae``, ``rmse`` and Pearson's ``correlation`` (None without rows, or
    where undefined: R² on targets that do not vary, where ``r2_score`` would say 1 or 0),
    ``mae_of_mean`` (the MAE of predicting these rows' mean: what ``mae`` is to beat) and
    ``target``, the name of what is scored (:func:`fgscale.runs._reports.target_name`)."""
    from sklearn import metrics

    y, pred = np.asarray(targets, float), np.asarray(predictions, float)
    if y.size == 0:
        return {"target": target, "n": 0, "r2": None, "mae": None, "rmse": None,
                "correlation": None, "mae_of_mean": None}
    varies = y.size > 1 and y.std() > 0
    defined = varies and pred.std() > 0
    return {"target": target, "n": int(y.size),
            "r2": float(metrics.r2_score(y, pred)) if varies else None,
            "mae": float(metrics.mean_absolute_error(y, pred)),
            "rmse": float(np.sqrt(metrics.mean_squared_error(y, pred))),
            "correlation": float(np.corrcoef(y, pred)[0, 1]) if defined else None,
            "mae_of_mean": float(np.abs(y - y.mean()).mean())}


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                      enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def _shown(value, spec: str) -> str:
    """A score as printed: ``n/a`` where it is undefined (None)."""
    return "n/a" if value is None else format(value, spec)


def format_report(report: dict) -> str:
    """A :func:`classification_report` as lines of text (the scores, a table per class and the
    confusion matrix), or a :func:`regression_report` as one line."""
    if not report["n"]:
        return "no rows to score"
    if "r2" in report:  # as the accuracy's line below, naming the target scored
        baseline = ("" if report.get("mae_of_mean") is None else
                    f" (predicting the mean: {report['mae_of_mean']:.4f})")
        return f"{report.get('target', 'target')} on {report['n']} rows: " + ", ".join(
            f"{k} {_shown(report[k], '.4f')}" + (baseline if k == "mae" else "")
            for k in ("r2", "mae", "rmse", "correlation"))
    chance = ("" if report.get("chance") is None else
              f" (the most frequent class alone: {report['chance']:.4f})")
    lines = [f"{report['n']} rows: accuracy {report['accuracy']:.4f}{chance}, balanced accuracy "
             f"{report['balanced_accuracy']:.4f}, loss {report['loss']:.4f}", ""]
    classes = report["classes"]
    lines += _columns([["class", "precision", "recall", "f1", "support"]] + [
        [c, *(_shown(report["per_class"][c][k], ".3f") for k in ("precision", "recall", "f1")),
         str(report["per_class"][c]["support"])] for c in classes])
    if any(v is None for scores in report["per_class"].values() for v in scores.values()):
        lines.append("n/a: undefined, the class has no true row (recall) or no prediction "
                     "(precision)")
    lines += ["", "confusion matrix (rows: true class, columns: predicted)"]
    lines += _columns([["", *classes]] + [[c, *map(str, counts)] for c, counts in
                                          zip(classes, report["confusion_matrix"], strict=True)])
    return "\n".join(lines)
