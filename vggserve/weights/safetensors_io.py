"""safetensors: read by memory-mapping (zero-copy views), written atomically and byte-for-byte reproducibly.

File layout: 8-byte little-endian header length N, N bytes of JSON
``{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensor bytes; offsets are relative to the end of the header.
"""

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from ..tempfiles import temporary_beside
from .mapped import map_file, view, widen_bfloat16

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
    if not isinstance(metadata, dict):
        raise WeightsError(f"{path}: unreadable safetensors header (__metadata__ is not a JSON object)")
    base = 8 + header_len
    tensors = {key: _tensor(path, mapped, base, size, key, entry) for key, entry in header.items()}
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def _tensor(path, mapped, base: int, size: int, key: str, entry) -> np.ndarray:
    try:
        dtype_name, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if not isinstance(dtype_name, str) or not all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)):
            raise ValueError
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
        arr = widen_bfloat16(arr)
    return arr


def save_safetensors(tensors: dict[str, np.ndarray], path, metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` to `path` atomically: a temporary file in the same folder, fsync, then rename.

    The bytes depend only on the tensors and metadata: keys sorted, header JSON with sorted keys and no spaces,
    padded with spaces to a multiple of 8 bytes (so every float32 tensor is aligned). The `safetensors`
    package's writer keeps metadata in a hash map whose order changes from run to run, hence this writer.
    A crash or a full disk leaves either the old file or none, never a partial one. Returns the path; a file
    that cannot be written (folder not writable, a file where a folder should be, a folder at `path`, a full
    disk) is a one-line WeightsError.
    """
    path = Path(path)
    folder = path.parent
    arrays = {k: _little_endian(tensors[k], k) for k in sorted(tensors)}
    header = _header(arrays, metadata)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = temporary_beside(path)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            for arr in arrays.values():
                f.write(memoryview(arr).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _cannot_write(path, exc) from None
        raise
    _fsync_dir(folder)
    return path


def _cannot_write(path: Path, exc: OSError) -> WeightsError:
    return WeightsError(f"{path}: cannot write: {exc.strerror or exc}")


_NAMES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<f8"): "F64"}


def _little_endian(arr, key: str) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        raise WeightsError(f"{key}: cannot save dtype {arr.dtype} (float16, float32 or float64 only)")
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))


def _header(arrays: dict[str, np.ndarray], metadata: dict | None) -> bytes:
    entries, offset = {}, 0
    for key, arr in arrays.items():
        entries[key] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    if metadata:
        entries["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # not every platform can fsync a directory
