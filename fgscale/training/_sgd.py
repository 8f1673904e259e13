"""Plain stochastic gradient descent with per-group weight decay, the trainer's optimizer.

The step is ``torch.optim.SGD``'s without momentum, bit for bit (``p -= lr * (g + wd * p)``),
and so is the state dict, so that checkpoints written with either load in the other. What it
leaves out is what a small model pays for on every step: ``torch.optim``'s profiling hooks and
its first call's import of ``torch._dynamo`` (over a second, once per process, before the first
step of every run).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["SGD", "sgd_update"]

# the keys of torch.optim.SGD's parameter groups, written for its readers
_TORCH_GROUP = {"momentum": 0, "dampening": 0, "nesterov": False, "maximize": False,
                "foreach": None, "differentiable": False, "fused": None}


def sgd_update(param: torch.Tensor, grad: torch.Tensor, lr: float, weight_decay: float) -> None:
    """``param -= lr * (grad + weight_decay * param)`` in place, with torch.optim.SGD's
    floating-point operations (no momentum); call under ``torch.no_grad()``."""
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    param.add_(grad, alpha=-lr)


class SGD:
    """SGD steps on groups of parameters, each with its own ``lr`` and ``weight_decay``.

    Parameters
    ----------
    groups : iterable of dict
        Each ``{"params": [tensors], "weight_decay": float}``, optionally ``"lr"``.
    lr : float
        The step size of the groups that do not set theirs; set ``group["lr"]`` to change it
        between steps.
    """

    def __init__(self, groups: Iterable[dict], lr: float):
        self.param_groups = [{"weight_decay": 0.0, **group, "lr": group.get("lr", lr),
                              "params": list(group["params"])} for group in groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter that has a gradient."""
        for group in self.param_groups:
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is not None:
                    sgd_update(p, p.grad, lr, decay)

    def state_dict(self) -> dict:
        """Step sizes and weight decays, in ``torch.optim.SGD``'s layout (no buffers)."""
        groups, start = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append({**_TORCH_GROUP, "lr": group["lr"],
                           "weight_decay": group["weight_decay"],
                           "params": list(range(start, start + n))})
            start += n
        return {"state": {}, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Restore step sizes and weight decays from :meth:`state_dict` or a ``torch.optim.SGD``
        without momentum."""
        saved = state["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups, strict=False)):
            raise ValueError("the saved optimizer has other parameter groups than this model's")
        if state.get("state") or any(s.get("momentum", 0) for s in saved):
            raise ValueError("the saved optimizer has momentum buffers, which plain SGD has not")
        for group, s in zip(self.param_groups, saved, strict=True):
            group["lr"], group["weight_decay"] = float(s["lr"]), float(s["weight_decay"])
