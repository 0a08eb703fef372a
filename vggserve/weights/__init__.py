"""Weights: the VGG16 spec, generated weights, loaders for every supported format, lookup and fetching.

Public API:
    load_weights(path) -> LoadedWeights      safetensors, .npz, torch .pth (zip and legacy), Keras .h5
    weights_from_tensors(tensors)            the same validation for in-memory tensors
    find_weights(explicit=None) -> Path      explicit path, $VGGSERVE_WEIGHTS, then fetched files in the cache
    save_safetensors(tensors, path, metadata=None)   atomic write
    fetch(source="timm", folder=None)        download and verify published weights (see `fetch`)
    SOURCES                                  provenance table of published weights
"""

from .fetch import fetch
from .loaded import LoadedWeights, sha256_file
from .loading import load_weights, weights_from_tensors
from .lookup import cache_dir, find_weights, weights_dir
from .provenance import SOURCES, WeightsSource
from .safetensors_io import save_safetensors

__all__ = [
    "LoadedWeights",
    "SOURCES",
    "WeightsSource",
    "cache_dir",
    "fetch",
    "find_weights",
    "load_weights",
    "save_safetensors",
    "sha256_file",
    "weights_dir",
    "weights_from_tensors",
]
