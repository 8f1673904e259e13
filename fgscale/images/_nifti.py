"""NIfTI at the edges: load images (path or image) with clear errors, and put vectors back.

Everything inside fgscale works on masked arrays: a volume ``vol`` becomes ``vol[mask]`` (C
order, as nilearn's maskers), and :func:`unmask` is its inverse, so weight maps written here can
be passed straight to ``nilearn.plotting``.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

log = logging.getLogger(__name__)

_READ_ERRORS = (OSError, EOFError, zlib.error, gzip.BadGzipFile, ValueError, OverflowError,
                nib.filebasedimages.ImageFileError, nib.wrapstruct.WrapStructError,
                nib.spatialimages.HeaderDataError)


def _name(img) -> str:
    return str(img.get_filename() or "<in-memory image>")


def load_img(img) -> nib.Nifti1Image:
    """Normalise a path or an image to a ``Nifti1Image`` (header only: data stays on disk).

    Parameters
    ----------
    img : str, Path or nibabel spatial image

    Returns
    -------
    img : nibabel.Nifti1Image

    Raises
    ------
    FileNotFoundError
        If the path does not exist.
    ValueError
        If the file is not a readable NIfTI image or the image is not 3D/4D.
    """
    if isinstance(img, (str, Path)):
        path = Path(img)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such NIfTI file")
        try:
            img = nib.load(path)
        except _READ_ERRORS as exc:
            raise ValueError(f"{path}: not a readable NIfTI image ({exc})") from exc
    if not isinstance(img, nib.spatialimages.SpatialImage):
        raise ValueError(f"expected a NIfTI path or a nibabel image, got {type(img).__name__}")
    if img.ndim not in (3, 4):
        raise ValueError(f"{_name(img)}: expected a 3D or 4D image, got shape {img.shape}")
    if not isinstance(img, nib.Nifti1Image):
        img = nib.Nifti1Image(img.dataobj, img.affine)
    return img


@dataclass(frozen=True)
class ImageHeader:
    """What the grid checks need of a NIfTI file: its shape and affine (no data)."""

    path: str
    shape: tuple[int, ...]
    affine: np.ndarray

    @property
    def ndim(self) -> int:
        return len(self.shape)


def read_header(path) -> ImageHeader:
    """Shape and affine of a NIfTI file, reading only its first bytes.

    A NIfTI-1 header (``.nii`` or ``.nii.gz``) is parsed straight from the first 348 bytes,
    without the image, file map and data proxy that ``nibabel.load`` builds around it:
    conversion checks every file's header before it starts, so this is paid once per file of
    the cohort before any work. Anything else (NIfTI-2, a truncated or foreign file) goes
    through :func:`load_img`, with its checks and errors.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    header : ImageHeader

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`load_img`.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        if path.suffix == ".gz":
            head = zlib.decompressobj(wbits=31).decompress(head, 348)
        header = nib.Nifti1Header(head[:348], check=True)
        single_file = header["magic"].item() == b"n+1"
        shape = tuple(int(n) for n in header.get_data_shape())
    except _READ_ERRORS:  # anything else goes through load_img, with its errors
        single_file, shape = False, ()
    if not single_file or len(shape) not in (3, 4):
        img = load_img(path)  # the general path, and its errors
        return ImageHeader(str(path), img.shape, img.affine)
    return ImageHeader(str(path), shape, header.get_best_affine())


def read_data(img) -> np.ndarray:
    """The image's voxel values as float32 (scaling applied), read now.

    Parameters
    ----------
    img : str, Path or nibabel image

    Returns
    -------
    data : ndarray of shape img.shape, float32

    Raises
    ------
    ValueError
        Naming the file, if its data cannot be read (truncated or corrupt gzip...).
    """
    img = load_img(img)
    try:
        # dataobj, not get_fdata: no float64 copy and no cache kept on the image.
        return np.asarray(img.dataobj, dtype=np.float32)
    except _READ_ERRORS as exc:
        raise ValueError(f"{_name(img)}: cannot read the image data, the file is truncated or "
                         f"corrupt ({type(exc).__name__}: {exc})") from exc


def read_image(path) -> tuple[nib.Nifti1Image, np.ndarray]:
    """Load a NIfTI file and its data as float32, with errors naming the file.

    A ``.gz`` file is decompressed in one zlib call and parsed from memory, rather than read
    through nibabel's GzipFile in small pieces: decompression is most of what conversion
    does (scripts/bench_convert.py compares it with ``nibabel.load(path).get_fdata()``).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    img : nibabel.Nifti1Image
        Header and affine (its data is in memory).
    data : ndarray of shape img.shape, float32
        Possibly a read-only view of the decompressed file: copy it to modify it.
    """
    path = Path(path)
    if path.suffix != ".gz" or not path.is_file():
        img = load_img(path)
        return img, read_data(img)
    raw = path.read_bytes()
    inflater = zlib.decompressobj(wbits=31)
    try:
        payload = inflater.decompress(raw)
    except zlib.error as exc:
        raise ValueError(f"{path}: cannot read the image data, the file is truncated or corrupt "
                         f"(zlib.error: {exc})") from exc
    if not inflater.eof or inflater.unused_data:  # truncated, or several gzip members
        img = load_img(path)
        return img, read_data(img)
    try:
        img = nib.Nifti1Image.from_bytes(payload)
    except _READ_ERRORS as exc:
        raise ValueError(f"{path}: not a readable NIfTI image ({exc})") from exc
    img = load_img(img)  # same checks as for a path (3D/4D)
    proxy = img.dataobj
    if proxy.dtype == np.float32 and proxy.slope == 1 and proxy.inter == 0:
        # already float32, unscaled: a view of the decompressed bytes, no copy
        size = int(np.prod(img.shape))
        if len(payload) < proxy.offset + 4 * size:
            raise ValueError(f"{path}: cannot read the image data, {len(payload)} bytes for "
                             f"{size} float32 voxels after a {proxy.offset}-byte header")
        data = np.frombuffer(payload, np.float32, size, proxy.offset)
        return img, data.reshape(img.shape, order="F")
    try:
        return img, np.asarray(proxy, dtype=np.float32)
    except _READ_ERRORS as exc:  # the header asks for more bytes than the file holds...
        raise ValueError(f"{path}: cannot read the image data, the file is truncated or corrupt "
                         f"({type(exc).__name__}: {exc})") from exc


def load_mask(img) -> tuple[np.ndarray, np.ndarray]:
    """A mask image as (bool array, affine): voxels finite and non-zero.

    Parameters
    ----------
    img : str, Path or nibabel image, 3D

    Returns
    -------
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    """
    img = load_img(img)
    if img.ndim != 3:
        raise ValueError(f"{_name(img)}: a mask must be 3D, got shape {img.shape}")
    data = read_data(img)
    mask = np.isfinite(data) & (data != 0)
    if not mask.any():
        raise ValueError(f"{_name(img)}: the mask is empty (no finite non-zero voxel)")
    return mask, img.affine


def unmask(values, mask, affine) -> nib.Nifti1Image:
    """Put per-voxel values back on the grid, zeros outside the mask.

    Parameters
    ----------
    values : array-like of shape (n_features,) or (n_maps, n_features)
        ``n_features == mask.sum()``, in C-order mask order.
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)

    Returns
    -------
    img : nibabel.Nifti1Image
        3D for a vector, 4D of shape grid_shape + (n_maps,) for a matrix. Float values are
        stored as float32, integers as int32.
    """
    values = np.asarray(values)
    mask = np.asarray(mask, dtype=bool)
    p = int(mask.sum())
    if values.ndim not in (1, 2) or values.shape[-1] != p:
        raise ValueError(f"values must have shape ({p},) or (n, {p}) to match the mask, "
                         f"got {values.shape}")
    dtype = np.int32 if np.issubdtype(values.dtype, np.integer) else np.float32
    if values.ndim == 1:
        out = np.zeros(mask.shape, dtype)
        out[mask] = values
    else:
        out = np.zeros((*mask.shape, values.shape[0]), dtype)
        out[mask] = values.T
    return nib.Nifti1Image(out, np.asarray(affine, dtype=np.float64))
