"""Per-voxel values of a store written as NIfTI maps: arrays, a bank's groupings, its Omega."""

from __future__ import annotations

import logging
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale.grouping._bank import omega_diagonal
from fgscale.images._nifti import unmask
from fgscale.store._reader import Store, open_store

__all__ = ["export_map"]

log = logging.getLogger(__name__)


def export_map(store, out, *, values=None, grouping: int | None = None,
               omega: bool = False) -> nib.Nifti1Image:
    """Write per-voxel values of a store as a NIfTI image on its grid.

    Exactly one of ``values``, ``grouping`` and ``omega`` is given.

    Parameters
    ----------
    store : Store or str or Path
    out : str or Path
        Output image (``.nii`` or ``.nii.gz``).
    values : array-like of shape (n_features,) or (n_maps, n_features), or a ``.npy`` path
    grouping : int, optional
        Row of the store's bank: the cluster labels of that grouping.
    omega : bool
        The bank's Omega diagonal (see :func:`fgscale.grouping.omega_diagonal`).

    Returns
    -------
    img : nibabel.Nifti1Image
    """
    if sum(x is not None and x is not False for x in (values, grouping, omega)) != 1:
        raise ValueError("give exactly one of values, grouping or omega")
    store = store if isinstance(store, Store) else open_store(store)
    if values is not None:
        if isinstance(values, (str, Path)):
            if not Path(values).is_file():
                raise FileNotFoundError(f"{values}: no such .npy file")
            values = np.load(values)
    else:
        if "bank" not in store.group:
            raise ValueError(f"{store.path}: no bank in the store yet (build one first)")
        bank = store.group["bank"]
        if grouping is not None:
            if not 0 <= grouping < bank.shape[0]:
                raise ValueError(f"{store.path}: grouping {grouping} out of range, the bank has "
                                 f"{bank.shape[0]} groupings")
            values = bank[grouping]
        else:
            values = omega_diagonal(bank)
    img = unmask(values, store.mask, store.affine)
    nib.save(img, out)
    log.info("wrote %s, shape %s", out, img.shape)
    return img
