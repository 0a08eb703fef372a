"""maxpool.cl's host: 2x2 max pooling on NCHW storage (FP32 or FP16)."""

import pyopencl as cl

from .launch import Launch, round_up

KERNEL_FILE = "maxpool.cl"


class MaxPool:
    def __init__(self, program, params: dict):
        self.kernel = Launch(cl.Kernel(program, "maxpool2x2"))
        self.wg = params.get("POOL_WG", 256)

    def enqueue(self, queue, src, dst, n: int, c: int, h: int, w: int):
        total = n * c * (h // 2) * (w // 2)
        return self.kernel(queue, (round_up(total, self.wg),), (self.wg,), src, dst, n * c, h, w)
