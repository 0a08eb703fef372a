"""softmax.cl's host: row-wise softmax of float32 logits."""

import pyopencl as cl

from .launch import Launch

KERNEL_FILE = "softmax.cl"


class Softmax:
    def __init__(self, program, params: dict):
        self.kernel = Launch(cl.Kernel(program, "softmax"))
        self.wg = params.get("SOFTMAX_WG", 256)

    def enqueue(self, queue, src, dst, n: int, ncls: int):
        return self.kernel(queue, (n * self.wg,), (self.wg,), src, dst, ncls)
