"""`LoadedWeights`: VGG16 tensors in torchvision names, plus where they came from and how to feed them."""

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np


def sha256_file(path, chunk_size: int = 1 << 22) -> str:
    """Hex SHA256 of a file's bytes, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class LoadedWeights:
    """VGG16 weights ready for the engine.

    tensors:       torchvision key names (``features.{i}.weight``, ``classifier.{0,3,6}.bias``, ...) -> float32,
                   C-contiguous, aligned numpy arrays; conv weights (out, in, 3, 3), fc weights (out, in).
                   Most are read-only views of a memory map of the file (safetensors, .pth, aligned .npz
                   members); converted or misaligned ones are copies.
    path:          the file they were read from (None for tensors given in memory).
    format:        "safetensors" | "npz" | "pth-zip" | "pth-legacy" | "keras-h5" | "memory".
    key_scheme:    the names in the source: "torchvision" | "timm" | "keras".
    preprocessing: what the input needs: "torchvision" (RGB, /255, ImageNet mean/std) or
                   "caffe" (BGR, 0..255 minus the per-channel mean, no scaling: Keras weights).
    width:         1.0 for VGG16; smaller for the narrow test networks (see `vgg16_spec`).
    metadata:      string metadata of the source file (safetensors header), else empty.
    """

    tensors: dict[str, np.ndarray]
    path: Path | None
    format: str
    key_scheme: str
    preprocessing: str
    width: float
    metadata: dict[str, str] = field(default_factory=dict)

    @cached_property
    def sha256(self) -> str | None:
        """Hex SHA256 of the source file, computed on first use (about 1 s for the full 528 MB file)."""
        return None if self.path is None else sha256_file(self.path)

    @property
    def parameter_count(self) -> int:
        return int(sum(t.size for t in self.tensors.values()))
