"""torch .pth checkpoints without torch, in both on-disk formats.

zip (torch >= 1.6): ``<folder>/data.pkl`` is the pickle; storage ``key`` is the member ``<folder>/data/<key>``
(stored uncompressed, so it is memory-mapped); ``<folder>/byteorder`` says "little" or "big" (absent = little).

legacy (``vgg16-397923af.pth`` and other files from torch < 1.6, or ``_use_new_zipfile_serialization=False``):
five pickles in a row - the magic number 0x1950a86a20f9469cfc6c, the protocol version 1001, a sys-info dict
(byte order, type sizes), the state dict, the sorted list of storage keys - then, for each key in that order,
an 8-byte little-endian element count followed by the storage's raw bytes.

Every pickle goes through `torch_pickle.RestrictedUnpickler`.
"""

import zipfile
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from .mapped import map_file, stored_member_span, view, widen_bfloat16
from .sniff import TORCH_LEGACY_MAGIC
from .torch_pickle import BF16, RestrictedUnpickler, StorageRef, UnsafePickle, collect_tensors, tensor_array

LEGACY_PROTOCOL = 1001


def read_pth(path: Path, fmt: str) -> dict[str, np.ndarray]:
    """Tensors of a torch checkpoint (fmt "pth-zip" or "pth-legacy") as numpy arrays, keyed as in the file."""
    try:
        reader = _read_zip if fmt == "pth-zip" else _read_legacy
        return reader(path)
    except UnsafePickle as exc:
        raise WeightsError(
            f"{path}: refused: the checkpoint's pickle asks for the global {exc}, which a tensor checkpoint never "
            "needs (it could run code); nothing from it was executed"
        ) from None
    except WeightsError as exc:
        message = str(exc)
        raise WeightsError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    except Exception as exc:  # a damaged pickle or archive can fail in many ways; none may escape as a crash
        raise WeightsError(f"{path}: truncated or damaged torch checkpoint ({type(exc).__name__}: {exc})") from None


def _read_zip(path: Path) -> dict[str, np.ndarray]:
    mapped = map_file(path)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        pkl = next((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), None)
        if pkl is None:
            raise WeightsError("no data.pkl in the archive")
        prefix = pkl[: -len("data.pkl")]
        byteorder = zf.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        with zf.open(pkl) as f:
            unpickler = RestrictedUnpickler(f, legacy=False)
            refs = collect_tensors(unpickler.load(), "data.pkl")
        storages = {}
        for key, ref in unpickler.storages.items():
            member = f"{prefix}data/{key}"
            if member not in names:
                raise WeightsError(f"storage {key}: member {member} missing from the archive")
            storages[key] = _zip_storage(zf, mapped, zf.getinfo(member), ref, byteorder)
    return {name: _finish(tensor_array(ref, storages[ref.storage.key], name), ref) for name, ref in refs.items()}


def _zip_storage(zf, mapped, info: zipfile.ZipInfo, ref: StorageRef, byteorder: str) -> np.ndarray:
    dtype = _dtype(ref, byteorder)
    nbytes = ref.numel * dtype.itemsize
    if info.file_size < nbytes:
        raise WeightsError(f"storage {ref.key}: {info.file_size} bytes, need {nbytes} (truncated file?)")
    span = stored_member_span(mapped, info)
    if span is not None:
        return view(mapped, dtype, span[0], ref.numel)
    return np.frombuffer(zf.read(info), dtype=dtype, count=ref.numel)


def _read_legacy(path: Path) -> dict[str, np.ndarray]:
    mapped = map_file(path)
    with open(path, "rb") as f:
        magic = RestrictedUnpickler(f, legacy=True).load()
        if magic != TORCH_LEGACY_MAGIC:
            raise WeightsError("not a torch checkpoint (wrong magic number)")
        protocol = RestrictedUnpickler(f, legacy=True).load()
        if protocol != LEGACY_PROTOCOL:
            raise WeightsError(f"unsupported legacy torch protocol version {protocol}")
        sys_info = RestrictedUnpickler(f, legacy=True).load()
        byteorder = "little" if not isinstance(sys_info, dict) or sys_info.get("little_endian", True) else "big"
        unpickler = RestrictedUnpickler(f, legacy=True)
        refs = collect_tensors(unpickler.load(), "state dict")
        keys = [str(k) for k in RestrictedUnpickler(f, legacy=True).load()]
        offset = f.tell()
    storages = {}
    for key in keys:
        ref = unpickler.storages.get(key)
        if ref is None:
            raise WeightsError(f"storage {key} listed but never used")
        storages[key], offset = _legacy_storage(mapped, offset, ref, byteorder)
    missing = set(unpickler.storages) - set(storages)
    if missing:
        raise WeightsError(f"storage {sorted(missing)[0]} has no data (truncated file?)")
    return {name: _finish(tensor_array(ref, storages[ref.storage.key], name), ref) for name, ref in refs.items()}


def _legacy_storage(mapped, offset: int, ref: StorageRef, byteorder: str) -> tuple[np.ndarray, int]:
    """(storage elements, offset of the next storage): an 8-byte element count, then the raw bytes."""
    dtype = _dtype(ref, byteorder)
    if offset + 8 > len(mapped):
        raise WeightsError(f"storage {ref.key}: missing (truncated file?)")
    count = int.from_bytes(mapped[offset : offset + 8], byteorder)
    if count != ref.numel:
        raise WeightsError(f"storage {ref.key}: {count} elements on disk, {ref.numel} in the pickle")
    start, end = offset + 8, offset + 8 + count * dtype.itemsize
    if end > len(mapped):
        raise WeightsError(f"storage {ref.key}: ends at byte {end}, file has {len(mapped)} (truncated file?)")
    return view(mapped, dtype, start, count), end


def _dtype(ref: StorageRef, byteorder: str) -> np.dtype:
    dtype = np.dtype("<u2") if ref.storage_type.dtype == BF16 else ref.storage_type.dtype
    return dtype.newbyteorder(">") if byteorder == "big" and dtype.itemsize > 1 else dtype


def _finish(arr: np.ndarray, ref) -> np.ndarray:
    """bfloat16 storages widen to float32 here; everything else stays a view until validation."""
    if ref.storage.storage_type.dtype == BF16:
        return widen_bfloat16(arr)
    return arr
