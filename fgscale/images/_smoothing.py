"""Spatial smoothing of volumes as nilearn's maskers smooth them (``smoothing_fwhm``).

A Gaussian kernel of the given full width at half maximum, in millimetres, applied along each
axis of the whole 3D volume before masking, its width in voxels taken from the affine's voxel
sizes; non-finite values are set to 0 first. These are nilearn's rules
(``nilearn.image.smooth_img``), so a decoder fitted with nilearn's ``smoothing_fwhm`` and one
fitted here see the same rows. Runs on conversion workers: numpy and scipy only.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

__all__ = ["smooth_volume"]

_FWHM_PER_SIGMA = np.sqrt(8 * np.log(2))


def smooth_volume(data: np.ndarray, affine: np.ndarray, fwhm) -> np.ndarray:
    """``data`` (3D) smoothed by a Gaussian of ``fwhm`` mm, as float32.

    Parameters
    ----------
    data : ndarray of shape (X, Y, Z)
    affine : ndarray of shape (4, 4)
        The volume's voxel-to-world transform: its columns' lengths are the voxel sizes.
    fwhm : float or None
        Full width at half maximum in mm; None or 0 leaves ``data`` as it is (as float32).

    Returns
    -------
    ndarray of shape (X, Y, Z), float32
        A new array.
    """
    out = np.array(data, dtype=np.float32)  # a copy: the caller's volume stays as read
    if fwhm is None or fwhm == 0:
        return out
    out[~np.isfinite(out)] = 0
    voxel_sizes = np.sqrt(np.sum(np.asarray(affine, np.float64)[:3, :3] ** 2, axis=0))
    for axis, sigma in enumerate(float(fwhm) / (_FWHM_PER_SIGMA * voxel_sizes)):
        if sigma > 0:
            ndimage.gaussian_filter1d(out, sigma, output=out, axis=axis)
    return out
