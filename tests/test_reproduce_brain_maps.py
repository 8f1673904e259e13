"""scripts/reproduce_brain_maps.py end to end on a tiny setting: the real SYNTHETIC 'brain-white'
cohort, two regularizers, a few epochs, a small bank."""

import sys

import nibabel as nib
import numpy as np
from helpers import assert_png_not_blank, load_script


def test_reproduce_brain_maps_tiny(tmp_path):
    with load_script("reproduce_brain_maps") as script:
        out, maps = tmp_path / "results", tmp_path / "maps"
        accuracies = script.main(["--out", out, "--nifti-dir", maps, "--class-index", 1,
                                  "--max-epochs", 3, "--n-groupings", 3,
                                  "--regularizers", "none,feature_grouping"])
        mask = sys.modules["bench_accuracy"].brain_split(0, "brain-white").mask
    assert set(accuracies) == {"none", "feature_grouping"}
    assert all(0.0 <= a <= 1.0 for a in accuracies.values())
    for name in ("truth", "none", "feature_grouping"):
        img = nib.load(maps / f"{name}.nii.gz")
        data = np.asarray(img.dataobj)
        assert data.shape == mask.shape
        assert np.any(data[mask] != 0) and not np.any(data[~mask])
    assert not (maps / "l2.nii.gz").exists()
    assert_png_not_blank(out / "fig4_brain_weights.png")
