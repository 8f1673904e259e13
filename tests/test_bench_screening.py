"""scripts/bench_screening.py: the pass it times is the estimator's, and a quick run's table."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_script

from fgscale.training._screening import screen_bank

pytestmark = pytest.mark.scripts

ROOT = Path(__file__).resolve().parents[1]


def test_the_timed_pass_is_screen_bank_one_vs_rest():
    with load_script("bench_screening") as bench:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((30, 500)).astype(np.float32)
        y = rng.integers(0, 3, 30)
        bank = torch.from_numpy(np.stack([rng.permutation(np.arange(500) % 50)
                                          for _ in range(4)]).astype(np.int32))
        keep = bench.screening_pass(X, y, bank, 50, 3, block=7)
        blocks = [(X[i : i + 7], y[i : i + 7]) for i in range(0, 30, 7)]
        expected = screen_bank(blocks, bank, 50, 20.0, n_outputs=3, one_vs_rest=True)
        np.testing.assert_array_equal(keep, expected)
        assert keep.shape == (4, 3, 50) and (keep.sum(-1) == 10).all()


def test_a_quick_run_prints_one_row_per_grid():
    out = subprocess.run([sys.executable, "scripts/bench_screening.py", "--quick"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 3000 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "3,000" and float(cells[2]) > 0 and float(cells[4]) > 0
