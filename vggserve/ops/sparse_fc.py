"""Sparse fully connected layers: the host side of kernels/fc_sparse.cl (docs/sparse.md) and its registry entry
("sparse_csr": portable family, FP32, chosen from a layer's measured sparsity through ops/sparse_select.py).

`SparseFc` holds one pruned (M, K) layer in CSR (sparse_formats.csr) and runs it at any batch size up to
`max_batch`: fc_spmv for n <= SPMV_NB (one pass over the non-zeros, whatever n), else fc_transpose + fc_spmm.
`enqueue(queue, src, dst, n)` returns an event or (first, last) events, as GemvLayer does.
"""

import numpy as np
import pyopencl as cl

from .launch import Launch, PerQueue, round_up, upload
from .registry import Algorithm, register
from .sparse_conv import upload_raw
from .sparse_formats import csr

MF = cl.mem_flags
ALGO = "sparse_csr"

# CPUs: a work-item walks a whole row (SPMV_LK 1), 8 rows per work-group; fc_spmm keeps 16 images in one vector.
# GPUs: 32 lanes (a warp) share a row's non-zeros; fc_spmm runs 64 images of one row per work-group.
DEFAULTS = {
    "cpu": {"SPMV_LM": 8, "SPMV_LK": 1, "SPMV_NB": 4, "SPMM_NV": 16, "SPMM_WG": 1, "TR_WG": 16},
    "gpu": {"SPMV_LM": 4, "SPMV_LK": 32, "SPMV_NB": 4, "SPMM_NV": 1, "SPMM_WG": 64, "TR_WG": 64},
}
TUNABLES = tuple(DEFAULTS["gpu"])


def default_params(kind: str) -> dict:
    return {"ALGO": ALGO, **DEFAULTS["cpu" if kind == "cpu" else "gpu"]}


class SparseFc:
    """fc_sparse.cl: y = act(x W^T + b) for a pruned (M, K) weight, reading only its non-zeros."""

    def __init__(self, ctx, cache, params: dict, weight: np.ndarray, bias: np.ndarray, relu: int = 1,
                 max_batch: int = 1):
        if params["SPMM_NV"] not in (1, 2, 4, 8, 16):
            raise ValueError(f"sparse fc params {params}: SPMM_NV must be 1, 2, 4, 8 or 16")
        self.p = dict(params)
        self.m, self.k = weight.shape
        w = csr(weight)
        self.nnz = int(w.vals.size)
        self.density = self.nnz / max(weight.size, 1)
        self.format_bytes = w.nbytes
        self.rowptr, self.cols, self.vals = (upload_raw(ctx, a) for a in (w.rowptr, w.cols, w.vals))
        self.bias = upload(ctx, bias)
        defs = {**{k: v for k, v in params.items() if k in TUNABLES}, "RELU": relu, "SP_COL16": int(w.col16)}
        program = cache.build("fc_sparse.cl", defs)
        self.spmv = Launch(cl.Kernel(program, "fc_spmv"))
        self.spmm = Launch(cl.Kernel(program, "fc_spmm"))
        self.transpose = Launch(cl.Kernel(program, "fc_transpose"))
        self.max_batch = max_batch
        self.xt = None  # K x NP transposed input of fc_spmm, only where batches beyond SPMV_NB can come
        if max_batch > params["SPMV_NB"]:
            self.xt = PerQueue(ctx, 4 * self.k * round_up(max_batch, params["SPMM_NV"]))  # one per lane

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        """fc_spmv (one launch, its event) for n <= SPMV_NB, else fc_transpose + fc_spmm (first, last)."""
        p = self.p
        if n > self.max_batch:
            raise ValueError(f"batch {n} is larger than this layer's max_batch {self.max_batch}")
        if n <= p["SPMV_NB"]:
            local = (p["SPMV_LK"], p["SPMV_LM"])
            grid = (p["SPMV_LK"], round_up(self.m, p["SPMV_LM"]))
            return self.spmv(queue, grid, local, src, self.rowptr, self.cols, self.vals, self.bias, dst, self.k,
                             self.m, n)
        nv, np_ = p["SPMM_NV"], round_up(n, p["SPMM_NV"])
        xt = self.xt.get(queue)
        first = self.transpose(queue, (round_up(self.k, p["TR_WG"]), n), (p["TR_WG"], 1), src, xt, self.k, n, np_)
        grid = (round_up(np_ // nv, p["SPMM_WG"]), self.m)
        last = self.spmm(queue, grid, (p["SPMM_WG"], 1), xt, self.rowptr, self.cols, self.vals, self.bias, dst,
                         self.m, n, np_)
        return first, last

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        """The DENSE layer's flops (the work done is `density` of it)."""
        return 2.0 * n * self.m * self.k

    def weight_bytes_read(self) -> int:
        """Bytes of weights one pass reads (dense: 4 * M * K)."""
        return self.format_bytes

    def describe(self) -> str:
        return (f"sparse_csr {self.nnz:,} non-zeros ({self.density:.1%}), {self.format_bytes / 1e6:.1f} MB read; "
                f"fc_spmv up to batch {self.p['SPMV_NB']}, fc_spmm above")


CANDIDATES = {
    "cpu": [{"SPMV_LM": lm, "SPMM_NV": nv} for lm in (8, 4, 16) for nv in (16, 8)],
    "gpu": [{"SPMV_LK": lk, "SPMV_LM": lm, "SPMM_WG": wg} for lk in (32, 16) for lm in (4, 8) for wg in (64, 32)],
}


class SparseCsr(Algorithm):
    """The registry entry of fc_sparse.cl: fully connected layers, FP32, portable family; `sparse` as in
    ops/sparse_conv.SparseConvAlgorithm."""

    name = ALGO
    family = "portable"
    kinds = ("fc",)
    precisions = ("fp32",)
    tunables = TUNABLES
    kernel_file = "fc_sparse.cl"
    sparse = True

    def default(self, caps, precision):
        return default_params(caps.kind)

    def candidates(self, caps, precision, layer):
        return self.variants(caps, precision, CANDIDATES["cpu" if caps.kind == "cpu" else "gpu"])

    def local_mem(self, params, precision):
        return 4 * params["SPMV_LM"] * params["SPMV_LK"] if params["SPMV_LK"] > 1 else 0

    def work_group_size(self, params):
        return max(params["SPMV_LM"] * params["SPMV_LK"], params["SPMM_WG"], params["TR_WG"])

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, **extra):
        p = {**self.default(env.caps, precision), **params, "ALGO": self.name}
        return SparseFc(ctx, cache, p, weight, bias, relu=int(layer.relu), max_batch=env.max_batch)


ALGORITHM = register(SparseCsr())
