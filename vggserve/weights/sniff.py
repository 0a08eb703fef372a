"""Recognise a weights file by its first bytes, never by its extension.

Formats: "safetensors" (8-byte little-endian header length, then a JSON object), "npz" (zip of .npy
members), "pth-zip" (zip with ``<folder>/data.pkl``, torch >= 1.6), "pth-legacy" (a pickle stream that starts
with torch's magic number), "keras-h5" (HDF5 signature at offset 0 or at a power-of-two user-block offset).

Each format is recognised by its whole signature, never by one byte: a safetensors header length is any 8 bytes,
so its first byte is a pickle's 0x80 in about 1 file of 32 (the test tries every value).
"""

import struct
import zipfile
from pathlib import Path

from ..errors import WeightsError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
ZIP_SIGNATURE = b"PK\x03\x04"
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# protocol-2 pickle of the magic number: PROTO 2, LONG1 with 10 bytes
TORCH_LEGACY_PREFIX = b"\x80\x02\x8a\x0a" + TORCH_LEGACY_MAGIC.to_bytes(10, "little")
PICKLE_PROTO = b"\x80"
# the safetensors library refuses longer headers; the shortest is "{}"
SAFETENSORS_MAX_HEADER = 100_000_000
SAFETENSORS_MIN_HEADER = 2


def detect_format(path: Path) -> str:
    """The format name of the file at `path`; WeightsError if it is none of the supported ones."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head:
        raise WeightsError(f"{path}: file is empty")
    if head.startswith(ZIP_SIGNATURE):
        return _zip_kind(path)
    if head.startswith(HDF5_SIGNATURE):
        return "keras-h5"
    if head.startswith(TORCH_LEGACY_PREFIX):
        return "pth-legacy"
    if _is_safetensors(head):
        return "safetensors"
    if head.startswith(PICKLE_PROTO):
        if _starts_with_torch_magic(path):
            return "pth-legacy"
        raise WeightsError(f"{path}: a Python pickle but not a torch checkpoint (no torch magic number)")
    if _hdf5_user_block(path):
        return "keras-h5"
    raise WeightsError(
        f"{path}: not a supported weights file (expected safetensors, .npz, torch .pth or Keras .h5)"
    )


def _is_safetensors(head: bytes) -> bool:
    """An 8-byte little-endian header length that a safetensors writer can produce, then the header's `{`.

    A length past the end of the file still counts: the reader then reports a truncated safetensors file, which
    says more than "not a supported weights file". No pickle matches: its PROTO opcode and the next ones make the
    first 8 bytes far larger than the longest header, or leave no `{` at byte 8.
    """
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (header_len,) = struct.unpack("<Q", head[:8])
    return SAFETENSORS_MIN_HEADER <= header_len <= SAFETENSORS_MAX_HEADER


def _zip_kind(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise WeightsError(f"{path}: truncated or damaged zip archive ({exc})") from None
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return "pth-zip"
    if names and all(n.endswith(".npy") for n in names):
        return "npz"
    raise WeightsError(f"{path}: a zip archive that is neither a numpy .npz nor a torch checkpoint")


def _hdf5_user_block(path: Path) -> bool:
    """HDF5 files may start with a user block of 512, 1024, 2048, ... bytes before the signature."""
    offset = 512
    with open(path, "rb") as f:
        while offset <= 1 << 20:
            f.seek(offset)
            block = f.read(8)
            if len(block) < 8:
                return False
            if block == HDF5_SIGNATURE:
                return True
            offset *= 2
    return False


def _starts_with_torch_magic(path: Path) -> bool:
    """A legacy checkpoint written with a pickle protocol other than 2: read its first pickle (restricted)."""
    from .torch_pickle import RestrictedUnpickler

    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, legacy=True).load() == TORCH_LEGACY_MAGIC
    except Exception:  # not a pickle we can read, or one that asks for globals: not a torch checkpoint
        return False
