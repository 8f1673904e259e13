"""Some volumes of a 4D NIfTI file, read without reading the whole file.

Conversion writes a store a block of rows at a time, and a block holds a few volumes of a long
fMRI run (at 1 mm, 8 of its 300): reading the whole run for every block would inflate it once
per block and hold all of it in memory in every worker thread. :func:`read_volumes` reads the
bytes of the volumes asked for: an uncompressed file through nibabel's slicing (a seek), a
``.gz`` one by inflating only up to its last volume. The inflater's state at the end of each
read is kept (:data:`_RESUME`), so that the next block of the same file, which starts there,
goes on from it rather than from the file's first byte: the blocks of a run, converted in
order, inflate it about once in all.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale.images._nifti import _READ_ERRORS, _why, _zlib, load_img, read_array, read_image

__all__ = ["iter_volumes", "read_volumes"]

_CHUNK = 1 << 20  # compressed bytes read at a time
_OUT = 1 << 24  # inflated bytes at most per zlib call: a run of zeros inflates 1000-fold

# (path, size, mtime) -> {inflated position: (compressed position, inflater copy)}, the files
# used longest ago dropped first; an inflater's state is its 32 KiB window and a little more
_RESUME: OrderedDict[tuple, dict[int, tuple[int, object]]] = OrderedDict()
_RESUME_FILES = 16
_RESUME_LOCK = threading.Lock()


def read_volumes(path, start: int, stop: int, n_volumes: int, *, image: bool = False):
    """Volumes ``start`` to ``stop - 1`` of a NIfTI file as float32 (scaling applied).

    Parameters
    ----------
    path : str or Path
    start, stop : int
        The volumes, along the 4th axis.
    n_volumes : int
        The file's volumes (1 for a 3D file), as its header, read beforehand, says: all of
        them are read at once, through :func:`read_array` (or :func:`read_image`), without
        parsing the header again.
    image : bool, default=False
        Return the image too (its header and affine), as :func:`read_image` does.

    Returns
    -------
    data : ndarray of shape (X, Y, Z, stop - start), float32
        The same numbers as ``read_array(path)[..., start:stop]`` (all of ``read_array(path)``,
        3D or 4D, when the volumes are all the file's); possibly read-only.
    img : nibabel.Nifti1Image
        With ``image=True``: ``(img, data)``.
    """
    path = Path(path)
    if (start, stop) == (0, n_volumes):
        return read_image(path) if image else read_array(path)
    img = load_img(path)  # the header only: the data stays on disk
    data = None
    if path.suffix == ".gz" and isinstance(img, nib.Nifti1Image):
        data = _gz_volumes(path, img, start, stop)
    if data is None:  # uncompressed (a seek), or a .gz file of several members
        try:
            data = np.asarray(img.dataobj[..., start:stop], dtype=np.float32)
        except _READ_ERRORS as exc:
            raise ValueError(f"{path}: cannot read the image data, the file is truncated or "
                             f"corrupt ({type(exc).__name__}: {_why(exc)})") from exc
    return (img, data) if image else data


def iter_volumes(sources, grid, resampled: bool):
    """Yield each ``(path, volume, volumes of the file)`` of ``sources`` (a block of rows of a
    conversion) as a float32 array on the target ``grid`` (``(shape, affine)``), resampled to
    it (linear) when ``resampled``."""
    # a 4D file's rows are consecutive: its volumes in this block are read at once, and only
    # they (read_volumes), rather than the whole run once per block
    for (path, n_volumes), run in itertools.groupby(sources, key=lambda s: (s[0], s[2])):
        volumes = [source[1] for source in run]
        first, stop = min(volumes), max(volumes) + 1
        img, data = (read_volumes(path, first, stop, n_volumes, image=True) if resampled else
                     (None, read_volumes(path, first, stop, n_volumes)))
        for volume in volumes:
            vol = data if data.ndim == 3 else data[..., volume - first]
            if resampled:
                # here: nibabel.processing imports scipy.ndimage, a tenth of a second that a
                # conversion without resampling (most) should not pay
                from nibabel.processing import resample_from_to

                vol = resample_from_to(nib.Nifti1Image(vol, img.affine), grid,
                                       order=1).get_fdata(dtype=np.float32)
            yield vol


def _gz_volumes(path: Path, img, start: int, stop: int) -> np.ndarray | None:
    """The volumes from a single-member ``.gz`` file, inflated up to the last one; None for a
    file of several gzip members (nibabel's reader then reads it)."""
    header = img.header
    offset = int(img.dataobj.offset)  # in the file (the loaded header's vox_offset is reset)
    if offset < header.sizeof_hdr:  # a damaged header: nibabel's reader says what is wrong
        return None
    volume = int(np.prod(img.shape[:3])) * header.get_data_dtype().itemsize
    first, last = offset + start * volume, offset + stop * volume
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    (position, compressed), inflater = _resume_point(key, first)
    part = bytearray()
    with open(path, "rb") as f:
        f.seek(compressed)
        data = b""
        while position < last and not inflater.eof:
            if not data:
                data = f.read(_CHUNK)
                if not data:
                    break
            try:  # never past ``last``: the state kept there is where the next block starts
                out = inflater.decompress(data, min(_OUT, last - position))
            except _zlib.error as exc:
                raise ValueError(f"{path}: cannot read the image data, the file is truncated or "
                                 f"corrupt (zlib.error: {_why(exc)})") from exc
            data = inflater.unconsumed_tail
            if position + len(out) > first:
                part += out[max(first - position, 0):]
            position += len(out)
        compressed = f.tell() - len(data)
    if inflater.eof and inflater.unused_data:  # another gzip member follows
        return None
    if position < last:
        raise ValueError(f"{path}: cannot read the image data, the file is truncated or corrupt "
                         f"({position - offset} bytes of data, {last - offset} needed up to "
                         f"volume {stop - 1})")
    if not inflater.eof:
        _keep(key, position, compressed, inflater.copy())
    sub = header.copy()
    sub.set_data_shape((*img.shape[:3], stop - start))
    sub.set_data_offset(offset)
    sub.set_slope_inter(img.dataobj.slope, img.dataobj.inter)  # kept by the proxy, not the header
    block = sub.binaryblock  # the header of the volumes read, their bytes at its vox_offset:
    blob = bytes(block) + bytes(offset - len(block)) + bytes(part)  # scaled as the whole file
    try:
        return np.asarray(type(img).from_bytes(blob).dataobj, dtype=np.float32)
    except _READ_ERRORS as exc:
        raise ValueError(f"{path}: cannot read the image data ({type(exc).__name__}: "
                         f"{_why(exc)})") from exc


def _resume_point(key: tuple, first: int):
    """((inflated, compressed) position, inflater) to start from: the kept state furthest into
    the file that is not past ``first``, else the file's start."""
    with _RESUME_LOCK:
        states = _RESUME.get(key, {})
        best = max((p for p in states if p <= first), default=None)
        if best is not None:
            _RESUME.move_to_end(key)
            compressed, inflater = states[best]
            return (best, compressed), inflater.copy()  # copies: other threads may resume too
    return (0, 0), _zlib.decompressobj(wbits=31)


def _keep(key: tuple, position: int, compressed: int, inflater) -> None:
    with _RESUME_LOCK:
        states = _RESUME.setdefault(key, {})
        states[position] = (compressed, inflater)
        _RESUME.move_to_end(key)
        while len(states) > 8:  # the points furthest back are the least likely resumed
            del states[min(states)]
        while len(_RESUME) > _RESUME_FILES:
            _RESUME.popitem(last=False)
