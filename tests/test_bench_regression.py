"""scripts/bench_regression.py's brain-smooth mode: its cohorts are make_cohort(target=True)'s,
and a run on a tiny grid prints the report's tables (SYNTHETIC data: the R² mean nothing, the
tables' shape does)."""

import csv

import nibabel as nib
import numpy as np
import pytest
from helpers import load_script

from fgscale.images import make_cohort

pytestmark = pytest.mark.scripts

GRID = (16, 18, 16)
CELLS = ["brain-smooth:0.5:16", "brain-smooth:0.1:32"]


@pytest.fixture(scope="module")
def bench():
    with load_script("bench_regression") as module:
        yield module


def test_a_cohort_is_make_cohorts_with_a_target(bench, tmp_path):
    """The rows, targets, subjects and test split of a cell are those of the files that
    ``make_cohort(target=True)`` writes with the cell's design and the script's SNR."""
    c = bench.smooth_cohort("brain-smooth:0.5:32", seed=3, grid=GRID)
    table = make_cohort(tmp_path, n_samples=32, n_classes=4, grid=GRID, snr_db=bench.SMOOTH_SNR_DB,
                        n_subjects=8, seed=3, smooth_noise=0.5, target=True, compress=False)
    with open(table) as f:
        rows = list(csv.DictReader(f))
    mask = np.asarray(c.mask_img.dataobj).astype(bool)
    X = np.stack([np.asarray(nib.load(tmp_path / r["path"]).dataobj)[mask] for r in rows])
    test = np.array([r["split"] == "test" for r in rows])
    assert test.sum() == 8 and c.X_te.shape == (8, mask.sum()) and c.X_tr.shape[0] == 24
    np.testing.assert_array_equal(c.X_tr, X[~test])
    np.testing.assert_array_equal(c.X_te, X[test])
    target = np.array([float(r["target"]) for r in rows])
    np.testing.assert_allclose(c.t_tr, target[~test], rtol=1e-5)
    np.testing.assert_allclose(c.t_te, target[test], rtol=1e-5)
    np.testing.assert_array_equal(c.groups_tr, [r["group"] for r in rows if r["split"] == "train"])


@pytest.mark.filterwarnings("ignore:screening_percentile set to")  # nilearn, on a tiny mask
def test_a_tiny_run_prints_the_tables(bench, tmp_path, capsys):
    out_file, csv_file = tmp_path / "report.md", tmp_path / "fits.csv"
    bench.main(["--datasets", ",".join(CELLS), "--grid", "16x18x16", "--seeds", "2",
                "--first-seed", "7", "--out", str(out_file), "--csv", str(csv_file)])
    text = capsys.readouterr().out
    assert text.rstrip() == out_file.read_text().rstrip()
    assert "SYNTHETIC" in text and f"{bench.SMOOTH_SNR_DB:g} dB" in text
    labels = [bench.SMOOTH_METHODS[name][0] for name in bench.DEFAULT_METHODS]
    tables = [block.splitlines() for block in text.split("\n\n") if block.startswith("| ")]
    results, differences, per_seed = tables
    # one row per cell and method, smallest cohort first, 2 seeds each
    assert len(results) == 2 + len(CELLS) * len(labels)
    cells = [row.split(" | ") for row in results[2:]]
    assert [(c[0], c[1], c[2]) for c in cells] == (
        [("| 16", "0.5", "12 / 4")] * 3 + [("| 32", "0.1", "24 / 8")] * 3)
    assert [c[3] for c in cells] == labels * 2 and all(c[-1] == "2 |" for c in cells)
    assert all(" ± " in c[4] for c in cells)
    # the defaults against each of the two baselines, per cell: a paired difference and a count
    assert differences[0].count("defaults − ") == 2 and len(differences) == 2 + len(CELLS)
    for row in differences[2:]:
        for diff in row.split(" | ")[2:]:
            assert diff.rstrip(" |")[0] in "+-" and diff.rstrip(" |").endswith("/2)")
    # every seed's R², and the CSV holds the same fits
    assert len(per_seed) == 2 + len(CELLS) * len(labels)
    assert all("7: " in row and "8: " in row for row in per_seed[2:])
    with open(csv_file) as f:
        assert len(list(csv.DictReader(f))) == len(CELLS) * len(labels) * 2
    # the report of the CSV, fitting nothing, holds the same tables
    bench.main(["--datasets", ",".join(CELLS), "--from-csv", str(csv_file)])
    again = capsys.readouterr().out
    assert again.split("\nRendered from")[0] == text.split("\nTotal run time")[0]


def test_the_one_pattern_options_are_refused_with_the_grid(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--datasets", "brain-smooth", "--n-train", "50"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--datasets", "brain-smooth", "--methods", "fgscale-l2"])
    args = bench.parse_args([])
    assert args.datasets is None and args.snr_db is None  # the one-pattern mode's -27 dB
