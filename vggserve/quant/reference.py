"""The 8-bit engines' arithmetic in numpy: the whole network's logits as `--precision fp8` (or INT8) computes them.

    weights = QuantizedWeights(tensors)                     # per-channel 8-bit weights, made once, layer by layer
    logits = fp8_logits(weights, x, cal, fp16_layers={"features.0"})
    logits = fp8_logits(weights, x, cal, fmt="int8")        # the same network with s8 operands (int8.py)

An 8-bit layer, for its input a (float32) and weights w, in format `fmt` (FORMATS: its largest code `top` and its
rounding `q`):
    a8 = q(float32(a) * float32(1 / s_in))                  s_in = amax / top, amax = cal.amax[layer]: per tensor
    w8 = q(float32(w) * float32(1 / s_w[n]))                s_w = amax of output channel n / top
    y  = float32(s_in * s_w[n]) * sum(a8 * w8) + bias[n]
fp8: q = e4m3 rounding (saturating to +-448), top = 448, the products exact, the sum in float32.
int8: q = nearest integer, ties to even, clipped to +-127, top = 127; the sum exact (the int32 accumulator's).
Then ReLU (and pooling) as in FP32. An FP16 layer (in `fp16_layers`) rounds its input and weights to float16 and
sums their products in float32, + bias. The rounding of each input happens where the layer reads it, which equals
the previous layer's epilogue rounding it before the pooling: ReLU, max pooling and rounding are all monotonic.

This is the oracle for the 8-bit engines' whole-network tests and what benchmarks/precision_accuracy.py
--fp8-model, --int8-model and --sensitivity measure. The activations stay float32 in between, as in the engine's
accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..model.reference import conv3x3_nhwc, staged_logits
from ..weights.spec import infer_width, vgg16_spec
from . import e4m3, int8
from .calibration import LAYERS, Calibration, scaled, weight_scales
from .rounding import to_e4m3, to_fp16

FIRST_CONV = "features.0"
LAST_FC = "classifier.6"


@dataclass(frozen=True)
class Format:
    """An 8-bit operand format: its largest code (the calibrated amax maps onto it) and its rounding."""

    name: str
    top: float
    round: Callable[[np.ndarray], np.ndarray]  # float32 -> float32 of the format's values (saturating)
    exact: bool  # integer products: the sum is exact (int32), else float32

    def scale(self, amax: float) -> float:
        """The per-tensor scale of a calibrated range (1.0 for an input that was all zeros)."""
        return amax / self.top if amax > 0 else 1.0


FORMATS = {"fp8": Format("fp8", e4m3.MAX, to_e4m3, exact=False),
           "int8": Format("int8", int8.MAX, int8.to_int8, exact=True)}


def format_named(fmt: str | Format) -> Format:
    if isinstance(fmt, Format):
        return fmt
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"no 8-bit format {fmt!r}; formats: {', '.join(FORMATS)}") from None


class QuantizedWeights:
    """The network's weights in both forms a layer can take, each made on first use and kept."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors
        self.spec = vgg16_spec(infer_width(tensors))
        self._q: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, float]] = {}
        self._fp16: dict[str, np.ndarray] = {}

    def fp8(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(e4m3 values of w / s_w as float32, s_w per output channel)."""
        return self.eight_bit(name, "fp8")[:2]

    def eight_bit(self, name: str, fmt: str | Format = "fp8") -> tuple[np.ndarray, np.ndarray, float]:
        """(w / s_w rounded to `fmt` as float32, s_w per output channel, max over n of sum |w8[n]|)."""
        fmt = format_named(fmt)
        key = (fmt.name, name)
        if key not in self._q:
            w = self.tensors[f"{name}.weight"]
            s_w = weight_scales(w, fmt.top)
            w8 = fmt.round(scaled(w, s_w))
            self._q[key] = w8, s_w, int8.l1_bound(w8) if fmt.exact else 0.0
        return self._q[key]

    def fp16(self, name: str) -> np.ndarray:
        if name not in self._fp16:
            self._fp16[name] = to_fp16(self.tensors[f"{name}.weight"])
        return self._fp16[name]

    def bias(self, name: str) -> np.ndarray:
        return np.asarray(self.tensors[f"{name}.bias"], dtype=np.float32)


def _products(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return conv3x3_nhwc(a, w) if w.ndim == 4 else a @ w.T


def fp8_layer(weights: QuantizedWeights, cal: Calibration, fp16_layers: Iterable[str] = (), fmt: str | Format = "fp8"):
    """`staged_logits`' layer function for the 8-bit engine's arithmetic in `fmt` ("fp8" or "int8")."""
    fp16, fmt = check_layers(fp16_layers), format_named(fmt)

    def layer(name: str, a: np.ndarray) -> np.ndarray:
        if name in fp16:
            return _products(to_fp16(a), weights.fp16(name)) + weights.bias(name)
        s_in = fmt.scale(cal.amax[name])
        w8, s_w, w_l1 = weights.eight_bit(name, fmt)
        a8 = fmt.round(scaled(a, s_in))
        total = int8.exact_sum(_products, a8, w8, w_l1) if fmt.exact else _products(a8, w8)
        return total.astype(np.float32, copy=False) * (np.float32(s_in) * s_w) + weights.bias(name)

    return layer


def fp8_logits(weights: QuantizedWeights | dict, x: np.ndarray, cal: Calibration, fp16_layers: Iterable[str] = (),
               batch_size: int = 8, upto: str | None = None, start: str | None = None,
               fmt: str | Format = "fp8", layer=None) -> np.ndarray:
    """float32 logits (N, 1000) of normalised input x (N, 3, 224, 224) at 8 bits in `fmt` ("fp8" or "int8"), the
    layers named in `fp16_layers` at FP16; `upto`: that layer's input instead, `start`: x is that layer's input
    (staged_logits); `layer`: a wrapper of the layer function (e.g. one that records the inputs). Computed
    `batch_size` images at a time."""
    if not isinstance(weights, QuantizedWeights):
        weights = QuantizedWeights(weights)
    run = fp8_layer(weights, cal, fp16_layers, fmt)
    run = layer(run) if layer is not None else run
    x = np.asarray(x, dtype=np.float32)
    starts = range(0, max(len(x), 1), batch_size)  # no images: one empty batch, for the shape
    return np.concatenate([staged_logits(weights.spec, x[i:i + batch_size], run, upto, start) for i in starts])


def check_layers(names: Iterable[str]) -> frozenset[str]:
    """`names` as a set, each a convolution or FC layer of VGG16 (else a ValueError naming the layers)."""
    names = frozenset([names] if isinstance(names, str) else names)
    unknown = sorted(names - set(LAYERS))
    if unknown:
        raise ValueError(f"no layer {', '.join(unknown)} in VGG16; layers: {', '.join(LAYERS)}")
    return names
