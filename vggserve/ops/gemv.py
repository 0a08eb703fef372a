"""fc_gemv.cl's host: fully connected layers at small batch (1 .. GEMV_NB), split over K, sharing the GEMM's
re-laid weights."""

import pyopencl as cl

from .gemm import GemmLayer, enqueue_reduce, split_for
from .launch import MF, Launch, PerQueue

KERNEL_FILE = "fc_gemv.cl"


def gemv_span(params: dict) -> int:
    """Outputs one fc_gemv work-group covers; FC weights are padded to a multiple of it."""
    return params["GEMV_LM"] * params.get("GEMV_WM", 1)


class GemvLayer:
    """fc_gemv.cl: a fully connected layer at batch <= GEMV_NB, split over K, sharing GemmLayer's weights."""

    def __init__(self, ctx, program, params: dict, gemm: GemmLayer):
        self.p, self.g = params, gemm
        self.k = gemm.cin
        lm, lk, span = params["GEMV_LM"], params["GEMV_LK"], gemv_span(params)
        assert gemm.mpad % span == 0, "Mpad must be a multiple of GEMV_LM * GEMV_WM"
        groups_m = gemm.mpad // span
        self.ksplit, self.kchunk = split_for(self.k, 1, groups_m, params["ksplit_target"], -(-self.k // (lk * 16)))
        self.part = PerQueue(ctx, 4 * self.ksplit * params["GEMV_NB"] * gemm.mpad)  # one per lane
        self.gemv = Launch(cl.Kernel(program, "fc_gemv"))
        self.reduce = Launch(cl.Kernel(program, "fc_reduce"))
        self.local = (lm, lk)
        self.grid = (groups_m * lm, self.ksplit * lk)

    def enqueue(self, queue, src, dst, n: int):
        """Two launches (partial sums, then reduce + bias + activation); returns both events."""
        g = self.g
        part = self.part.get(queue)
        first = self.gemv(queue, self.grid, self.local, src, g.wt, part, self.k, g.mpad, n, self.kchunk)
        return first, enqueue_reduce(self.reduce, queue, part, g, dst, n, self.ksplit)
