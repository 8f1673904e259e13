"""Run folders: the one module that writes and reads the files of a training run
(:func:`fgscale.runs.train_run` and its siblings drive them).

A run folder holds::

    config.json      the estimator's parameters and task (a regression's target: the name of its
                     column), the store (path, identity), the versions
    checkpoint.pt    model, optimiser, early-stopping and RNG state after the last epoch
                     (tensors, numbers and strings only: it loads with ``weights_only=True``)
    metrics.jsonl    one JSON line per epoch (train loss, validation loss and accuracy)
    checkpoint-<phase>.pt, metrics-<phase>.jsonl
                     the same for the other phases of a fit: each candidate of a search
                     (``candidate-1`` ...), whose checkpoint.pt and metrics.jsonl are not
                     written, and the refit on all training rows after early stopping
                     (``refit``); a resumed run continues the phase it was in, and a
                     finished phase is read back rather than trained again
    model.json       the fitted estimator as data: class, parameters, classes, the selected
    model.npz        hyper-parameters; the model's weights and the standardization; the mask
    mask.nii.gz      of the store (:mod:`fgscale.estimators._persist`); model.json is written
                     last: a run without it has not finished
    maps/            a 3D map per class on the store's grid (``maps/<class>.nii.gz``), for
    maps.nii.gz      nilearn.plotting; maps.nii.gz holds them as one 4D image; maps.json says
    maps.json        which volume and file is which class, and what the values are
                     (:mod:`fgscale.runs._maps`)
    test_predictions.csv
                     each test row's prediction (``fgscale evaluate --predictions``' columns)
    final.json       the test report on the store's test rows and the run's summary

Every file is written under a temporary name and renamed (:func:`atomic_path`): a run killed
mid-write keeps the previous version of each file. Nothing read back executes code: JSON,
``np.load(allow_pickle=False)``, NIfTI, and ``torch.load(weights_only=True)`` for the
checkpoint; :func:`fgscale.runs.load_run` is the way back to a fitted estimator.
"""

from __future__ import annotations

import json
import logging
import pickle
import platform
from pathlib import Path

import torch

from fgscale._utils.files import atomic_path, read_json, signals_deferred
from fgscale.estimators._params import RUNTIME_PARAMS, params_to_json, saved_param
from fgscale.estimators._persist import load_model, write_model
from fgscale.runs._listing import check_finished_run
from fgscale.runs._maps import MAPS_IMAGE, write_maps
from fgscale.runs._reports import write_table
from fgscale.training._loop import History, cuda_device

__all__ = ["PREDICTIONS", "UNSEEN_PARAMS", "RunFolder", "versions"]

log = logging.getLogger(__name__)

# Parameters that change how a run is shown or fed, never what it computes: a finished run asked
# again with other values (`fgscale train --resume --no-progress`) has nothing left to do.
UNSEEN_PARAMS = ("verbose", "prefetch")
PREDICTIONS = "test_predictions.csv"


def versions() -> dict:
    from fgscale import __version__  # "0+unknown" in a source tree that was not installed

    return {"fgscale": __version__, "torch": torch.__version__, "python": platform.python_version()}


class RunFolder:
    """The files of one run folder (see the module docstring), read and written here only.

    Parameters
    ----------
    path : str or Path
    """

    def __init__(self, path):
        self.path = Path(path).expanduser()

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def _write_json(self, obj, name: str) -> None:
        with atomic_path(self / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")

    def saved_task(self, task: str, resume: bool) -> str:
        """The task to run: ``task``, or on ``resume`` with ``"auto"`` the saved run's (the
        estimator of a run on a store with labels and a target is that of its first command)."""
        config = self / "config.json"
        if resume and task == "auto" and config.exists():
            return read_json(config, "run configuration", ("params",)).get("task", task)
        return task

    def start(self, params: dict, store, *, resume: bool, task: str | None = None) -> dict | None:
        """Check that a run may start (or resume) here, then write ``config.json``.

        A folder with a run in it is refused unless ``resume``, and then only with the same
        task and parameters, bar :data:`RUNTIME_PARAMS`. Returns the summary of a run that
        already ended with these parameters, bar :data:`UNSEEN_PARAMS` (nothing is written
        then), else None.
        """
        config, identity = self / "config.json", store.identity()
        if not config.exists() and (self / "model.json").exists():
            # until the run ends, that model would pass for the run's (evaluate, predict)
            raise ValueError(f"{self.path}: holds a saved model (model.json) and no run: choose "
                             "another --out, or move the model away")
        if config.exists():
            if not resume:
                if (self / "final.json").exists():  # nothing to continue at the same budget
                    raise ValueError(f"{self.path}: a finished run already exists there; "
                                     "choose another --out (--resume with a larger "
                                     "--max-epochs trains it further)")
                raise ValueError(f"{self.path}: an unfinished run exists there; pass --resume "
                                 "to continue it or choose another --out")
            saved_run = read_json(config, "run configuration", ("params",))
            if saved_run.get("store_id", identity) != identity:
                if saved_run.get("store") == str(store.path.resolve()):  # converted again since
                    raise ValueError(f"{self.path}: --resume on {store.path}, which no longer "
                                     "holds the run's rows, labels, split, groups and mask (it "
                                     "was converted again since): choose another --out")
                raise ValueError(f"{self.path}: --resume on another store than the run's "
                                 f"({saved_run['store']}): give that store, or another --out")
            if task is not None and saved_run.get("task", task) != task:
                raise ValueError(f"{self.path}: --resume with another task than the saved run "
                                 f"(saved {saved_run['task']}, given {task}; see {config})")
            saved = saved_run["params"]
            changed = _changed(params, saved)
            if changed:  # saved and given, as cv's --resume says them
                detail = "; ".join(f"{k}: saved {saved_param(saved, k)!r}, given {params[k]!r}"
                                   for k in changed)
                raise ValueError(f"{self.path}: --resume with other parameters than the saved "
                                 f"run ({detail}; see {config})")
            trained = max((len(p.read_text().splitlines())
                           for p in self.path.glob("metrics*.jsonl")), default=0)
            if isinstance(params.get("max_epochs"), int) and params["max_epochs"] < trained:
                # its epochs so far stay: config.json would say fewer than the model took
                raise ValueError(f"{self.path}: --resume with max_epochs {params['max_epochs']}, "
                                 f"fewer than the {trained} epochs the run has trained: leave "
                                 "--max-epochs out, give at least that, or train into another "
                                 "--out")
            final = self / "final.json"
            if final.exists() and all(saved_param(saved, k) == params[k] for k in params
                                      if k not in UNSEEN_PARAMS):
                summary = read_json(final, "run summary")
                # its files where they are now: a run folder copied or moved since names the
                # folder it was trained in
                summary["run"] = str(self.path)
                if summary.get("maps"):
                    summary["maps"] = str(self / MAPS_IMAGE)
                if summary.get("predictions"):
                    summary["predictions"] = str(self / PREDICTIONS)
                return summary
            # a finished run extended (a larger --max-epochs): unfinished until it ends again,
            # so that the same command after a kill goes on rather than finding it complete
            final.unlink(missing_ok=True)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # said with the folder: "[Errno 13] Permission denied: 'r'" is not
            raise OSError(exc.errno, f"{self.path}: the run folder cannot be created "
                                     f"({exc.strerror or exc}): choose another --out, or make its "
                                     "parent folder writable") from None
        self._write_json({"params": params, "task": task,
                          # a regression's target, by the cohort table's column (scores name
                          # it); None where the store did not keep it (a store of arrays)
                          "target": store.attrs.get("target_name") if task == "regression"
                          else None,
                          "store": str(store.path.resolve()),
                          "store_id": identity,
                          "synthetic": bool(store.attrs.get("synthetic", False)),
                          "versions": versions()}, "config.json")
        return None

    def target(self, known: bool = False) -> str | None:
        """The name of the run's target (config.json's, else "target": a run of a store that
        did not keep it, or of an fgscale that did not; with ``known``, None then)."""
        config = self / "config.json"
        saved = read_json(config, "run configuration") if config.is_file() else {}
        name = saved.get("target") if isinstance(saved, dict) else None
        return name if known else name or "target"

    def _saved_params(self) -> dict | None:
        config = self / "config.json"
        return (read_json(config, "run configuration", ("params",))["params"]
                if config.exists() else None)

    def changed_params(self, params: dict) -> list[str]:
        """The parameters (bar :data:`RUNTIME_PARAMS`) whose value in ``params`` differs from
        the run saved here; [] for a folder with no run."""
        saved = self._saved_params()
        return [] if saved is None else _changed(params, saved)

    def forget_unstarted(self) -> None:
        """Remove what :meth:`start` wrote when the run failed before its first epoch ended
        (a bad parameter found late, a cluster that went away, Ctrl-C), so that the corrected
        command starts afresh instead of being refused; a run with a checkpoint is kept."""
        if any(self.path.glob("checkpoint*.pt")):
            return
        (self / "config.json").unlink(missing_ok=True)
        try:
            self.path.rmdir()  # only if nothing else is in it
        except OSError:
            pass

    def checkpoints(self, estimator, optimizer, stopper, phase: str = "",
                    params=None) -> _Checkpoints:
        """The estimator's per-epoch hook: a checkpoint and the metrics after every epoch of
        one phase (:class:`~fgscale.training._loop.History`)."""
        return _Checkpoints(self, estimator, optimizer, stopper, phase, params)

    def write_estimator(self, clf, store) -> None:
        """``model.json``, ``model.npz`` and the store's mask
        (:func:`fgscale.estimators._persist.write_model`)."""
        write_model(clf, self.path, mask_img=store.mask_img())

    def read_estimator(self):
        check_finished_run(self.path)
        return load_model(self.path)

    def write_maps(self, clf, store) -> Path:
        """A map per class and maps.json (:func:`fgscale.runs._maps.write_maps`); returns the 4D one."""
        write_maps(self.path, clf, store.mask, store.affine, store.space_codes)
        return self / MAPS_IMAGE

    def write_predictions(self, table: dict) -> Path:
        """``test_predictions.csv``: a line per test row (:func:`fgscale.runs._reports.score_store`'s
        table), what the report's plot of predictions against targets draws."""
        return write_table(table, self / PREDICTIONS)

    def write_final(self, summary: dict) -> None:
        self._write_json(summary, "final.json")


def _changed(params: dict, saved: dict) -> list[str]:
    return sorted(k for k in params if k not in RUNTIME_PARAMS and saved_param(saved, k) != params[k])


class _Checkpoints(History):
    """Checkpoints and per-epoch metrics of one fit in a run folder."""

    def __init__(self, folder: RunFolder, estimator, optimizer, stopper, phase="",
                 params=None):
        super().__init__(estimator, optimizer, stopper, phase, params)
        self.folder = folder
        self.estimator_params = {k: v for k, v in params_to_json(estimator.get_params()).items()
                                 if k not in RUNTIME_PARAMS}
        self.phase_params = None if params is None else params_to_json(params)
        self.gpu = cuda_device(estimator.device)  # its generator is checkpointed
        suffix = f"-{phase}" if phase else ""
        self.checkpoint_path = folder / f"checkpoint{suffix}.pt"
        self.metrics_path = folder / f"metrics{suffix}.jsonl"

    def resume(self) -> int:
        """Load the phase's checkpoint if there is one; return the first epoch left to run.

        A refit's checkpoint made with other hyper-parameters than those chosen now (a
        resumed search whose candidates trained longer chose another) is started afresh.
        """
        path = self.checkpoint_path
        if not path.exists():
            return 0
        try:  # weights_only: tensors, numbers, strings and containers, never code
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # an unpickling error (a foreign object), a damaged file
            why = ("holds objects other than plain tensors and numbers: refused unread"
                   if isinstance(exc, pickle.UnpicklingError) else
                   f"is cut short or damaged: unreadable ({type(exc).__name__})")
            raise ValueError(f"{path}: the checkpoint {why}; delete it to restart the run, or "
                             "use a new run folder") from None
        if state["params"] != self.estimator_params:
            changed = _changed(self.estimator_params, state["params"])
            raise ValueError(f"{path}: saved with other parameters ({', '.join(changed)}); "
                             "use a new run folder")
        if "phase_params" in state and state["phase_params"] != self.phase_params:
            log.info("%s: made with %s, not %s: this phase starts afresh", path,
                     state.get("phase_params"), self.phase_params)
            return 0
        self.estimator.model_.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.stopper is not None:
            self.stopper.load_state_dict(state["stopper"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and self.gpu is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.gpu)
        self.history = state["history"]
        log.info("resumed %s after epoch %d", self.folder.path, state["epoch"])
        return state["epoch"] + 1

    def epoch_end(self, metrics: dict) -> None:
        super().epoch_end(metrics)
        cuda_rng = None if self.gpu is None else torch.cuda.get_rng_state(self.gpu)
        model = self.estimator.model_.state_dict()
        stopper = None if self.stopper is None else self.stopper.state_dict()
        if stopper is not None and stopper["best_epoch"] == metrics["epoch"]:
            # the best weights are this epoch's: the model's own tensors, which torch.save
            # stores once, rather than a copy that would double the checkpoint
            stopper["best_state"] = model
        state = {"epoch": metrics["epoch"], "model": model,
                 "optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state(),
                 "cuda_rng": cuda_rng, "stopper": stopper, "history": self.history,
                 "params": self.estimator_params, "phase_params": self.phase_params}
        # into an open file: on a full disk that raises the OSError, which torch's own writer
        # of a path turns into a RuntimeError naming no file
        with signals_deferred(), atomic_path(self.checkpoint_path) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)
        with atomic_path(self.metrics_path) as tmp:
            tmp.write_text("".join(json.dumps(h) + "\n" for h in self.history))
