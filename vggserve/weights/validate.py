"""Check torchvision-named tensors against VGG16's spec and bring them to float32, C-contiguous, aligned."""

import numpy as np

from ..errors import WeightsError
from .schemes import source_name
from .spec import infer_width, vgg16_spec


def validate(tensors: dict[str, np.ndarray], where: str, scheme: str = "torchvision") -> tuple[dict, float]:
    """(float32 tensors in spec order, width). `where` prefixes every message (the file name).

    The width is read from ``features.0.weight``; every key of that width's spec must be present with its
    exact shape and finite values (no NaN or infinity, also after narrowing to float32), and no other key may
    be. Arrays already float32/contiguous/aligned are kept (no copy).
    """
    try:
        width = infer_width(tensors)
        expected = vgg16_spec(width).shapes()
    except (ValueError, TypeError, AttributeError, IndexError):
        first = tensors.get("features.0.weight")
        shape = getattr(first, "shape", type(first).__name__)
        name = _display(scheme, "features.0.weight")
        raise WeightsError(f"{where}: {name}: shape {shape} is not a VGG16 first convolution") from None
    out = {}
    for key, shape in expected.items():
        name = _display(scheme, key)
        if key not in tensors:
            raise WeightsError(f"{where}: missing key {name} (expected shape {shape})")
        arr = tensors[key]
        if not isinstance(arr, np.ndarray):
            raise WeightsError(f"{where}: {name}: not a tensor ({type(arr).__name__})")
        if tuple(arr.shape) != shape:
            raise WeightsError(f"{where}: {name}: expected shape {shape}, got {tuple(arr.shape)}")
        if arr.dtype.kind != "f":
            raise WeightsError(f"{where}: {name}: expected a float tensor, got {arr.dtype}")
        out[key] = _float32(arr)
        _check_finite(out[key], where, name)
    extra = sorted(set(tensors) - set(expected))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        names = ", ".join(_display(scheme, k) for k in extra[:3])
        raise WeightsError(f"{where}: unexpected keys for VGG16: {names}{more}")
    return out, width


def _check_finite(arr: np.ndarray, where: str, name: str) -> None:
    """WeightsError when `arr` holds a NaN or an infinity: the engine would turn every image's probabilities
    into NaN (or, through a ReLU, silently into wrong ones). A finite float32 sum proves every value finite (a
    NaN or infinity makes it non-finite) in one fast pass; only a non-finite sum is looked at value by value."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(arr.sum()):
            return
    bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
    if bad:
        raise WeightsError(f"{where}: {name}: {bad:,} of {arr.size:,} values are NaN or infinite (a damaged file, "
                           f"or weights from a diverged training run)")


def _display(scheme: str, key: str) -> str:
    src = source_name(scheme, key)
    return key if src == key else f"{src} (-> {key})"


def _float32(arr: np.ndarray) -> np.ndarray:
    if arr.dtype != np.dtype(np.float32):  # also catches non-native byte order
        with np.errstate(over="ignore"):  # float64 beyond float32's range: infinite, refused by _check_finite
            arr = arr.astype(np.float32)
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.ascontiguousarray(arr)
        if not arr.flags.aligned:
            arr = arr.copy()
    return arr
