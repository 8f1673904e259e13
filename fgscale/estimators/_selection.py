"""Hyper-parameters chosen on validation data: the validation split (by group when the rows
have subjects), the candidates of ``"auto"`` and of lists, and which parameters apply at all.

``alpha``, ``dropout`` and ``n_clusters`` each take a value, a list of values or ``"auto"``
(``fgscale.estimators._auto.AUTO_GRIDS``). The candidates are every combination of the values that
apply to the estimator's regularizer; all are trained on the same training rows with early
stopping on the same validation rows, and the one of least validation loss (or error,
``stop_on="accuracy"``) is kept (ties: the first, in the order of the lists). Nothing here
touches the test rows.

Rows too few for a validation split leave nothing to choose on: ``"auto"`` then takes its
value in ``fgscale.estimators._auto.AUTO_FALLBACK``, and an explicit list of several values is refused
by the caller.
"""

from __future__ import annotations

import itertools
import numbers
import os
import sys
import warnings

import numpy as np
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import (
    GroupKFold,
    GroupShuffleSplit,
    KFold,
    StratifiedKFold,
    train_test_split,
)

from fgscale.estimators._auto import searched_values
from fgscale.estimators._inputs import missing
from fgscale.estimators._params import PARAMS
from fgscale.estimators._regularizers import regularizer_named
from fgscale.grouping._bank import resolve_n_clusters

__all__ = ["candidates", "check_cv", "check_groups", "fold_splits", "image_groups", "resolved",
           "split_rows", "use_validation", "validation_split", "warn_chain", "warn_ignored",
           "warn_not_converged"]

_DEFAULTS = {p.name: p.default for p in PARAMS}
# cv="auto": K folds where one validation split would hold fewer than 50 rows (a fifth of 250),
# one split above. Chosen on dev seeds (scripts/results/accuracy_k_grid_dev.md): three folds
# and a refit were level or ahead wherever the rows were few, and level at 300 training rows
# and more, at twice the time.
AUTO_FOLDS = 3
AUTO_FOLDS_BELOW = 250


def _in_effect(estimator) -> dict:
    """Whether each parameter that applies to some settings only applies to these (the bank's
    ``n_groupings`` and ``n_bootstrap`` left out: one dict of them serves every regularizer)."""
    regularizer, model = regularizer_named(estimator.regularizer), estimator.model
    return {"alpha": regularizer.weight_decay, "dropout": regularizer.dropout_applies(model),
            "n_clusters": regularizer.grouping, "screening_percentile": regularizer.grouping,
            "hidden_layer_sizes": model != "logreg"}


def resolved(estimator) -> dict:
    """The parameters that may be searched, as the estimator gives them (None resolved)."""
    in_effect = _in_effect(estimator)
    alpha = estimator.alpha
    if alpha is None:  # "auto" with L2, else no weight decay
        alpha = "auto" if regularizer_named(estimator.regularizer).alpha_auto else 0.0
    elif not in_effect["alpha"]:
        alpha = 0.0
    dropout = estimator.dropout if in_effect["dropout"] else 0.0
    n_clusters = estimator.n_clusters if in_effect["n_clusters"] else None
    return {"alpha": alpha, "dropout": dropout, "n_clusters": n_clusters}


def _is_default(value, default) -> bool:
    """Equal as values go: 0.5 and ``np.float64(0.5)``, ``[256]`` and ``(256,)``."""
    try:
        return np.array_equal(np.asarray(value, dtype=object), np.asarray(default, dtype=object))
    except ValueError:  # ragged
        return False


def warn_ignored(estimator, stacklevel: int = 2) -> None:
    """Warn of parameters given another value than their default where it has no effect
    (``alpha`` with ``regularizer="none"``, ``dropout`` with ``"l2"``...), as scikit-learn's
    ``LogisticRegression`` warns of an ``l1_ratio`` without elastic net."""
    ignored = [f"{name}={getattr(estimator, name)!r}"
               for name, used in _in_effect(estimator).items()
               if not used and not _is_default(getattr(estimator, name), _DEFAULTS[name])]
    if ignored:
        warnings.warn(f"{', '.join(ignored)} ha{'s' if len(ignored) == 1 else 've'} no effect "
                      f"with regularizer={estimator.regularizer!r} and model={estimator.model!r}",
                      UserWarning, stacklevel=stacklevel)


def check_groups(groups, n_samples: int):
    """``groups`` (one label per row: rows of one subject) as an array, or None."""
    if groups is None:
        return None
    groups = np.asarray(groups)
    if groups.ndim != 1 or len(groups) != n_samples:
        raise ValueError(f"groups must hold one value per sample: got shape {groups.shape} for "
                         f"{n_samples} samples")
    # a table's column with gaps: NaN, None or NA would reach numpy's sort as a raw TypeError
    gaps = missing(groups)
    if gaps.any():
        raise ValueError(f"groups has {int(gaps.sum())} missing value(s) (NaN, None or NA), the "
                         f"first at sample {int(np.argmax(gaps))}: give every sample its "
                         "subject")
    return groups


def image_groups(estimator, X):
    """The groups of images given without ``groups=``: their subjects, from their files' BIDS
    names, where several subjects give several volumes each and a split will use them, said
    in a warning; else None. On maps of several conditions per subject, a split by volume
    puts each validation map beside its subject's other maps in training, which stops
    training too early: 10 points lost on the real-map benchmark's dev seeds
    (scripts/results/accuracy_k_grid_dev.md)."""
    from fgscale.images._masking import image_subjects

    if estimator.early_stopping is False:
        return None
    subjects = image_subjects(X)
    if subjects is None:
        return None
    names, counts = np.unique(subjects, return_counts=True)
    if len(names) < 2 or counts.max() < 2:
        return None
    warnings.warn(f"groups=None: the images' BIDS names give {len(names)} subjects "
                  f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}), so the "
                  "validation split keeps each subject's volumes on one side, as groups= "
                  "would; give groups= to split otherwise (groups=range(n_volumes) splits the "
                  "volumes one by one)", UserWarning, stacklevel=_caller_level())
    return subjects


_GROUP_DRAWS = 50  # splits by group drawn until one holds every class on both sides


def validation_split(y: np.ndarray, fraction: float, seed: int, groups=None, *,
                     stratify: bool = True, classes=None):
    """Split rows into training and validation: by group when groups are given (no subject on
    both sides; with ``stratify``, the first of scikit-learn's ``GroupShuffleSplit`` draws that
    leaves no class out of either side, with a warning naming the class, of ``classes``, when
    none does), else stratified when every class allows it."""
    rows = np.arange(len(y))
    n_val = max(1, int(round(fraction * len(y))))
    if len(y) - n_val < 1:
        raise ValueError(f"early stopping needs a validation split: {len(y)} sample(s) with "
                         f"validation_fraction={fraction} leave {len(y) - n_val} to train on; give "
                         "more samples, a smaller validation_fraction or early_stopping=False")
    if groups is not None and len(np.unique(groups)) >= 2:
        # the first draw does not depend on n_splits: a split that holds every class is kept
        splitter = GroupShuffleSplit(n_splits=_GROUP_DRAWS if stratify else 1,
                                     test_size=fraction, random_state=seed)
        draws = splitter.split(rows, y, groups)
        first = next(draws)
        n_classes = len(np.unique(y))
        for train, val in itertools.chain([first], draws):
            if not stratify or all(len(np.unique(y[side])) == n_classes for side in (train, val)):
                return train, val
        _warn_class_left_out(y, groups, first, classes)
        return first
    counts = np.bincount(y) if stratify else None
    strata = y if stratify and counts.min() >= 2 and n_val >= len(counts) else None
    split = train_test_split(rows, test_size=n_val, random_state=seed, stratify=strata)
    if stratify and strata is None and any(len(np.unique(y[side])) < len(np.unique(y))
                                           for side in split):
        # a class of one sample, or more classes than validation rows: scikit-learn's
        # SGDClassifier refuses to stratify these; the split is kept, and said
        _warn_class_left_out(y, None, split, classes)
    return split


def warn_chain(estimator, p: int) -> None:
    """Warn where feature grouping clusters ``p`` array columns given without a mask: as a
    chain in their column order, which is no spatial layout for images' voxels (a mask is
    needed) nor for features with no order at all."""
    if estimator.mask is None and estimator.mask_img_ is None and \
            _in_effect(estimator)["n_clusters"] and estimator.model != "cnn":
        warnings.warn(f"{type(estimator).__name__}: feature grouping without mask= clusters the "
                      f"{p} features as a chain in their column order; give mask= (their grid: "
                      "an image, a path or a boolean array) where they are voxels, "
                      "regularizer='l2' where they have no order, or mask=np.ones("
                      f"{p}, bool) where the chain is their order (a spectrum, a time series)",
                      UserWarning, stacklevel=_caller_level())


def warn_not_converged(estimator, stopped: bool, validation: bool) -> None:
    """scikit-learn's ConvergenceWarning where the chosen fit ended at ``max_epochs`` before
    its stopping criterion: more epochs would have trained further (not said of the refit,
    which runs the chosen fit's epochs by design).

    The advice names the parameters as Python takes them (``max_epochs=``, no value): the
    command line says its options there instead (``--max-epochs``, in
    ``fgscale.cli._options.one_line_warnings``), which this library does not import.
    """
    if stopped:
        return
    loss = ("validation " + ("loss" if estimator.stop_on == "loss" else "error") if validation
            else "training loss")
    # which fit, where a script or the demo trains several
    warnings.warn(f"{type(estimator).__name__}(regularizer={estimator.regularizer!r}): training "
                  f"reached max_epochs={estimator.max_epochs} while its {loss} still improved (by more than "
                  f"tol={estimator.tol:g} within patience={estimator.patience} epochs); give a "
                  "larger max_epochs= to train until it stops, or a larger tol= where smaller "
                  "gains do not matter (a loss falling slowly to 0 on separable data)",
                  ConvergenceWarning,
                  stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` that names the first caller outside fgscale (the user's ``fit``, or
    scikit-learn's), from the function that calls ``warnings.warn``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _warn_class_left_out(y, groups, split, classes) -> None:
    lacks = {side: np.setdiff1d(y, y[rows]) for side, rows in zip(("training", "validation"),
                                                                   split, strict=True)}
    side, left_out = next((side, lack) for side, lack in lacks.items() if lack.size)
    name = left_out[0] if classes is None else classes[left_out[0]]
    judged = "early stopping and the choice of hyper-parameters are judged without it; "
    if groups is None:
        warnings.warn(f"the validation split of the rows cannot hold every class on both sides: "
                      f"the {side} rows lack class '{name}' ({int((y == left_out[0]).sum())} "
                      f"sample(s) of it in {len(y)}), so {judged}give more samples of each "
                      "class, or early_stopping=False", UserWarning, stacklevel=_caller_level())
        return
    n_groups = len(np.unique(groups[y == left_out[0]]))
    warnings.warn(f"no split of the rows by group (groups=) keeps every class on both sides: the "
                  f"{side} rows lack class '{name}' (its samples are in {n_groups} group(s)), so "
                  f"{judged}give more subjects of each class, or no groups to split by sample",
                  UserWarning, stacklevel=_caller_level())


def use_validation(estimator, y_idx: np.ndarray, warn: bool = False) -> bool:
    """Whether a fit on training targets ``y_idx`` has a validation split: ``early_stopping``,
    or with ``"auto"`` whether each side can hold every class (two samples of each). With
    ``warn``, a class too small for a split that the rows would otherwise allow is named: a
    mistyped label silently turned early stopping and the search off."""
    if estimator.early_stopping != "auto":
        return bool(estimator.early_stopping)
    if estimator.cv not in (None, "auto"):  # the folds validate: the splitter refuses rows too few
        return True
    counts = np.bincount(y_idx) if is_classifier(estimator) else np.array([len(y_idx)])
    n_val = estimator.validation_fraction * len(y_idx)
    enough = n_val >= len(counts) and len(y_idx) - n_val >= len(counts)
    if warn and enough and counts.min() < 2:
        small = int(counts.argmin())
        name = small if getattr(estimator, "classes_", None) is None else estimator.classes_[small]
        warnings.warn(f"early_stopping='auto' trains without a validation split: class '{name}' "
                      f"has {counts.min()} sample(s) of {len(y_idx)}, and a split needs 2 of "
                      "each class; training stops on the training loss and \"auto\" values take "
                      "their fallback. Is its label a typo? Else give early_stopping=True",
                      UserWarning, stacklevel=_caller_level())
    return bool(counts.min() >= 2 and enough)


def split_rows(estimator, y_idx: np.ndarray, rows: np.ndarray, seed: int, groups=None, *,
               validation: bool, n_candidates: int):
    """The rows to fit on and the validation rows (None without a split) among ``rows``,
    split by :func:`validation_split`; several candidates with no split to choose them on
    are refused."""
    if validation:
        train, val = validation_split(y_idx[rows], estimator.validation_fraction, seed,
                                      None if groups is None else groups[rows],
                                      stratify=is_classifier(estimator),
                                      classes=getattr(estimator, "classes_", None))
        return rows[train], rows[val]
    if n_candidates > 1:
        off = estimator.early_stopping is False
        raise ValueError(
            f"{n_candidates} candidate hyper-parameters to choose from, but "
            + ("early_stopping=False leaves" if off else f"n_samples={len(rows)} training rows leave")
            + " no validation split to choose on; give single values, or "
            + ("early_stopping='auto'" if off else "more rows"))
    return rows, None


def check_cv(estimator) -> None:
    """Refuse what ``cv`` cannot do with the other parameters, before any work: averaging the
    fold models' weights (``refit=False``) is defined for a linear model only."""
    if estimator.cv not in (None, "auto") and not estimator.refit and estimator.model != "logreg":
        raise ValueError(f"refit=False with cv={estimator.cv!r} averages the fold models' "
                         f"weights, which is defined for model='logreg' only, not "
                         f"model={estimator.model!r}; give refit=True (the chosen candidate "
                         "trained again on all the rows) or cv=None")


def auto_folds(estimator, y_idx: np.ndarray, groups=None, *, validation: bool) -> int | None:
    """What ``cv="auto"`` stands for on training targets ``y_idx`` (and their ``groups``):
    :data:`AUTO_FOLDS` folds below :data:`AUTO_FOLDS_BELOW` rows, for the linear model with a
    validation split and a refit, where every fold can validate every class (each class in as
    many rows, or as many groups, as folds; two rows a fold at least); else None, one
    validation split. ``refit=False`` keeps one split: with folds it would average the fold
    models instead; so does a ``validation_fraction`` other than its default, the size of one
    split. The MLP and the CNN keep one split: the folds were measured with the linear model
    alone, and theirs are the costliest phases (the MLP's at 1 mm, minutes each)."""
    if not (validation and estimator.refit and estimator.model == "logreg"
            and 2 * AUTO_FOLDS <= len(y_idx) < AUTO_FOLDS_BELOW
            and estimator.validation_fraction == _DEFAULTS["validation_fraction"]):
        return None
    if groups is not None and len(np.unique(groups)) < AUTO_FOLDS:
        return None
    if is_classifier(estimator):
        spread = [len(y_idx[y_idx == c]) if groups is None else len(np.unique(groups[y_idx == c]))
                  for c in np.unique(y_idx)]
        if min(spread) < AUTO_FOLDS:
            return None
    return AUTO_FOLDS


def fold_splits(estimator, y_idx: np.ndarray, rows: np.ndarray, seed: int, groups=None, *,
                validation: bool, n_candidates: int) -> list[tuple]:
    """The ``(fit_rows, val_rows)`` pairs among ``rows`` that candidates are trained and
    judged on: with ``cv=None``, the one split of :func:`split_rows`; with an int, K folds
    (scikit-learn's ``GroupKFold`` when the rows have groups, ``StratifiedKFold`` for a
    classifier, ``KFold`` otherwise, shuffled by ``seed``); with ``"auto"``, those of
    :func:`auto_folds`; or the folds of the splitter given, called as
    ``cv.split(X, y, groups)`` on the rows' positions."""
    sub_groups = None if groups is None else groups[rows]
    splitter = estimator.cv
    if splitter == "auto":
        splitter = auto_folds(estimator, y_idx[rows], sub_groups, validation=validation)
    if splitter is None:
        return [split_rows(estimator, y_idx, rows, seed, groups, validation=validation,
                           n_candidates=n_candidates)]
    if estimator.early_stopping is False:
        raise ValueError(f"cv={estimator.cv!r} chooses on validation folds, which "
                         "early_stopping=False turns off; give early_stopping='auto' or cv=None")
    if isinstance(splitter, numbers.Integral):
        if sub_groups is not None:
            splitter = GroupKFold(int(splitter), shuffle=True, random_state=seed)
        elif is_classifier(estimator):
            splitter = StratifiedKFold(int(splitter), shuffle=True, random_state=seed)
        else:
            splitter = KFold(int(splitter), shuffle=True, random_state=seed)
    positions = np.zeros((len(rows), 1))
    splits = [(rows[fit_part], rows[val_part])
              for fit_part, val_part in splitter.split(positions, y_idx[rows], sub_groups)]
    if not splits or any(not len(part) for split in splits for part in split):
        raise ValueError(f"cv={estimator.cv!r} gave a fold with no training or no validation "
                         f"row of the {len(rows)} training rows")
    return splits


def candidates(estimator, n_features: int, validation: bool = True) -> list[dict]:
    """Every combination to try, in a fixed order: one dict per candidate, ``n_clusters`` as
    a count of clusters for ``n_features`` (None without feature grouping). Values that give
    the same candidate (fractions of a few features that round to one k) are tried once.
    ``validation``: whether the rows leave a validation split to choose on."""
    params = resolved(estimator)
    names = list(params)
    grids = [searched_values(name, params[name], validation, n_features,
                             regression=not is_classifier(estimator),
                             linear=estimator.model == "logreg") for name in names]
    out = []
    for combo in itertools.product(*grids):
        candidate = dict(zip(names, combo, strict=True))
        if candidate["n_clusters"] is not None:
            candidate["n_clusters"] = resolve_n_clusters(candidate["n_clusters"], n_features)
        if candidate not in out:
            out.append(candidate)
    return out
