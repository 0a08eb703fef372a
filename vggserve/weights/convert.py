"""`convert(src, dst)`: any supported weights file -> safetensors in torchvision names, with provenance metadata."""

from pathlib import Path

from ..errors import WeightsError
from .loaded import LoadedWeights
from .loading import load_weights
from .safetensors_io import save_safetensors


def convert(src, dst) -> tuple[LoadedWeights, Path]:
    """Load and validate `src`, write `dst` atomically. Metadata keeps the source format, key scheme, file name,
    SHA256 and the preprocessing the weights need (so converted Keras weights stay "caffe")."""
    src, dst = Path(src), Path(dst)
    loaded = load_weights(src)
    if dst.exists() and dst.resolve() == src.resolve():
        raise WeightsError(f"{dst}: output would overwrite the input")
    metadata = {
        "source_format": loaded.format,
        "source_key_scheme": loaded.key_scheme,
        "source_file": src.name,
        "source_sha256": loaded.sha256,
        "preprocessing": loaded.preprocessing,
        "width": repr(loaded.width),
    }
    return loaded, save_safetensors(loaded.tensors, dst, metadata)
