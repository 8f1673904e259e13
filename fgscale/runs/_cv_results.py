"""The results file of a cross-validation (``fgscale cv --out``): read back as JSON only,
checked field by field, and compared with the cross-validation that would resume it; and the
folder where the fold being trained keeps its checkpoints (``<out>.fold-<i>``), so that a
cross-validation killed mid-fold resumes that fold from its last epoch."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

from fgscale._utils.files import atomic_path, read_json
from fgscale.estimators._params import saved_param
from fgscale.runs._folder import UNSEEN_PARAMS

__all__ = ["ERRORS", "KIND", "POOLED", "SHARED", "check_fold_folders", "fold_folder",
           "forget_fold", "read_results", "saved_folds", "saved_header", "start_fold"]

KIND = "fgscale cv results"  # tells a results file from any other JSON file at --out
# What a resumed cross-validation must share with the saved one, in the order they are checked
SHARED = ("store_id", "params", "n_folds", "task", "seed", "test_rows")
ERRORS = ("mae", "rmse")  # a regression fold's errors, in the target's units, beside its R²
POOLED = ("targets", "predictions")  # a regression fold's test rows, kept for the pooled R²


def read_results(out) -> dict:
    """The results file ``out`` of a cross-validation (:func:`cross_validate`), checked to be
    one: JSON, of this kind, its folds in order.

    Raises
    ------
    ValueError
        Naming the file, when it is not such a file.
    """
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"{path}: a folder; --out is the results file, such as cv.json")
    hint = "not a results file of fgscale cv, or a damaged one; choose another --out"
    try:  # JSON only: nothing read back runs code
        results = json.loads(path.read_text())
    except ValueError as exc:  # not JSON, or not text (UnicodeDecodeError is a ValueError)
        raise ValueError(f"{path}: {hint} (it is not JSON: {exc})") from None
    problem = _problem(results)
    if problem:
        raise ValueError(f"{path}: {hint} ({problem})")
    return results


_INT, _NUMBER, _SCORE = "an integer", "a number", "a number or null"
_FIELDS = {"store": "a path", "store_id": "a string", "params": "an object",
           "n_folds": _INT, "task": "'classification' or 'regression'",
           "score": "'accuracy' or 'r2'", "seed": _INT,
           "test_rows": "a list of lists of row numbers", "folds": "a list"}
_FOLD = {"fold": _INT, "n": _INT, "n_train": _INT, "selected": "an object"}


def _is(value, what: str) -> bool:
    """Whether a JSON value is ``what`` (a description of :data:`_FIELDS` or :data:`_FOLD`)."""
    if what == _SCORE:
        return value is None or _is(value, _NUMBER)
    if what in (_INT, _NUMBER):
        kinds = int if what == _INT else (int, float)
        return isinstance(value, kinds) and not isinstance(value, bool)
    if what == "an object":
        return isinstance(value, dict)
    if what.startswith("a list"):
        return isinstance(value, list) and (what == "a list" or all(
            isinstance(r, list) and all(_is(i, _INT) for i in r) for r in value))
    if what.startswith("'"):
        return value in [word.strip("'") for word in what.split(" or ")]
    return isinstance(value, str)


def _problem(results) -> str | None:
    """What makes the JSON value ``results`` no results file of a cross-validation, naming the
    field and what it should be; None when it is one."""
    if not isinstance(results, dict):
        return f"it holds a JSON {type(results).__name__}, not an object"
    if results.get("kind") != KIND:
        return f'its "kind" is {_shown(results.get("kind"))}, expected {KIND!r}'
    for field, what in _FIELDS.items():
        if not _is(results.get(field), what):
            return f'its "{field}" is {_shown(results.get(field))}, expected {what}'
    if len(results["folds"]) > results["n_folds"]:
        return f'it has {len(results["folds"])} "folds", more than its "n_folds"'
    regression = results["score"] == "r2"
    fields = {**_FOLD, results["score"]: _SCORE if regression else _NUMBER,
              **{k: _NUMBER for k in ERRORS + POOLED if regression}}
    for i, fold in enumerate(results["folds"]):
        if not isinstance(fold, dict):
            return f'its "folds"[{i}] is {_shown(fold)}, expected an object'
        for field, what in fields.items():
            value = fold.get(field)
            if field in POOLED:  # a number per test row
                if not (isinstance(value, list) and len(value) == fold["n"]
                        and all(_is(v, _NUMBER) for v in value)):
                    return (f'its "folds"[{i}]["{field}"] is {_shown(value)}, expected a list of '
                            f'{fold["n"]} numbers')
            elif field not in fold or not _is(value, what) or field == "fold" and value != i:
                expected = str(i) if field == "fold" else what
                return f'its "folds"[{i}]["{field}"] is {_shown(value)}, expected {expected}'
    return None


def _shown(value) -> str:
    """A JSON value as an error shows it: missing, or as JSON cut to 40 characters."""
    if value is None:
        return "missing (or null)"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def saved_folds(out, header: dict, resume: bool) -> list:
    """The folds saved in ``out`` by the same cross-validation as ``header`` (none without the
    file); an existing file is refused unless ``resume``, a differing one always. ``header``
    takes the saved values of the parameters that only show or feed the folds."""
    if not Path(out).exists():
        return []
    saved = read_results(out)  # a file of anything else is said so, whether resumed or not
    if not resume:
        raise ValueError(f"{out}: cross-validation results already exist there; pass --resume "
                         "to continue them, or choose another --out")
    differs = _differs(saved, header)
    if differs:
        raise ValueError(f"{out}: --resume does not match the saved cross-validation in its "
                         f"{differs}: choose another --out, or delete {out} to start afresh")
    # how the folds were shown or fed stays as the file has it: a resume does not rewrite it
    header["params"].update({k: saved["params"][k] for k in UNSEEN_PARAMS if k in saved["params"]})
    return saved["folds"]


def _differs(saved: dict, given: dict) -> str:
    """What first differs between the saved and the given cross-validation, in the order of
    :data:`SHARED`, for an error; "" when nothing does."""
    return next(filter(None, (_field_differs(f, saved, given) for f in SHARED)), "")


def _field_differs(field: str, saved: dict, given: dict) -> str:
    """What differs in ``field`` between the saved and the given cross-validation, for its
    error; "" when nothing does."""
    if field == "params":  # bar those that change how folds are shown or fed, not their results
        old, new = saved["params"], given["params"]
        # a parameter added since the file was saved had its default there
        changed = sorted(k for k in old.keys() | new.keys()
                         if k not in UNSEEN_PARAMS and saved_param(old, k) != new.get(k))
        return "parameters (" + "; ".join(
            f"{k}: saved {saved_param(old, k)!r}, given {new.get(k)!r}"
            for k in changed) + ")" if changed else ""
    if saved[field] == given[field]:
        return ""
    if field == "store_id":
        return (f"store (saved {saved['store']}, given {given['store']}: other rows, labels, "
                "split or mask)")
    if field == "test_rows":
        return "split (the folds' test rows differ)"
    note = " (random_state=None draws one: give an int)" if field == "seed" else ""
    return f"{field} (saved {saved[field]!r}, given {given[field]!r}{note})"


_FOLD_KIND = "fgscale cv fold"  # a fold's fold.json: the checkpoints beside it are of this fold


def fold_folder(out, fold: int) -> Path:
    """Where fold ``fold`` of the cross-validation saved in ``out`` keeps its checkpoints while
    it trains: ``<out>.fold-<fold>``, beside ``out``, removed once the fold is in ``out``."""
    out = Path(out)
    return out.with_name(f"{out.name}.fold-{fold}")


def start_fold(out, header: dict, fold: int) -> Path:
    """Create fold ``fold``'s folder (kept as it is when a resumed fold has one), with its
    ``fold.json``: the cross-validation's ``header`` and the fold's number."""
    folder = fold_folder(out, fold)
    folder.mkdir(exist_ok=True)
    with atomic_path(folder / "fold.json") as tmp:
        tmp.write_text(json.dumps({**{k: header[k] for k in ("kind", "store", *SHARED)},
                                   "kind": _FOLD_KIND, "fold": fold}) + "\n")
    return folder


def saved_header(out) -> dict | None:
    """What a resumed cross-validation into ``out`` continues (its ``params``, ``n_folds``,
    ``task``...): the results file, else the record of its first fold's checkpoints (a
    command killed in its first fold); None when there is neither."""
    if Path(out).is_file():
        return read_results(out)
    folder = fold_folder(out, 0)
    return _fold_record(folder) if (folder / "fold.json").is_file() else None


def _fold_record(folder: Path) -> dict:
    """The ``fold.json`` of a fold's folder, checked to be one."""
    saved = read_json(folder / "fold.json", "fold record of fgscale cv", ("kind", "fold", *SHARED))
    if saved["kind"] != _FOLD_KIND or not isinstance(saved["fold"], int):
        raise ValueError(f"{folder / 'fold.json'}: not a fold record of fgscale cv; move "
                         f"{folder} away")
    return saved


def forget_fold(folder, done: bool = False) -> None:
    """Remove a fold's folder once its results are in the results file (``done``), or when
    it holds no checkpoint (the fold failed before its first epoch ended): a corrected command
    then starts afresh rather than being asked to resume."""
    folder = Path(folder)
    if done or not any(folder.glob("checkpoint*.pt")):
        shutil.rmtree(folder, ignore_errors=True)


def check_fold_folders(out, header: dict, done: int, resume: bool) -> None:
    """Check the fold folders beside ``out`` (checkpoints left by a cross-validation killed
    mid-fold) before anything trains: refused unless ``resume``, then kept for fold ``done``
    (the next to train) if made by this cross-validation, and removed when their fold is
    already in ``out`` (killed between the two) or when they hold no checkpoint."""
    out = Path(out)
    for folder in sorted(out.parent.glob(glob.escape(out.name) + ".fold-*")):
        if not any(folder.glob("checkpoint*.pt")):  # killed before its first epoch ended
            forget_fold(folder)
            continue
        if not resume:
            raise ValueError(f"{folder}: the checkpoints of a fold of an unfinished "
                             f"cross-validation into {out}; pass --resume to continue it, or "
                             f"delete {folder} to start afresh")
        saved = _fold_record(folder)
        if saved["fold"] < done:  # its results were saved in out before it was removed
            forget_fold(folder, done=True)
            continue
        if saved["fold"] > done:
            raise ValueError(f"{folder}: the checkpoints of fold {saved['fold']}, but {out} "
                             f"holds {done} finished folds: delete {folder} to train that fold "
                             "afresh")
        differs = _differs(saved, header)
        if differs:
            raise ValueError(f"{folder}: --resume does not match these checkpoints in their "
                             f"{differs}: delete {folder} to train that fold afresh")
