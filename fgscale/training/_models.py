"""Torch models whose first layer can run on a feature grouping (Algorithm 1).

The first layer holds ``W0`` (h x p) in voxel space. Given a grouping it computes
``W0_hat = W0 Phi^T`` (h x k) and applies it to the reduced input ``Phi x``. Autograd through
that projection yields exactly ``g_W0hat Phi`` for ``W0``: one SGD step is then plain SGD on
the loss of ``f(Phi^T Phi x)``, with no gradient mapped back by hand.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from fgscale.grouping._projection import project

__all__ = ["GroupedLinear", "LogisticRegression", "MLP", "build_model"]


class GroupedLinear(nn.Module):
    """Linear layer ``x W0^T + b0`` that also accepts inputs reduced by a grouping.

    Parameters
    ----------
    n_features : int
        p, the input dimension in voxel space.
    n_outputs : int
        h, the output dimension.
    """

    def __init__(self, n_features: int, n_outputs: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_outputs, n_features))
        self.bias = nn.Parameter(torch.empty(n_outputs))
        bound = 1.0 / math.sqrt(n_features)  # nn.Linear's default initialisation
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, grouping: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer.

        Parameters
        ----------
        x : Tensor of shape (m, p), or (m, k) when ``grouping`` is given
        grouping : LongTensor of shape (p,), optional
            Labels of the grouping that reduced ``x``; k is ``x.shape[1]``.
        """
        if grouping is None:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, project(self.weight, grouping, x.shape[1]), self.bias)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression; optional dropout on the input."""

    def __init__(self, n_features: int, n_classes: int, *, input_dropout: float = 0.0):
        super().__init__()
        self.input_dropout = nn.Dropout(input_dropout)
        self.first = GroupedLinear(n_features, n_classes)
        # The loss is convex: start from zero, so that an early-stopped fit stays near the
        # smallest weights that explain the data
        nn.init.zeros_(self.first.weight)
        nn.init.zeros_(self.first.bias)

    def forward(self, x, grouping=None):
        return self.first(self.input_dropout(x), grouping)


class MLP(nn.Module):
    """ReLU multilayer perceptron with dropout on the input and on hidden layers."""

    def __init__(self, n_features: int, n_classes: int, hidden_layer_sizes=(256,), *,
                 input_dropout: float = 0.0, hidden_dropout: float = 0.0):
        super().__init__()
        sizes = list(hidden_layer_sizes)
        if not sizes:
            raise ValueError("hidden_layer_sizes must name at least one hidden layer for the MLP")
        self.input_dropout = nn.Dropout(input_dropout)
        self.first = GroupedLinear(n_features, sizes[0])
        layers = []
        for n_in, n_out in zip(sizes, sizes[1:] + [n_classes], strict=True):
            layers += [nn.ReLU(), nn.Dropout(hidden_dropout), nn.Linear(n_in, n_out)]
        self.rest = nn.Sequential(*layers)

    def forward(self, x, grouping=None):
        return self.rest(self.first(self.input_dropout(x), grouping))


def build_model(model: str, n_features: int, n_classes: int, *, regularizer: str,
                dropout: float, hidden_layer_sizes=(256,)) -> nn.Module:
    """Build the model named by the estimator's parameters.

    ``regularizer="dropout"`` puts dropout on the input and hidden layers; feature grouping
    keeps it on hidden layers only (the paper's MLP); "none" and "l2" use no dropout.
    """
    input_dropout = dropout if regularizer == "dropout" else 0.0
    hidden_dropout = dropout if regularizer in ("dropout", "feature_grouping") else 0.0
    if model == "logreg":
        return LogisticRegression(n_features, n_classes, input_dropout=input_dropout)
    if model == "mlp":
        return MLP(n_features, n_classes, hidden_layer_sizes,
                   input_dropout=input_dropout, hidden_dropout=hidden_dropout)
    raise ValueError(f"model must be 'logreg' or 'mlp', got {model!r}")
