"""E4M3 (OCP FP8 "E4M3FN", NVIDIA's `.e4m3`): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinity;
NaN is S.1111.111; the largest finite value 448 (S.1111.110); normals from 2^-6, subnormals down to 2^-9.

`encode` rounds float32 to the nearest e4m3, ties to even, saturating to +-448 (infinities too) and keeping NaN: what
PTX's `cvt.rn.satfinite.e4m3x2.f32` does, and what the FP8 kernels' epilogues and their software model do. `decode` is
exact (every e4m3 is a float32). The reference against which kernels, scales and calibration are tested.
`encode` works on the floats' bits, a chunk at a time (an FP8 engine's start encodes every weight: 138M for VGG16);
`encode_reference` is the same rounding by its definition, which tests hold `encode` to.
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


# encode works on this many elements at a time, in scratch arrays it reuses (1 MB each for float64): they stay in
# the cache, and fresh ones would cost more than the arithmetic (a new array of a megabyte comes from mmap, its pages
# faulted in one by one: 25 ns per element here against 5)
CHUNK = 1 << 17

# per float type: its unsigned view, the mantissa bits rounded off (all but e4m3's 3), the "magic" 2^14 or 2^43
# (whose ulp is 2^-9, e4m3's subnormal step) and the exponent bias
_FLOAT32 = (np.uint32, 20, np.float32(2.0 ** 14), 127)
_FLOAT64 = (np.uint64, 49, np.float64(2.0 ** 43), 1023)


class Encoder:
    """`encode` for contiguous float32 or float64 vectors, chunk by chunk, in scratch arrays made once: for a caller
    that produces its values a block at a time (ops/eightbit.quantise_weights' quotients). `into(x, out)` writes the
    codes of x (1-d, `dtype`, any length) into out (uint8, x's length)."""

    def __init__(self, dtype, chunk: int | None = None):
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"an Encoder takes float32 or float64 values, not {self.dtype}")
        self.u, self.drop, self.magic, self.bias = _FLOAT64 if self.dtype == np.float64 else _FLOAT32
        self.chunk = max(1, chunk or CHUNK)
        self.a = np.empty(self.chunk, self.dtype)
        self.code, self.sign = np.empty(self.chunk, self.u), np.empty(self.chunk, self.u)

    def into(self, x: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):  # a signalling NaN
            for i in range(0, len(x), self.chunk):
                self._chunk(x[i:i + self.chunk], out[i:i + self.chunk])

    def _chunk(self, x: np.ndarray, out: np.ndarray) -> None:
        """From the float's bits, every step in place. With a = min(|x|, 448):
        - from 2^-6 up, the code is a's bits with all but 3 mantissa bits rounded off (+ half - 1 + the lowest kept
          bit: ties to even), the exponent re-biased from the float's bias to 7; a carry out of the mantissa moves into
          the exponent, the right answer (15.5 -> 16, just below 2^-6 -> 2^-6);
        - below 2^-6, it is rint(a * 2^9) (8 is 2^-6's code): a + 2^43 (float32: 2^14), whose ulp is 2^-9, leaves it
          in the sum's low bits, the hardware rounding to nearest even.
        Both are taken without a select (which costs more than a pass): max(rounded bits, 2^-6's) - 2^-6's is zero
        below 2^-6 and code - 8 above; the sum's low bits for min(a, 2^-6) are the code below and 8 above; their sum
        is the code. NaN becomes 0x7F; the sign is x's top bit."""
        u, drop, n = self.u, self.drop, len(x)
        a, code, sign = self.a[:n], self.code[:n], self.sign[:n]
        bits = a.view(u)
        np.abs(x, out=a)
        np.minimum(a, self.dtype.type(MAX), out=a)
        np.right_shift(bits, u(drop), out=code)
        code &= u(1)
        code += u((1 << (drop - 1)) - 1)
        code += bits
        code >>= u(drop)
        min_normal = u((self.bias - 6) << 3)  # 2^-6's bits >> drop
        np.maximum(code, min_normal, out=code)
        nan = np.isnan(a) if n and np.isnan(a.max()) else None
        np.minimum(a, self.dtype.type(MIN_NORMAL), out=a)
        a += self.magic  # bits now holds the sum's
        code += bits
        code -= min_normal + self.magic.view(u)
        if nan is not None:
            code[nan] = NAN_BITS
        np.right_shift(x.view(u), u(8 * x.itemsize - 8), out=sign)
        sign &= u(0x80)
        code |= sign
        np.copyto(out, code, casting="unsafe")


def encode(x) -> np.ndarray:
    """float32 (or float64) values -> uint8 e4m3 codes: round to nearest, ties to even, saturate to +-448, NaN kept.
    float32 is rounded on its own bits, anything else as float64 (float32 -> float64 is exact, so both give the
    codes of the same value), `CHUNK` elements at a time (`Encoder`). tests/test_e4m3.py holds it against
    `encode_reference` on every code, neighbour and tie and on millions of random values; benchmarks/fp8_weights.py
    times both on VGG16's 103M classifier.0 weights."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = np.asarray(x, dtype=np.float64)
    x = np.asarray(x, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    out = np.empty(x.shape, np.uint8)
    if x.size:
        Encoder(x.dtype, min(CHUNK, x.size)).into(x.reshape(-1), out.reshape(-1))
    return out


def encode_reference(x) -> np.ndarray:
    """`encode` by its definition, in float64 arithmetic on the whole array: the exponent from log2, rint at that
    binade's step (2^-9 below 2^-6). What `encode` was until it moved to the floats' bits; about 50 times slower, kept
    as the oracle tests/test_e4m3.py holds `encode` to and as benchmarks/fp8_weights.py's "before"."""
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
