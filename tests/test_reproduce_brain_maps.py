"""scripts/reproduce_brain_maps.py end to end on a tiny setting: the real SYNTHETIC 'brain-white'
cohort, two regularizers, a few epochs, a small bank."""

import sys
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pytest
from helpers import assert_png_not_blank, load_script

pytestmark = pytest.mark.scripts


def test_reproduce_brain_maps_tiny(tmp_path):
    with load_script("reproduce_brain_maps") as script:
        out, maps = tmp_path / "results", tmp_path / "maps"
        accuracies = script.main(["--out", out, "--nifti-dir", maps, "--class-index", 1,
                                  "--max-epochs", 3, "--n-groupings", 3, "--seeds", 2,
                                  "--regularizers", "none,feature_grouping"])
        mask = sys.modules["bench_accuracy"].brain_split(0, "brain-white").mask
        truths = script.true_patterns(0, mask, np.arange(8).repeat(60))
        exact = SimpleNamespace(coef_=truths[:, mask])
        assert script.pattern_correlation(exact, truths, mask) == pytest.approx(1.0)
        flipped = SimpleNamespace(coef_=-truths[:, mask][::-1])
        expected = np.mean([np.corrcoef(-truths[7 - c][mask], truths[c][mask])[0, 1]
                            for c in range(8)])
        assert script.pattern_correlation(flipped, truths, mask) == pytest.approx(expected)
    assert set(accuracies) == {"none", "feature_grouping"}
    assert all(0.0 <= a <= 1.0 for a in accuracies.values())
    table = (out / "brain_maps_seeds.md").read_text()
    assert "2 seed(s) (0, 1)" in table and "SYNTHETIC" in table
    assert table.count("| none |") == 1 and table.count("| feature_grouping |") == 1
    for name in ("truth", "none", "feature_grouping"):
        img = nib.load(maps / f"{name}.nii.gz")
        data = np.asarray(img.dataobj)
        assert data.shape == mask.shape
        assert np.any(data[mask] != 0) and not np.any(data[~mask])
    assert not (maps / "l2.nii.gz").exists()
    assert_png_not_blank(out / "fig4_brain_weights.png")
