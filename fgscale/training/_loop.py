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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm

__all__ = ["Batch", "EarlyStopping", "evaluate", "fit", "make_optimizer", "predict_logits",
           "train_epoch"]

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One minibatch.

    Attributes
    ----------
    x : ndarray of shape (m, k) if ``grouping`` is set, else (m, p), float32
    y : ndarray of shape (m,), int64 class indices
    grouping : int or None
        Index into the bank of the grouping that reduced ``x``.
    """

    x: np.ndarray
    y: np.ndarray
    grouping: int | None = None


def make_optimizer(model: nn.Module, learning_rate: float, weight_decay: float = 0.0):
    """SGD with L2 weight decay on weight matrices only (biases are not penalised)."""
    decay = [p for name, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for name, p in model.named_parameters() if p.ndim <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": weight_decay},
                            {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate)


def train_epoch(model: nn.Module, optimizer, batches: Iterable[Batch], *, bank=None,
                device="cpu") -> float:
    """Run one pass of SGD steps; return the mean training loss over the samples seen.

    Parameters
    ----------
    bank : Tensor of shape (n_groupings, n_features), int, on ``device``, optional
        Needed when batches carry a grouping index.
    """
    model.train()
    total, count = 0.0, 0
    for batch in batches:
        x = torch.as_tensor(batch.x, device=device)
        y = torch.as_tensor(batch.y, device=device, dtype=torch.long)
        grouping = None if batch.grouping is None else bank[batch.grouping].long()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, grouping), y)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        count += len(y)
    return total / max(count, 1)


@torch.no_grad()
def predict_logits(model: nn.Module, blocks: Iterable[np.ndarray], *, device="cpu") -> np.ndarray:
    """Logits of full (unreduced) rows, block by block; shape (n_samples, n_outputs)."""
    model.eval()
    out = [model(torch.as_tensor(x, device=device)).cpu().numpy() for x in blocks]
    return np.concatenate(out) if out else np.empty((0, 0), np.float32)


@torch.no_grad()
def evaluate(model: nn.Module, blocks: Iterable[tuple[np.ndarray, np.ndarray]], *,
             device="cpu") -> dict:
    """Mean cross-entropy and accuracy over ``(x, y)`` blocks of full rows."""
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in blocks:
        logits = model(torch.as_tensor(x, device=device))
        y_t = torch.as_tensor(y, device=device, dtype=torch.long)
        loss += float(F.cross_entropy(logits, y_t, reduction="sum"))
        correct += int((logits.argmax(1) == y_t).sum())
        count += len(y)
    return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1), "n": count}


class EarlyStopping:
    """Stop when the validation loss has not improved for ``patience`` epochs; keep the best weights."""

    def __init__(self, patience: int = 10):
        self.patience = patience
        self.best_loss = math.inf
        self.best_epoch = -1
        self.best_state = None
        self.bad_epochs = 0

    def update(self, epoch: int, loss: float, model: nn.Module) -> bool:
        """Record an epoch's validation loss; return True when training should stop."""
        if loss < self.best_loss:
            self.best_loss, self.best_epoch, self.bad_epochs = loss, epoch, 0
            self.best_state = copy.deepcopy(model.state_dict())
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


def fit(model: nn.Module, optimizer, *, epoch_batches: Callable[[int], Iterable[Batch]],
        max_epochs: int, bank=None, device="cpu",
        validation: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
        stopper: EarlyStopping | None = None, start_epoch: int = 0,
        on_epoch_end: Callable[[dict], None] | None = None, progress: bool = False
        ) -> list[dict]:
    """Train for up to ``max_epochs`` epochs; return one metrics dict per epoch.

    Parameters
    ----------
    epoch_batches : callable
        ``epoch_batches(epoch)`` returns the batches of that epoch, in plan order.
    validation : callable, optional
        Returns ``(x, y)`` blocks of full validation rows; evaluated after each epoch.
    stopper : EarlyStopping, optional
        With ``validation``: stop early, then restore the best weights.
    start_epoch : int
        First epoch to run (a resumed run continues where its checkpoint ended).
    on_epoch_end : callable, optional
        Called with each epoch's metrics after the epoch (checkpoints hook here).
    progress : bool
        Show a progress bar over epochs (tqdm, on stderr) with the latest losses.
    """
    history = []
    bar = tqdm(total=max_epochs, initial=start_epoch, desc="epochs", unit="epoch",
               disable=not progress)
    for epoch in range(start_epoch, max_epochs):
        metrics = {"epoch": epoch,
                   "train_loss": train_epoch(model, optimizer, epoch_batches(epoch),
                                             bank=bank, device=device)}
        stop = False
        if validation is not None:
            val = evaluate(model, validation(), device=device)
            metrics.update(val_loss=val["loss"], val_accuracy=val["accuracy"])
            if stopper is not None:
                stop = stopper.update(epoch, val["loss"], model)
        log.info("epoch %d: %s", epoch, {k: round(v, 5) for k, v in metrics.items()})
        bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items() if k != "epoch"})
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
