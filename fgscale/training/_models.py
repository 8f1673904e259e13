"""Torch models whose first layer can run on a feature grouping (Algorithm 1).

The first layer holds ``W0`` (h x p) in voxel space. Given a grouping it computes
``W0_hat = W0 Phi^T`` (h x k) and applies it to the reduced input ``Phi x``. Autograd through
that projection yields exactly ``g_W0hat Phi`` for ``W0``: one SGD step is then plain SGD on
the loss of ``f(Phi^T Phi x)``, with no gradient mapped back by hand.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fgscale.grouping._projection import back_project, cluster_scale, project
from fgscale.training._profile import phase
from fgscale.training._sgd import sgd_update

__all__ = ["CNN", "GroupedLinear", "LogisticRegression", "MLP", "build_model", "predict_forward"]


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
        # With defer, a forward keeps what W0's gradient is made of for step_deferred instead
        # of letting autograd build that (h x p) gradient: on a 1 mm grid it weighs as much as
        # W0 itself (1.9 GB for h = 256), is allocated and written in full at every step,
        # then read again by the optimizer. A grouped forward keeps the (h x k) gradient of
        # W0_hat; a forward on full rows keeps its input and its output's gradient.
        # False: no forward defers; "grouped": grouped forwards only; True: every forward.
        self.defer = False
        self._pending = None

    def forward(self, x: torch.Tensor, grouping: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer.

        Parameters
        ----------
        x : Tensor of shape (m, p), or (m, k) when ``grouping`` is given
        grouping : LongTensor of shape (p,), optional
            Labels of the grouping that reduced ``x``; k is ``x.shape[1]``.
        keep : Tensor of shape (k,) or (h, k), optional
            With ``grouping``: the reduced weights ``W0_hat`` are multiplied by it (screening,
            :mod:`fgscale.training._screening`: 0 for the clusters an output does not see).
        """
        kind = self.defer is True or (self.defer == "grouped" and grouping is not None)
        deferred = kind and torch.is_grad_enabled() and self.weight.requires_grad
        if grouping is None:
            if not deferred:
                return F.linear(x, self.weight, self.bias)
            with torch.no_grad():
                out = F.linear(x, self.weight)
            out.requires_grad_(True)
            out.register_hook(lambda grad: setattr(self, "_pending", (None, x, grad)))
            return out + self.bias
        if not deferred:
            with phase("reduce"):
                reduced = project(self.weight, grouping, x.shape[1])
            return F.linear(x, reduced if keep is None else reduced * keep, self.bias)
        with torch.no_grad(), phase("reduce"):
            reduced = project(self.weight, grouping, x.shape[1])
            if keep is not None:
                # screened in place here, its gradient in _take_grad: autograd's numbers
                # through ``reduced * keep``, without that (h x k) product and its gradient
                reduced.mul_(keep)
        reduced.requires_grad_(True)
        reduced.register_post_accumulate_grad_hook(
            lambda r: self._take_grad(grouping, r, keep))
        return F.linear(x, reduced, self.bias)

    def _take_grad(self, grouping, reduced: torch.Tensor, keep: torch.Tensor | None) -> None:
        # Taken from .grad once accumulated, not from a hook on the incoming gradient: that
        # hook's reference would make autograd store a clone in .grad, a third (h x k) array
        # alive beside W0_hat and its gradient
        grad = reduced.grad if keep is None else reduced.grad.mul_(keep)
        self._pending, reduced.grad = (grouping, None, grad), None

    @torch.no_grad()
    def step_deferred(self, lr: float, weight_decay: float = 0.0) -> bool:
        """Apply the gradient a deferred forward kept, as :func:`~fgscale.training._sgd.sgd_update`
        applies autograd's.

        After a grouped forward, ``W0 -= lr * (g_W0hat Phi + weight_decay * W0)``, one row at
        a time, with the same floating-point operations (the same numbers). After a forward on
        full rows ``x`` with output gradient ``g``, ``W0 = (1 - lr * weight_decay) W0 - lr gᵀ x``
        in one in-place matrix product: no (h x p) temporary at all, the same step up to
        float rounding.

        Returns False when no gradient was pending (the step is then for the optimizer).
        """
        if self._pending is None:
            return False
        pending, self._pending = self._pending, None
        with phase("expand"):
            self._expand(*pending, lr, weight_decay)
        return True

    def _expand(self, grouping, x, grad, lr: float, weight_decay: float) -> None:
        if grouping is None:
            self.weight.addmm_(grad.T, x, beta=1.0 - lr * weight_decay, alpha=-lr)
            return
        k = grad.shape[1]
        # project scales cluster q by 1/sqrt(|C_q|): its gradient for W0 carries the same
        # scale, applied in place (the gradient is this step's alone)
        expanded = grad.mul_(cluster_scale(grouping, k, grad.dtype))
        # One row of W0 at a time: the temporary is one row (p values), not (h x p), and the
        # gather reads one row of the (h x k) gradient, which stays in cache. index_select,
        # not grad_row[grouping]: the same values, 2.9x faster on a ReNA grouping at 2 mm
        for row, grad_row in zip(self.weight, expanded, strict=True):
            sgd_update(row, grad_row.index_select(0, grouping), lr, weight_decay)


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

    def forward(self, x, grouping=None, keep=None):
        return self.first(self.input_dropout(x), grouping, keep)


class MLP(nn.Module):
    """ReLU multilayer perceptron with dropout on the input and on hidden layers."""

    def __init__(self, n_features: int, n_classes: int, hidden_layer_sizes=(256,), *,
                 input_dropout: float = 0.0, hidden_dropout: float = 0.0):
        super().__init__()
        # one int is one layer, as scikit-learn's MLP takes it
        sizes = [int(hidden_layer_sizes)] if np.ndim(hidden_layer_sizes) == 0 else \
            [int(n) for n in hidden_layer_sizes]
        if not sizes:
            raise ValueError("hidden_layer_sizes must name at least one hidden layer for the MLP")
        self.input_dropout = nn.Dropout(input_dropout)
        self.first = GroupedLinear(n_features, sizes[0])
        layers = []
        for n_in, n_out in zip(sizes, sizes[1:] + [n_classes], strict=True):
            layers += [nn.ReLU(), nn.Dropout(hidden_dropout), nn.Linear(n_in, n_out)]
        self.rest = nn.Sequential(*layers)

    def forward(self, x, grouping=None, keep=None):
        return self.rest(self.first(self.input_dropout(x), grouping, keep))


_CONV = {1: (nn.Conv1d, nn.MaxPool1d), 2: (nn.Conv2d, nn.MaxPool2d), 3: (nn.Conv3d, nn.MaxPool3d)}


class CNN(nn.Module):
    """A small convolutional network on the features' grid: the paper's CNN baseline.

    Two blocks of convolution (5 wide, 16 then 32 channels), ReLU and max pooling by 2, then a
    dense hidden layer with ReLU and dropout, and the output layer (LeNet's shape). The rows
    are put back on the grid (zeros outside the mask) before the first convolution.

    With a grouping, the reduced input ``Phi x`` is expanded back to ``Phi^T Phi x``, the
    piecewise constant image of the cluster means: one SGD step is then plain SGD on the loss
    of ``f(Phi^T Phi x)``, as for the dense models.

    Parameters
    ----------
    grid : ndarray of bool, 1 to 3 dimensions
        The mask: which cells of the grid the p features fill, in C order.
    n_classes : int
    hidden : int, default=256
        Units of the dense hidden layer.
    hidden_dropout : float, default=0.0
    """

    def __init__(self, grid: np.ndarray, n_classes: int, hidden: int = 256, *,
                 hidden_dropout: float = 0.0):
        super().__init__()
        grid = np.asarray(grid, dtype=bool)
        if grid.ndim not in _CONV:
            raise ValueError(f"model='cnn' needs a mask of 1 to 3 dimensions, got {grid.ndim}")
        if min(grid.shape) < 4:
            raise ValueError(f"model='cnn' pools twice by 2: every side of the mask must be at "
                             f"least 4 long, got shape {grid.shape}")
        # a buffer: saved with the weights, so a saved model rebuilds on its own grid
        self.register_buffer("grid", torch.from_numpy(grid.copy()))
        self.register_buffer("index", torch.from_numpy(np.flatnonzero(grid)), persistent=False)
        conv, pool = _CONV[grid.ndim]
        self.features = nn.Sequential(
            conv(1, 16, 5, padding=2), nn.ReLU(), pool(2),
            conv(16, 32, 5, padding=2), nn.ReLU(), pool(2))
        cells = 32 * math.prod(side // 4 for side in grid.shape)
        self.classifier = nn.Sequential(
            nn.Linear(cells, hidden), nn.ReLU(), nn.Dropout(hidden_dropout),
            nn.Linear(hidden, n_classes))

    def forward(self, x, grouping=None, keep=None):
        if grouping is not None:  # keep: (k,), the clusters the input keeps
            x = back_project(x if keep is None else x * keep, grouping)
        return self.classifier(self.conv_features(x))

    def conv_features(self, x):
        """The convolution blocks' output on full rows ``x`` put on the grid, flattened."""
        volume = x.new_zeros((x.shape[0], int(self.grid.numel())))
        volume[:, self.index] = x
        volume = volume.reshape(x.shape[0], 1, *self.grid.shape)
        return self.features(volume).flatten(1)


_CONV_BLOCK = 8  # rows per convolution at predict: one shape, so one algorithm, for all rows
# Dense weights up to this many are copied to float64 to predict (256 MB); above (an MLP of
# 256 units from 2 mm up: 1.9 GB of float32 weights at 1 mm), a copy would hold twice the
# model's memory for the float32 rounding of a prediction, which then predicts in float32
FLOAT64_MAX_WEIGHTS = 1 << 25


def predict_forward(model: nn.Module):
    """``model``'s forward on full rows for predict (model in eval mode, no grad), float64
    logits of each row whatever rows come with it: float32 products sum in an order that
    depends on the number of rows (the kernels are chosen by shape), and the rounding reached
    the outputs. Dense layers run on float64 copies of the weights (the model is left as it
    is); a CNN's convolutions, 16 times slower in float64 on a CPU, run in float32 on blocks
    of a fixed number of rows, the last one padded with zeros. Dense layers of more than
    :data:`FLOAT64_MAX_WEIGHTS` weights run in float32 (their logits returned as float64):
    a row's logits may then change by float32 rounding with the rows predicted with it."""
    cnn = isinstance(model, CNN)
    dense = model.classifier if cnn else model
    if sum(p.numel() for p in dense.parameters()) > FLOAT64_MAX_WEIGHTS:
        return lambda x: model(x).double()
    state = {name: t.double() if t.is_floating_point() else t
             for name, t in [*dense.named_parameters(), *dense.named_buffers()]}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if cnn:
            n = len(x)
            x = torch.cat([x, x.new_zeros((-n % _CONV_BLOCK, x.shape[1]))])
            x = torch.cat([model.conv_features(b) for b in x.split(_CONV_BLOCK)])[:n]
        return torch.func.functional_call(dense, state, x.double())

    return forward


def build_model(model: str, n_features: int, n_classes: int, *, input_dropout: float = 0.0,
                hidden_dropout: float = 0.0, hidden_layer_sizes=(256,), grid=None) -> nn.Module:
    """Build the model named by the estimator's parameters.

    The dropout rates of the input and hidden layers are the regularizer's
    (:meth:`fgscale.estimators._regularizers.Regularizer.dropout_rates`). The CNN has dropout on
    its dense hidden layer only (the paper's CNN), and needs ``grid``, the mask as a boolean
    array.
    """
    if model == "logreg":
        return LogisticRegression(n_features, n_classes, input_dropout=input_dropout)
    if model == "mlp":
        return MLP(n_features, n_classes, hidden_layer_sizes,
                   input_dropout=input_dropout, hidden_dropout=hidden_dropout)
    if model == "cnn":
        if grid is None or int(np.count_nonzero(grid)) != n_features:
            raise ValueError(f"model='cnn' needs the features' grid: a mask with {n_features} "
                             "voxels set")
        return CNN(grid, n_classes, hidden_layer_sizes[0], hidden_dropout=hidden_dropout)
    raise ValueError(f"model must be 'logreg', 'mlp' or 'cnn', got {model!r}")
