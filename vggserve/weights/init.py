"""Deterministic random VGG16 weights, He-initialised so activations stay in range through all 16 layers."""

import numpy as np

from .spec import vgg16_spec


def init_weights(seed: int = 0, width: float = 1.0) -> dict[str, np.ndarray]:
    """torchvision-named float32 tensors drawn from numpy's PCG64 generator: the same seed gives the same bytes.

    Weights ~ N(0, 2 / fan_in) (He, for ReLU); biases ~ N(0, 0.05^2), non-zero so the bias path is tested.
    """
    spec = vgg16_spec(width)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for key, shape in spec.shapes().items():
        if key.endswith(".weight"):
            fan_in = int(np.prod(shape[1:]))
            std = np.float32(np.sqrt(2.0 / fan_in))
            tensors[key] = rng.standard_normal(shape, dtype=np.float32) * std
        else:
            tensors[key] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)
    return tensors
