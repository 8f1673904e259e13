"""fgscale.training._profile: the training loop's phases, measured only when asked, each without
the phases nested in it, so that they add up to at most their thread's time."""

import time

import numpy as np
import torch

from fgscale.training import Batch, _profile, build_model, fit, make_optimizer
from fgscale.training._profile import PHASES, Profile, phase, profiling


def _busy(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_nested_phases_are_charged_to_the_innermost():
    with profiling() as profile:
        start = time.thread_time()
        with phase("forward_backward"):
            _busy(0.02)
            with phase("reduce"):
                _busy(0.03)
            _busy(0.01)
        total = time.thread_time() - start
    assert profile.calls["forward_backward"] == profile.calls["reduce"] == 1
    assert 0.03 <= profile.cpu["reduce"] < 0.03 + 0.01
    assert 0.03 <= profile.cpu["forward_backward"] < 0.03 + 0.01
    assert profile.cpu["reduce"] + profile.cpu["forward_backward"] <= total
    assert profile.wall["reduce"] >= profile.cpu["reduce"] - 1e-3


def test_marks_do_nothing_unless_a_profile_is_active():
    assert _profile._ACTIVE is None
    assert phase("blocks") is phase("reduce")  # one shared no-op context
    outer = Profile()
    with profiling(outer), profiling() as inner, phase("step"):
        assert _profile._ACTIVE is inner
    assert _profile._ACTIVE is None and outer.calls["step"] == 0 and inner.calls["step"] == 1


def test_a_fit_marks_every_phase_within_its_thread_time():
    rng = np.random.default_rng(0)
    p, k = 100_000, 100
    bank = torch.as_tensor(rng.integers(0, k, (2, p)))
    batches = [Batch(rng.standard_normal((8, k)).astype(np.float32), rng.integers(0, 3, 8), g % 2)
               for g in range(6)]
    val = [(rng.standard_normal((5, p)).astype(np.float32), rng.integers(0, 3, 5))]
    model = build_model("logreg", p, 3)
    model.first.weight.data.normal_()
    with profiling() as profile:
        start = time.thread_time()
        fit(model, make_optimizer(model, 0.01), epoch_batches=lambda e: batches, max_epochs=2,
            bank=bank, validation=lambda: val, step_size=lambda x: 0.01)
        total = time.thread_time() - start
    # 3 x 100,000 weights: logistic regression defers its steps, so every phase is taken
    assert {name for name, n in profile.calls.items() if n} == set(PHASES)
    assert profile.calls["lipschitz"] == profile.calls["reduce"] == profile.calls["expand"] == 12
    assert profile.calls["blocks"] == 14 and profile.calls["validation"] == 2
    assert sum(profile.cpu.values()) <= total
