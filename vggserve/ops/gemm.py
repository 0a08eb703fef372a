"""conv_gemm.cl's host: the portable implicit GEMM (3x3 convolutions, and fully connected layers at larger
batches, with split K where the output tiles are too few), FP32 or FP16 storage, and its registry entry."""

import numpy as np
import pyopencl as cl

from .launch import MF, Launch, PerQueue, round_up, upload
from .precision import Precision, storage_defines
from .registry import Algorithm, LayerSpec, register
from .relayout import DeviceRelayout, relayout

KERNEL_FILE = "conv_gemm.cl"
TUNABLES = ("TM", "TN", "TK", "WM", "WN", "LPAD")


def check_tile_params(p: dict, what: str) -> int:
    """Rules every register-blocked, local-memory-tiled GEMM here relies on; returns the work-group size."""
    tm, tn, tk, wm, wn = (p[k] for k in ("TM", "TN", "TK", "WM", "WN"))
    if tm % wm or tn % wn:
        raise ValueError(f"{what} params {p}: TM must be a multiple of WM and TN of WN")
    nt = (tm // wm) * (tn // wn)
    if (tk * tm) % nt or (tk * tn) % nt:
        raise ValueError(f"{what} params {p}: TK*TM and TK*TN must be multiples of the work-group size {nt}")
    return nt


def check_conv_params(p: dict) -> None:
    """The shape rules conv_gemm.cl relies on; ValueError naming the broken one."""
    tn, tk = p["TN"], p["TK"]
    nt = check_tile_params(p, "conv")
    if nt % tn and tn % nt:
        raise ValueError(f"conv params {p}: work-group size {nt} and TN must divide one another")
    if nt >= tn and tk % (nt // tn):
        raise ValueError(f"conv params {p}: TK must be a multiple of work-group size / TN = {nt // tn}")


def gemm_defines(params: dict, ks: int, relu: int, splitk: int = 0) -> dict:
    """conv_gemm.cl's #defines for a layer: its tile parameters, kernel size (3: padding 1; 1: a fully connected
    layer), fused ReLU, and SPLITK for the split-K variant."""
    return {**params, "KS": ks, "PAD": 1 if ks == 3 else 0, "RELU": relu, **({"SPLITK": 1} if splitk else {})}


class GemmLayer:
    """conv_gemm.cl: a 3x3 convolution (ks=3, pad=1) or a fully connected layer over the batch (ks=1, pad=0)."""

    def __init__(self, ctx, program, params: dict, weight: np.ndarray, bias: np.ndarray, m_multiple: int = 1,
                 device_relayout: DeviceRelayout | None = None, storage=np.float32):
        """device_relayout: re-lay the weights out on the device (else numpy `relayout` on the host), in its storage
        type; storage: the weights' type otherwise (the program must be built with the matching W_HALF)."""
        check_conv_params(params)
        self.p = params
        self.m = weight.shape[0]
        self.cin = weight.shape[1]
        tk, tm = params["TK"], max(params["TM"], m_multiple)
        if device_relayout is not None:
            self.wt, (_, self.mpad) = device_relayout(weight, tk, tm)
        else:
            wt = relayout(weight, tk, tm, storage)
            self.mpad, self.wt = wt.shape[1], upload(ctx, wt, storage)
        self.bias = upload(ctx, bias)
        self.kernel = Launch(cl.Kernel(program, "conv_gemm"))
        self.local = (params["TN"] // params["WN"], params["TM"] // params["WM"])

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        """One launch; returns its event."""
        npix = n * h * w
        p = self.p
        grid = (round_up(npix, p["TN"]) // p["TN"] * self.local[0], self.mpad // p["TM"] * self.local[1])
        return self.kernel(queue, grid, self.local, src, self.wt, self.bias, dst, self.cin, h, w, self.m, self.mpad, npix)

    def flops(self, n: int, h: int = 1, w: int = 1, ks: int = 3) -> float:
        return 2.0 * n * h * w * self.m * self.cin * ks * ks

    def describe(self) -> str:
        p = self.p
        return f"gemm {p['TM']}x{p['TN']}x{p['TK']} blocks {p['WM']}x{p['WN']}"


def split_for(k: int, align: int, groups: int, target: int, max_split: int) -> tuple[int, int]:
    """(splits, K per split) so that `groups` work-groups per split times the splits reach about `target`, with at
    most `max_split` splits and K per split a multiple of `align`. (1, K) when the groups alone are enough."""
    want = max(1, min(max_split, -(-target // max(groups, 1))))
    if want == 1:
        return 1, k
    kchunk = round_up(-(-k // want), align)
    return -(-k // kchunk), kchunk


def enqueue_reduce(launch: "Launch", queue, part, gemm: "GemmLayer", dst, n: int, splits: int):
    """fc_gemv.cl's fc_reduce: dst = activation(bias + the `splits` partial sums in `part`), n rows of gemm.m."""
    return launch(queue, (round_up(n * gemm.m, 64),), None, part, gemm.bias, dst, gemm.m, gemm.mpad, n, splits)


class SplitKGemm:
    """conv_gemm.cl with SPLITK = 1 for a fully connected layer: K split over work-groups, partial sums reduced by
    fc_gemv.cl's fc_reduce (bias + activation). Shares GemmLayer's weights. Used where the layer's M x N tiles
    are too few to fill the device (batch 8..64 on a GPU with 100+ compute units)."""

    def __init__(self, ctx, program, reduce_program, gemm: GemmLayer, max_n: int, target_groups: int):
        """program: conv_gemm.cl built with `gemm_defines(gemm.p, 1, 0, splitk=1)`."""
        self.g = gemm
        self.splits = self.plan(gemm, max_n, target_groups)
        floats = max(s * n for n, (s, _) in self.splits.items()) * gemm.mpad
        self.part = PerQueue(ctx, 4 * floats)  # one per lane
        self.kernel = Launch(cl.Kernel(program, "conv_gemm"))
        self.reduce = Launch(cl.Kernel(reduce_program, "fc_reduce"))

    @staticmethod
    def plan(gemm: GemmLayer, max_n: int, target_groups: int) -> dict:
        """{n: (splits, K per split)} for batches 1..max_n; worth building only if some n has splits > 1."""
        p = gemm.p
        most = min(64, gemm.cin // (8 * p["TK"]))  # each split keeps at least 8 TK-deep slices
        tiles_m = gemm.mpad // p["TM"]
        return {n: split_for(gemm.cin, p["TK"], round_up(n, p["TN"]) // p["TN"] * tiles_m, target_groups, most)
                for n in range(1, max_n + 1)}

    def used_for(self, n: int) -> bool:
        return self.splits.get(n, (1, 0))[0] > 1

    def enqueue(self, queue, src, dst, n: int):
        """Two launches (partial sums, then reduce + bias + activation); returns both events."""
        g, p = self.g, self.g.p
        splits, kchunk = self.splits[n]
        grid = (round_up(n, p["TN"]) // p["TN"] * g.local[0], g.mpad // p["TM"] * g.local[1], splits)
        part = self.part.get(queue)
        first = self.kernel(queue, grid, (*g.local, 1), src, g.wt, g.bias, part, g.cin, 1, 1, g.m, g.mpad, n, kchunk)
        return first, enqueue_reduce(self.reduce, queue, part, g, dst, n, splits)


def local_mem(params: dict) -> int:
    """Bytes of local memory of gemm_loop.clh's double-buffered FP32 tiles (conv_gemm.cl and conv_winograd.cl)."""
    return 2 * params["TK"] * (params["TM"] + params["TN"] + 2 * params.get("LPAD", 0)) * 4


def work_group_size(params: dict) -> int:
    return (params["TM"] // params["WM"]) * (params["TN"] // params["WN"])


def candidate_grid(kind: str) -> list[dict]:
    """conv_gemm.cl tile shapes worth timing on a device kind, most promising first (more outputs per work-item,
    bigger tiles), the design card's 64x64/4x4 reference first of all."""
    import itertools

    if kind == "cpu":
        grid = itertools.product((32, 64, 128), (64, 128, 256), (16, 32, 64), (8, 16, 32), (4, 8, 16), (0,))
    else:
        grid = itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32), (2, 4, 8), (2, 4, 8), (1,))
    out = []
    for tm, tn, tk, wm, wn, lpad in grid:
        p = dict(TM=tm, TN=tn, TK=tk, WM=wm, WN=wn, LPAD=lpad)
        try:
            check_conv_params(p)
        except ValueError:
            continue
        nt = work_group_size(p)
        if kind != "cpu" and (nt < 64 or wm * wn > 64):
            continue
        if kind == "cpu" and tn // wn != 16:  # PoCL vectorises 16 work-items wide (AVX-512)
            continue
        out.append(p)
    out.sort(key=lambda p: (-(p["WM"] * p["WN"]), -(p["TM"] * p["TN"]), p["TK"] != 16))
    out = [p for p in out if p != REFERENCE]
    return [dict(REFERENCE)] + out


# the design card's reference variant: 64x64 work-group tiles, 4x4 per work-item, TK-deep double buffer
REFERENCE = {"TM": 64, "TN": 64, "TK": 16, "WM": 4, "WN": 4, "LPAD": 1}


class PortableGemm(Algorithm):
    """conv_gemm.cl on any OpenCL device: 3x3 convolutions; fully connected layers (with fc_gemv.cl at small
    batch and split K in between: `ops.fc.PortableFc`)."""

    name = "gemm"
    family = "portable"
    kinds = ("conv3x3", "fc")
    precisions = ("fp32", "fp16")
    tunables = TUNABLES
    kernel_file = KERNEL_FILE

    def default(self, caps, precision):
        from ..runtime.params import TABLE, GPU_DEFAULT

        return dict(TABLE.get(caps.kind, GPU_DEFAULT)["conv"])

    def candidates(self, caps, precision, layer):
        return [p for p in candidate_grid(caps.kind) if self.fits(p, caps, precision)]

    def local_mem(self, params, precision):
        return local_mem(params)

    def work_group_size(self, params):
        return work_group_size(params)

    def defines(self, params: dict, precision: Precision, layer: LayerSpec, first: bool = False,
                splitk: int = 0) -> dict:
        tiles = {k: params[k] for k in TUNABLES if k in params}
        relu = int(layer.relu) if not splitk else 0
        return {**gemm_defines(tiles, layer.ks, relu, splitk),
                **storage_defines(precision, in_float=first, out_float=layer.last)}

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, first: bool = False):
        program = cache.build(KERNEL_FILE, self.defines(params, precision, layer, first))
        if layer.kind == "fc":
            from .fc import PortableFc

            return PortableFc(ctx, cache, self, params, precision, layer, weight, bias, env)
        return GemmLayer(ctx, program, {k: params[k] for k in TUNABLES if k in params}, weight, bias,
                         device_relayout=env.relayout, storage=precision.storage)


ALGORITHM = register(PortableGemm())
