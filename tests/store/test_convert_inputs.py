"""Conversion of what real cohorts hold: odd files, odd tables, files changed between runs."""

import nibabel as nib
import numpy as np
import pytest

from fgscale.store._convert import convert

SHAPE = (10, 12, 10)
AFFINE = np.array([[2.0, 0, 0, -10], [0, 2, 0, -12], [0, 0, 2, -10], [0, 0, 0, 1]])


def write_cohort(folder, images, table=None):
    """Save ``images`` ({file name: array}) beside a cohort table; return the table's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in images.items():
        nib.save(nib.Nifti1Image(data, AFFINE), folder / name)
    path = folder / "cohort.csv"
    path.write_text(table if table is not None else "path,label\n" + "".join(
        f"{name},c{i % 2}\n" for i, name in enumerate(images)))
    return path


def volumes(rng, n, *extra):
    return [(rng.standard_normal(SHAPE + extra) + 5).astype(np.float32) for _ in range(n)]


def test_a_four_d_file_of_no_volume_is_refused_naming_it(tmp_path, rng):
    images = dict(zip(["a.nii.gz", "b.nii.gz", "c.nii.gz"], volumes(rng, 3), strict=True))
    images["run.nii.gz"] = np.zeros((*SHAPE, 0), np.float32)  # adds no row, without a word
    table = write_cohort(tmp_path / "cohort", images)
    with pytest.raises(ValueError, match=r"cohort.csv:5: .*run.nii.gz: image of shape "
                                         r"\(10, 12, 10, 0\) holds no voxel"):
        convert(table, tmp_path / "s.zarr", progress=False)
    assert not (tmp_path / "s.zarr").exists()
