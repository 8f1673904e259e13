"""Per-voxel values of a store written as NIfTI maps: arrays, a bank's groupings, its Omega."""

from __future__ import annotations

import logging
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale._utils.files import atomic_path, check_writable
from fgscale.grouping._bank import omega_diagonal
from fgscale.images._nifti import unmask
from fgscale.store._banks import list_banks, open_bank
from fgscale.store._reader import Store, open_store

__all__ = ["export_map"]

log = logging.getLogger(__name__)


def export_map(store, out, *, values=None, grouping: int | None = None, omega: bool = False,
               bank: str | None = None) -> nib.Nifti1Image:
    """Write per-voxel values of a store as a NIfTI image on its grid.

    Exactly one of ``values``, ``grouping`` and ``omega`` is given.

    Parameters
    ----------
    store : Store or str or Path
    out : str or Path
        Output image (``.nii`` or ``.nii.gz``).
    values : array-like of shape (n_features,) or (n_maps, n_features), or a ``.npy`` path
    grouping : int, optional
        Row of the bank: the cluster labels of that grouping (it must be built), numbered
        from 1 (0 is outside the mask, as in nilearn's atlases).
    omega : bool
        The bank's Omega diagonal (see :func:`fgscale.grouping.omega_diagonal`); every grouping
        of the bank must be built.
    bank : str, optional
        Key of the bank (see :func:`fgscale.store.list_banks`) for ``grouping`` and ``omega``,
        read from the store or else its cache store; default the only bank of either.

    Returns
    -------
    img : nibabel.Nifti1Image

    Raises
    ------
    ValueError
        On a bad choice of values; for ``grouping`` and ``omega``: when the key is not one of
        the store's, or none is given and the store holds no bank or several (the message
        lists the keys), or the grouping is out of range or not built.
    """
    if sum(x is not None and x is not False for x in (values, grouping, omega)) != 1:
        raise ValueError("give exactly one of values, grouping or omega")
    if not str(out).lower().endswith((".nii", ".nii.gz")):
        raise ValueError(f"{out}: expected a NIfTI file name ending in .nii or .nii.gz")
    check_writable(out, "; choose another --out; nothing exported")
    store = store if isinstance(store, Store) else open_store(store)
    if values is not None:
        if bank is not None:
            raise ValueError("bank goes with grouping or omega, not with values")
        source = values
        if isinstance(values, (str, Path)):
            if not Path(values).is_file():
                raise FileNotFoundError(f"{values}: no such .npy file")
            with open(values, "rb") as f:  # else numpy reads any file as a pickle, refused
                npy = f.read(6) == b"\x93NUMPY"  # with advice to load it "unsafely"
            if not npy:
                raise ValueError(f"{values}: not a .npy file (numpy.save's format); expected an "
                                 "array of shape (p,) or (n, p)")
            try:  # never unpickled: a .npy of objects is refused
                values = np.load(values, allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:
                reason = "an array of objects, never unpickled" if "pickle" in str(exc) else exc
                raise ValueError(f"{values}: not a .npy array of numbers ({reason})") from None
        # said with the file and the store
        name = source if isinstance(source, (str, Path)) else "values"
        if not (np.issubdtype(np.asarray(values).dtype, np.number)
                or np.asarray(values).dtype == bool):
            raise ValueError(f"{name}: expected numbers, got dtype {np.asarray(values).dtype}")
        shape, p = np.shape(values), store.n_features
        if len(shape) not in (1, 2) or shape[-1] != p:
            raise ValueError(f"{name}: an array of shape {shape}; expected ({p},) or (n, {p}), "
                             f"a value per voxel of the mask of {store.path} ({p} voxels)")
    else:
        values = _bank_values(store, bank, grouping)
    img = unmask(values, store.mask, store.affine, store.space_codes)
    with atomic_path(out) as tmp:  # a run killed while writing leaves no half-written image
        nib.save(img, tmp)
    log.info("wrote %s, shape %s", out, img.shape)
    return img


def _bank_values(store: Store, key: str | None, grouping: int | None) -> np.ndarray:
    """Grouping ``grouping`` of bank ``key`` (default the only bank), or its Omega (None)."""
    if key is None:
        banks = list_banks(store)  # the store's and its cache's
        keys = sorted({b["key"] for b in banks})
        if len(keys) != 1:
            places = {"the store" if Path(b["location"]) == Path(store.path).resolve()
                      else "its cache store" for b in banks}
            raise ValueError(f"{store.path}: " + (
                "no bank in the store or its cache yet (build one with 'fgscale bank')"
                if not keys else
                f"{len(keys)} banks in {' and '.join(sorted(places, reverse=True))}, choose one "
                "(--bank KEY): " + ", ".join(keys)))
        key = keys[0]
    bank = open_bank(store, key)
    done = bank.done[:]
    if grouping is None:
        if not done.all():
            raise ValueError(f"{store.path}: bank {key!r} is incomplete ({int(done.sum())} of "
                             f"{done.size} groupings built); Omega needs all of them")
        return omega_diagonal(bank.labels)
    if not 0 <= grouping < done.size:
        raise ValueError(f"{store.path}: grouping {grouping} out of range, bank {key!r} has "
                         f"{done.size} groupings")
    if not done[grouping]:
        raise ValueError(f"{store.path}: grouping {grouping} of bank {key!r} is not built yet")
    # clusters numbered from 1: 0 is outside the mask, as in nilearn's parcellations
    return bank.labels[grouping].astype(np.int64) + 1
