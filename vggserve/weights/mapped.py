"""Read-only memory maps of weight files, and numpy views into them (no copies)."""

import mmap
import struct
import zipfile
from pathlib import Path

import numpy as np


def map_file(path: Path) -> mmap.mmap:
    """The whole file, mapped read-only. Arrays viewing it keep the map alive; the descriptor is closed."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def view(buffer, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """`count` items of `dtype` at byte `offset` of `buffer`, as a read-only array (copied only if misaligned)."""
    arr = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
    return arr if arr.flags.aligned else arr.copy()


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values stored as uint16 -> float32 (a copy): bfloat16 is the top half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored_member_span(mapped: mmap.mmap, info: zipfile.ZipInfo) -> tuple[int, int] | None:
    """(offset, size) of an uncompressed zip member's bytes inside the mapped archive; None if compressed.

    The local file header is 30 bytes plus its own name and extra field lengths, which may differ from the
    central directory's, so they are read from the local header itself.
    """
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    start = info.header_offset
    header = mapped[start : start + 30]
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        return None
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    offset = start + 30 + name_len + extra_len
    if offset + info.file_size > len(mapped):
        return None
    return offset, info.file_size
