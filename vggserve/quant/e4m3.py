"""E4M3 (OCP FP8 "E4M3FN", NVIDIA's `.e4m3`): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinity;
NaN is S.1111.111; the largest finite value 448 (S.1111.110); normals from 2^-6, subnormals down to 2^-9.

`encode` rounds float32 to the nearest e4m3, ties to even, saturating to +-448 (infinities too) and keeping NaN: what
PTX's `cvt.rn.satfinite.e4m3x2.f32` does, and what the FP8 kernels' epilogues and their software model do. `decode` is
exact (every e4m3 is a float32). The reference against which kernels, scales and calibration are tested.
"""

import numpy as np

MAX = 448.0  # largest finite e4m3
MIN_NORMAL = 2.0 ** -6
MIN_SUBNORMAL = 2.0 ** -9
NAN_BITS = 0x7F


def _table() -> np.ndarray:
    """float32 value of each of the 256 codes."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, mant = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, mant * MIN_SUBNORMAL, (1.0 + mant / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(codes & 0x7F) == NAN_BITS] = np.nan
    return value.astype(np.float32)


VALUES = _table()


def decode(bits) -> np.ndarray:
    """uint8 e4m3 codes -> float32."""
    return VALUES[np.asarray(bits, dtype=np.uint8)]


def encode(x) -> np.ndarray:
    """float32 (or float64) values -> uint8 e4m3 codes: round to nearest, ties to even, saturate to +-448, NaN kept."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    sign = np.signbit(x).astype(np.uint8) << 7
    a = np.minimum(np.abs(np.where(nan, 0.0, x)), MAX)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, -6.0)  # below 2^-6: the subnormals' fixed step 2^-9
    step = 2.0 ** (e - 3.0)
    q = np.rint(a / step) * step  # exact in float64; rint rounds half to even
    # q may have rounded up into the next binade (e.g. 15.5 -> 16): recompute its exponent
    with np.errstate(divide="ignore"):
        qe = np.floor(np.log2(np.where(q > 0, q, 1.0)))
    normal = q >= MIN_NORMAL
    exp_field = np.where(normal, qe + 7.0, 0.0)
    mant_field = np.where(normal, q / 2.0 ** (qe - 3.0) - 8.0, q / MIN_SUBNORMAL)
    bits = (exp_field.astype(np.int64) << 3 | np.rint(mant_field).astype(np.int64)).astype(np.uint8)
    bits = bits | sign
    return np.where(nan, np.uint8(NAN_BITS) | sign, bits).astype(np.uint8)


def round_trip(x) -> np.ndarray:
    """x rounded to e4m3 as float32 (decode(encode(x)))."""
    return decode(encode(x))
