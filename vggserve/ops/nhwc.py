"""kernels/nhwc.cl's hosts: the tensor-core family's NHWC storage (model input in, 2x2 max pooling)."""

import pyopencl as cl

from .launch import Launch, round_up
from .precision import Precision

KERNEL_FILE = "nhwc.cl"
WG = 256


def defines(precision: Precision) -> dict:
    return {"TF32": int(not precision.half), "NHWC_WG": WG}


class NhwcInput:
    """float32 NCHW (N, C, H, W) -> NHWC storage with cpad channels (zero past C), TF32-rounded for TF32."""

    def __init__(self, program, channels: int, cpad: int):
        self.kernel = Launch(cl.Kernel(program, "to_nhwc"))
        self.c, self.cpad = channels, cpad

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        total = n * h * w * self.cpad
        return self.kernel(queue, (round_up(total, WG),), (WG,), src, dst, n, self.c, h, w, self.cpad)


class MaxPoolNhwc:
    """2x2 max pooling, stride 2, on NHWC storage with cpad channels."""

    def __init__(self, program, precision: Precision):
        self.kernel = Launch(cl.Kernel(program, "maxpool_nhwc"))
        self.vec = 16 // precision.itemsize

    def enqueue(self, queue, src, dst, n: int, cpad: int, h: int, w: int):
        total = n * (h // 2) * (w // 2) * (cpad // self.vec)
        return self.kernel(queue, (round_up(total, WG),), (WG,), src, dst, n, h, w, cpad)
