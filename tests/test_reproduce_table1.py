"""scripts/reproduce_table1.py: the picks, the margins, and a tiny end-to-end run on fake IDX
files (the real Fashion-MNIST is not needed)."""

import sys

import numpy as np
import pytest
from helpers import load_script, write_idx

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def table1():
    with load_script("reproduce_table1") as module:
        yield module


def _row(seed, method, val_loss, test, value=""):
    return {"seed": seed, "noise": "high", "model": "logreg", "method": method, "value": value,
            "val_loss": val_loss, "test": test, "seconds": 1.0, "chosen": {}}


def test_grid_methods_are_picked_on_validation_and_on_test_separately(table1):
    rows = [_row(0, "L2", 0.9, 0.60, 1e-3), _row(0, "L2", 0.7, 0.50, 1e-1),  # val pick: 0.50
            _row(0, "L2", 1.2, 0.70, 10.0),                                  # test pick: 0.70
            _row(1, "L2", 0.5, 0.55, 1e-3), _row(1, "L2", 0.8, 0.65, 1e-1),
            _row(0, "none", 1.0, 0.40), _row(1, "none", 1.0, 0.42)]
    acc = table1.picks(rows)
    assert acc[("high", "logreg", "L2")] == [0.50, 0.55]
    assert acc[("high", "logreg", "L2 (test pick)")] == [0.70, 0.65]
    assert acc[("high", "logreg", "none")] == [0.40, 0.42]
    assert ("high", "logreg", "none (test pick)") not in acc


def test_margin_is_the_difference_of_means_with_the_combined_standard_error(table1):
    fg, l2 = [0.80, 0.82, 0.84], [0.50, 0.52, 0.60]
    se = np.sqrt(np.var(fg, ddof=1) / 3 + np.var(l2, ddof=1) / 3)
    assert table1._margin(fg, l2) == f"+{100 * (0.82 - 0.54):.2f} ± {100 * se:.2f} (beyond the SEs)"
    assert table1._margin([0.5, 0.6], [0.52, 0.58]).endswith("(within the SEs)")


def test_quick_run_end_to_end_on_fake_images(table1, tmp_path):
    rng = np.random.default_rng(0)
    for part, n in (("train", 400), ("test", 2000)):
        labels = np.arange(n) % 10
        # class-dependent brightness: something to learn, so accuracies are not all chance
        images = np.clip(rng.normal(20 * labels[:, None, None], 30, (n, 28, 28)), 0, 255)
        files = sys.modules["bench_accuracy"].FASHION_FILES
        write_idx(tmp_path / files[f"{part}_images"], images)
        write_idx(tmp_path / files[f"{part}_labels"], labels)
    out = tmp_path / "out" / "table1.md"
    assert table1.main(["--quick", "--noise", "high", "--models", "logreg", "--fashion-dir",
                        str(tmp_path), "--out", str(out), "--csv", str(tmp_path / "t.csv"),
                        "--figures"]) == 0
    text = out.read_text()
    assert "Fashion-MNIST (standing in for Olivetti)" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| high | LR |"))
    values = [float(cell.split()[0]) for cell in line.split("|")[3:7]]
    assert all(0.0 <= v <= 100.0 for v in values) and max(values) > 30.0  # chance is 10%
    # 12 fits of LR (quick) and the 2 reference rows
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 1 + 12 + 2
    for name in ("fig3_convergence.png", "fig4_weights.png", "fig5_groupings.png"):
        assert (out.parent / name).stat().st_size > 5000
    # the report rebuilt from the CSV (seeds split between processes) has the same tables
    again = tmp_path / "again.md"
    assert table1.main(["--report-from", str(tmp_path / "t.csv"), "--out", str(again)]) == 0
    tables = [ln for ln in text.splitlines() if ln.startswith("| high")]
    assert tables and tables == [ln for ln in again.read_text().splitlines()
                                 if ln.startswith("| high")]


def test_report_from_keeps_the_last_files_row_of_a_fit(table1, tmp_path):
    fields = table1.CSV_FIELDS
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    first.write_text(",".join(fields) + "\n0,high,logreg,none,,1.0,0.40,1.0\n"
                     "0,high,logreg,feature grouping,,0.9,0.60,1.0\n"
                     "1,high,logreg,feature grouping,,0.9,0.62,1.0\n")
    second.write_text(",".join(fields) + "\n0,high,logreg,feature grouping,,0.95,0.70,1.0\n")
    acc = table1.picks(table1._read_csv([first, second]))
    assert acc[("high", "logreg", "feature grouping")] == [0.70, 0.62]
    assert acc[("high", "logreg", "none")] == [0.40]
    assert ("high", "logreg", "feature grouping (test pick)") not in acc
