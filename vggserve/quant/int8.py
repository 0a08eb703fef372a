"""INT8 (s8, int32 accumulation): symmetric signed 8-bit integers, what `mma.sync`/`wgmma` `.s8` multiply.

    s_w = weight_scales(w)                  # per output channel (axis 0): amax / 127, float32
    codes = quantize(x, scale)              # int8 of clip(rint(float32(x) * float32(1 / scale)), -127, 127)
    dequantize(codes, scale)                # float32 codes * scale
    total = exact_sum(products, a8, w8)     # sum of a8 * w8, exact (the int32 accumulator's answer)

The scaling rule is FP8's (calibration.py): x is multiplied by float32(1 / scale) and rounded, here to the nearest
integer, ties to even (`cvt.rni.sat.s8.f32`), and clipped to +-127; -128 is never used, so the grid is symmetric
and the calibrated range [-amax, amax] maps onto [-127, 127] with scale = amax / 127. NaN is a ValueError: no
integer stands for it.

Accumulation: every product is an integer of magnitude at most 127^2 = 16,129, and VGG16's longest sum (25,088
terms, classifier.0) stays below 127^2 * 25,088 = 4.05e8 < 2^31, so the kernels' int32 accumulators cannot overflow.
In numpy the sums are computed in float32 (fast BLAS) when no partial sum can reach 2^24 (every integer up to 2^24
is exact in float32): max |a8| * max over n of sum_k |w8[n, k]| <= 2^24, whatever the order of the additions;
otherwise in float64 (exact up to 2^53). Either way the answer is the exact integer sum.
"""

from __future__ import annotations

import numpy as np

from . import calibration
from .calibration import scaled

MAX = 127  # symmetric: -128 unused
EXACT_FLOAT32 = 2 ** 24  # every integer of magnitude up to this is a float32


def to_int8(y: np.ndarray) -> np.ndarray:
    """float32 array -> float32 array of the nearest integers, ties to even, clipped to +-127."""
    y = np.asarray(y, dtype=np.float32)
    if np.isnan(y).any():
        raise ValueError("NaN has no INT8 value; the activations or weights hold NaN")
    return np.clip(np.rint(y), -MAX, MAX)


def weight_scales(weight: np.ndarray) -> np.ndarray:
    """Per output channel (axis 0): the channel's absolute maximum / 127, float32; 1.0 for a channel of zeros."""
    return calibration.weight_scales(weight, MAX)


def quantize(x, scale) -> np.ndarray:
    """int8 codes of x / scale (`scale` a scalar, or a vector along axis 0): nearest even, clipped to +-127."""
    return to_int8(scaled(x, scale)).astype(np.int8)


def dequantize(codes, scale) -> np.ndarray:
    """float32 codes * scale, `scale` a scalar or a vector along axis 0."""
    codes = np.asarray(codes, dtype=np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    return codes * (scale if scale.ndim == 0 else scale.reshape((-1,) + (1,) * (codes.ndim - 1)))


def l1_bound(w8: np.ndarray) -> float:
    """max over output channels n of sum_k |w8[n, k]|: with max |a8|, the bound on every partial sum."""
    return float(np.abs(w8.reshape(len(w8), -1)).sum(axis=1, dtype=np.float64).max()) if w8.size else 0.0


def exact_sum(products, a8: np.ndarray, w8: np.ndarray, w_l1: float | None = None) -> np.ndarray:
    """`products(a, w)` (a sum of products, e.g. a convolution or a @ w.T) of integer-valued a8 and w8, exact:
    in float32 when max |a8| * w_l1 <= 2^24 (`w_l1`: `l1_bound(w8)`, computed if not given), else in float64.
    Returns float32 when that is exact, float64 otherwise."""
    w_l1 = l1_bound(w8) if w_l1 is None else w_l1
    top = float(np.abs(a8).max()) if a8.size else 0.0
    if top * w_l1 <= EXACT_FLOAT32:
        return products(a8.astype(np.float32, copy=False), w8.astype(np.float32, copy=False))
    return products(a8.astype(np.float64), w8.astype(np.float64))
