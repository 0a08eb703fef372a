"""`load_weights(path)`: any supported file -> validated torchvision-named float32 tensors (`LoadedWeights`)."""

from pathlib import Path

import numpy as np

from ..errors import WeightsError
from ..preprocessing import MODES
from .loaded import LoadedWeights
from .lookup import named_file
from .schemes import detect_scheme, to_torchvision
from .sniff import detect_format
from .validate import validate


def load_weights(path) -> LoadedWeights:
    """Read, convert and validate the VGG16 weights in `path`; the format comes from the file's first bytes.

    Raises WeightsNotFound for a missing file (or a folder) and WeightsError (one line naming the file and, where
    there is one, the key and the expected shape) for anything unreadable, truncated or not VGG16.
    """
    path = named_file(Path(path), f"{path}: no such weights file", f"{path} is a folder")
    fmt = detect_format(path)
    raw, metadata = _read(path, fmt)
    scheme = detect_scheme(raw)
    tensors, width = validate(to_torchvision(raw, scheme), str(path), scheme)
    preprocessing = _preprocessing(path, scheme, metadata)
    return LoadedWeights(tensors, path, fmt, scheme, preprocessing, width, metadata)


def weights_from_tensors(tensors: dict[str, np.ndarray], preprocessing: str = "torchvision") -> LoadedWeights:
    """Validate in-memory tensors (any supported key scheme) the same way a file is validated."""
    scheme = detect_scheme(tensors)
    checked, width = validate(to_torchvision(tensors, scheme), "weights", scheme)
    if scheme == "keras":
        preprocessing = "caffe"
    return LoadedWeights(checked, None, "memory", scheme, preprocessing, width)


def _read(path: Path, fmt: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if fmt == "safetensors":
        from .safetensors_io import read_safetensors

        return read_safetensors(path)
    if fmt == "npz":
        from .npz_io import read_npz

        return read_npz(path), {}
    if fmt in ("pth-zip", "pth-legacy"):
        from .pth_io import read_pth

        return read_pth(path, fmt), {}
    if fmt == "keras-h5":
        from .keras_io import read_keras_h5

        return read_keras_h5(path), {}
    raise WeightsError(f"{path}: unsupported format {fmt}")


def _preprocessing(path: Path, scheme: str, metadata: dict[str, str]) -> str:
    """Keras weights want caffe-style input; a converted file says which in its metadata; else torchvision."""
    if scheme == "keras":
        return "caffe"
    value = metadata.get("preprocessing", "torchvision")
    if value not in MODES:
        raise WeightsError(f"{path}: metadata preprocessing={value!r} is not one of {', '.join(MODES)}")
    return value
