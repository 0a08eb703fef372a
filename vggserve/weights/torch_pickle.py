"""A restricted unpickler for torch checkpoints: tensors come back as numpy arrays, and nothing else runs.

torch pickles a state dict as an ``OrderedDict`` of tensors. Each tensor is a call to
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` (older files:
``_rebuild_tensor(storage, offset, size, stride)``; parameters wrap that in ``_rebuild_parameter``), and each
storage is a *persistent id* ``("storage", torch.FloatStorage, key, location, numel[, view])`` whose bytes live
outside the pickle. `find_class` maps exactly these globals to the plain-Python stand-ins below and refuses any
other global (``os.system``, ``builtins.eval``, ...) before anything is called, so loading runs no code from
the file. Storages are resolved after unpickling, by the caller (`pth_io`), through `resolve`.
"""

import collections
import pickle
from dataclasses import dataclass

import numpy as np

from ..errors import WeightsError

BF16 = "bfloat16"  # stored as uint16, widened to float32 when resolved
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": BF16,
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}


class UnsafePickle(Exception):
    """The pickle asked for a global outside the allow-list (carries the global's dotted name)."""


@dataclass(frozen=True)
class StorageType:
    """Stand-in for ``torch.FloatStorage`` and friends: just the element type."""

    name: str

    @property
    def dtype(self):
        return STORAGE_DTYPES[self.name]


@dataclass(frozen=True)
class StorageRef:
    """A storage named in the pickle; its bytes are read later. `view` = (offset, numel) within the root."""

    key: str
    storage_type: StorageType
    numel: int
    view: tuple[int, int] | None = None


@dataclass(frozen=True)
class TensorRef:
    """A strided tensor over a storage: offset, size and stride in elements (torch's convention)."""

    storage: StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored):
    if not isinstance(storage, StorageRef):
        raise WeightsError(f"tensor over {type(storage).__name__}, not a storage")
    return TensorRef(storage, int(storage_offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


def _rebuild_parameter(data, *_ignored):
    return data


def _rebuild_from_type_v2(func, _new_type, args, _state):
    return func(*args)


def _latin1_encode(text, encoding="latin1"):
    """``_codecs.encode``: how protocol-2 pickles written by Python 3 spell bytes objects."""
    if encoding not in ("latin1", "latin-1"):
        raise UnsafePickle(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): tuple,
    ("_codecs", "encode"): _latin1_encode,
    **{("torch", name): StorageType(name) for name in STORAGE_DTYPES},
    **{("torch.cuda", name): StorageType(name) for name in STORAGE_DTYPES},  # saved from a GPU: same bytes
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a torch checkpoint's pickle into plain containers of `TensorRef`s; refuses other globals."""

    def __init__(self, file, legacy: bool):
        super().__init__(file, encoding="utf-8")
        self._legacy = legacy
        self._roots: dict[str, StorageRef] = {}

    def find_class(self, module, name):
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickle(f"{module}.{name}") from None

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid:
            raise WeightsError(f"unexpected persistent id {pid!r}")
        kind = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
        if kind == "module":
            raise WeightsError("the file holds a whole pickled nn.Module, not a state dict of tensors")
        if kind != "storage" or len(pid) < 5 or not isinstance(pid[1], StorageType):
            raise WeightsError(f"unexpected persistent id {pid[:2]!r}")
        storage_type, key, numel = pid[1], str(pid[2]), int(pid[4])
        view = pid[5] if len(pid) > 5 else None
        root = self._roots.setdefault(key, StorageRef(key, storage_type, numel))
        if view is None:
            return root
        _view_key, view_offset, view_numel = view  # legacy files only: a storage slice of a root storage
        return StorageRef(key, storage_type, root.numel, (int(view_offset), int(view_numel)))

    @property
    def storages(self) -> dict[str, StorageRef]:
        """Every root storage the pickle referred to, by key."""
        return self._roots


def tensor_array(ref: TensorRef, storage: np.ndarray, name: str) -> np.ndarray:
    """The tensor `ref` as a numpy array over `storage` (1-D, the root storage's elements); bounds checked."""
    base = storage
    if ref.storage.view is not None:
        v_offset, v_numel = ref.storage.view
        base = storage[v_offset : v_offset + v_numel]
    if any(s < 0 for s in ref.size) or any(s < 0 for s in ref.stride) or len(ref.size) != len(ref.stride):
        raise WeightsError(f"{name}: invalid size {ref.size} / stride {ref.stride}")
    if 0 in ref.size:
        return np.zeros(ref.size, dtype=base.dtype)
    last = ref.offset + sum((n - 1) * st for n, st in zip(ref.size, ref.stride))
    if ref.offset < 0 or last >= base.size:
        raise WeightsError(f"{name}: tensor reaches element {last} of a storage of {base.size} (truncated file?)")
    item = base.itemsize
    strides = tuple(st * item for st in ref.stride)
    return np.lib.stride_tricks.as_strided(base[ref.offset :], ref.size, strides, writeable=False)


def collect_tensors(obj, where: str) -> dict[str, TensorRef]:
    """The state dict inside an unpickled checkpoint: a dict of TensorRefs, or one under "state_dict"/"model"."""
    if isinstance(obj, dict):
        if obj and all(isinstance(v, TensorRef) for v in obj.values()):
            return {str(k): v for k, v in obj.items()}
        for wrapper in ("state_dict", "model", "model_state_dict"):
            if isinstance(obj.get(wrapper), dict):
                return collect_tensors(obj[wrapper], where)
        bad = next((k for k, v in obj.items() if not isinstance(v, TensorRef)), None)
        if bad is not None and any(isinstance(v, TensorRef) for v in obj.values()):
            raise WeightsError(f"{where}: {bad}: not a tensor")
    raise WeightsError(f"{where}: no state dict of tensors in this checkpoint ({type(obj).__name__} at the top)")
