"""The training loop of Algorithm 1, fed by any iterator of batches.

The loop knows nothing about where batches come from: the in-memory source
(:class:`fgscale.training.MemorySource`) and the distributed Zarr streamer
(:class:`fgscale.training.StoreSource`) both yield :class:`Batch` objects in the order of the
same :class:`~fgscale.training.EpochPlan`.
A batch carries the rows already reduced by its grouping (``Phi x``, m x k) together with the
grouping's index in the bank, or full rows (m x p) when no grouping is used.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fgscale._utils.progress import tqdm
from fgscale.training._models import GroupedLinear, predict_forward
from fgscale.training._profile import phase
from fgscale.training._sgd import SGD, LipschitzStep

__all__ = ["Batch", "EarlyStopping", "IterateAverage", "batch_loss", "check_finite",
           "cuda_device", "evaluate", "evaluation_sums", "fit", "make_optimizer",
           "predict_logits", "torch_threads", "train_epoch"]

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One minibatch.

    Attributes
    ----------
    x : ndarray of shape (m, k) if ``grouping`` is set, else (m, p), float32
    y : ndarray of shape (m,), int64 class indices, or float32 targets (regression)
    grouping : int or None
        Index into the bank of the grouping that reduced ``x``.
    lipschitz : float or None
        :func:`~fgscale.training._sgd.lipschitz` of ``x``, when the source computed it where
        it made the block (a worker): the central step then takes its step size from it.
    """

    x: np.ndarray
    y: np.ndarray
    grouping: int | None = None
    lipschitz: float | None = None


def make_optimizer(model: nn.Module, learning_rate: float, weight_decay: float = 0.0) -> SGD:
    """SGD with L2 weight decay on weight matrices only (biases are not penalised)."""
    decay = [p for name, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for name, p in model.named_parameters() if p.ndim <= 1]
    return SGD([{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate)


def batch_loss(out: torch.Tensor, y: torch.Tensor, regression: bool = False,
               reduction: str = "mean", class_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax cross-entropy of class indices ``y``, or half the squared error of targets
    ``y`` (one output): half, so that the loss of a linear layer is λmax([x, 1][x, 1]ᵀ / m)-
    smooth, twice :func:`~fgscale.training._sgd.lipschitz`'s constant, whatever the units.
    With ``class_weight`` (one weight per class), each row's cross-entropy is multiplied by
    its class's weight, and "mean" divides by the rows, not by the weights: the minibatch's
    loss is then an unbiased estimate of the training rows' weighted mean loss, whose
    weights average 1."""
    if regression:
        return 0.5 * F.mse_loss(out[:, 0], y.to(out.dtype), reduction=reduction)
    if class_weight is None:
        return F.cross_entropy(out, y.long(), reduction=reduction)
    losses = F.cross_entropy(out, y.long(), weight=class_weight.to(out.dtype), reduction="none")
    return losses.mean() if reduction == "mean" else losses.sum()


class IterateAverage:
    """The running mean of a model's parameters over an epoch's steps (Polyak-Ruppert
    averaging, :func:`train_epoch` in regression): :meth:`update` after each step,
    :meth:`finish` loads the mean into the model."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.mean = [torch.zeros_like(p) for p in model.parameters()]
        self.steps = 0

    @torch.no_grad()
    def update(self) -> None:
        self.steps += 1
        for a, p in zip(self.mean, self.model.parameters(), strict=True):
            a.add_(p.detach() - a, alpha=1.0 / self.steps)

    @torch.no_grad()
    def finish(self) -> None:
        if self.steps:
            for a, p in zip(self.mean, self.model.parameters(), strict=True):
                p.copy_(a)


def train_epoch(model: nn.Module, optimizer, batches: Iterable[Batch], *, bank=None,
                device="cpu", step_size: Callable[..., float] | None = None,
                regression: bool = False, class_weight: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> float:
    """Run one pass of SGD steps; return the mean training loss over the samples seen.

    In regression the epoch ends at the average of its iterates (Polyak-Ruppert averaging):
    with a constant step, SGD on a squared loss wanders at a distance from the optimum set by
    the noise of the targets, and the average of its iterates does not (Bach and Moulines,
    NeurIPS 2013). Cross-entropy keeps its last iterate.

    Parameters
    ----------
    bank : Tensor of shape (n_groupings, n_features), int, on ``device``, optional
        Needed when batches carry a grouping index.
    step_size : callable, optional
        ``step_size(x)`` gives the step of the batch whose first-layer input is ``x``
        (``step_size(x, w)`` with ``class_weight``, ``w`` the rows' weights); default the
        optimizer's fixed learning rate. A :class:`~fgscale.training._sgd.LipschitzStep`
        takes the step from the batch's ``lipschitz`` where its source computed it.
    regression : bool, default=False
        Squared error on float targets instead of cross-entropy on class indices.
    class_weight : Tensor of shape (n_classes,), optional
        Each class's weight in the loss (:func:`batch_loss`), on ``device``.
    keep : Tensor of shape (n_groupings, n_clusters) or (n_groupings, h, n_clusters), optional
        Screening (:mod:`~fgscale.training._screening`): True for a kept cluster,
        for all the first layer's h outputs or for each; a reduced batch's forward gets its
        grouping's row (``model(x, grouping, keep[g])``).
    """
    model.train()
    total, count = 0.0, 0
    average = IterateAverage(model) if regression else None
    first, first_group = _deferred_layer(model, optimizer)
    batches = iter(batches)
    try:
        while True:
            with phase("blocks"):
                batch = next(batches, None)
            if batch is None:
                break
            with phase("to_device"):
                x = torch.as_tensor(batch.x, device=device)
                y = torch.as_tensor(batch.y, device=device)
                grouping = None if batch.grouping is None else bank[batch.grouping].long()
            mask = None if keep is None or grouping is None else keep[batch.grouping]
            if step_size is not None:
                with phase("lipschitz"):
                    lr = _step_of(step_size, batch, x, y, class_weight)
                for group in optimizer.param_groups:
                    group["lr"] = lr
            with phase("forward_backward"):
                optimizer.zero_grad(set_to_none=True)
                loss = batch_loss(model(x, grouping, mask), y, regression,
                                  class_weight=class_weight)
                loss.backward()
                # the graph is let go before the step: through it a grouped forward's W0_hat
                # (h x k) would stay alive until the next batch's forward is done
                total += loss.item() * len(y)
                del loss
            with phase("step"):
                optimizer.step()  # W0 has no .grad after a deferred forward: SGD leaves it alone
                if first is not None:
                    first.step_deferred(first_group["lr"], first_group["weight_decay"])
                count += len(y)
                if average is not None:
                    average.update()
    finally:  # an interrupted epoch leaves no layer deferring, nor a step half taken
        if first is not None:
            first.defer, first._pending = False, None
    if average is not None:
        average.finish()
    # The last step's gradients are not kept past the epoch: a first layer on a 1 mm grid
    # weighs as much as its weights, and validation and the best-epoch snapshot come next.
    optimizer.zero_grad(set_to_none=True)
    return total / max(count, 1)


def _step_of(step_size: Callable[..., float], batch: Batch, x: torch.Tensor, y: torch.Tensor,
             class_weight: torch.Tensor | None) -> float:
    """The step size of a batch: from the Lipschitz constant its source computed when the
    step size is a :class:`~fgscale.training._sgd.LipschitzStep` (whose constant is of
    unweighted rows: class weights need the rows' weights, so the step computes it here),
    else ``step_size(x)``, or ``step_size(x, w)`` with the rows' class weights ``w``."""
    if class_weight is not None:
        return step_size(x, class_weight[y])
    if batch.lipschitz is not None and isinstance(step_size, LipschitzStep):
        return step_size.of_constant(batch.lipschitz)
    return step_size(x)


# First layers of at least this many weights take deferred steps (scripts/bench_step.py, README
# "Projection and the training step"). A grouped forward's deferred step gives autograd's
# numbers exactly and is faster from logistic regression at 4 mm up (1.4-1.6x; slower on
# Fashion-MNIST's 784 features). A full-row forward's step matches autograd's to float rounding
# only: it is taken where the dense gradient's memory matters, the MLP from 2 mm up (69M
# weights; 1.2-1.7x faster), and smaller models keep autograd's exact numbers.
_DEFER_GROUPED_MIN_WEIGHTS = 1 << 18
_DEFER_FULL_MIN_WEIGHTS = 1 << 26


def _deferred_layer(model: nn.Module, optimizer):
    """The model's first layer (a GroupedLinear), switched to deferred steps (see
    :class:`~fgscale.training._models.GroupedLinear`), and the optimizer's group that holds its
    weight; (None, None) for a small layer, or when the optimizer is not plain SGD, whose step
    alone it reproduces."""
    first = getattr(model, "first", None)
    if not isinstance(first, GroupedLinear) or not isinstance(optimizer, SGD) \
            or first.weight.numel() < _DEFER_GROUPED_MIN_WEIGHTS:
        return None, None
    for group in optimizer.param_groups:
        if any(p is first.weight for p in group["params"]):
            first.defer = first.weight.numel() >= _DEFER_FULL_MIN_WEIGHTS or "grouped"
            return first, group
    return None, None


@torch.no_grad()
def predict_logits(model: nn.Module, blocks: Iterable[np.ndarray], *, device="cpu") -> np.ndarray:
    """Logits of full rows, float64, shape (n_samples, n_outputs), block by block; a row's do
    not depend on the rows predicted with it (:func:`~fgscale.training._models.predict_forward`)."""
    model.eval()
    forward = predict_forward(model)
    out = [forward(torch.as_tensor(x, device=device)).cpu().numpy() for x in blocks]
    return np.concatenate(out) if out else np.empty((0, 0), np.float64)


@torch.no_grad()
def evaluate(model: nn.Module, blocks: Iterable[tuple[np.ndarray, np.ndarray]], *,
             device="cpu", regression: bool = False,
             class_weight: torch.Tensor | None = None) -> dict:
    """Mean loss (:func:`batch_loss`) over ``(x, y)`` blocks of full rows, with the accuracy,
    or with the R² of regression targets (``"score"``: either). With ``class_weight``, the
    loss and the accuracy are means weighted by the rows' class weights.

    Blocks that can be evaluated where they are read (``blocks.evaluation_sums``, as
    :meth:`fgscale.training.StoreSource.blocks` gives them) send back their
    :func:`evaluation_sums` rather than their rows; they add up as the rows' would here."""
    model.eval()
    remote = getattr(blocks, "evaluation_sums", None)
    parts = None if remote is None else remote(model, regression=regression,
                                               class_weight=class_weight)
    if parts is None:
        parts = (evaluation_sums(model, x, y, device=device, regression=regression,
                                 class_weight=class_weight) for x, y in blocks)
    loss, correct, count, total_weight = 0.0, 0.0, 0, 0.0
    sum_y = sum_y2 = 0.0  # the targets' total sum of squares, for R²
    for part in parts:  # in block order: the same sums however the blocks were evaluated
        loss, correct, count = loss + part["loss"], correct + part["correct"], count + part["n"]
        total_weight += part["weight"]
        sum_y, sum_y2 = sum_y + part["sum_y"], sum_y2 + part["sum_y2"]
    n = max(count, 1)
    if class_weight is not None and not regression:
        n = total_weight or 1.0
    if not regression:
        return {"loss": loss / n, "accuracy": correct / n, "score": correct / n, "n": count}
    total = sum_y2 - sum_y * sum_y / n
    r2 = 1.0 - 2.0 * loss / total if total > 0 else float("nan")
    return {"loss": loss / n, "r2": r2, "score": r2, "n": count}


@torch.no_grad()
def evaluation_sums(model: nn.Module, x: np.ndarray, y: np.ndarray, *, device="cpu",
                    regression: bool = False, class_weight: torch.Tensor | None = None) -> dict:
    """One block's share of :func:`evaluate` (``model`` in eval mode): its summed loss, its
    hits (weighted by ``class_weight``) and their weight, its targets' sum and sum of squares
    (regression), and its rows. Python numbers: a numpy scalar in the history would make the
    checkpoint one that torch.load(weights_only=True) refuses, and the run impossible to
    resume."""
    out = model(torch.as_tensor(x, device=device))
    y_t = torch.as_tensor(y, device=device)
    sums = {"loss": float(batch_loss(out, y_t, regression, reduction="sum",
                                     class_weight=class_weight)),
            "correct": 0, "weight": 0.0, "sum_y": 0.0, "sum_y2": 0.0, "n": len(y)}
    if regression:
        y64 = np.asarray(y, np.float64)
        sums["sum_y"], sums["sum_y2"] = float(y64.sum()), float(y64 @ y64)
    elif class_weight is None:
        sums["correct"] = int((out.argmax(1) == y_t.long()).sum())
    else:  # float64 sums: the same for any split of the rows into blocks
        w = class_weight[y_t.long()].double()
        hits = out.argmax(1) == y_t.long()
        sums["correct"], sums["weight"] = float(w[hits].sum()), float(w.sum())
    return sums


class History:
    """Per-epoch metrics of one fit, and where a fit resumes: nothing is saved here.

    The run folders of :mod:`fgscale.runs` subclass it to checkpoint every epoch.
    """

    def __init__(self, estimator, optimizer, stopper, phase: str = "", params=None):
        # phase: "" for a fit of one candidate, "candidate-<i>" in a search, "refit" after
        # early stopping; params: the hyper-parameters this phase trains with
        self.estimator, self.optimizer, self.stopper = estimator, optimizer, stopper
        self.phase, self.params = phase, params
        self.history: list[dict] = []

    @property
    def stopped_early(self) -> bool:
        """The stopping criterion ended the run: resuming it, even with a larger
        ``max_epochs``, trains no more. A run that ended at ``max_epochs`` goes on when that is
        raised."""
        return self.stopper is not None and self.stopper.bad_epochs >= self.stopper.patience

    @property
    def label(self) -> str:
        """The progress bar's name for this phase: in a search, the candidate and its values,
        so that the bars of its candidates and refit are told apart."""
        if not self.phase.startswith("candidate-"):
            return f"epochs ({self.phase})" if self.phase else "epochs"
        values = ", ".join(f"{'k' if name == 'n_clusters' else name} {value:g}"
                           for name, value in (self.params or {}).items() if value is not None)
        return f"epochs (candidate {self.phase.split('-')[1]}: {values})"

    def resume(self) -> int:
        """The first epoch left to run."""
        return 0

    def epoch_end(self, metrics: dict) -> None:
        self.history.append(metrics)


class EarlyStopping:
    """Stop when a loss has not improved by ``tol`` for ``patience`` epochs; keep the best weights.

    The loss is the validation loss when there is a validation set, else the training loss.

    Parameters
    ----------
    patience : int, default=10
    tol : float, default=0.0
        An epoch improves when its loss is below the best one minus ``tol`` (as in
        scikit-learn's MLP); the best weights are kept whatever ``tol``.
    """

    def __init__(self, patience: int = 10, tol: float = 0.0):
        self.patience = patience
        self.tol = tol
        self.best_loss = math.inf
        self.best_epoch = -1
        self.best_state = None
        self.bad_epochs = 0

    def update(self, epoch: int, loss: float, model: nn.Module) -> bool:
        """Record an epoch's loss; return True when training should stop."""
        if loss < self.best_loss - self.tol:
            self.bad_epochs = 0
        else:  # a NaN loss too
            self.bad_epochs += 1
        if loss < self.best_loss:
            self.best_loss, self.best_epoch = loss, epoch
            self.best_state = _snapshot(model.state_dict(), self.best_state)
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


def _snapshot(state: dict, into: dict | None) -> dict:
    """A copy of a state dict, written into the tensors of the previous copy when they match:
    a fresh copy would hold two snapshots of a large model at once while the old one is
    replaced."""
    if into is None or into.keys() != state.keys() or any(
            into[k].shape != v.shape or into[k].dtype != v.dtype or into[k].device != v.device
            for k, v in state.items()):
        return copy.deepcopy(state)
    with torch.no_grad():
        for k, v in state.items():
            into[k].copy_(v)
    return into


def fit(model: nn.Module, optimizer, *,
        epoch_batches: Callable[[int], Iterable[Batch]] | None = None,
        max_epochs: int, bank=None, device="cpu",
        validation: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
        stopper: EarlyStopping | None = None, start_epoch: int = 0,
        on_epoch_end: Callable[[dict], None] | None = None, progress: bool | str = False,
        step_size: Callable[..., float] | None = None,
        monitor: str = "loss", regression: bool = False,
        class_weight: torch.Tensor | None = None, keep: torch.Tensor | None = None,
        run_epoch: Callable[[int], float] | None = None) -> list[dict]:
    """Train for up to ``max_epochs`` epochs; return one metrics dict per epoch (epoch,
    train_loss, val_loss and val_accuracy or val_r2 with validation, seconds).

    Parameters
    ----------
    epoch_batches : callable, optional
        ``epoch_batches(epoch)`` returns the batches of that epoch, in plan order; required
        unless ``run_epoch`` trains the epochs.
    validation : callable, optional
        Returns ``(x, y)`` blocks of full validation rows; evaluated after each epoch.
    stopper : EarlyStopping, optional
        Stop on the validation loss (with ``validation``), else on the training loss, then
        restore the best weights.
    start_epoch : int
        First epoch to run (a resumed run continues where its checkpoint ended).
    on_epoch_end : callable, optional
        Called with each epoch's metrics after the epoch (checkpoints hook here).
    progress : bool or str
        Show a progress bar over epochs (tqdm, on stderr) with the latest losses; a string
        is its name (default "epochs").
    step_size : callable, optional
        Per-batch step size (see :func:`train_epoch`).
    monitor : {"loss", "accuracy"}, default="loss"
        What the stopper watches on the validation set: the loss, or one minus the score
        (the accuracy, or R² in regression), as scikit-learn's MLP and SGD stop on their
        validation score.
    regression : bool, default=False
        Squared error on float targets (see :func:`batch_loss`).
    class_weight : array-like of shape (n_classes,), optional
        Each class's weight in the training and validation losses and accuracy.
    keep : Tensor of shape (n_groupings, [h,] n_clusters), optional
        The clusters each grouping keeps (see :func:`train_epoch`).
    run_epoch : callable, optional
        ``run_epoch(epoch)`` trains ``model`` in place for that epoch and returns its mean
        training loss, instead of :func:`train_epoch` on ``epoch_batches(epoch)``: the
        data-parallel replicas of :func:`~fgscale.training._replicas.fit_replicas`.
        Validation, the stopper and ``on_epoch_end`` follow each epoch as they do
        :func:`train_epoch`'s; ``optimizer``, ``bank``, ``step_size`` and ``keep`` are then
        ``run_epoch``'s to use.
    """
    if (epoch_batches is None) == (run_epoch is None):
        raise ValueError("fit trains on epoch_batches or with run_epoch: give one of them, not "
                         f"{'both' if run_epoch is not None else 'neither'}")
    if class_weight is not None:
        class_weight = torch.as_tensor(class_weight, dtype=torch.float32, device=device)
    history = []
    bar = tqdm(total=max_epochs, initial=start_epoch, unit="epoch", disable=not progress,
               desc=progress if isinstance(progress, str) else "epochs")
    for epoch in range(start_epoch, max_epochs):
        started = time.perf_counter()
        if run_epoch is not None:
            train_loss = float(run_epoch(epoch))
        else:
            train_loss = train_epoch(model, optimizer, epoch_batches(epoch), bank=bank,
                                     device=device, step_size=step_size, regression=regression,
                                     class_weight=class_weight, keep=keep)
        metrics = {"epoch": epoch, "train_loss": train_loss}
        monitored = metrics["train_loss"]
        if validation is not None:
            with phase("validation"):
                val = evaluate(model, validation(), device=device, regression=regression,
                               class_weight=class_weight)
            score = "val_r2" if regression else "val_accuracy"
            metrics.update({"val_loss": val["loss"], score: val["score"]})
            monitored = val["loss"] if monitor == "loss" else 1.0 - val["score"]
        metrics["seconds"] = time.perf_counter() - started  # the epoch's, validation included
        stop = stopper is not None and stopper.update(epoch, monitored, model)
        log.info("epoch %d: %s", epoch, {k: round(v, 5) for k, v in metrics.items()})
        bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items() if k != "epoch"}, refresh=False)
        bar.update()
        history.append(metrics)
        if on_epoch_end is not None:
            on_epoch_end(metrics)
        if stop:
            log.info("early stop at epoch %d, best epoch %d", epoch, stopper.best_epoch)
            break
    bar.close()
    if stopper is not None and stopper.best_state is not None:
        model.load_state_dict(stopper.best_state)
    return history


_SMALL_BATCH_VALUES = 1 << 24  # minibatches of fewer input values train on one thread


_FINITE_CHUNK = 1 << 22  # values checked at a time by check_finite (16 MiB of float32)


def check_finite(model: nn.Module, epochs: int, learning_rate) -> None:
    """Refuse a trained model whose weights overflowed (a fixed step too large for the data),
    as scikit-learn's SGD and MLP estimators do, rather than let it predict NaN."""
    # in chunks: torch.isfinite makes an |x| copy and two masks of its input, 3 GB at once
    # for the first layer of an MLP on a 1 mm grid (1.9 GB)
    chunks = (c for p in model.parameters() for c in p.detach().reshape(-1).split(_FINITE_CHUNK))
    if not all(bool(torch.isfinite(c).all()) for c in chunks):
        raise ValueError(f"training diverged: the model's weights are not finite after {epochs} "
                         f"epoch{'' if epochs == 1 else 's'} with learning_rate={learning_rate!r}; "
                         "use learning_rate='auto' (a step of 1/L on each minibatch) or a "
                         "smaller step")


@contextmanager
def torch_threads(batch_values: int):
    """One intra-op thread for minibatches of up to a few million values: on a busy machine
    (Dask workers in this process, other jobs), torch's thread pool spends more in waking its
    threads than it saves on a step that size (figures in the README's performance section)."""
    previous = torch.get_num_threads()
    if batch_values < _SMALL_BATCH_VALUES:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cuda_device(device) -> torch.device | None:
    """``device`` as a torch device if it is a GPU, else None."""
    device = torch.device(device)
    return device if device.type == "cuda" else None
