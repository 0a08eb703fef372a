"""The FP8 engine's arithmetic in numpy: the whole network's logits as `--precision fp8` computes them.

    weights = QuantizedWeights(tensors)                     # per-channel e4m3 weights, made once, layer by layer
    logits = fp8_logits(weights, x, cal, fp16_layers={"features.0"})

An FP8 layer, for its input a (float32) and weights w:
    a8 = e4m3(float32(a) * float32(1 / s_in))                s_in = cal.scale(layer): one scale per tensor
    w8 = e4m3(float32(w) * float32(1 / s_w[n]))              s_w = weight_scales(w): one per output channel n
    y  = float32(s_in * s_w[n]) * sum(a8 * w8) + bias[n]     the products exact, the sum in float32
then ReLU (and pooling) as in FP32. An FP16 layer (in `fp16_layers`) rounds its input and weights to float16 and
sums their products in float32, + bias. The rounding of each input happens where the layer reads it, which equals
the previous layer's epilogue rounding it before the pooling: ReLU, max pooling and rounding are all monotonic.

This is the oracle for the FP8 engine's whole-network test and what benchmarks/precision_accuracy.py --fp8-model
measures. The activations stay float32 in between, as in the engine's accumulators.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..model.reference import conv3x3_nhwc, staged_logits
from ..weights.spec import infer_width, vgg16_spec
from .calibration import LAYERS, Calibration, scaled, weight_scales
from .rounding import to_e4m3, to_fp16

FIRST_CONV = "features.0"
LAST_FC = "classifier.6"


class QuantizedWeights:
    """The network's weights in both forms a layer can take, each made on first use and kept."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors
        self.spec = vgg16_spec(infer_width(tensors))
        self._fp8: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._fp16: dict[str, np.ndarray] = {}

    def fp8(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(e4m3 values of w / s_w as float32, s_w per output channel)."""
        if name not in self._fp8:
            w = self.tensors[f"{name}.weight"]
            s_w = weight_scales(w)
            self._fp8[name] = to_e4m3(scaled(w, s_w)), s_w
        return self._fp8[name]

    def fp16(self, name: str) -> np.ndarray:
        if name not in self._fp16:
            self._fp16[name] = to_fp16(self.tensors[f"{name}.weight"])
        return self._fp16[name]

    def bias(self, name: str) -> np.ndarray:
        return np.asarray(self.tensors[f"{name}.bias"], dtype=np.float32)


def _products(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return conv3x3_nhwc(a, w) if w.ndim == 4 else a @ w.T


def fp8_layer(weights: QuantizedWeights, cal: Calibration, fp16_layers: Iterable[str] = ()):
    """`staged_logits`' layer function for the FP8 engine's arithmetic."""
    fp16 = check_layers(fp16_layers)

    def layer(name: str, a: np.ndarray) -> np.ndarray:
        if name in fp16:
            return _products(to_fp16(a), weights.fp16(name)) + weights.bias(name)
        s_in = cal.scale(name)
        w8, s_w = weights.fp8(name)
        total = _products(to_e4m3(scaled(a, s_in)), w8)
        return total * (np.float32(s_in) * s_w) + weights.bias(name)

    return layer


def fp8_logits(weights: QuantizedWeights | dict, x: np.ndarray, cal: Calibration, fp16_layers: Iterable[str] = (),
               batch_size: int = 8, upto: str | None = None) -> np.ndarray:
    """float32 logits (N, 1000) of normalised input x (N, 3, 224, 224) at FP8, the layers named in `fp16_layers`
    at FP16; `upto`: that layer's input instead (staged_logits). Computed `batch_size` images at a time."""
    if not isinstance(weights, QuantizedWeights):
        weights = QuantizedWeights(weights)
    layer = fp8_layer(weights, cal, fp16_layers)
    x = np.asarray(x, dtype=np.float32)
    starts = range(0, max(len(x), 1), batch_size)  # no images: one empty batch, for the shape
    return np.concatenate([staged_logits(weights.spec, x[i:i + batch_size], layer, upto) for i in starts])


def check_layers(names: Iterable[str]) -> frozenset[str]:
    """`names` as a set, each a convolution or FC layer of VGG16 (else a ValueError naming the layers)."""
    names = frozenset([names] if isinstance(names, str) else names)
    unknown = sorted(names - set(LAYERS))
    if unknown:
        raise ValueError(f"no layer {', '.join(unknown)} in VGG16; layers: {', '.join(LAYERS)}")
    return names
