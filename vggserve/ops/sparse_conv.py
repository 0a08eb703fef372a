"""Sparse 3x3 convolutions (padding 1) + bias + ReLU over pruned weights: the host side of kernels/pad.cl,
conv_sparse_codegen.cl and conv_sparse_compressed.cl (docs/sparse.md), and their registry entries
("sparse_codegen", "sparse_compressed": portable family, FP32, chosen by the engine from a layer's measured
sparsity through ops/sparse_select.py, never from a dense tuned table).

Both layers have GemmLayer's call shape: built once from (M, Cin, 3, 3) weights and bias, `enqueue(queue, src, dst,
n, h, w)` returns (first event, last event) of its two launches (pad, convolution), `flops(n, h, w)` counts the
DENSE convolution (so GFLOP/s figures compare with the dense layers'; the useful work is `density` of that).
The zero-padded input copy lives in a `PadWorkspace`, sized once at construction for max_batch images of
max_h x max_w (shareable by the layers of one in-order queue, like winograd.WinogradWorkspace); nothing is
allocated per call.
"""

import time

import numpy as np
import pyopencl as cl

from .launch import Launch, PerQueue, round_up, upload
from .registry import Algorithm, register
from ..runtime.programs import Generated
from ..wording import count
from .sparse_formats import codegen_cases, groups, tap_masks, weights_digest

MF = cl.mem_flags
CODEGEN = "sparse_codegen"
COMPRESSED = "sparse_compressed"
GATE = 2**31 - 1  # conv_sparse_codegen.cl's `gate`: every G(i) block runs

# tunables (kernels/conv_sparse.clh, conv_sparse_compressed.cl, pad.cl) per device kind. CPUs: one 16-float vector
# of pixels per work-item (PoCL runs a work-item's code as scalar code: the vector width has to come from inside
# it), small work-groups. The compressed kernel on CPUs: one channel per group (a tap entry per non-zero), no
# zero-activation test: on 128x256x56 at 90% sparsity 7.8 ms against 30 ms with the test (a 16-pixel vector of
# ReLU outputs is seldom all zero, and the test stalls every entry) and 33-51 ms with 4-8 channels per group, whose
# FMAs on zeros cost more than the shared loads save (2.73x dense there, 10x at 99%; docs/sparse.md).
# GPUs: one pixel per work-item, 64 work-items along the pixels sharing the weights.
DEFAULTS = {
    ("cpu", CODEGEN): {"SP_PX": 16, "SP_OCG": 16, "SP_WG": 1, "PAD_WG": 16},
    ("gpu", CODEGEN): {"SP_PX": 1, "SP_OCG": 16, "SP_WG": 64, "PAD_WG": 64},
    ("cpu", COMPRESSED): {"SP_PX": 16, "SP_OCG": 1, "SP_WG": 1, "SP_MEM": 0, "SP_CHUNK": 1024, "SP_SKIP_ZERO": 0,
                          "SP_BRANCHLESS": 0, "PAD_WG": 16},
    ("gpu", COMPRESSED): {"SP_PX": 1, "SP_OCG": 8, "SP_WG": 64, "SP_MEM": 1, "SP_CHUNK": 1024, "SP_SKIP_ZERO": 1,
                          "SP_BRANCHLESS": 0, "PAD_WG": 64},
}
TUNABLES = {CODEGEN: ("SP_PX", "SP_OCG", "SP_WG"),
            COMPRESSED: ("SP_PX", "SP_OCG", "SP_WG", "SP_MEM", "SP_CHUNK", "SP_SKIP_ZERO", "SP_BRANCHLESS")}


def default_params(kind: str, algo: str) -> dict:
    """The tunables of `algo` (CODEGEN or COMPRESSED) for a device kind ("cpu"; anything else: "gpu")."""
    return {"ALGO": algo, **DEFAULTS["cpu" if kind == "cpu" else "gpu", algo]}


def check_params(p: dict) -> None:
    """The rules the kernels rely on; ValueError naming the broken one."""
    if p["SP_PX"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"sparse conv params {p}: SP_PX must be 1, 2, 4, 8 or 16")
    if p["SP_OCG"] < 1 or p["SP_WG"] < 1:
        raise ValueError(f"sparse conv params {p}: SP_OCG and SP_WG must be positive")
    if p.get("ALGO") == COMPRESSED and (p["SP_OCG"] > 16 or p["SP_MEM"] not in (0, 1, 2)):
        raise ValueError(f"sparse conv params {p}: the compressed kernel takes SP_OCG <= 16 and SP_MEM 0, 1 or 2")


def defines(p: dict, relu: int = 1) -> dict:
    return {**{k: v for k, v in p.items() if k in TUNABLES[p["ALGO"]]}, "RELU": relu}


def padded_width(w: int, px: int) -> int:
    """PW: the padded row length, room for ceil(w / px) strips of px pixels plus a 1-pixel border each side."""
    return round_up(w, px) + 2


def density(weight: np.ndarray) -> float:
    return np.count_nonzero(weight) / max(weight.size, 1)


class PadWorkspace:
    """pad.cl's output: the zero-padded input of the sparse convolutions that run one after another on one queue.

    `reserve` (called by each layer's constructor) grows the buffer to the largest request; layers take their
    queue's (`PerQueue`: one per lane) at enqueue time, made on a lane's first batch, never per call."""

    def __init__(self, ctx, cache, wg: int):
        self.ctx, self.wg = ctx, wg
        self.kernel = Launch(cl.Kernel(cache.build("pad.cl", {"PAD_WG": wg}), "pad_nchw"))
        self.bufs = PerQueue(ctx)  # one per lane

    @property
    def floats(self) -> int:
        return self.bufs.nbytes // 4

    def reserve(self, floats: int) -> None:
        self.bufs.reserve(4 * floats)

    def enqueue(self, queue, src, n: int, c: int, h: int, w: int, pw: int):
        rows = n * c * (h + 2)
        if rows * pw > self.floats:
            raise ValueError(f"{count(n, 'image')} of {c} x {h} x {w} need {rows * pw} padded floats; the workspace "
                             f"holds {self.floats} (raise max_batch/max_h/max_w)")
        return self.kernel(queue, (round_up(pw, self.wg), rows), (self.wg, 1), src, self.bufs.get(queue), h, w, h + 2,
                           pw)


class SparseConv:
    """What both sparse convolutions share: parameters, bias, the pad pass and the launch geometry."""

    def __init__(self, ctx, cache, params: dict, weight: np.ndarray, bias: np.ndarray, max_batch: int = 1,
                 max_h: int = 224, max_w: int = 224, workspace: PadWorkspace | None = None, relu: int = 1):
        check_params(params)
        if weight.ndim != 4 or weight.shape[2:] != (3, 3):
            raise ValueError(f"a sparse 3x3 convolution needs (M, C, 3, 3) weights, got {weight.shape}")
        self.p = dict(params)
        self.m, self.cin = weight.shape[:2]
        self.nnz = int(np.count_nonzero(weight))
        self.density = density(weight)
        self.px, self.ocg, self.wg = params["SP_PX"], params["SP_OCG"], params["SP_WG"]
        self.groups = groups(self.m, self.ocg)
        self.bias = upload(ctx, bias)
        self.ws = workspace if workspace is not None else PadWorkspace(ctx, cache, params.get("PAD_WG", 64))
        self.ws.reserve(max_batch * self.cin * (max_h + 2) * padded_width(max_w, self.px))
        self.relu = relu
        self.build_s = 0.0  # this layer's program: seconds to build (or load from the cache)
        self.binary_bytes = 0

    def _program(self, cache, name: str, generated: Generated | None = None):
        t0 = time.perf_counter()
        program = cache.build(name, defines(self.p, self.relu), generated)
        self.build_s = time.perf_counter() - t0
        self.binary_bytes = sum(len(b) for b in program.get_info(cl.program_info.BINARIES))
        return program

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        """Two launches (pad, convolution); returns (first event, last event)."""
        pw = padded_width(w, self.px)
        first = self.ws.enqueue(queue, src, n, self.cin, h, w, pw)
        nstrips = n * h * (pw - 2) // self.px
        grid = (round_up(nstrips, self.wg), self.groups)
        last = self._launch(queue, grid, (self.wg, 1), dst, h, w, pw, nstrips)
        return first, last

    def _launch(self, queue, grid, local, dst, h, w, pw, nstrips):
        raise NotImplementedError

    def flops(self, n: int, h: int = 1, w: int = 1, ks: int = 3) -> float:
        """The DENSE convolution's flops (the work done is `density` of it)."""
        return 2.0 * n * h * w * self.m * self.cin * ks * ks

    def describe(self) -> str:
        p = self.p
        return (f"{p['ALGO']} {self.nnz:,} non-zeros ({self.density:.1%}), {p['SP_OCG']} channels x {p['SP_PX']} "
                f"pixels per work-item")


class SparseConvCodegen(SparseConv):
    """conv_sparse_codegen.cl: the layer's non-zero weights compiled into its program as constants.

    The program is cached by (device, driver, template, weights' sha256 and grouping): a second load of the same
    weights finds the binary without generating the source. `build_s` and `binary_bytes` say what it cost."""

    def __init__(self, ctx, cache, params: dict, weight: np.ndarray, bias: np.ndarray, **kw):
        super().__init__(ctx, cache, params, weight, bias, **kw)
        w = np.ascontiguousarray(weight, dtype=np.float32)
        piece = Generated("conv_sparse_weights.gen", weights_digest(w, "conv3x3", self.ocg),
                          lambda: codegen_cases(w, self.ocg))
        self.kernel = Launch(cl.Kernel(self._program(cache, "conv_sparse_codegen.cl", piece), "conv_sparse_codegen"))

    def _launch(self, queue, grid, local, dst, h, w, pw, nstrips):
        return self.kernel(queue, grid, local, self.ws.bufs.get(queue), self.bias, dst, self.cin, h, w, self.m, pw, nstrips,
                           GATE)


class SparseConvCompressed(SparseConv):
    """conv_sparse_compressed.cl: the non-zeros in the tap-mask format (sparse_formats.tap_masks), read from global,
    local or constant memory (SP_MEM), skipping input taps whose values are all zero (SP_SKIP_ZERO)."""

    def __init__(self, ctx, cache, params: dict, weight: np.ndarray, bias: np.ndarray, **kw):
        super().__init__(ctx, cache, params, weight, bias, **kw)
        fmt = tap_masks(weight, self.ocg, params["SP_CHUNK"] if params["SP_MEM"] == 1 else None)
        if params["SP_MEM"] == 2:
            limit = min(d.max_constant_buffer_size for d in ctx.devices)
            if fmt.heads.nbytes + fmt.vals.nbytes > limit:
                raise ValueError(f"the layer's {fmt.heads.nbytes + fmt.vals.nbytes} bytes of weights do not fit the "
                                 f"device's {limit}-byte constant buffer (SP_MEM 2); use SP_MEM 0 or 1")
        self.format_bytes = fmt.nbytes
        self.heads, self.vals = upload_raw(ctx, fmt.heads), upload_raw(ctx, fmt.vals)
        self.cptr, self.vptr, self.gchunk = (upload_raw(ctx, a) for a in (fmt.cptr, fmt.vptr, fmt.gchunk))
        self.kernel = Launch(cl.Kernel(self._program(cache, "conv_sparse_compressed.cl"), "conv_sparse_compressed"))

    def _launch(self, queue, grid, local, dst, h, w, pw, nstrips):
        return self.kernel(queue, grid, local, self.ws.bufs.get(queue), self.heads, self.vals, self.cptr, self.vptr, self.gchunk,
                           self.bias, dst, self.cin, h, w, self.m, pw, nstrips)


def upload_raw(ctx, array: np.ndarray):
    """A read-only device copy of `array` in its own dtype (at least 4 bytes, so empty formats still upload)."""
    a = np.ascontiguousarray(array)
    if a.nbytes == 0:
        a = np.zeros(4 // a.itemsize or 1, a.dtype)
    return cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=a)


LAYERS = {CODEGEN: SparseConvCodegen, COMPRESSED: SparseConvCompressed}


def sparse_conv(ctx, cache, params: dict, weight: np.ndarray, bias: np.ndarray, **kw) -> SparseConv:
    """The sparse convolution params["ALGO"] names, built."""
    return LAYERS[params["ALGO"]](ctx, cache, params, weight, bias, **kw)


CANDIDATES = {  # tunables the sparse tuner tries per device kind, over the default
    ("cpu", CODEGEN): [{"SP_PX": px, "SP_OCG": g} for px in (16, 8) for g in (16, 8, 24)],
    ("gpu", CODEGEN): [{"SP_PX": px, "SP_OCG": g, "SP_WG": wg}
                       for px in (1, 2) for g in (16, 8, 32) for wg in (64, 128)],
    ("cpu", COMPRESSED): [{"SP_PX": px, "SP_OCG": g, "SP_SKIP_ZERO": z, "SP_BRANCHLESS": int(g > 1)}
                          for px in (16, 8) for g in (1, 2, 4) for z in (0, 1)],
    ("gpu", COMPRESSED): [{"SP_PX": px, "SP_OCG": g, "SP_MEM": mem, "SP_SKIP_ZERO": z}
                          for px in (1, 2) for g in (8, 4, 16) for mem in (1, 0) for z in (1, 0)],
}


class SparseConvAlgorithm(Algorithm):
    """A registry entry of the sparse convolutions: portable family, FP32 (their sums are FP32 and their input the
    NCHW activation), 3x3 layers only. `sparse` = True: the engine takes them only where sparse_select says a
    layer's sparsity makes them win; the dense tuner leaves them out (its random weights have no zeros)."""

    family = "portable"
    kinds = ("conv3x3",)
    precisions = ("fp32",)
    sparse = True

    def __init__(self, name: str, kernel_file: str):
        self.name, self.kernel_file, self.tunables = name, kernel_file, TUNABLES[name]

    def default(self, caps, precision):
        return default_params(caps.kind, self.name)

    def candidates(self, caps, precision, layer):
        return self.variants(caps, precision, CANDIDATES["cpu" if caps.kind == "cpu" else "gpu", self.name])

    def local_mem(self, params, precision):
        return 4 * (params["SP_CHUNK"] + 1) if params.get("SP_MEM") == 1 else 0

    def work_group_size(self, params):
        return params["SP_WG"]

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, first: bool = False):
        p = {**self.default(env.caps, precision), **params, "ALGO": self.name}
        workspace = env.workspace("pad", lambda: PadWorkspace(ctx, cache, p["PAD_WG"]))
        return sparse_conv(ctx, cache, p, weight, bias, max_batch=env.max_batch, max_h=layer.size,
                           max_w=layer.size, workspace=workspace, relu=int(layer.relu))


CODEGEN_ALGORITHM = register(SparseConvAlgorithm(CODEGEN, "conv_sparse_codegen.cl"))
COMPRESSED_ALGORITHM = register(SparseConvAlgorithm(COMPRESSED, "conv_sparse_compressed.cl"))
