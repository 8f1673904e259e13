"""The scale-free step size and the stopping criteria of the training loop."""

import numpy as np
import pytest
import torch
from torch import nn

from fgscale.training import EarlyStopping, lipschitz


@pytest.mark.parametrize("shape", [(32, 5), (7, 300), (1, 10), (50, 50), (64, 2000),
                                   (65, 40), (120, 120), (200, 30)])
def test_lipschitz_is_half_the_top_eigenvalue_of_the_augmented_gram(shape, rng):
    x = rng.standard_normal(shape) * rng.uniform(0.1, 100)
    aug = np.hstack([x, np.ones((shape[0], 1))])
    dense = 0.5 * np.linalg.eigvalsh(aug @ aug.T / shape[0]).max()
    got = lipschitz(torch.as_tensor(x, dtype=torch.float32))
    if shape[0] <= 64:  # from the Gram matrix: exact, to float32's rounding of x x^T
        assert got == pytest.approx(dense, rel=1e-5)
        return
    # power iterations from ones never overestimate; after 8 the estimate is within 25% even
    # for a square Gaussian matrix, whose top eigenvalues crowd together: a step below 2/L,
    # where gradient descent still descends (the next test)
    assert lipschitz(torch.as_tensor(x, dtype=torch.float32), n_iter=50) == pytest.approx(
        dense, rel=2e-2)
    assert 0.75 * dense <= lipschitz(torch.as_tensor(x)) <= dense * (1 + 1e-9)
    assert got == pytest.approx(lipschitz(torch.as_tensor(x)), rel=1e-4)  # float32 as float64


@pytest.mark.parametrize("m", [40, 100])  # the Gram matrix, power iterations
def test_lipschitz_bounds_the_curvature_of_the_softmax_loss(rng, m):
    """A step of 1/L on a linear softmax layer never increases the batch's mean loss."""
    x = torch.as_tensor(rng.standard_normal((m, 30)) * 50 + 1000, dtype=torch.float32)
    y = torch.as_tensor(rng.integers(0, 4, m))
    layer = nn.Linear(30, 4).double()
    x = x.double()
    step = 1.0 / lipschitz(x)
    for _ in range(20):
        loss = nn.functional.cross_entropy(layer(x), y)
        layer.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in layer.parameters():
                p -= step * p.grad
        assert nn.functional.cross_entropy(layer(x), y) <= loss + 1e-12


def test_early_stopping_counts_epochs_without_improvement_by_tol():
    model = nn.Linear(2, 2)
    stopper = EarlyStopping(patience=2, tol=0.1)
    assert not stopper.update(0, 1.0, model)
    assert not stopper.update(1, 0.95, model)  # better, but by less than tol: a bad epoch
    assert stopper.best_epoch == 1  # the best weights are still kept
    assert stopper.update(2, float("nan"), model)  # a NaN loss is no improvement
    assert stopper.best_epoch == 1 and stopper.best_loss == 0.95


def test_early_stopping_keeps_a_copy_of_the_best_weights_in_one_set_of_tensors():
    """The snapshot is a copy (later steps do not change it), written into the same tensors
    at every improvement: a large model is never held twice over by snapshots."""
    model = nn.Linear(3, 2)
    stopper = EarlyStopping(patience=5)
    stopper.update(0, 1.0, model)
    tensors = {k: v.data_ptr() for k, v in stopper.best_state.items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    stopper.update(1, 0.5, model)  # improves: the snapshot takes the new weights
    with torch.no_grad():
        model.weight.add_(1.0)
    stopper.update(2, 0.7, model)  # does not: the snapshot stays at epoch 1's weights
    assert {k: v.data_ptr() for k, v in stopper.best_state.items()} == tensors
    for k, v in expected.items():
        torch.testing.assert_close(stopper.best_state[k], v, rtol=0, atol=0)
        assert stopper.best_state[k].data_ptr() != model.state_dict()[k].data_ptr()
