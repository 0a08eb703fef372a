"""8-bit tensor-core layers, TensorRT's recipe: weights with one scale per output channel, activations with one scale
per tensor (a float per layer, from calibration), the sums exact or in FP32.

| precision | activations (codes) | weights (codes) | s_in, s_out | s_w[n] | mma.sync | sums |
|---|---|---|---|---|---|---|
| fp8 | e4m3 of x / s | e4m3 of W[n] / s_w[n] | amax / 448 | amax / 448 | m16n8k32 e4m3 | FP32 |
| int8 | u8: rint(x / s), 0..255 | s8: rint(W[n] / s_w[n]), +-127 | amax / 255 | amax / 127 | m16n8k32 u8.s8 | int32 |

    y[p, n] = act( s_in * s_w[n] * sum_k Aq[p, k] * Wq[n, k] + bias[n] )
The kernels (conv_tc.cl, conv_tc_halo.cl with FP8 = 1 or INT8 = 1) take cs[n] = s_in * s_w[n] (`cs`, a float buffer
like the bias) and write the next layer's input: its codes of y / s_out (OUT_FP8 = 1 or OUT_INT8 = 1,
`out_scale_inv` = 1 / s_out), FP16 (the next layer stays FP16), or float32 logits (the last layer). The input and
output storage are independent: an FP16 layer can write 8-bit codes (a first convolution that stays FP16), an 8-bit
layer FP16 (before an FP16 last FC layer). FP8 and INT8 do not mix in one layer.

INT8's activations are unsigned (u8) because every 8-bit layer's input follows a ReLU (the first convolution, whose
input is the signed normalised image, stays FP16): 255 steps over [0, amax] instead of s8's 127, the same speed
(IMMA u8.s8 is s8.s8's instruction), ReLU folded into the saturation at 0, and the codes order as their bytes, so
pooling them is an unsigned byte max. The weights are symmetric s8 (-128 unused), as quant/int8.py's model has them.
INT8's sums are exact: |u8 * s8| <= 255 * 127, and VGG16's longest sum (25,088 terms) stays below 2^31.

`LayerScales` is what a layer object (tensorcore.TensorCoreLayer, HaloLayer) makes of its constructor's `in_scale`,
`out_scale` and `out_codes`: the weights to lay out, the #defines, and the kernel arguments that follow the bias.
"""

import math

import numpy as np

from ..quant import e4m3, int8
from .launch import upload
from .precision import FP8, INT8, Precision

U8_MAX = 255  # INT8's activation codes: 0 .. 255


def weight_scales(weight) -> np.ndarray:
    """FP8's s_w[n] = amax |W[n]| / 448 as float32, over each output channel's weights (axis 0 is the channel); 1.0
    where a channel's weights are all zero (or the quotient underflows), so that every scale is positive."""
    w = np.abs(np.asarray(weight, dtype=np.float32).reshape(len(weight), -1))
    s = (w.max(axis=1) / np.float32(e4m3.MAX)).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def quantise_weights(weight) -> tuple[np.ndarray, np.ndarray]:
    """FP8: (codes, s_w): codes[n, ...] = e4m3(W[n, ...] / s_w[n]) (uint8, W's shape), s_w = weight_scales(W)."""
    w = np.asarray(weight, dtype=np.float32)
    s = weight_scales(w)
    # the quotient in float64 (exact float32 -> float64, one rounding: a product with 1 / s_w could miss an e4m3 tie
    # that W / s_w hits exactly), a few rows at a time into one buffer: VGG16's classifier.0 whole would take 800 MB
    # per temporary, and fresh blocks their page faults
    rows, s64 = w.reshape(len(w), -1), s.astype(np.float64)[:, None]
    cols = rows.shape[1]
    codes = np.empty(rows.shape, np.uint8)
    step = max(1, e4m3.CHUNK // max(1, cols))
    quotient = np.empty(min(step, len(rows)) * cols, np.float64)
    encoder = e4m3.Encoder(np.float64)
    for i in range(0, len(rows), step):
        block = rows[i:i + step]
        q = quotient[:block.size]
        np.divide(block, s64[i:i + step], out=q.reshape(block.shape))
        encoder.into(q, codes[i:i + step].reshape(-1))
    return codes.reshape(w.shape), s


def int8_weights(weight) -> tuple[np.ndarray, np.ndarray]:
    """INT8: (codes, s_w): int8 codes rint(float32(W[n]) * float32(1 / s_w[n])) clipped to +-127, s_w[n] = amax / 127
    (quant/int8.py, the numpy model's weights exactly)."""
    s = int8.weight_scales(weight)
    return int8.quantize(weight, s), s


def u8_codes(x, scale: float) -> np.ndarray:
    """INT8's activation codes of x: rint(float32(x) * float32(1 / scale)) (ties to even), clipped to 0 .. 255."""
    from ..quant.calibration import scaled

    return np.clip(np.rint(scaled(x, scale)), 0, U8_MAX).astype(np.uint8)


def _positive(name: str, value) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite scale above 0 (the calibrated amax / the format's top), got "
                         f"{value!r}")
    return v


class LayerScales:
    """One layer's 8-bit side. precision: its input storage (FP8 or INT8: codes of x / in_scale; FP16 or TF32: no
    scale); out_scale: the next layer's input scale where this layer writes 8-bit codes, None where it writes FP16
    (8-bit input) or its precision's storage, or the logits (`last`); out_codes: the codes it writes (FP8 or INT8;
    default: the input's format, FP8 for an FP16 layer)."""

    def __init__(self, precision: Precision, weight, in_scale: float | None, out_scale: float | None, last: bool,
                 out_codes: Precision | None = None):
        if precision.eight_bit and in_scale is None:
            raise ValueError(f"an {precision} layer needs in_scale, the scale of its {precision} input (calibration's "
                             "amax / the format's largest code)")
        if not precision.eight_bit and in_scale is not None:
            raise ValueError(f"in_scale is the scale of an 8-bit input; a {precision} layer takes none (pass None)")
        if out_scale is not None and last:
            raise ValueError("the last layer writes float32 logits: it takes no out_scale (pass None)")
        out_codes = out_codes or (precision if precision.eight_bit else FP8)
        if not out_codes.eight_bit or (precision.eight_bit and out_codes != precision):
            raise ValueError(f"a {precision} layer writes {precision if precision.eight_bit else 'fp8 or int8'} "
                             f"codes, not {out_codes}")
        self.precision, self.last, self.codes = precision, last, out_codes
        self.in_scale = None if in_scale is None else _positive("in_scale", in_scale)
        self.out_scale = None if out_scale is None else _positive("out_scale", out_scale)
        self.weight, self.cs = weight, None
        if precision.fp8:  # the weights to lay out are already e4m3 values: their layout encodes them exactly
            codes, s_w = quantise_weights(weight)
            self.weight = e4m3.decode(codes)
            self.cs = (np.float64(self.in_scale) * s_w.astype(np.float64)).astype(np.float32)
        elif precision.int8:  # integers: their layout stores them as s8 exactly; cs as the numpy model's
            codes, s_w = int8_weights(weight)
            self.weight = codes.astype(np.float32)
            self.cs = (np.float32(self.in_scale) * s_w).astype(np.float32)

    @property
    def active(self) -> bool:
        """Whether the kernels take scales at all (8-bit input or output)."""
        return self.precision.eight_bit or self.out_scale is not None

    @property
    def out_precision(self) -> Precision | None:
        """The storage of the output activation (None: the float32 logits)."""
        if self.last:
            return None
        if self.out_scale is not None:
            return self.codes
        return self.precision.floats

    @property
    def defines(self) -> dict:
        """FP8 or INT8, OUT_FP8 or OUT_INT8 where set (an FP16 or TF32 layer's program stays as it was)."""
        out = {}
        if self.precision.eight_bit:
            out["INT8" if self.precision.int8 else "FP8"] = 1
        if self.out_scale is not None:
            out["OUT_INT8" if self.codes.int8 else "OUT_FP8"] = 1
        return out

    def args(self, ctx, npad: int) -> tuple:
        """The kernel arguments after the bias: cs (8-bit input, npad floats, 1.0 past the layer's channels),
        out_scale_inv (8-bit output, float32)."""
        out = ()
        if self.cs is not None:
            cs = np.ones(npad, np.float32)
            cs[:len(self.cs)] = self.cs
            out += (upload(ctx, cs),)
        if self.out_scale is not None:
            out += (np.float32(1.0 / self.out_scale),)
        return out

    def describe(self) -> str:
        """", e4m3 in, e4m3 out", ", u8 in, fp16 out" and the like; "" for a layer without 8-bit storage."""
        if not self.active:
            return ""
        names = {FP8: "e4m3", INT8: "u8"}
        out = self.out_precision
        out = "float32 logits" if out is None else f"{names.get(out, out)} out"
        return f", {names.get(self.precision, self.precision)} in, {out}"
