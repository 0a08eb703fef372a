"""The portable family's fully connected layer: one set of re-laid weights, three ways to use them by batch size.

    n <= GEMV_NB                     fc_gemv.cl: matrix-vector products split over K (bandwidth-bound)
    SplitKGemm.plan says split       conv_gemm.cl with SPLITK = 1, then fc_gemv.cl's fc_reduce
    otherwise                        conv_gemm.cl as a 1x1 convolution over the batch
"""


from .gemm import KERNEL_FILE as GEMM_FILE, GemmLayer, SplitKGemm, gemm_defines
from .gemv import KERNEL_FILE as GEMV_FILE, GemvLayer, gemv_span
from .precision import storage_defines


class PortableFc:
    def __init__(self, ctx, cache, algo, params: dict, precision, layer, weight, bias, env):
        tables = env.tables
        gemv_p = tables["gemv"]
        gemv_defs = {k: v for k, v in gemv_p.items() if k.startswith("GEMV_")}
        store = storage_defines(precision, out_float=layer.last)
        relu = int(layer.relu)
        gemm_prog = cache.build(GEMM_FILE, algo.defines(params, precision, layer))
        tiles = {k: params[k] for k in algo.tunables if k in params}
        self.gemm = GemmLayer(ctx, gemm_prog, tiles, weight, bias, m_multiple=gemv_span(gemv_p),
                              device_relayout=env.relayout, storage=precision.storage)
        gemv_prog = cache.build(GEMV_FILE, {**gemv_defs, "RELU": relu, **store})
        self.gemv = GemvLayer(ctx, gemv_prog, gemv_p, self.gemm)
        self.gemv_max = gemv_p["GEMV_NB"]
        groups = int(tables.get("splitk_groups", 2 * env.caps.compute_units))
        self.split = None  # built (and its program too) only where some batch size past fc_gemv's splits K
        plan = SplitKGemm.plan(self.gemm, env.max_batch, groups)
        if any(s > 1 for n, (s, _) in plan.items() if n > self.gemv_max):
            split_prog = cache.build(GEMM_FILE, {**gemm_defines(tiles, 1, 0, splitk=1), **store})
            self.split = SplitKGemm(ctx, split_prog, gemv_prog, self.gemm, env.max_batch, groups)
        self.layer = layer

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        if n <= self.gemv_max:
            return self.gemv.enqueue(queue, src, dst, n)
        if self.split is not None and self.split.used_for(n):
            return self.split.enqueue(queue, src, dst, n)
        return self.gemm.enqueue(queue, src, dst, n)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * self.layer.cin * self.layer.cout

    def describe(self) -> str:
        return f"{self.gemm.describe()}; fc_gemv up to batch {self.gemv_max}" + \
            ("; split K in between" if self.split is not None else "")
