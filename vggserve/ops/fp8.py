"""FP8 (e4m3) tensor-core layers, TensorRT's recipe: weights in e4m3 with one scale per output channel, activations
in e4m3 with one scale per tensor (a float per layer, from calibration), FP32 accumulation.

    s_w[n]  = amax |W[n, :]| / 448                     (a channel of zero weights: 1, its codes all 0)
    Wq[n,k] = e4m3(W[n, k] / s_w[n])                   laid out at load (tensorcore.tc_weights)
    y[p, n] = act( s_in * s_w[n] * sum_k Aq[p, k] * Wq[n, k] + bias[n] )
The kernels (conv_tc.cl, conv_tc_halo.cl with FP8 = 1) take cs[n] = s_in * s_w[n] (`cs`, a float buffer like the
bias) and write the next layer's input: e4m3 codes of y / s_out (OUT_FP8 = 1, `out_scale_inv` = 1 / s_out), FP16 (the
next layer stays FP16), or float32 logits (the last layer). The input and output storage are independent: an FP16
layer can write FP8 (a first convolution that stays FP16), an FP8 layer FP16 (before an FP16 last FC layer).

`LayerScales` is what a layer object (tensorcore.TensorCoreLayer, HaloLayer) makes of its constructor's `in_scale`
and `out_scale`: the weights to lay out, the #defines, and the kernel arguments that follow the bias.
"""

import math

import numpy as np

from ..quant import e4m3
from .launch import upload
from .precision import FP8, FP16, Precision


def weight_scales(weight) -> np.ndarray:
    """s_w[n] = amax |W[n]| / 448 as float32, over each output channel's weights (axis 0 is the channel); 1.0 where
    a channel's weights are all zero (or the quotient underflows), so that every scale is positive."""
    w = np.abs(np.asarray(weight, dtype=np.float32).reshape(len(weight), -1))
    s = (w.max(axis=1) / np.float32(e4m3.MAX)).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def quantise_weights(weight) -> tuple[np.ndarray, np.ndarray]:
    """(codes, s_w): codes[n, ...] = e4m3(W[n, ...] / s_w[n]) (uint8, W's shape), s_w = weight_scales(W)."""
    w = np.asarray(weight, dtype=np.float32)
    s = weight_scales(w)
    q = w.astype(np.float64) / s.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    return e4m3.encode(q), s


def _positive(name: str, value) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite scale above 0 (the calibrated amax / 448), got {value!r}")
    return v


class LayerScales:
    """One layer's FP8 side. precision: its input storage (FP8: e4m3 codes of x / in_scale; FP16 or TF32: no scale);
    out_scale: the next layer's input scale where this layer writes e4m3 codes, None where it writes its precision's
    storage (FP8: FP16) or the logits (`last`)."""

    def __init__(self, precision: Precision, weight, in_scale: float | None, out_scale: float | None, last: bool):
        if precision.fp8 and in_scale is None:
            raise ValueError("an fp8 layer needs in_scale, the scale of its e4m3 input (calibration's amax / 448)")
        if not precision.fp8 and in_scale is not None:
            raise ValueError(f"in_scale is the scale of an e4m3 input; a {precision} layer takes none (pass None)")
        if out_scale is not None and last:
            raise ValueError("the last layer writes float32 logits: it takes no out_scale (pass None)")
        self.precision, self.last = precision, last
        self.in_scale = None if in_scale is None else _positive("in_scale", in_scale)
        self.out_scale = None if out_scale is None else _positive("out_scale", out_scale)
        self.weight, self.cs = weight, None
        if precision.fp8:  # the weights to lay out are already e4m3 values: their layout encodes them exactly
            codes, s_w = quantise_weights(weight)
            self.weight = e4m3.decode(codes)
            self.cs = (np.float64(self.in_scale) * s_w.astype(np.float64)).astype(np.float32)

    @property
    def active(self) -> bool:
        """Whether the kernels take scales at all (FP8 input or output)."""
        return self.precision.fp8 or self.out_scale is not None

    @property
    def out_precision(self) -> Precision | None:
        """The storage of the output activation (None: the float32 logits)."""
        if self.last:
            return None
        if self.out_scale is not None:
            return FP8
        return FP16 if self.precision.fp8 else self.precision

    @property
    def defines(self) -> dict:
        """FP8, OUT_FP8 where set (an FP16 or TF32 layer's program stays as it was)."""
        return {**({"FP8": 1} if self.precision.fp8 else {}), **({"OUT_FP8": 1} if self.out_scale is not None else {})}

    def args(self, ctx, npad: int) -> tuple:
        """The kernel arguments after the bias: cs (FP8, npad floats, 1.0 past the layer's channels), out_scale_inv
        (OUT_FP8, float32)."""
        out = ()
        if self.cs is not None:
            cs = np.ones(npad, np.float32)
            cs[:len(self.cs)] = self.cs
            out += (upload(ctx, cs),)
        if self.out_scale is not None:
            out += (np.float32(1.0 / self.out_scale),)
        return out

    def describe(self) -> str:
        """", e4m3 in, e4m3 out" and the like; "" for a layer without FP8."""
        if not self.active:
            return ""
        out = {None: "float32 logits", FP8: "e4m3 out"}.get(self.out_precision, f"{self.out_precision} out")
        inp = "e4m3 in" if self.precision.fp8 else f"{self.precision} in"
        return f", {inp}, {out}"

