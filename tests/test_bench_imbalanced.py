"""scripts/bench_imbalanced.py: the rows it keeps, its score, and a run on small fake IDX files
(random images: the accuracies mean nothing, the table's shape does)."""

import sys

import numpy as np
import pytest
from helpers import load_script, write_idx
from sklearn.metrics import balanced_accuracy_score

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def bench():
    with load_script("bench_imbalanced") as module:
        yield module


def test_class_c_keeps_a_geometric_share_of_its_rows(bench):
    y = np.repeat(np.arange(10), 100)[np.random.default_rng(0).permutation(1000)]
    rows = bench.imbalanced_rows(y, 100, 0.1)
    counts = np.bincount(y[rows])
    assert counts[0] == 100 and counts[-1] == 10 and (np.diff(counts) < 0).all()
    np.testing.assert_array_equal(counts, np.round(100 * 0.1 ** (np.arange(10) / 9)))
    # the first rows of each class, class by class
    np.testing.assert_array_equal(rows[:100], np.flatnonzero(y == 0)[:100])
    np.testing.assert_array_equal(rows[-10:], np.flatnonzero(y == 9)[:10])


def test_balanced_accuracy_is_scikit_learns(bench):
    rng = np.random.default_rng(1)
    y, pred = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    assert bench.balanced_accuracy(y, pred) == pytest.approx(balanced_accuracy_score(y, pred))


def test_a_run_prints_one_row_per_method(bench, tmp_path, capsys):
    accuracy = sys.modules["bench_accuracy"]  # imported by the script
    rng = np.random.default_rng(0)
    for part, n in (("train", 600), ("test", 2500)):
        write_idx(tmp_path / accuracy.FASHION_FILES[f"{part}_images"],
                  rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / accuracy.FASHION_FILES[f"{part}_labels"], np.arange(n) % 10)
    bench.main(["--seeds", "2", "--n-max", "20", "--ratio", "0.5", "--data", str(tmp_path)])
    out = capsys.readouterr().out
    assert "training rows per class [20, 19, 17, 16, 15, 14, 13, 12, 11, 10]" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == list(bench.METHODS)
    assert rows[-1].split(" | ")[2] == "-"  # the anchor, against itself
