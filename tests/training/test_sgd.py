"""fgscale.training._sgd.SGD against torch.optim.SGD: the same steps, bit for bit, and state dicts
that load in either."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fgscale.training import build_model, make_optimizer
from fgscale.training._sgd import SGD, LipschitzStep, lipschitz


def _model(name, p, n_classes):
    return build_model(name, p, n_classes, hidden_layer_sizes=(7,))


def _groups(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]


@pytest.mark.parametrize("weight_decay", [0.0, 0.03])
def test_steps_equal_torch_sgd(weight_decay):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    ours = _model("mlp", 20, 3)
    theirs = _model("mlp", 20, 3)
    theirs.load_state_dict(ours.state_dict())
    start = {name: value.clone() for name, value in ours.state_dict().items()}
    opt_ours = make_optimizer(ours, 0.1, weight_decay)
    opt_theirs = torch.optim.SGD(_groups(theirs, weight_decay), lr=0.1)
    for lr in (0.3, 0.05, 0.2, 0.7):
        x = torch.as_tensor(rng.standard_normal((5, 20)).astype(np.float32))
        y = torch.as_tensor(rng.integers(0, 3, 5))
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    moved = False
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
        moved |= not torch.equal(value, start[name])
    assert moved
    assert [p.grad is None for p in ours.parameters()] == [False] * 4
    opt_ours.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in ours.parameters())


def test_state_dicts_load_in_either():
    model = _model("logreg", 6, 2)
    ours = make_optimizer(model, 0.25, 0.5)
    theirs = torch.optim.SGD(_groups(model, 0.0), lr=0.01)
    theirs.load_state_dict(ours.state_dict())  # an older fgscale reads a newer checkpoint
    assert [(g["lr"], g["weight_decay"]) for g in theirs.param_groups] == [(0.25, 0.5),
                                                                           (0.25, 0.0)]
    theirs.param_groups[0]["lr"] = 0.125
    fresh = make_optimizer(model, 1.0)
    fresh.load_state_dict(theirs.state_dict())  # a checkpoint of an older fgscale
    assert [(g["lr"], g["weight_decay"]) for g in fresh.param_groups] == [(0.125, 0.5),
                                                                          (0.25, 0.0)]


def test_refuses_other_groups_and_momentum():
    model = _model("logreg", 6, 2)
    with pytest.raises(ValueError, match="other parameter groups"):
        SGD([{"params": list(model.parameters())}], lr=0.1).load_state_dict(
            make_optimizer(model, 0.1).state_dict())
    momentum = torch.optim.SGD(_groups(model, 0.0), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum"):
        make_optimizer(model, 0.1).load_state_dict(momentum.state_dict())


def test_lipschitz_step_is_one_over_the_scaled_constant_plus_alpha():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.standard_normal((70, 9)).astype(np.float32))
    w = torch.as_tensor(rng.uniform(0.5, 2, 70).astype(np.float32))
    step = LipschitzStep(steepness=2.5, alpha=0.1)
    assert step(x) == 1.0 / (lipschitz(x) * 2.5 + 0.1)
    assert step(x, w) == 1.0 / (lipschitz(x, weights=w) * 2.5 + 0.1)
    assert step.of_constant(lipschitz(x)) == step(x)  # a constant computed elsewhere
    assert LipschitzStep()(x) == 1.0 / lipschitz(x)
