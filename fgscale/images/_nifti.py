"""NIfTI at the edges: load images (path or image) with clear errors, and put vectors back.

Everything inside fgscale works on masked arrays: a volume ``vol`` becomes ``vol[mask]`` (C
order, as nilearn's maskers), and :func:`unmask` is its inverse, so weight maps written here can
be passed straight to ``nilearn.plotting``.
"""

from __future__ import annotations

import collections
import gzip
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

log = logging.getLogger(__name__)

try:  # inflates gzip about twice as fast as zlib, with the same API and the same bytes
    from zlib_ng import zlib_ng as _zlib
except ImportError:
    _zlib = zlib

_READ_ERRORS = (OSError, EOFError, zlib.error, _zlib.error, gzip.BadGzipFile, ValueError,
                OverflowError, nib.filebasedimages.ImageFileError, nib.wrapstruct.WrapStructError,
                nib.spatialimages.HeaderDataError)


def _name(img) -> str:
    return str(img.get_filename() or "<in-memory image>")


def _why(exc: BaseException) -> str:
    """An error's text on one line (nibabel's "Expected N bytes, got M bytes from F\n - could
    the file be damaged?" would break the one line a refused file gets)."""
    return " ".join(str(exc).split())


def load_img(img, name: str | None = None) -> nib.Nifti1Image:
    """Normalise a path or an image to a ``Nifti1Image`` (header only: data stays on disk).

    Parameters
    ----------
    img : str, Path or nibabel spatial image
    name : str, optional
        The file to name in errors, for an image read from its bytes; default the image's own.

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
    given = img
    if isinstance(img, (str, Path)):
        path = Path(img).expanduser()  # "~/betas/x.nii.gz", as nilearn reads it
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such NIfTI file")
        try:
            img = nib.load(path)
        except _READ_ERRORS as exc:
            raise ValueError(f"{path}: not a readable NIfTI image ({_why(exc)})") from exc
    if not isinstance(img, nib.spatialimages.SpatialImage):
        raise ValueError(f"expected a NIfTI path or a nibabel image, got {type(img).__name__}")
    _check_shape(name := name or _name(img), img.shape)
    _check_values(name, img.get_data_dtype(), img.affine)
    if not isinstance(img, nib.Nifti1Image):
        data = getattr(img.file_map.get("image"), "filename", None)  # a pair's .img
        if data and not Path(data).is_file():  # named as given: the .hdr of the table
            raise ValueError(f"{given if isinstance(given, (str, Path)) else _name(img)}: not a "
                             f"readable NIfTI image (its data file {data} is missing)")
        img = nib.Nifti1Image.from_image(img)  # with its header: an MNI pair stays MNI
    return img


def _check_shape(name: str, shape) -> None:
    """Refuse what gives no row: another number of axes, or an axis of length 0 (a 4D file of
    no volume, as an interrupted merge writes it, would otherwise add no row without a word)."""
    if len(shape) not in (3, 4):
        raise ValueError(f"{name}: expected a 3D or 4D image, got shape {shape}")
    if 0 in shape:
        raise ValueError(f"{name}: image of shape {shape} holds no voxel (an axis of length 0); "
                         "expected a 3D image or a 4D one of at least one volume")


def _check_values(name: str, dtype, affine) -> None:
    """Refuse what no voxel value or grid can be made of: RGB or complex voxels (one number per
    voxel is what is masked; numpy would drop the imaginary part without a word) and an affine
    that is not finite or not invertible (voxel sizes of 0 or NaN: no grid to resample from)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        what = "complex numbers" if dtype.kind == "c" else "not one number"
        raise ValueError(f"{name}: voxels of type {dtype} ({what}); expected one real number per "
                         "voxel (integers or floats)")
    if affine is None:  # an in-memory image without one: nibabel's default grid
        return
    affine = np.asarray(affine, dtype=np.float64)
    if not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise ValueError(f"{name}: affine {np.round(affine, 4).tolist()} is not an invertible "
                         "voxel-to-world matrix (voxel sizes 0 or NaN in the header's "
                         "qform/sform/pixdim); expected finite, non-zero voxel sizes")


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
            head = _zlib.decompressobj(wbits=31).decompress(head, 348)
    except _READ_ERRORS:
        head = b""
    parsed = _single_file_header(head, check=True)
    if parsed is None:
        img = load_img(path)  # the general path, and its errors
        return ImageHeader(str(path), img.shape, img.affine)
    header, shape = parsed
    affine = header.get_best_affine()
    _check_shape(str(path), shape)
    _check_values(str(path), header.get_data_dtype(), affine)
    return ImageHeader(str(path), shape, affine)


def _single_file_header(head: bytes, *, check: bool):
    """``(header, shape)`` of a single-file NIfTI-1 3D or 4D image from its first bytes, or
    None for anything else (NIfTI-2, a truncated or foreign file, another number of axes)."""
    try:
        # checked only once known to be a NIfTI-1 header: checking the first bytes of a NIfTI-2
        # file, or of an Analyze .img, logs nibabel's ERROR lines for a file that then loads
        header = nib.Nifti1Header(head[:348], check=False)
        shape = tuple(int(n) for n in header.get_data_shape())
        if header["magic"].item() != b"n+1" or len(shape) not in (3, 4):
            return None
        if check:
            header.check_fix()
    except _READ_ERRORS:
        return None
    return header, shape


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
                         f"corrupt ({type(exc).__name__}: {_why(exc)})") from exc


def _inflate(path: Path) -> bytes | None:
    """The decompressed bytes of a one-member ``.gz`` file in one zlib call (which releases the
    GIL, so thread workers inflate in parallel), or None for anything else."""
    if path.suffix != ".gz" or not path.is_file():
        return None
    raw = path.read_bytes()
    inflater = _zlib.decompressobj(wbits=31)
    try:
        payload = inflater.decompress(raw)
    except _zlib.error as exc:
        raise ValueError(f"{path}: cannot read the image data, the file is truncated or corrupt "
                         f"(zlib.error: {_why(exc)})") from exc
    if not inflater.eof or inflater.unused_data:  # truncated, or several gzip members
        return None
    return payload


def _float32_view(payload: bytes, shape, offset: int, path: Path) -> np.ndarray:
    size = int(np.prod(shape))
    if len(payload) < offset + 4 * size:
        raise ValueError(f"{path}: cannot read the image data, {len(payload)} bytes for "
                         f"{size} float32 voxels after a {offset}-byte header")
    return np.frombuffer(payload, np.float32, size, offset).reshape(shape, order="F")


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
    payload = _inflate(path)
    if payload is None or _single_file_header(payload, check=False) is None:
        # not a one-member .gz NIfTI-1 file (a NIfTI-2 one, say): nibabel's general path
        img = load_img(path)
        return img, read_data(img)
    try:
        img = nib.Nifti1Image.from_bytes(payload)
    except _READ_ERRORS as exc:
        raise ValueError(f"{path}: not a readable NIfTI image ({_why(exc)})") from exc
    img = load_img(img, str(path))  # same checks as for a path (3D/4D)
    proxy = img.dataobj
    if proxy.dtype == np.float32 and proxy.slope == 1 and proxy.inter == 0:
        # already float32, unscaled: a view of the decompressed bytes, no copy
        return img, _float32_view(payload, img.shape, proxy.offset, path)
    try:
        return img, np.asarray(proxy, dtype=np.float32)
    except _READ_ERRORS as exc:  # the header asks for more bytes than the file holds...
        raise ValueError(f"{path}: cannot read the image data, the file is truncated or corrupt "
                         f"({type(exc).__name__}: {_why(exc)})") from exc


def read_array(path) -> np.ndarray:
    """The data of a NIfTI file as float32, as :func:`read_image` gives it, without the image.

    For the common case of conversion, a ``.gz`` NIfTI-1 file of float32 unscaled 3D or 4D
    data, only the 348-byte header is parsed and the data is a view of the decompressed bytes:
    the per-file Python work that building a nibabel image costs (and that holds the GIL while
    thread workers could inflate other files) is skipped. Anything else goes through
    :func:`read_image`, with its checks and errors.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    data : ndarray, float32
        Possibly a read-only view of the decompressed file: copy it to modify it.
    """
    path = Path(path)
    payload = _inflate(path)
    # check=False: the header pass of a conversion (read_header) checked the file already
    parsed = None if payload is None else _single_file_header(payload, check=False)
    if parsed is not None:
        header, shape = parsed
        try:
            slope, inter = header.get_slope_inter()
        except _READ_ERRORS:  # a valid slope with an invalid intercept
            slope = inter = np.nan
        if (header.get_data_dtype() == np.float32 and slope in (None, 1.0)
                and inter in (None, 0.0)):
            return _float32_view(payload, shape, int(header.get_data_offset()), path)
    return read_image(path)[1]


def load_mask(img) -> tuple[np.ndarray, np.ndarray]:
    """A mask image as (bool array, affine): voxels finite and non-zero (NaN outside the brain
    is outside the mask), as nilearn's maskers read one.

    Parameters
    ----------
    img : str, Path or nibabel image
        3D, or 4D of one volume (as some tools write masks; nilearn takes it as 3D).

    Returns
    -------
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    """
    img = load_img(img)
    if img.ndim != 3 and img.shape[3:] != (1,):
        raise ValueError(f"{_name(img)}: a mask must be 3D (or 4D of one volume), got shape "
                         f"{img.shape}")
    data = read_data(img).reshape(img.shape[:3])
    mask = np.isfinite(data) & (data != 0)
    if not mask.any():
        raise ValueError(f"{_name(img)}: the mask is empty (no finite non-zero voxel)")
    return mask, img.affine


def nonzero_voxels(name: str, data: np.ndarray, remedy: str) -> np.ndarray:
    """Where ``data`` is finite and non-zero: the voxels a mask computed from the images keeps.
    An image with none (a failed contrast) is refused by ``name``, with ``remedy``: it would
    otherwise empty the mask unnamed."""
    keep = np.isfinite(data) & (data != 0)
    if not keep.any():
        raise ValueError(f"{name}: no voxel is finite and non-zero (all zero or NaN), so no "
                         f"voxel is in every image: drop it, or {remedy}")
    return keep


def space_codes(img) -> list[int]:
    """``[qform_code, sform_code]`` of an image's header: the space its affine maps to (1
    scanner, 2 aligned, 3 Talairach, 4 MNI; 0 unknown)."""
    return [int(img.header["qform_code"]), int(img.header["sform_code"])]


def with_space_codes(img: nib.Nifti1Image, codes) -> nib.Nifti1Image:
    """``img`` with the :func:`space_codes` of the images it was made from, so that a viewer
    puts it in their space (AFNI: the view of an MNI template); codes of 0 (or None) leave
    nibabel's default (sform 'aligned')."""
    qform, sform = codes if codes is not None else (0, 0)
    if sform:
        img.set_sform(img.affine, code=int(sform))
    if qform:
        img.set_qform(img.affine, code=int(qform))
    return img


def unmask(values, mask, affine, codes=None) -> nib.Nifti1Image:
    """Put per-voxel values back on the grid, zeros outside the mask.

    Parameters
    ----------
    values : array-like of shape (n_features,) or (n_maps, n_features)
        ``n_features == mask.sum()``, in C-order mask order.
    mask : ndarray of shape grid_shape, bool
    affine : ndarray of shape (4, 4)
    codes : [qform_code, sform_code], optional
        The space of the images the mask came from (:func:`with_space_codes`).

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
    return with_space_codes(nib.Nifti1Image(out, np.asarray(affine, dtype=np.float64)), codes)


GRID_ATOL = 1e-4  # mm: affines equal up to what a header's float32 fields keep


def same_grid(shape, affine, grid) -> bool:
    """Whether a volume of spatial ``shape`` and ``affine`` lies on ``grid`` (shape, affine)."""
    return (tuple(shape[:3]) == tuple(grid[0])
            and np.allclose(affine, grid[1], atol=GRID_ATOL))


def common_grid(headers) -> tuple[int, int]:
    """Of images' ``headers`` (each with a shape and an affine), the first one on the grid that
    most of them share (the first image's, unless another grid is shared by more), and how many
    share it: the reference that names the odd image, not the good one after it."""
    keys = [(tuple(h.shape[:3]), np.round(np.asarray(h.affine, float), 3).tobytes())
            for h in headers]
    counts = collections.Counter(keys)
    most = max(counts.values())
    return next(i for i, k in enumerate(keys) if counts[k] == most), most


def grid_mismatch(name: str, shape, affine, grid, reference: str, hint: str = "") -> str:
    """The message that refuses ``name`` (of spatial ``shape`` and ``affine``): not on the
    ``reference``'s grid (shape, affine); ``hint`` says how to allow it, if anything can."""
    return (f"{name}: grid {tuple(shape[:3])} with affine {np.round(affine, 4).tolist()} does "
            f"not match the {reference}'s grid {tuple(grid[0])} with affine "
            f"{np.round(grid[1], 4).tolist()}{hint}")
