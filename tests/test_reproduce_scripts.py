"""scripts/reproduce_rb.py and scripts/reproduce_learning_curve.py, end to end on tiny settings:
real cohorts, a real store on disk, real LocalClusters."""

import re

import numpy as np
import pytest
from helpers import load_script

pytestmark = pytest.mark.scripts


@pytest.fixture
def scripts():
    with load_script("reproduce_rb") as rb, load_script("reproduce_learning_curve") as lc:
        yield {"reproduce_rb": rb, "reproduce_learning_curve": lc}


def _percentages(text: str) -> list[float]:
    """The 'mean ± se' entries of the Markdown tables."""
    return [float(m) for m in re.findall(r"\| (\d+\.\d+) ± (?:n/a|\d+\.\d+)", text)]


def test_reproduce_rb_tiny(scripts, tmp_path):
    out, table = tmp_path / "rb.md", tmp_path / "rb.csv"
    cells = scripts["reproduce_rb"].main(["--quick", "--r", "10,20", "--b", "2",
                                          "--max-epochs", "2", "--out", out, "--csv", table])
    assert [(c.r, c.b) for c in cells] == [(10, 2), (20, 2)]
    text = out.read_text()
    assert "SYNTHETIC" in text and "HCP-small" in text and "77.97-79.88%" in text
    values = _percentages(text)
    assert len(values) == 2 and all(0 <= v <= 100 for v in values)
    assert np.allclose(values, [100 * c.accuracy for c in cells], atol=0.005)
    assert len(table.read_text().splitlines()) == 3


def test_reproduce_learning_curve_tiny(scripts, tmp_path):
    lc = scripts["reproduce_learning_curve"]
    out, png = tmp_path / "lc.md", tmp_path / "lc.png"
    # sizes of 40 rows at least: 'auto' needs a validation split of every class (8 classes)
    common = ["--quick", "--grid", "10x10x10", "--n-samples", "120", "--sizes", "40,48",
              "--max-epochs", "2", "--n-groupings", "2", "--n-workers", "1",
              "--work", tmp_path / "work", "--png", png]
    first, second = tmp_path / "seed0.csv", tmp_path / "seed1.csv"
    cells = lc.main(common + ["--out", out, "--csv", first])
    assert len(cells) == 2 * 4  # sizes x regularizers, one model, one seed
    text = out.read_text()
    assert "SYNTHETIC" in text and "Command:" in text
    values = _percentages(text)
    assert len(values) == 8 and all(0 <= v <= 100 for v in values)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "work" / "cohort.zarr").is_dir()

    # A second part of the grid (seed 1 only), then one report of both parts from their CSVs.
    more = lc.main(common + ["--regularizers", "none", "--first-seed", "1", "--out",
                             tmp_path / "seed1.md", "--csv", second])
    assert [(c.seed, c.n_train) for c in more] == [(1, 40), (1, 48)]
    merged = tmp_path / "merged.md"
    lc.main(common + ["--seeds", "2", "--from-csv", f"{first},{second}", "--out", merged])
    text = merged.read_text()
    assert "over 2 seed(s) (0, 1;" in text and "seed0.csv`, `" in text
    assert "± n/a (1) |" in text  # the cells of one seed say so
    assert "**INCOMPLETE**: 10 fits of the grid's 16" in text
    fits = text.split("## Every fit")[1]  # the rows it was rendered from, one per fit
    assert fits.count("\n| logreg |") == 10
    one = more[0]  # every field of its CSV row
    assert (f"| logreg | none | 40 | 1 | {100 * one.accuracy:.2f} | {one.fit_s:.0f} | "
            f"{one.score_s:.1f} | {one.epochs} | {one.candidates} | - |") in fits
    none_40 = [100 * c.accuracy for c in cells + more if (c.regularizer, c.n_train) == ("none", 40)]
    row = re.search(r"\| 40 \| (\d+\.\d+) ± (\d+\.\d+) \|", text)
    assert float(row[1]) == pytest.approx(np.mean(none_40), abs=0.005)
    assert float(row[2]) == pytest.approx(np.std(none_40, ddof=1) / np.sqrt(2), abs=0.005)
    with pytest.raises(SystemExit, match="seed1.csv: the fit model=logreg regularizer=none "
                                         "n_train=40 seed=1 is also in"):
        lc.main(common + ["--from-csv", f"{second},{second}", "--out", merged])
    with pytest.raises(SystemExit, match="nothing.csv: no such file"):
        lc.main(common + ["--from-csv", str(tmp_path / "nothing.csv"), "--out", merged])
    (tmp_path / "other.csv").write_text("seed,accuracy\n0,0.5\n")
    with pytest.raises(SystemExit, match="other.csv: columns \\['seed', 'accuracy'\\], expected"):
        lc.main(common + ["--from-csv", str(tmp_path / "other.csv"), "--out", merged])


def test_nested_rows_are_stratified_and_nested(scripts):
    lc = scripts["reproduce_learning_curve"]
    y = np.repeat(np.arange(4), 10)
    train = np.arange(40)[::-1].copy()
    order = lc.nested_rows(y, train, seed=3)
    assert sorted(order) == list(range(40))
    for n in (8, 12, 20):
        assert np.bincount(y[order[:n]], minlength=4).tolist() == [n // 4] * 4
    assert np.array_equal(order, lc.nested_rows(y, train, seed=3))
