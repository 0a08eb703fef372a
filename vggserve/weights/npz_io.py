"""numpy .npz: a zip of .npy members. Stored (np.savez) members are memory-mapped; compressed ones are read."""

import io
import zipfile
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from .mapped import map_file, stored_member_span, view


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Arrays keyed by member name without ``.npy``; object (pickled) arrays are refused."""
    try:
        mapped = map_file(path)
        with zipfile.ZipFile(path) as zf:
            return {info.filename[:-4]: _member(path, zf, mapped, info) for info in zf.infolist()}
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise WeightsError(f"{path}: truncated or damaged .npz ({exc})") from None


def _member(path: Path, zf: zipfile.ZipFile, mapped, info: zipfile.ZipInfo) -> np.ndarray:
    key = info.filename[:-4]
    span = stored_member_span(mapped, info)
    try:
        header = None if span is None else _npy_header(mapped, *span)
        if header is None:  # compressed member, or a .npy version without a public header reader
            return np.load(io.BytesIO(zf.read(info)), allow_pickle=False)
        shape, fortran, dtype, data_offset = header
    except ValueError as exc:
        raise WeightsError(f"{path}: {key}: unreadable array ({exc})") from None
    if dtype.hasobject:
        raise WeightsError(f"{path}: {key}: object arrays are not weights")
    count = int(np.prod(shape, dtype=np.int64))
    offset, size = span
    if data_offset + count * dtype.itemsize > size:
        raise WeightsError(f"{path}: {key}: truncated array data")
    arr = view(mapped, dtype, offset + data_offset, count)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _npy_header(mapped, offset: int, size: int):
    """(shape, fortran_order, dtype, data offset within the member) of a .npy member, or None."""
    head = io.BytesIO(mapped[offset : offset + min(size, 65536)])
    version = np.lib.format.read_magic(head)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if reader is None:
        return None
    shape, fortran, dtype = reader(head)
    return shape, fortran, dtype, head.tell()
