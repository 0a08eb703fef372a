"""safetensors: read by memory-mapping (zero-copy views), write atomically with the `safetensors` package.

File layout: 8-byte little-endian header length N, N bytes of JSON
``{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensor bytes; offsets are relative to the end of the header.
"""

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from .mapped import map_file, view

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


def read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata). Float tensors only; BF16 is widened to float32 (a copy), the rest are views."""
    size = path.stat().st_size
    if size < 8:
        raise WeightsError(f"{path}: truncated safetensors file ({size} bytes)")
    mapped = map_file(path)
    (header_len,) = struct.unpack("<Q", mapped[:8])
    if 8 + header_len > size:
        raise WeightsError(f"{path}: truncated safetensors file (header of {header_len} bytes, file has {size})")
    try:
        header = json.loads(bytes(mapped[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: unreadable safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + header_len
    tensors = {key: _tensor(path, mapped, base, size, key, entry) for key, entry in header.items()}
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def _tensor(path, mapped, base: int, size: int, key: str, entry) -> np.ndarray:
    try:
        dtype_name, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise WeightsError(f"{path}: {key}: malformed safetensors header entry") from None
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise WeightsError(f"{path}: {key}: dtype {dtype_name} is not a float type (F32, F16, BF16, F64)")
    count = int(np.prod(shape, dtype=np.int64))
    if end - begin != count * dtype.itemsize or begin < 0:
        raise WeightsError(f"{path}: {key}: data size {end - begin} does not match shape {shape} of {dtype_name}")
    if base + end > size:
        raise WeightsError(f"{path}: {key}: truncated file (tensor ends at byte {base + end}, file has {size})")
    arr = view(mapped, dtype, base + begin, count).reshape(shape)
    if dtype_name == "BF16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def save_safetensors(tensors: dict[str, np.ndarray], path, metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` to `path` atomically: a temporary file in the same folder, fsync, then rename.

    A crash or a full disk leaves either the old file or none, never a partial one. Returns the path.
    """
    from safetensors.numpy import save_file

    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata=meta or None)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return path


def _fsync(name) -> None:
    fd = os.open(name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        _fsync(folder)
    except OSError:
        pass  # not every platform can fsync a directory
