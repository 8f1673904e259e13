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

__all__ = ["SGD", "LipschitzStep", "lipschitz", "sgd_update"]

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


_GRAM_ROWS = 64  # up to this many rows, λmax comes from the m x m Gram matrix


@torch.no_grad()
def lipschitz(x: torch.Tensor, n_iter: int = 8, weights: torch.Tensor | None = None) -> float:
    """Smoothness constant of the softmax cross-entropy of a linear layer on the batch ``x``.

    ``L = λmax(G) / 2`` with ``G = [x, 1] [x, 1]ᵀ / m`` (the input and the intercept's column):
    the mean loss over the batch has an ``L``-Lipschitz gradient in the layer's weights, so a
    step of ``1 / L`` decreases it whatever the data's units, ``p`` or ``m``. For up to 64
    rows ``λmax`` is exact, from the eigenvalues of the m x m Gram matrix (one matrix product:
    the cheapest way for the full rows of L2 and dropout); above, from ``n_iter`` power
    iterations in the batch's m-dimensional space started from ones, at ``2 m d`` operations
    each, in the batch's own precision. Both are deterministic: a resumed run takes the same
    steps. The figures are in the README's performance section.

    Parameters
    ----------
    x : Tensor of shape (m, d)
        The inputs of the first layer: full rows, or rows reduced by a grouping.
    n_iter : int, default=8
    weights : Tensor of shape (m,), optional
        The rows' weights in a weighted mean loss ``sum_i w_i loss_i / m`` (``class_weight``):
        then ``G = sum_i w_i [x_i, 1] [x_i, 1]ᵀ / m``.

    Returns
    -------
    L : float
    """
    m = max(x.shape[0], 1)
    root = None if weights is None else weights.to(x.dtype).sqrt()
    if root is not None:  # the rows, and the intercept's column, scaled by sqrt(w_i)
        x = x * root[:, None]
    if x.shape[0] <= _GRAM_ROWS:
        ones = 1.0 if root is None else torch.outer(root, root).double()
        gram = (x @ x.T).double() + ones
        return 0.5 * float(torch.linalg.eigvalsh(gram)[-1]) / m if x.shape[0] else 0.0
    u = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
    u /= u.norm()
    lam = 0.0
    for _ in range(n_iter):
        v = x @ (x.T @ u) + (u.sum() if root is None else root * (root @ u))
        lam = float(u @ v)  # the Rayleigh quotient of the unit vector u
        norm = v.norm()
        if norm == 0:
            break
        u = v / norm
    return 0.5 * lam / m


class LipschitzStep:
    """The step size ``1 / (steepness * L + alpha)`` of a minibatch, ``L`` its
    :func:`lipschitz` constant (``learning_rate="auto"``).

    Called on the batch's first-layer input ``x`` (and the rows' weights), it computes ``L``
    there; a batch whose source computed ``L`` where it made the block (a worker: see
    :class:`~fgscale.training.StoreSource`) gets its step from :meth:`of_constant` instead,
    so that the central process does not run the power iterations, which read the block
    16 times.

    Parameters
    ----------
    steepness : float, default=1.0
        How much steeper the loss is than the cross-entropy of a linear layer on ``x`` (input
        dropout, a squared error).
    alpha : float, default=0.0
        The L2 penalty's own smoothness, added to the loss's.
    """

    def __init__(self, steepness: float = 1.0, alpha: float = 0.0):
        self.steepness = steepness
        self.alpha = alpha

    def __call__(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> float:
        return self.of_constant(lipschitz(x, weights=weights))

    def of_constant(self, constant: float) -> float:
        """The step for a batch whose :func:`lipschitz` constant is ``constant``."""
        return 1.0 / (constant * self.steepness + self.alpha)
