import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import SCRIPTS, random_labels
from torch.nn import functional as F

from fgscale.estimators._regularizers import model_dropout
from fgscale.grouping._projection import back_project, project
from fgscale.training import (
    Batch,
    EarlyStopping,
    MemorySource,
    evaluate,
    fit,
    make_optimizer,
    train_epoch,
)
from fgscale.training import _loop as loop_module
from fgscale.training._loop import check_finite
from fgscale.training._models import GroupedLinear, build_model
from fgscale.training._plan import epoch_plan


@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
def test_grouped_step_equals_plain_sgd_on_smoothed_input(model_name):
    """Algorithm 1: one step on (Phi x, W0 Phi^T) == plain SGD on f(Phi^T Phi x; W0)."""
    rng = np.random.default_rng(0)
    p, k, m, n_classes = 60, 13, 16, 4
    labels = random_labels(rng, p, k)
    x = rng.standard_normal((m, p))
    y = torch.as_tensor(rng.integers(0, n_classes, m))
    torch.manual_seed(0)
    grouped = build_model(model_name, p, n_classes,
                          hidden_layer_sizes=(8, 5)).double()
    dense = copy.deepcopy(grouped)
    w0 = grouped.first.weight.detach().clone()
    for model, inputs, grouping in [
        (grouped, project(x, labels), torch.as_tensor(labels).long()),
        (dense, back_project(project(x, labels), labels), None),
    ]:
        opt = make_optimizer(model, learning_rate=0.1)
        opt.zero_grad()
        F.cross_entropy(model(torch.as_tensor(inputs), grouping), y).backward()
        opt.step()
    for (name, a), b in zip(grouped.named_parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # W0 moved, and only along directions constant within each cluster
    delta = (grouped.first.weight.detach() - w0).numpy()
    assert np.abs(delta).max() > 1e-6
    for q in range(k):
        cols = delta[:, labels == q]
        np.testing.assert_allclose(cols, cols[:, :1].repeat(cols.shape[1], 1), atol=1e-12)


def test_grouped_linear_gradient_is_g_phi():
    rng = np.random.default_rng(1)
    p, k, h = 30, 7, 3
    labels = random_labels(rng, p, k)
    layer = GroupedLinear(p, h).double()
    z = torch.as_tensor(rng.standard_normal((5, k)))
    out = layer(z, torch.as_tensor(labels).long())
    g = torch.as_tensor(rng.standard_normal(out.shape))
    out.backward(g)
    g_what = g.T @ z  # gradient w.r.t. W0_hat (h x k)
    expected = back_project(g_what.numpy(), labels)  # g_W0hat Phi
    np.testing.assert_allclose(layer.weight.grad.numpy(), expected, rtol=1e-10)


def test_weight_decay_spares_biases():
    model = build_model("logreg", 5, 2)
    opt = make_optimizer(model, learning_rate=0.5, weight_decay=0.1)
    w, b = model.first.weight.detach().clone(), model.first.bias.detach().clone()
    for prm in model.parameters():
        prm.grad = torch.zeros_like(prm)
    opt.step()
    torch.testing.assert_close(model.first.weight.detach(), w * (1 - 0.05))
    torch.testing.assert_close(model.first.bias.detach(), b)


def test_memory_source_follows_the_plan():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((20, 9)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    bank = np.stack([random_labels(rng, 9, 4) for _ in range(3)])
    plan = epoch_plan(np.arange(20), batch_size=6, epoch=0, seed=0, n_groupings=3)
    batches = list(MemorySource(X, y, bank).batches(plan))
    assert [b.grouping for b in batches] == list(plan.groupings)
    for batch, rows in zip(batches, plan.batches, strict=True):
        np.testing.assert_array_equal(batch.x, project(X[rows], bank[batch.grouping]))
        np.testing.assert_array_equal(batch.y, y[rows])


def test_fit_learns_and_early_stopping_restores_best():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((200, 10)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    torch.manual_seed(0)
    model = build_model("mlp", 10, 2, hidden_layer_sizes=(16,))
    opt = make_optimizer(model, learning_rate=0.2)
    stopper = EarlyStopping(patience=3)
    saved = {}

    def epochs(epoch):
        plan = epoch_plan(np.arange(150), batch_size=25, epoch=epoch, seed=0)
        return MemorySource(X, y).batches(plan)

    def on_end(metrics):
        saved[metrics["epoch"]] = copy.deepcopy(model.state_dict())

    history = fit(model, opt, epoch_batches=epochs, max_epochs=200,
                  validation=lambda: [(X[150:], y[150:])], stopper=stopper, on_epoch_end=on_end)
    assert len(history) < 200  # stopped early
    assert history[-1]["epoch"] - stopper.best_epoch == 3
    best = min(history, key=lambda h: h["val_loss"])
    assert best["epoch"] == stopper.best_epoch
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, saved[stopper.best_epoch][name])
    assert evaluate(model, [(X[150:], y[150:])])["accuracy"] > 0.85


def test_train_epoch_returns_mean_loss():
    torch.manual_seed(0)
    model = build_model("logreg", 4, 2)
    opt = make_optimizer(model, learning_rate=0.0)  # no update: the mean is a plain average
    x = np.ones((3, 4), np.float32)
    batches = [Batch(x, np.array([0, 1, 1])), Batch(x[:1], np.array([0]))]
    loss = train_epoch(model, opt, batches)
    with torch.no_grad():
        logits = model(torch.as_tensor(x))
        expected = (F.cross_entropy(logits, torch.tensor([0, 1, 1]), reduction="sum")
                    + F.cross_entropy(logits[:1], torch.tensor([0]), reduction="sum")) / 4
    assert loss == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("screened", [False, True], ids=["all-clusters", "screened"])
def test_deferred_grouped_steps_equal_autograd_and_sgd(model_name, weight_decay, screened,
                                                       monkeypatch):
    """train_epoch's deferred first-layer step (no dense (h x p) gradient) gives the weights
    that autograd and plain SGD give (torch.optim.SGD's, test_sgd), bit for bit, over steps
    with changing groupings and step sizes; wider than a block of columns, so that the blocks
    are exercised. Screened: each grouping keeps some clusters, for each class of the
    logistic regression, for all hidden units of the MLP."""
    rng = np.random.default_rng(7)
    p, k, n_classes = 5000, 300, 3
    bank = torch.as_tensor(np.stack([random_labels(rng, p, k) for _ in range(3)]))
    shape = (3, n_classes, k) if model_name == "logreg" else (3, k)
    keep = torch.as_tensor(rng.random(shape) < 0.3) if screened else None
    batches = [Batch(rng.standard_normal((6, k)).astype(np.float32),
                     rng.integers(0, n_classes, 6), grouping=i % 3) for i in range(5)]
    steps = iter([0.3, 0.1, 0.2, 0.05, 0.4])

    def step_size(x):
        return next(steps)

    monkeypatch.setattr(loop_module, "_DEFER_GROUPED_MIN_WEIGHTS", 0)  # the test's small layers
    monkeypatch.setattr(loop_module, "_DEFER_FULL_MIN_WEIGHTS", 0)
    torch.manual_seed(0)
    deferred = build_model(model_name, p, n_classes, hidden_layer_sizes=(8,))
    reference = copy.deepcopy(deferred)
    start = deferred.first.weight.detach().clone()
    train_epoch(deferred, make_optimizer(deferred, 0.1, weight_decay), batches, bank=bank,
                step_size=step_size, keep=keep)
    assert deferred.first.defer is False and deferred.first.weight.grad is None
    # without the override, a layer this small takes autograd's steps: the same weights again
    monkeypatch.undo()
    small = copy.deepcopy(reference)
    steps = iter([0.3, 0.1, 0.2, 0.05, 0.4])
    train_epoch(small, make_optimizer(small, 0.1, weight_decay), batches, bank=bank,
                step_size=step_size, keep=keep)
    for name, value in small.state_dict().items():
        assert torch.equal(deferred.state_dict()[name], value), name

    opt = make_optimizer(reference, 0.1, weight_decay)
    for batch, lr in zip(batches, [0.3, 0.1, 0.2, 0.05, 0.4], strict=True):
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        mask = None if keep is None else keep[batch.grouping]
        F.cross_entropy(reference(torch.as_tensor(batch.x), bank[batch.grouping].long(), mask),
                        torch.as_tensor(batch.y)).backward()
        assert reference.first.weight.grad.shape == (8 if model_name == "mlp" else 3, p)
        opt.step()
    for name, value in reference.state_dict().items():
        assert torch.equal(deferred.state_dict()[name], value), name
    assert not torch.equal(deferred.first.weight.detach(), start)  # the steps did move W0
    if screened and model_name == "logreg":  # from zero, a class moves on its kept clusters
        kept = torch.stack([keep[g][:, bank[g]] for g in range(3)]).amax(0) > 0  # (3, p)
        assert torch.all(deferred.first.weight.detach()[~kept] == 0)
        assert torch.all(deferred.first.weight.detach()[kept] != 0)


@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
@pytest.mark.parametrize("regularizer,weight_decay", [("none", 0.0), ("l2", 0.05),
                                                      ("dropout", 0.0)])
def test_deferred_full_row_steps_match_autograd_and_sgd(model_name, regularizer, weight_decay,
                                                        monkeypatch):
    """On full rows, the deferred first-layer step (one in-place addmm_, no (h x p) gradient)
    gives the weights of autograd and plain SGD to float rounding, over steps with changing
    step sizes, with weight decay and with input dropout (the same masks drawn)."""
    rng = np.random.default_rng(3)
    p, n_classes, lrs = 3000, 3, [0.3, 0.1, 0.2, 0.05]
    batches = [Batch(rng.standard_normal((6, p)).astype(np.float32),
                     rng.integers(0, n_classes, 6)) for _ in lrs]
    monkeypatch.setattr(loop_module, "_DEFER_GROUPED_MIN_WEIGHTS", 0)  # the test's small layers
    monkeypatch.setattr(loop_module, "_DEFER_FULL_MIN_WEIGHTS", 0)
    torch.manual_seed(0)
    deferred = build_model(model_name, p, n_classes, **model_dropout(regularizer, 0.3),
                           hidden_layer_sizes=(8,))
    if model_name == "logreg":  # logistic regression starts from zero: move off it first
        torch.nn.init.normal_(deferred.first.weight, std=0.05)
    reference = copy.deepcopy(deferred)
    start = deferred.first.weight.detach().clone()

    dense = []  # autograd computing W0's (h x p) gradient calls this hook
    deferred.first.weight.register_hook(lambda grad: dense.append(grad.shape))
    steps = iter(lrs)
    torch.manual_seed(1)
    train_epoch(deferred, make_optimizer(deferred, 0.1, weight_decay), batches,
                step_size=lambda x: next(steps))
    assert dense == [] and deferred.first.defer is False and deferred.first.weight.grad is None

    opt = make_optimizer(reference, 0.1, weight_decay)
    torch.manual_seed(1)
    for batch, lr in zip(batches, lrs, strict=True):
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        F.cross_entropy(reference(torch.as_tensor(batch.x)), torch.as_tensor(batch.y)).backward()
        assert reference.first.weight.grad.shape == (8 if model_name == "mlp" else 3, p)
        opt.step()
    # atol: weights that cancel to near 0 keep the rounding of their terms (~1e-7 where
    # AVX-512 sums in another order); three orders of magnitude below what the steps move
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(deferred.state_dict()[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    moved = (deferred.first.weight.detach() - start).abs().max()
    assert moved > 1e-3  # the steps did move W0, far beyond the tolerance


def test_deferred_full_row_forward_keeps_no_dense_gradient(monkeypatch):
    """With defer on, a backward through full rows builds no (h x p) gradient for W0 (what
    the deferred step saves), while the bias and later layers get theirs."""
    monkeypatch.setattr(loop_module, "_DEFER_GROUPED_MIN_WEIGHTS", 0)
    monkeypatch.setattr(loop_module, "_DEFER_FULL_MIN_WEIGHTS", 0)
    model = build_model("mlp", 500, 3, hidden_layer_sizes=(4,))
    opt = make_optimizer(model, 0.1)
    first, _ = loop_module._deferred_layer(model, opt)
    x = torch.randn(5, 500)
    F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0, 1])).backward()
    assert first.weight.grad is None and first.bias.grad is not None
    assert first._pending is not None and first._pending[2].shape == (5, 4)
    assert first.step_deferred(0.1) and first._pending is None
    assert not first.step_deferred(0.1)  # nothing pending any more
    first.defer = False


_STEP_PEAK = """
import sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])  # scripts/, for the benchmarks' peak-memory meter
from bench_accuracy import PeakRSS
from fgscale.training import Batch, make_optimizer, train_epoch
from fgscale.training._models import build_model

p, k, h = 4_000_000, 2_000_000, 16
torch.manual_seed(0)
model = build_model("mlp", p, 3,
                    hidden_layer_sizes=(h,))
bank = torch.as_tensor(np.stack([np.arange(p) % k, (np.arange(p) // 2) % k]).astype(np.int32))
rng = np.random.default_rng(0)
batches = [Batch(rng.standard_normal((4, k)).astype(np.float32), np.array([0, 1, 2, 0]), g % 2)
           for g in range(4)]
optimizer = make_optimizer(model, 0.01)
train_epoch(model, optimizer, batches[:1], bank=bank)  # first touches: allocator, kernels
with PeakRSS() as meter:
    train_epoch(model, optimizer, batches, bank=bank)
print(meter.kernel, meter.peak / (h * k * 4))
"""


@pytest.mark.scripts  # runs the peak-memory meter of scripts/bench_accuracy.py
def test_a_grouped_deferred_step_holds_few_reduced_arrays():
    """A deferred grouped step of a wide first layer (h x p, reduced to h x k) needs about two
    (h x k) arrays beyond the weights: W0_hat and its gradient, during the backward. Measured
    as the growth of the peak resident memory of a fresh process over an epoch, in units of
    one (h x k) float32 array: about 2.6, and 4.4 if autograd's clone of the gradient in
    .grad, a scaled copy of it and the last batch's graph stay alive."""
    out = subprocess.run([sys.executable, "-c", _STEP_PEAK, str(SCRIPTS)], capture_output=True,
                         text=True, check=True, timeout=300)
    kernel, peak = out.stdout.split()[-2:]
    if kernel != "True":  # a sampled peak could miss the step's short-lived arrays
        pytest.skip("the kernel's peak resident memory cannot be reset here")
    assert float(peak) < 3.5, out.stdout


_FINITE_PEAK = """
import sys
import torch
sys.path.insert(0, sys.argv[1])  # scripts/, for the benchmarks' peak-memory meter
from bench_accuracy import PeakRSS
from fgscale.training._loop import check_finite
from fgscale.training._models import build_model

model = build_model("logreg", 25_000_000, 4)  # a first layer of 400 MB
check_finite(model, 1, "auto")  # first touches
with PeakRSS() as meter:
    check_finite(model, 1, "auto")
print(meter.kernel, meter.peak / model.first.weight.nbytes)
"""


@pytest.mark.scripts  # runs the peak-memory meter of scripts/bench_accuracy.py
def test_the_finite_check_of_a_large_layer_holds_no_copy_of_it():
    """torch.isfinite on a whole layer makes an |x| copy and two masks of it (1.5 times the
    layer): on a 1 mm grid that was the MLP's training peak, at the end of the fit. In chunks,
    the check's peak is a small part of the layer."""
    out = subprocess.run([sys.executable, "-c", _FINITE_PEAK, str(SCRIPTS)],
                         capture_output=True, text=True, check=True, timeout=300)
    kernel, peak = out.stdout.split()[-2:]
    if kernel != "True":  # a sampled peak could miss the check's short-lived arrays
        pytest.skip("the kernel's peak resident memory cannot be reset here")
    assert float(peak) < 0.2, out.stdout


def test_the_finite_check_finds_a_value_in_any_chunk():
    model = build_model("logreg", 3 * loop_module._FINITE_CHUNK // 2, 2)
    check_finite(model, 3, "auto")
    for value in (float("nan"), float("inf"), -float("inf")):
        with torch.no_grad():
            model.first.weight[1, -1] = value  # in the last chunk
        with pytest.raises(ValueError, match=r"^training diverged: .* after 3 epochs with "
                                             r"learning_rate=0\.5;"):
            check_finite(model, 3, 0.5)
        with torch.no_grad():
            model.first.weight[1, -1] = 0.0


@pytest.mark.cuda
def test_grouped_step_on_cuda_matches_cpu():
    rng = np.random.default_rng(4)
    labels = torch.as_tensor(random_labels(rng, 50, 10)).long()
    x = torch.as_tensor(rng.standard_normal((8, 10)), dtype=torch.float32)
    torch.manual_seed(0)
    cpu = build_model("logreg", 50, 3)
    gpu = copy.deepcopy(cpu).cuda()
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    for model, dev in [(cpu, "cpu"), (gpu, "cuda")]:
        F.cross_entropy(model(x.to(dev), labels.to(dev)), y.to(dev)).backward()
    torch.testing.assert_close(gpu.first.weight.grad.cpu(), cpu.first.weight.grad, rtol=1e-4, atol=1e-6)


def test_which_layers_defer_which_steps(monkeypatch):
    """Grouped steps (autograd's numbers exactly) defer from a lower size than full-row steps
    (autograd's to rounding): logistic regression at 4 mm defers the first only, on
    Fashion-MNIST neither; a mid-sized layer's full rows still get autograd's dense gradient."""
    for p, n_classes, expected in ((33854, 8, "grouped"), (784, 10, None)):
        model = build_model("logreg", p, n_classes)
        first, _ = loop_module._deferred_layer(model, make_optimizer(model, 0.1))
        assert (None if first is None else first.defer) == expected, p

    monkeypatch.setattr(loop_module, "_DEFER_GROUPED_MIN_WEIGHTS", 1000)
    monkeypatch.setattr(loop_module, "_DEFER_FULL_MIN_WEIGHTS", 10 ** 9)
    model = build_model("logreg", 500, 3)
    first, _ = loop_module._deferred_layer(model, make_optimizer(model, 0.1))
    assert first.defer == "grouped"
    y = torch.tensor([0, 1, 2, 0])
    F.cross_entropy(model(torch.randn(4, 500)), y).backward()
    assert first.weight.grad is not None and first._pending is None  # autograd's step
    first.weight.grad = None
    labels = torch.as_tensor(random_labels(np.random.default_rng(0), 500, 40))
    F.cross_entropy(model(torch.randn(4, 40), labels), y).backward()
    assert first.weight.grad is None and first._pending is not None  # deferred
    first.defer = False


def test_large_dense_models_predict_in_float32_small_ones_in_float64(rng, monkeypatch):
    """A float64 copy of the weights makes a row's logits independent of the rows predicted
    with it; above FLOAT64_MAX_WEIGHTS (an MLP at 1 mm) that copy would double the model's
    memory, and the model predicts in its own float32."""
    from fgscale.training import _models

    model = build_model("mlp", 300, 3,
                        hidden_layer_sizes=(16,)).eval()
    x = torch.as_tensor(rng.standard_normal((50, 300)), dtype=torch.float32)
    with torch.no_grad():
        exact = model.double()(x.double())
        model.float()
        small = _models.predict_forward(model)(x)
        monkeypatch.setattr(_models, "FLOAT64_MAX_WEIGHTS", 300 * 16)  # fewer than its weights
        large = _models.predict_forward(model)(x)
    assert small.dtype == large.dtype == torch.float64
    torch.testing.assert_close(small, exact, rtol=1e-12, atol=1e-12)
    assert torch.equal(large, model(x).double())
    assert not torch.equal(large, small)  # float32's rounding
