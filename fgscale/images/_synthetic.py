"""Synthetic brain-like cohorts (no real data ships with fgscale; everything here is SYNTHETIC).

The paper's HCP contrast maps cannot be downloaded here, so the demo and the tests use generated
cohorts that share their shape: a brain-shaped mask on the HCP grid (91x109x91 at 2 mm, exactly
p = 270,806 in-mask voxels; 46x55x46 at 4 mm, p = 33,854 as HCP-small; 182x218x182 at 1 mm,
p = 1,827,243) or a tiny custom grid,
class-specific smooth activation patterns (a few Gaussian blobs per class), and noise made of a
spatially smooth part (half from the subject, half from the sample; a share ``smooth_noise`` of
the noise power) and a white part, scaled to a chosen SNR = 10 log10(signal power / noise
power) inside the mask. Values outside the mask are exactly 0, so the mask computed from the
files (finite and non-zero everywhere) is the brain mask.

:func:`make_cohort` writes the cohort as real NIfTI files plus ``cohort.csv`` (path, label,
group, split) and ``cohort.json`` (``"synthetic": true`` and the generator's parameters, read by
``fgscale convert``). :func:`make_classification_volumes` returns the same data in memory.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale._utils.files import atomic_path

log = logging.getLogger(__name__)

# Grid shape, voxel size (mm) and in-mask voxel count of the HCP grids (MNI origin).
_GRIDS = {
    "1mm": ((182, 218, 182), 1.0, 1_827_243),  # about 1.8M voxels, as a 1 mm MNI brain
    "2mm": ((91, 109, 91), 2.0, 270_806),
    "4mm": ((46, 55, 46), 4.0, 33_854),
}
_CUSTOM_FILL = 0.3  # fraction of a custom grid inside the mask (HCP grids: 0.30, 0.29)
_DESCRIP = b"fgscale synthetic cohort"


def _gaussian_filter(volume: np.ndarray, sigma) -> np.ndarray:
    # scipy.ndimage is imported here, not with the module: fgscale.images is imported by every
    # conversion worker, which never generates data.
    from scipy import ndimage

    return ndimage.gaussian_filter(volume, sigma)


def grid_geometry(grid="4mm") -> tuple[tuple[int, int, int], np.ndarray, int]:
    """Shape, affine and in-mask voxel count of a named grid or a custom shape.

    Parameters
    ----------
    grid : {"1mm", "2mm", "4mm"} or tuple of 3 int
        A custom shape gets 4 mm voxels and a mask filling 30% of it.

    Returns
    -------
    shape : tuple of 3 int
    affine : ndarray of shape (4, 4)
    n_voxels : int
    """
    if isinstance(grid, str):
        if grid not in _GRIDS:
            raise ValueError(f"grid must be '1mm', '2mm', '4mm' or a shape tuple, got {grid!r}")
        shape, vox, n_voxels = _GRIDS[grid]
    else:
        shape = tuple(int(s) for s in grid)
        if len(shape) != 3 or min(shape) < 3:
            raise ValueError(f"a custom grid must be 3 sizes >= 3, got {grid!r}")
        vox, n_voxels = 4.0, max(1, round(_CUSTOM_FILL * np.prod(shape)))
    affine = np.diag([-vox, vox, vox, 1.0])
    affine[:3, 3] = [90.0, -126.0, -72.0]
    return shape, affine, int(n_voxels)


def brain_mask(shape, n_voxels: int) -> np.ndarray:
    """A brain-shaped mask (cerebrum and cerebellum, smoothly deformed) with exactly n_voxels.

    Parameters
    ----------
    shape : tuple of 3 int
    n_voxels : int

    Returns
    -------
    mask : ndarray of shape `shape`, bool
    """
    grid = np.stack(np.meshgrid(*[np.linspace(0.0, 1.0, s) for s in shape], indexing="ij"))

    def ellipsoid(centre, radii):
        return np.sqrt(sum(((grid[i] - centre[i]) / radii[i]) ** 2 for i in range(3)))

    field = np.minimum(ellipsoid((0.5, 0.52, 0.56), (0.40, 0.40, 0.34)),
                       ellipsoid((0.5, 0.28, 0.30), (0.26, 0.16, 0.14)) + 0.1)
    # A fixed smooth deformation, the same for every cohort (one brain, many maps).
    bumps = _gaussian_filter(np.random.default_rng(1234).standard_normal(shape),
                             max(1.0, min(shape) / 10))
    field = field + 0.15 * bumps / (np.abs(bumps).max() + 1e-12)
    # Thresholding at the n-th smallest value gives exactly n voxels (the field has no ties).
    threshold = np.partition(field.ravel(), n_voxels - 1)[n_voxels - 1]
    return field <= threshold


def _unit_rms(vol: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return vol / (np.sqrt(np.mean(vol[mask] ** 2)) + 1e-12)


def _class_patterns(rng, mask: np.ndarray, n_classes: int) -> np.ndarray:
    """Smooth activation patterns, shape (n_classes, *grid), unit RMS inside the mask."""
    inside = np.argwhere(mask)
    sigma = max(1.0, min(mask.shape) / 12)
    patterns = np.zeros((n_classes, *mask.shape))
    for k in range(n_classes):
        spikes = np.zeros(mask.shape)
        for centre in inside[rng.choice(len(inside), size=3, replace=False)]:
            spikes[tuple(centre)] = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.0)
        patterns[k] = _unit_rms(_gaussian_filter(spikes, sigma) * mask, mask)
    return patterns


def _smooth_noise(rng, mask: np.ndarray) -> np.ndarray:
    return _unit_rms(_gaussian_filter(rng.standard_normal(mask.shape), 1.5) * mask, mask)


def _design(n_samples, n_classes, n_subjects, test_fraction, rng):
    """Labels, subjects and split per sample (plain arrays, balanced classes)."""
    if n_classes < 2 or n_samples < n_classes:
        raise ValueError(f"need n_classes >= 2 and n_samples >= n_classes, "
                         f"got n_classes={n_classes}, n_samples={n_samples}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if n_subjects and n_subjects * n_classes > n_samples:  # else fewer subjects than said
        raise ValueError(f"n_subjects={n_subjects} needs n_samples >= n_subjects x n_classes = "
                         f"{n_subjects * n_classes} (each subject has a sample of every class), "
                         f"got n_samples={n_samples}")
    y = np.arange(n_samples) % n_classes
    split = np.full(n_samples, "train", dtype="<U5")
    if n_subjects:
        subject = (np.arange(n_samples) // n_classes) % n_subjects
        n_test = min(n_subjects - 1, round(test_fraction * n_subjects))
        test_subjects = rng.permutation(n_subjects)[:n_test]
        split[np.isin(subject, test_subjects)] = "test"
        groups = np.array([f"sub-{s:03d}" for s in subject])
    else:
        subject = np.zeros(n_samples, int)
        for k in range(n_classes):  # stratified: the same test fraction in every class
            members = rng.permutation(np.flatnonzero(y == k))
            split[members[: round(test_fraction * members.size)]] = "test"
        groups = np.full(n_samples, "")
    return y, subject, groups, split


def _volumes(n_samples, n_classes, grid, snr_db, n_subjects, test_fraction, seed,
             smooth_noise=0.5, target=False) -> tuple[dict, Iterator[np.ndarray]]:
    """The cohort's design and a generator of its volumes, one float32 array per sample."""
    if not 0.0 <= smooth_noise <= 1.0:
        raise ValueError(f"smooth_noise must be in [0, 1], got {smooth_noise}")
    if not np.isfinite(snr_db):  # nan: every voxel NaN, an empty mask at conversion
        raise ValueError(f"snr_db must be a finite number of dB, got {snr_db}")
    shape, affine, n_voxels = grid_geometry(grid)
    mask = brain_mask(shape, n_voxels)
    rng = np.random.default_rng(seed)
    y, subject, groups, split = _design(n_samples, n_classes, n_subjects, test_fraction, rng)
    patterns = _class_patterns(rng, mask, n_classes)
    subject_seeds = rng.integers(2**31, size=max(n_subjects or 1, 1))
    sample_seeds = rng.integers(2**31, size=n_samples)
    noise_scale = 10.0 ** (-snr_db / 20.0)  # signal has unit power
    # the target from a generator of its own: a cohort without one is what it always was
    t, t_pattern = np.zeros(n_samples), np.zeros(mask.shape)
    if target:
        rng_t = np.random.default_rng([seed, 1])
        t, t_pattern = rng_t.standard_normal(n_samples), _class_patterns(rng_t, mask, 1)[0]
    design = dict(mask=mask, affine=affine, y=y, groups=groups, split=split,
                  target=t if target else None)

    def generate():
        subject_fields = {}
        for i in range(n_samples):
            s = subject[i]
            if s not in subject_fields:
                subject_fields[s] = _smooth_noise(np.random.default_rng(subject_seeds[s]), mask)
            r = np.random.default_rng(sample_seeds[i])
            smooth = _unit_rms(subject_fields[s] + _smooth_noise(r, mask), mask)
            white = _unit_rms(r.standard_normal(shape) * mask, mask)
            noise = np.sqrt(smooth_noise) * smooth + np.sqrt(1.0 - smooth_noise) * white
            noise = _unit_rms(noise * mask, mask)
            amplitude = r.uniform(0.8, 1.2)
            signal = amplitude * patterns[y[i]]
            if target:
                signal = signal + t[i] * t_pattern
            yield ((signal + noise_scale * noise) * mask).astype(np.float32)

    return design, generate()


def make_classification_volumes(n_samples: int = 40, n_classes: int = 4, *, grid="4mm",
                                snr_db: float = 0.0, n_subjects: int | None = None,
                                test_fraction: float = 0.25, seed: int = 0,
                                smooth_noise: float = 0.5, return_groups: bool = False):
    """Generate a SYNTHETIC cohort in memory, already masked.

    Same data as :func:`make_cohort` with the same arguments (before writing to NIfTI); the
    parameters are :func:`make_cohort`'s.

    Parameters
    ----------
    return_groups : bool, default=False
        Also return each sample's subject and split, the cohort table's ``group`` and
        ``split`` columns: for ``GroupKFold`` or ``fit(..., groups=)``.

    Returns
    -------
    X : ndarray of shape (n_samples, n_voxels), float32
        Rows are ``vol[mask]`` in C order.
    y : ndarray of shape (n_samples,), int
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    groups : ndarray of shape (n_samples,), str
        Only with ``return_groups``: ``"sub-000"``...; ``""`` for all without ``n_subjects``.
    split : ndarray of shape (n_samples,), str
        Only with ``return_groups``: ``"train"`` or ``"test"`` (by subject with
        ``n_subjects``, else stratified by class), ``test_fraction`` of them tested.
    """
    design, volumes = _volumes(n_samples, n_classes, grid, snr_db, n_subjects, test_fraction,
                               seed, smooth_noise)
    mask = design["mask"]
    X = np.stack([vol[mask] for vol in volumes])
    out = (X, design["y"], mask, design["affine"])
    return out + (design["groups"], design["split"]) if return_groups else out


def make_cohort(out_dir, *, n_samples: int = 40, n_classes: int = 4, grid="4mm",
                snr_db: float = 0.0, n_subjects: int | None = None, test_fraction: float = 0.25,
                seed: int = 0, smooth_noise: float = 0.5, four_d: bool = False,
                compress: bool = True, target: bool = False) -> Path:
    """Write a SYNTHETIC NIfTI cohort and its cohort table.

    Parameters
    ----------
    out_dir : str or Path
        Created if needed; receives the images, ``cohort.csv`` and ``cohort.json``.
    n_samples, n_classes : int
        Balanced classes named ``class_0``, ``class_1``...
    grid : {"1mm", "2mm", "4mm"} or tuple of 3 int
        The 1 mm MNI grid (182x218x182, p = 1,827,243), the HCP grid (p = 270,806), the
        HCP-small grid (p = 33,854), or a tiny custom shape.
    snr_db : float
        10 log10(signal power / noise power) inside the mask.
    n_subjects : int, optional
        Group samples into subjects (column ``group``); the test split is then by subject.
    test_fraction : float
        Fraction of subjects (or of each class's samples) in the test split.
    seed : int
    smooth_noise : float, default=0.5
        Share of the noise power that is spatially smooth (Gaussian-filtered, half of it shared
        by the samples of a subject); the rest is white. Feature grouping averages white noise
        away but not smooth noise.
    four_d : bool
        Write one 4D file per (subject, class, split) instead of one 3D file per sample.
    compress : bool
        ``.nii.gz`` (True) or ``.nii``.
    target : bool, default=False
        Also a continuous target per sample (column ``target``, standard normal, for
        regression): each volume adds the target times a smooth pattern of its own, of the
        class patterns' power per unit of target. The images and labels of the other columns
        are drawn as without it, so the labels stay predictable too.

    Returns
    -------
    csv_path : Path
        The cohort table, columns path (relative to its folder), label, [target,] group,
        split.
    """
    out_dir = Path(out_dir)
    # the arguments checked first: a refused call leaves no empty folder behind
    design, volumes = _volumes(n_samples, n_classes, grid, snr_db, n_subjects, test_fraction,
                               seed, smooth_noise, target)
    if four_d and target:
        raise ValueError("four_d groups volumes by class, not by target: write a 3D file per "
                         "volume for a cohort with a target")
    out_dir.mkdir(parents=True, exist_ok=True)
    ext = ".nii.gz" if compress else ".nii"
    names = [f"class_{k}" for k in range(n_classes)]
    y, groups, split = design["y"], design["groups"], design["split"]
    rows = []

    def save(data, name):
        img = nib.Nifti1Image(data, design["affine"])
        img.header["descrip"] = _DESCRIP
        nib.save(img, out_dir / name)

    if not four_d:
        for i, vol in enumerate(volumes):
            name = f"synthetic_{i:05d}{ext}"
            save(vol, name)
            rows.append((name, names[y[i]], *([f"{design['target'][i]:.6g}"] if target else []),
                         groups[i], split[i]))
    else:
        vols = list(volumes)  # 4D mode is for small cohorts: files are grouped, not streamed
        keys = sorted({(groups[i], y[i], split[i]) for i in range(n_samples)})
        for j, (g, k, s) in enumerate(keys):
            members = [i for i in range(n_samples) if (groups[i], y[i], split[i]) == (g, k, s)]
            name = f"synthetic_series_{j:04d}{ext}"
            save(np.stack([vols[i] for i in members], axis=-1), name)
            rows.append((name, names[k], g, s))
    meta = dict(synthetic=True, generator="fgscale.images.make_cohort", n_samples=n_samples,
                n_classes=n_classes, grid=grid if isinstance(grid, str) else list(grid),
                snr_db=snr_db, smooth_noise=smooth_noise, n_subjects=n_subjects,
                test_fraction=test_fraction, seed=seed, four_d=four_d, target=target,
                n_voxels=int(design["mask"].sum()))
    (out_dir / "cohort.json").write_text(json.dumps(meta, indent=2) + "\n")
    # the table last, under a temporary name: its presence means a whole cohort (the demo
    # reuses a cohort whose table exists)
    csv_path = out_dir / "cohort.csv"
    with atomic_path(csv_path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")  # not csv's \r\n: grep, cut, awk
        writer.writerow(["path", "label", *(["target"] if target else []), "group", "split"])
        writer.writerows(rows)
    log.info("wrote synthetic cohort of %d samples (%d files) to %s", n_samples, len(rows),
             out_dir)
    return csv_path
