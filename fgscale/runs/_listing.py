"""The run folders in a folder and below, a line each (its state, task, model, test score and
store), as ``fgscale runs`` prints them; and the checks that a folder holds a finished run. All
read from the files every run writes (config.json, metrics*.jsonl,
final.json): no model is loaded, so a folder of many runs lists at once."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["check_finished_run", "check_not_a_store", "model_label", "run_rows",
           "runs_table", "test_score"]

_HEADER = ("run", "state", "task", "model", "test", "store")


def _json(path: Path):
    """A JSON file's document; None when it is missing or not JSON (a run being written)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def model_label(params: dict, regression: bool) -> str:
    """A run's ``model/regularizer`` as the commands say it: ``model="logreg"`` is least squares
    for a regressor, its linear model."""
    model = "linear" if regression and params.get("model") == "logreg" else params.get("model")
    return f"{model}/{params.get('regularizer')}"


def check_not_a_store(path) -> None:
    """Refuse a store given where a run folder is expected (arguments swapped)."""
    if (Path(path) / "zarr.json").is_file():
        raise FileNotFoundError(f"{path}: a store (fgscale convert writes them), not a run "
                                "folder; the run folder (fgscale train --out) comes first: "
                                "fgscale evaluate RUN STORE, predict RUN INPUT...")


def check_finished_run(path) -> None:
    """Refuse a folder that holds no finished run (nor a saved model): checked from its files
    alone, before evaluate and predict import torch to load it."""
    path = Path(path)
    check_not_a_store(path)
    if not (path / "model.json").exists() and not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a run folder (no config.json or model.json); "
                                "expected the --out folder of fgscale train")
    if not (path / "model.json").exists():
        raise FileNotFoundError(f"{path / 'model.json'}: no such file; the run in {path} has not "
                                "finished (fgscale train writes it at the end; --resume "
                                "continues a killed run)")


def test_score(test: dict) -> str:
    """A run's test score, named: "accuracy 0.8123", "R² of age 0.5123" ("n/a" where it is
    undefined); what ``fgscale runs`` and ``fgscale train`` (:func:`fgscale.runs.summary_lines`)
    say of ``final.json``'s ``test``."""
    name, key = (f"R² of {test.get('target', 'target')}", "r2") if "r2" in test else (
        "accuracy", "accuracy")
    return f"{name} " + ("n/a" if test.get(key) is None else f"{test[key]:.4f}")


def _state(run: Path) -> tuple[str, str]:
    """The run's state and test score, from final.json or the epochs recorded so far."""
    final = run / "final.json"
    if final.is_file():
        summary = _json(final)
        if not isinstance(summary, dict) or not isinstance(summary.get("test"), dict):
            return "damaged final.json", ""
        test = summary["test"]
        return "finished", test_score(test) if test.get("n") else "no test rows"
    counts = {"": 0, "refit": 0}  # the epochs of the fit (each candidate's), of the refit
    for path in run.glob("metrics*.jsonl"):
        phase = "refit" if path.name == "metrics-refit.jsonl" else ""
        counts[phase] += sum(1 for line in path.read_text().splitlines() if line.strip())
    if not any(counts.values()):
        return "not started", ""
    refit = f", {counts['refit']} refit" if counts["refit"] else ""
    return f"unfinished ({counts['']} epochs{refit})", ""


def run_rows(folder) -> list[dict]:
    """The run folders in ``folder`` and below (a ``config.json`` of ``fgscale train``).

    Parameters
    ----------
    folder : str or Path

    Returns
    -------
    rows : list of dict
        One per run, by path: ``run`` (relative to ``folder``), ``state`` ("finished",
        "unfinished (N epochs)", "not started"), ``task``, ``model`` (model/regularizer),
        ``test`` (the test score of a finished run) and ``store``.
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder; give the folder that holds the runs")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    configs = []
    for top, dirs, files in os.walk(folder):
        if "zarr.json" in files:  # a store: thousands of shard files, no run
            dirs[:] = []
        elif "config.json" in files:
            configs.append(Path(top) / "config.json")
    rows = []
    for config in sorted(configs):
        saved = _json(config)
        if not (isinstance(saved, dict) and isinstance(saved.get("params"), dict)
                and "versions" in saved):  # some other program's config.json
            continue
        run, params = config.parent, saved["params"]
        state, test = _state(run)
        task = str(saved.get("task") or "classification")
        rows.append({"run": str(run.relative_to(folder)), "state": state, "task": task,
                     "model": model_label(params, task == "regression"),
                     "test": test, "store": str(saved.get("store", ""))})
    return rows


def runs_table(folder) -> list[str]:
    """The lines of ``fgscale runs FOLDER``: a header, then a line per run (:func:`run_rows`)."""
    rows = [tuple(r[k] for k in _HEADER) for r in run_rows(folder)]
    if not rows:
        return [f"{folder}: no run folder in it or below"]
    rows = [_HEADER, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]])
            for r in rows]
