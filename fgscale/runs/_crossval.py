"""Cross-validation on a store's training rows, each fold trained by streaming
(``fgscale cv``); with ``out``, the results so far are kept in a JSON file after every fold,
and a killed cross-validation resumes from it with the folds it has not finished.

The results file holds the store (path and identity), the estimator's parameters, the number
of folds, the task, whether the folds are grouped, the seed and each fold's test rows: what a
resumed cross-validation must share with the one it continues; then every finished fold and,
once all are, the mean and standard deviation of the scores and ``"complete": true``. A
regression fold also keeps its targets and out-of-fold predictions, pooled over the folds into
one R² (as scikit-learn's ``cross_val_predict`` then ``r2_score``): the score of leave one
subject out with a scan per subject, where no fold's own R² is defined. It is
written whole under a temporary name, then renamed (:func:`fgscale._utils.files.atomic_path`), and
read back as JSON only.
"""

from __future__ import annotations

import json

import numpy as np
from sklearn.base import clone, is_classifier

from fgscale._dask.client import get_client
from fgscale._utils.files import atomic_path, check_writable, exclusive_name
from fgscale._utils.progress import bar_prefix
from fgscale.estimators._factory import make_estimator
from fgscale.estimators._params import params_to_json, plain_json, resolve_seed
from fgscale.runs._cv_results import (
    ERRORS,
    KIND,
    POOLED,
    check_fold_folders,
    forget_fold,
    read_results,
    saved_folds,
    start_fold,
)
from fgscale.runs._folder import RunFolder, versions
from fgscale.runs._reports import score_store, target_name
from fgscale.runs._scores import regression_report
from fgscale.store._reader import open_store

__all__ = ["cross_validate", "read_results", "summary_line"]


def cross_validate(store_path, *, params: dict | None = None, n_folds: int = 5, client=None,
                   echo=None, task: str = "auto", out=None, resume: bool = False) -> dict:
    """K-fold cross-validation on a store's training rows, each fold trained by streaming.

    Folds are grouped by the store's ``group`` column when the rows have one (rows of a
    group, a subject or a run, never straddle folds; a store where only some rows have a group
    is refused), else stratified by class (shuffled for regression). Each fold standardizes
    with, and builds its banks from, its own training rows; the store's test rows are never
    read.

    Parameters
    ----------
    store_path : str or Path
    params : dict, optional
        Estimator parameters. With ``out``, give an int ``random_state``: a resumed
        cross-validation must draw the same folds.
    n_folds : int, default=5
    client : distributed.Client, optional
        Default the active ``distributed`` client, else an embedded LocalCluster, of threads
        up to 4 workers, of processes beyond (``processes="auto"`` of
        :func:`fgscale._dask.client.get_client`).
    echo : callable, optional
        Called with a line of text after each fold (and, when resuming, for each saved fold).
    task : {"auto", "classification", "regression"}, default="auto"
        As :func:`fgscale.runs.train_run`.
    out : str or Path, optional
        A JSON file where the results so far are written after each fold (see the module
        docstring); an existing one is refused unless ``resume``. Default: none, nothing is
        written.
    resume : bool, default=False
        Continue the cross-validation saved in ``out``: the same store, parameters (bar
        ``verbose`` and ``prefetch``), folds, task and seed, or a ValueError names what
        differs; only the folds not in the file are trained, and the result equals that of
        a cross-validation run in one go.

    Returns
    -------
    scores : dict
        ``folds`` (a dict per fold: its report, as :func:`fgscale.runs._scores.classification_report`
        or ``regression_report``, its training rows, the chosen hyper-parameters),
        ``score`` (``"accuracy"`` or ``"r2"``), ``mean_score``, ``std_score``, ``grouped``,
        ``n_groups`` (0 when not grouped), ``n_folds``; for classification also
        ``mean_accuracy`` and ``std_accuracy``, for
        regression ``mean_mae`` and ``mean_rmse`` (in the target's units), ``n_scored`` (the
        folds whose R² is defined, those of the mean and sd, which are None when no fold's is:
        one test row, or one target value) and ``pooled_r2``, ``pooled_mae``, ``pooled_rmse``
        (of every fold's out-of-fold predictions together); with
        ``out``, ``out`` and ``already_complete`` (the file had every fold: none was trained).
    """
    if resume and out is None:
        raise ValueError("resume=True continues the cross-validation saved in out: give out")
    if out is None:
        return _cross_validate(store_path, params, n_folds, client, echo, task, None, False)
    # a second command on the file would train the folds again and write them between these
    with exclusive_name(out, busy=f"{out}: another fgscale cv is writing these results; wait "
                                  "for it to end (--resume then finds them), or choose another "
                                  "--out"):
        return _cross_validate(store_path, params, n_folds, client, echo, task, out, resume)


def _cross_validate(store_path, params, n_folds, client, echo, task, out, resume) -> dict:
    """:func:`cross_validate`, while it holds ``out``."""
    store = open_store(store_path)
    clf = make_estimator(store, params, task)
    name = "accuracy" if is_classifier(clf) else "r2"
    target = None if name == "accuracy" else target_name(store)  # what a fold's R² is of
    rows, n_groups = _training_rows(store, n_folds)
    grouped = n_groups > 0
    seed = resolve_seed(clf.random_state)  # drawn once: the split's, and the file's
    splits = list(_splits(rows, store, n_folds, grouped, name, seed))
    if name == "r2":
        _check_target_varies(store, rows)
    header = {"kind": KIND, "store": str(store.path.resolve()), "store_id": store.identity(),
              "params": params_to_json(clf.get_params()), "n_folds": n_folds,
              "task": "classification" if name == "accuracy" else "regression", "score": name,
              "grouped": grouped, "seed": seed, "test_rows": [rows[t].tolist() for _, t in splits],
              **({} if target is None else {"target": target})}
    folds = [] if out is None else saved_folds(out, header, resume)  # before any cluster starts
    done = len(folds)
    if out is not None and done < n_folds:
        check_writable(out, ", so no fold could be saved there: choose another --out; nothing "
                            "trained")
        check_fold_folders(out, header, done, resume)
    for fold in folds:
        if echo is not None:
            echo(_fold_line(fold, name, saved=out, target=target))
    for train, _ in splits[done:]:  # what a fold's fit refuses (k above p, nowhere to write
        clone(clf).check_store_fit(store, rows[train])  # its statistics...), before any cluster
    if done < n_folds:
        with get_client(client, processes="auto") as client:
            for fold, (train, test) in enumerate(splits[done:], start=done):
                model = clone(clf)
                # with out, a checkpoint after every epoch: a fold killed midway resumes there
                folder = None if out is None else RunFolder(start_fold(out, header, fold))
                try:  # as its line is named: the folds' bars (statistics, bank, epochs) apart
                    with bar_prefix(f"fold {fold}"):
                        model.fit(store, client=client, rows=rows[train],
                                  checkpoint=None if folder is None else folder.checkpoints)
                        metrics, table = score_store(model, store, client, rows[test],
                                                     progress=bool(model.verbose))
                except BaseException:
                    if folder is not None:  # none for a fold that never finished an epoch
                        forget_fold(folder.path)
                    raise
                if name == "r2":
                    metrics.update(targets=table["target"], predictions=table["prediction"])
                # as JSON keeps it: a resumed cross-validation reads its saved folds back
                folds.append(json.loads(json.dumps(plain_json(
                    {"fold": fold, "n_train": int(train.size), **metrics,
                     "selected": {"alpha": model.alpha_, "dropout": model.dropout_,
                                  "n_clusters": model.n_clusters_}}))))
                if out is not None:
                    _write(out, header, folds)
                    forget_fold(folder.path, done=True)  # its results are in out
                if echo is not None:
                    echo(_fold_line(folds[-1], name, target=target))
    scores = {"folds": folds, **_summary(folds, name), "grouped": grouped, "n_groups": n_groups,
              "n_folds": n_folds}
    if target is not None:
        scores["target"] = target
    if out is not None:
        scores.update(out=str(out), already_complete=done == n_folds)
    return scores


def _training_rows(store, n_folds: int) -> tuple[np.ndarray, int]:
    """The store's training rows and their number of groups (0: not grouped); a store or a
    number of folds that cannot make ``n_folds`` folds is refused."""
    rows = store.train_rows()
    groups = store.groups[rows]
    has_group = groups != ""
    grouped = bool(has_group.any())
    if grouped and not has_group.all():
        raise ValueError(f"{store.path}: {int((~has_group).sum())} of the {rows.size} training "
                         "rows have no group: give each row its group (subject or run), or none "
                         "of them")
    n_groups = len(set(groups)) if grouped else 0
    most = n_groups or rows.size
    if not 2 <= n_folds <= most:
        unit = "groups (rows of a group never straddle folds)" if grouped else "rows"
        raise ValueError(f"{store.path}: {n_folds} folds; give 2 or more, and at most the "
                         f"{most} training {unit}")
    return rows, n_groups


def _check_target_varies(store, rows: np.ndarray) -> None:
    """Refuse, before any fold trains, training rows whose target does not vary: no R² is
    defined, pooled or in a fold."""
    if np.ptp(store.target[rows]) == 0:
        raise ValueError(f"{store.path}: the target is {store.target[rows[0]]:g} for all "
                         f"{rows.size} training rows: there is nothing to predict (is it the "
                         "right column of the cohort table?)")


def _splits(rows, store, n_folds: int, grouped: bool, name: str, seed: int):
    from sklearn.model_selection import GroupKFold, KFold, StratifiedKFold

    if grouped:
        return GroupKFold(n_splits=n_folds).split(rows, groups=store.groups[rows])
    if name == "accuracy":
        return StratifiedKFold(n_splits=n_folds, shuffle=True,
                               random_state=seed).split(rows, store.y[rows])
    return KFold(n_splits=n_folds, shuffle=True, random_state=seed).split(rows)


def _summary(folds: list, name: str) -> dict:
    score = np.array([f[name] for f in folds if f[name] is not None], float)
    summary = {"score": name, "mean_score": float(score.mean()) if score.size else None,
               "std_score": float(score.std()) if score.size else None}
    if name == "accuracy":
        chance = [f["chance"] for f in folds if f.get("chance") is not None]  # older files: none
        summary.update(mean_accuracy=summary["mean_score"], std_accuracy=summary["std_score"],
                       mean_chance=float(np.mean(chance)) if chance else None)
        return summary
    # the errors, in the target's units, as the folds give them; then every fold's rows at once
    summary.update({f"mean_{k}": float(np.mean([f[k] for f in folds])) for k in ERRORS})
    pooled = regression_report(*(np.concatenate([f[k] for f in folds]) for k in POOLED))
    summary.update(n_scored=int(score.size),
                   **{f"pooled_{k}": pooled[k] for k in ("r2", *ERRORS)})
    return summary


def _fold_line(fold: dict, name: str, saved=None, target: str | None = None) -> str:
    errors = "".join(f", {k} {fold[k]:.4g}" for k in ERRORS if name == "r2")
    selected = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in fold["selected"].items())
    score = (f"{fold[name]:.4f}" if fold[name] is not None else
             "n/a (" + ("one row" if fold["n"] < 2 else "one target value") + ")")
    line = (f"fold {fold['fold']}: {'' if target is None else target + ' '}{name} {score}"
            f"{errors} on {fold['n']} rows "
            f"(trained on {fold['n_train']}; {selected})")
    return line if saved is None else f"{line}, from {saved}"


def summary_line(scores: dict) -> str:
    """The last line of ``fgscale cv``: the folds' mean score ± sd (a regression's: of the
    folds where R² is defined, then pooled over every fold), and where they are kept."""
    # the store's group column: subjects, or runs ("chunks"), as the table gave them
    kind = (f"grouped by the store's {scores['n_groups']} groups" if scores["grouped"] else
            ("stratified by class, " if scores["score"] == "accuracy" else "")
            + "shuffled (the store has no groups)")
    n, name = scores["n_folds"], scores["score"]
    # what the scores are of: a regression's target, by the column it came from
    what = f"{n}-fold cross-validation" + (f" of {scores['target']}" if scores.get("target")
                                           else "")
    if scores["mean_score"] is None:
        line = f"{what}, {kind}: {name} n/a in every fold (one row or one target value)"
    else:
        line = (f"{what}, {kind}: {name} {scores['mean_score']:.4f} ± "
                f"{scores['std_score']:.4f} (mean ± sd")
        scored = scores.get("n_scored", n)
        line += ")" if scored == n else f" of the {scored} folds where it is defined)"
        if scores.get("mean_chance") is not None:  # what a model that learnt nothing scores
            line += f", the most frequent class alone {scores['mean_chance']:.4f}"
    line += "".join(f", {k} {scores[f'mean_{k}']:.4g}" for k in ERRORS if f"mean_{k}" in scores)
    if "pooled_r2" in scores:
        line += "; pooled out-of-fold: " + ", ".join(
            f"{k} " + ("n/a" if scores[f"pooled_{k}"] is None else f"{scores[f'pooled_{k}']:.4g}")
            for k in ("r2", *ERRORS))
    if "out" not in scores:
        return line
    if scores["already_complete"]:
        return f"{line}; already complete in {scores['out']}, nothing trained"
    return f"{line}; results in {scores['out']}"


def _write(out, header: dict, folds: list) -> None:
    results = {**header, "folds": folds, "complete": len(folds) == header["n_folds"],
               "versions": versions()}
    if results["complete"]:
        results.update(_summary(folds, header["score"]))
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(results, indent=1) + "\n")
