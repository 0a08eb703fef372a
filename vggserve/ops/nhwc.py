"""kernels/nhwc.cl's hosts: the tensor-core family's NHWC storage (model input in, 2x2 max pooling), FP16, TF32,
FP8 or INT8 (e4m3 or u8 codes: the input scaled by 1 / s_in, the pooling an unsigned byte max)."""

import numpy as np
import pyopencl as cl

from .launch import Launch, round_up
from .precision import Precision

KERNEL_FILE = "nhwc.cl"
WG = 256


def defines(precision: Precision) -> dict:
    """nhwc.cl's #defines (FP8, INT8 only where set: FP16's and TF32's programs, and their cached binaries, as
    before)."""
    return {"TF32": int(precision.tf32), "NHWC_WG": WG, **({"FP8": 1} if precision.fp8 else {}),
            **({"INT8": 1} if precision.int8 else {})}


class NhwcInput:
    """float32 NCHW (N, C, H, W) -> NHWC storage with cpad channels (zero past C), TF32-rounded for TF32; for FP8 (a
    program built with FP8 = 1) the e4m3 codes of x / scale, `scale` the first layer's input scale s_in; for INT8 its
    u8 codes (for x >= 0: the engine's first layer stays FP16 instead)."""

    def __init__(self, program, channels: int, cpad: int, scale: float | None = None):
        self.kernel = Launch(cl.Kernel(program, "to_nhwc"))
        self.c, self.cpad = channels, cpad
        self.extra = () if scale is None else (np.float32(1.0 / scale),)

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        total = n * h * w * self.cpad
        return self.kernel(queue, (round_up(total, WG),), (WG,), src, dst, n, self.c, h, w, self.cpad, *self.extra)


class MaxPoolNhwc:
    """2x2 max pooling, stride 2, on NHWC storage with cpad channels."""

    def __init__(self, program, precision: Precision):
        self.kernel = Launch(cl.Kernel(program, "maxpool_nhwc"))
        self.vec = 16 // precision.itemsize

    def enqueue(self, queue, src, dst, n: int, cpad: int, h: int, w: int):
        total = n * (h // 2) * (w // 2) * (cpad // self.vec)
        return self.kernel(queue, (round_up(total, WG),), (WG,), src, dst, n, h, w, cpad)
