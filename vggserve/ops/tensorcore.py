"""Tensor-core implicit GEMM (kernels/conv_tc.cl): 3x3 convolutions and fully connected layers on NHWC storage,
FP16, TF32, FP8 (e4m3) or INT8 (u8 x s8), scaled (ops/eightbit.py), with split K where the output tiles are too few
to fill the device.

Weights are re-laid out once at load into the kernel's "OHWI" matrix: Wt[n, (ky*KS + kx)*Cpad + ci], rows padded to
the tile BN and columns to the k-tile BK, in the storage type (TF32: rounded as cvt.rna.tf32.f32 does; FP8: e4m3
codes of W[n] / s_w[n]; INT8: s8 codes of W[n] / s_w[n] in bytes). The tiles' K sizes (KB) are bytes, the same at
every precision.
"""

import numpy as np
import pyopencl as cl

from ..quant import e4m3
from .eightbit import LayerScales
from .launch import MF, Launch, PerQueue, round_up, upload
from .precision import Precision
from .registry import Algorithm, BuildEnv, LayerSpec, register

KERNEL_FILE = "conv_tc.cl"
TUNABLES = ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB")
# 128x128 tiles, 8 warps of 64x32, 3 stages of 64-byte rows: the best at batch 64 on every VGG16 shape but the
# first two on the H100 (benchmarks/tc_layers.py); the tuner picks per layer and batch
DEFAULT = {"ALGO": "tc_gemm", "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "STAGES": 3, "KB": 64}
TILES = [(128, 128, 2, 4, 3, 64), (128, 128, 2, 2, 3, 64), (128, 64, 2, 2, 4, 64), (64, 64, 2, 2, 3, 128),
         (64, 128, 1, 4, 3, 64), (256, 128, 4, 2, 2, 64), (256, 128, 4, 2, 4, 32), (128, 128, 2, 2, 6, 32),
         (64, 64, 2, 2, 6, 64), (32, 64, 1, 2, 3, 128)]


def rna_tf32(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 does (10 mantissa bits, ties away from zero)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def vec(precision: Precision) -> int:
    """Channels per 16-byte chunk: activations hold a multiple of this many channels."""
    return 16 // precision.itemsize


def tc_weights(weight: np.ndarray, cpad: int, npad: int, kpad: int, precision: Precision) -> np.ndarray:
    """(M, C, KS, KS) or (M, C) weights -> (npad, kpad) in the storage type: row n = channel n, column
    (ky*KS + kx)*cpad + ci, zero in every padding. FP8: weights already quantised per channel (LayerScales.weight:
    e4m3 values of W[n] / s_w[n]), stored as their codes; INT8: integers of +-127 (LayerScales.weight), stored as s8
    in bytes."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim == 2:
        w = w[:, :, None, None]
    m, c, ks, _ = w.shape
    laid = np.zeros((m, ks, ks, cpad), np.float32)
    laid[..., :c] = w.transpose(0, 2, 3, 1)
    out = np.zeros((npad, kpad), np.float32)
    out[:m, :ks * ks * cpad] = laid.reshape(m, -1)
    if precision.fp8:
        return e4m3.encode(out)
    if precision.int8:
        return out.astype(np.int8).view(np.uint8)
    if precision.tf32:
        return rna_tf32(out)
    return out.astype(np.float16)


def nhwc_fc_weights(weight: np.ndarray, channels: int, cpad: int, side: int) -> np.ndarray:
    """The first FC layer's (out, C*side*side) weights, whose columns follow torchvision's NCHW flatten
    (c*side*side + y*side + x), as the columns of an NHWC flatten with cpad channels ((y*side + x)*cpad + c)."""
    out = weight.shape[0]
    w = np.asarray(weight, dtype=np.float32).reshape(out, channels, side, side).transpose(0, 2, 3, 1)
    laid = np.zeros((out, side, side, cpad), np.float32)
    laid[..., :channels] = w
    return laid.reshape(out, -1)


def padded_bias(ctx, bias: np.ndarray, npad: int):
    """The bias as a device buffer of npad floats, zero past the layer's channels (whose outputs stay zero)."""
    b = np.zeros(npad, np.float32)
    b[:len(bias)] = bias
    return upload(ctx, b)


# split counts the tuner tries for a layer that splits K at its batch (TensorCoreLayer.split_targets)
SPLITS_TRIED = (1, 2, 3, 4, 6, 8, 12, 16)


class TensorCoreLayer:
    """One 3x3 convolution (ks=3) or fully connected layer (ks=1) on conv_tc.cl. Input: NHWC with `cpad` channels;
    output: NHWC with `cstore` = cout rounded up to 16 bytes of the output's storage (float32 logits when `last`).
    8-bit (ops/eightbit.py): in_scale, the scale of an FP8 or INT8 input (required); out_scale, the next layer's input
    scale where this layer writes 8-bit codes (`out_codes`: FP8 or INT8, any input precision), None for FP16 (8-bit
    input) or the precision's storage."""

    name = "tc_gemm"

    def extra_defines(self, params: dict) -> dict:
        return {}

    def program(self, cache, env, defines: dict):
        return cache.build(KERNEL_FILE, defines)

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv, cpad: int | None = None, in_scale: float | None = None,
                 out_scale: float | None = None, out_codes: Precision | None = None):
        self.p, self.precision, self.layer = dict(params), precision, layer
        self.scales = LayerScales(precision, weight, in_scale, out_scale, layer.last, out_codes)
        self.elem = precision.itemsize
        self.vec, self.bk = vec(precision), params["KB"] // self.elem
        self.cout = layer.cout
        self.cpad = cpad or round_up(layer.cin, self.vec)
        self.cstore = out_channels(layer, precision, self.scales)
        self.ks = layer.ks
        self.kpad = round_up(self.ks * self.ks * self.cpad, self.bk)
        self.npad = round_up(layer.cout, params["BN"])
        self.threads = 32 * params["WARPS_M"] * params["WARPS_N"]
        self.groups_n = self.npad // params["BN"]
        self.ntiles = self.kpad // self.bk
        self.wt = upload(ctx, tc_weights(self.scales.weight, self.cpad, self.npad, self.kpad, precision),
                         precision.storage)
        self.bias = padded_bias(ctx, bias, self.npad)
        self.scale_args = self.scales.args(ctx, self.npad)  # after the bias: cs (8-bit in), out_scale_inv (8-bit out)
        defines = dict(defines_for(params, precision, layer), **env.caps.mma_define, **self.extra_defines(params),
                       **self.scales.defines)
        self.kernel = Launch(cl.Kernel(self.program(cache, env, defines), "conv_tc"))
        self.target = int(params.get("GROUPS_TARGET", 2 * env.caps.compute_units))
        self.split_kernel = self.reduce = None
        self.plans = {n: self.plan(n) for n in range(1, env.max_batch + 1)}
        if any(s > 1 for s, _ in self.plans.values()):
            split = self.program(cache, env, {**defines, "SPLITK": 1})
            self.split_kernel = Launch(cl.Kernel(split, "conv_tc"))
            self.reduce = Launch(cl.Kernel(split, "tc_reduce"))
            # the FP32 partial sums of the model's split layers (they run one after another on a lane's queue)
            self.ws = env.workspace("tc_split", lambda: PerQueue(ctx))
            hw = layer.size * layer.size
            self.ws.reserve(max(4 * s * n * hw * self.cstore for n, (s, _) in self.plans.items()))

    def groups(self, npix: int) -> int:
        """Work-groups (output tiles) for npix output pixels, before any split."""
        return -(-npix // self.p["BM"]) * self.groups_n

    def split_targets(self, n: int) -> list[int]:
        """GROUPS_TARGET values that split K for n images in each other way of SPLITS_TRIED (1: no split; each
        split at least 4 k-tiles), for the tuner to time against this layer's own plan; [] where it does not split
        (its tiles already fill the device)."""
        mine, groups = self.plan(n), self.groups(n * self.layer.size ** 2)
        if mine[0] == 1:
            return []
        out, seen = [], {mine}
        for s in SPLITS_TRIED:
            target = s * groups
            got = self.plan_for(n, target)
            if got not in seen:
                seen.add(got)
                out.append(target)
        return out

    def plan(self, n: int) -> tuple[int, int]:
        return self.plan_for(n, self.target)

    def plan_for(self, n: int, target: int) -> tuple[int, int]:
        """(splits, k-tiles per split) for n images: K is split until the work-groups reach about `target`
        (GROUPS_TARGET, tuned per shape and batch; else twice the compute units), each split keeping at least 4
        k-tiles."""
        groups = self.groups(n * self.layer.size ** 2)
        want = min(-(-target // groups), self.ntiles // 4) if groups < target else 1
        if want <= 1:
            return 1, self.ntiles
        per = -(-self.ntiles // want)
        return -(-self.ntiles // per), per

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        npix = n * h * w
        groups = self.groups(npix)
        splits, per = self.plans.get(n) or self.plan(n)
        args = (self.cpad, h, w, npix, self.cstore, self.kpad, self.groups_n, per)
        scales = self.scale_args
        if splits == 1:
            return self.kernel(queue, (groups * self.threads, 1), (self.threads, 1), src, self.wt, self.bias, *scales,
                               dst, *args)
        part = self.ws.get(queue)
        first = self.split_kernel(queue, (groups * self.threads, splits), (self.threads, 1), src, self.wt,
                                  self.bias, *scales, part, *args)
        total = npix * self.cstore
        last = self.reduce(queue, (round_up(total, 256),), (256,), part, self.bias, *scales, dst, npix, self.cstore,
                           splits)
        return first, last

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * self.ks * self.ks

    def describe(self) -> str:
        p = self.p
        return (f"{self.name} {p['BM']}x{p['BN']} warps {p['WARPS_M']}x{p['WARPS_N']} {p['STAGES']} stages "
                f"{p['KB']}-byte rows{self.scales.describe()}")


def out_channels(layer: LayerSpec, precision: Precision, scales: LayerScales) -> int:
    """Channels per stored output pixel: cout rounded up to 16 bytes of the output's storage: 8 FP16, 4 TF32, 16 e4m3
    (the next layer's cpad), 4 for the float32 logits (VGG16's 1000 logits: 1000 a row, as the engine reads them)."""
    out = scales.out_precision
    return round_up(layer.cout, 4 if out is None else vec(out))


def defines_for(params: dict, precision: Precision, layer: LayerSpec) -> dict:
    out = {k: params[k] for k in TUNABLES}
    out.update(TF32=int(precision.tf32), KS=layer.ks, PAD=1 if layer.ks == 3 else 0, RELU=int(layer.relu),
               OUT_F32=int(layer.last))
    return out


def local_mem(params: dict) -> int:
    return params["STAGES"] * (params["BM"] + params["BN"]) * params["KB"]


def valid(params: dict) -> bool:
    """conv_tc.cl's shape rules (its #error line)."""
    bm, bn, wm, wn, kb = (params[k] for k in ("BM", "BN", "WARPS_M", "WARPS_N", "KB"))
    threads, chunks = 32 * wm * wn, kb // 16
    return (kb in (32, 64, 128) and params["STAGES"] >= 2 and bm % wm == 0 and bn % wn == 0
            and (bm // wm) % 16 == 0 and (bn // wn) % 16 == 0 and (bm * chunks) % threads == 0
            and (bn * chunks) % threads == 0)


class _TensorCoreAlgorithm(Algorithm):
    """What the tensor-core entries share: they need tensor cores; a candidate is a tile tuple of `tile_keys`,
    kept where `valid` (the kernel's shape rules) and where it fits the device; the default is `default_params` and
    the local memory is `local_mem_of(params)`, whatever the precision."""

    family = "tensorcore"
    precisions = ("fp16", "tf32", "fp8", "int8")
    tiles: list = []
    tile_keys: tuple = ()
    default_params: dict = {}

    def available(self, caps, precision):
        return caps.tensor_cores and precision.name in self.precisions and (caps.fp8 or not precision.fp8)

    def default(self, caps, precision):
        return dict(self.default_params)

    @staticmethod
    def valid(params: dict) -> bool:
        raise NotImplementedError

    @staticmethod
    def local_mem_of(params: dict) -> int:
        raise NotImplementedError

    def local_mem(self, params, precision):
        return self.local_mem_of(params)

    def candidates(self, caps, precision, layer):
        out = []
        for tile in self.tiles:
            p = {"ALGO": self.name, **dict(zip(self.tile_keys, tile))}
            if self.valid(p) and self.fits(p, caps, precision):
                out.append(p)
        return out

    def work_group_size(self, params):
        return 32 * params["WARPS_M"] * params["WARPS_N"]


class TensorCoreGemm(_TensorCoreAlgorithm):
    name = "tc_gemm"
    kinds = ("conv3x3", "fc")
    tunables = TUNABLES
    kernel_file = KERNEL_FILE
    tiles, tile_keys, default_params = TILES, TUNABLES, DEFAULT
    valid, local_mem_of = staticmethod(valid), staticmethod(local_mem)

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None, in_scale=None,
             out_scale=None, out_codes=None):
        return TensorCoreLayer(ctx, cache, params, precision, layer, weight, bias, env, cpad=cpad, in_scale=in_scale,
                               out_scale=out_scale, out_codes=out_codes)


ALGORITHM = register(TensorCoreGemm())


# ---- conv_tc.cl with WGMMA = 1: Hopper's warpgroup MMA from local memory, built through PTX ------------------------
WGMMA_TUNABLES = TUNABLES + ("WG_INFLIGHT",)
WGMMA_DEFAULT = {"ALGO": "tc_wgmma", "BM": 128, "BN": 128, "WARPS_M": 8, "WARPS_N": 1, "STAGES": 3, "KB": 64,
                 "WG_INFLIGHT": 0}
# (BM, BN, WARPS_M, WARPS_N, STAGES, KB, WG_INFLIGHT): one or two warpgroups of 64 rows, the whole BN per warpgroup;
# WG_INFLIGHT 1 keeps a stage's wgmma running across the next stage's barrier, at the cost of one stage of prefetch
WGMMA_TILES = [(128, 128, 8, 1, 3, 64, 0), (128, 128, 8, 1, 6, 32, 0), (128, 128, 8, 1, 6, 32, 1),
               (128, 256, 8, 1, 4, 32, 0), (128, 256, 8, 1, 4, 32, 1), (64, 128, 4, 1, 4, 64, 0),
               (64, 128, 4, 1, 4, 64, 1), (64, 256, 4, 1, 4, 32, 0), (128, 64, 8, 1, 4, 64, 0),
               (64, 64, 4, 1, 6, 64, 1), (64, 128, 4, 1, 2, 128, 0)]


def wgmma_valid(params: dict) -> bool:
    """conv_tc.cl's shape rules under WGMMA = 1 (its #error lines)."""
    bm, bn, wm, wn = (params[k] for k in ("BM", "BN", "WARPS_M", "WARPS_N"))
    inflight = params.get("WG_INFLIGHT", 0)
    return (wn == 1 and bm == 16 * wm and wm % 4 == 0 and bn % 64 == 0 and bn <= 256 and inflight in (0, 1)
            and params["STAGES"] >= 2 + inflight and valid(params))


class OnWgmma:
    """What a layer on wgmma adds to its mma.sync twin: its kernel file (`kernel_file`) built with WGMMA = 1 and
    WG_INFLIGHT; natively from the driver's PTX, patched (runtime/ptx.py); emulated (PoCL) the software model,
    built as the mma.sync kernels are."""

    kernel_file = ""

    def extra_defines(self, params: dict) -> dict:
        diag = {"WG_DIAG": int(params["WG_DIAG"])} if params.get("WG_DIAG") else {}  # benchmarks/wgmma_diag.py
        return {"WGMMA": 1, "WG_INFLIGHT": int(params.get("WG_INFLIGHT", 0)), **diag}

    def program(self, cache, env, defines: dict):
        from ..runtime import ptx

        return cache.build(self.kernel_file, defines, ptx=None if env.caps.emulate_mma else ptx)


class NeedsWgmma:
    """A registry entry whose kernels need wgmma (`Caps.wgmma`) besides what its mma.sync twin needs; FP16 and TF32
    (wgmma_halo also runs FP8 and INT8). An `experimental` entry (slower than mma.sync wherever it was
    measured) natively needs VGGSERVE_WGMMA=1 too (`Caps.wgmma_experimental`)."""

    precisions = ("fp16", "tf32")
    experimental = True

    def available(self, caps, precision):
        return (caps.wgmma and (caps.wgmma_experimental or not self.experimental)
                and super().available(caps, precision))


class WgmmaLayer(OnWgmma, TensorCoreLayer):
    """A TensorCoreLayer on wgmma."""

    name, kernel_file = "tc_wgmma", KERNEL_FILE


class TensorCoreWgmma(NeedsWgmma, TensorCoreGemm):
    name = "tc_wgmma"
    tunables = WGMMA_TUNABLES
    tiles, tile_keys, default_params = WGMMA_TILES, WGMMA_TUNABLES, WGMMA_DEFAULT
    valid = staticmethod(wgmma_valid)

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None):
        return WgmmaLayer(ctx, cache, params, precision, layer, weight, bias, env, cpad=cpad)


WGMMA_ALGORITHM = register(TensorCoreWgmma())


# ---- conv_tc_halo.cl: halo tiles, one input patch per channel chunk for all nine taps ------------------------------
HALO_FILE = "conv_tc_halo.cl"
HALO_TUNABLES = ("TH", "TW", "BN", "WARPS_M", "WARPS_N", "STAGES")
HALO_DEFAULT = {"ALGO": "tc_halo", "TH": 8, "TW": 16, "BN": 128, "WARPS_M": 2, "WARPS_N": 2, "STAGES": 3}
HALO_TILES = [(8, 16, 128, 2, 2, 3), (8, 16, 128, 2, 4, 3), (8, 16, 64, 2, 2, 4), (12, 16, 64, 2, 2, 3),
              (16, 8, 128, 2, 2, 3), (8, 8, 128, 1, 4, 3), (8, 16, 128, 2, 2, 2)]
# blocks shaped to the image: at 56, 28 and 14 pixels an 8x16 block leaves 12.5%, 23% and 23% of its rows past the
# image (computed, never stored); these cover those sizes with less or none (halo_coverage), and are tried where they
# cover a layer's image better than the default block does (TensorCoreHalo.candidates)
HALO_FITTED_TILES = [(4, 28, 128, 1, 4, 3), (14, 8, 128, 1, 4, 3), (8, 14, 128, 1, 4, 3), (7, 16, 128, 1, 4, 3),
                     (8, 28, 64, 2, 2, 2), (14, 16, 64, 2, 2, 2)]
HALO_ROW = 64  # bytes of one chunk of channels


def halo_local_mem(params: dict) -> int:
    return HALO_ROW * (2 * (params["TH"] + 2) * (params["TW"] + 2) + params["STAGES"] * params["BN"])


def halo_pools(params: dict) -> bool:
    """conv_tc_halo.cl's POOL rule: blocks start at even pixels and a 2x2 window's four pixels are in one warp."""
    tw, wtm = params["TW"], params["TH"] * params["TW"] // params["WARPS_M"]
    return halo_valid(params) and params["TH"] % 2 == 0 and (tw == 8 or (tw % 16 == 0 and wtm % (2 * tw) == 0))


def halo_coverage(params: dict, size: int) -> float:
    """The share of a block grid's rows that lie in a size x size image (1.0: the blocks tile it exactly)."""
    th, tw = params["TH"], params["TW"]
    return size * size / (-(-size // th) * th * -(-size // tw) * tw)


def halo_valid(params: dict) -> bool:
    th, tw, bn, wm, wn = (params[k] for k in ("TH", "TW", "BN", "WARPS_M", "WARPS_N"))
    threads, bm = 32 * wm * wn, th * tw
    return (th >= 1 and tw >= 1 and params["STAGES"] >= 2 and bm % wm == 0 and bn % wn == 0 and (bm // wm) % 16 == 0
            and (bn // wn) % 16 == 0 and (bn * 4) % threads == 0 and params["STAGES"] - 1 < 9)


def halo_enqueue(layer, queue, src, weights: tuple, dst, n: int, h: int, w: int, scales: tuple = ()):
    """One launch of a halo kernel (conv_tc_halo.cl, conv_tc_halo_sparse.cl), whose arguments differ only in the
    weight buffers (and FP8's scales after the bias): a work-group per TH x TW pixels of an image and BN channels."""
    p = layer.p
    tiles_x, tiles_y = -(-w // p["TW"]), -(-h // p["TH"])
    groups = n * tiles_x * tiles_y * layer.groups_n
    return layer.kernel(queue, (groups * layer.threads,), (layer.threads,), src, *weights, layer.bias, *scales, dst,
                        layer.cpad, layer.cpadk, h, w, layer.cstore, layer.groups_n, tiles_x, tiles_x * tiles_y)


class HaloLayer:
    """One 3x3 convolution on conv_tc_halo.cl (NHWC, FP16, TF32, FP8 or INT8 with in_scale / out_scale as
    TensorCoreLayer); the weights' taps padded to whole chunks. With `layer.pool`, the 2x2/2 max-pool that follows is
    fused into the store: the output is the (h/2) x (w/2) image."""

    name = "tc_halo"

    def extra_defines(self, params: dict) -> dict:
        return {}

    def program(self, cache, env, defines: dict):
        return cache.build(HALO_FILE, defines)

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv, in_scale: float | None = None, out_scale: float | None = None,
                 out_codes: Precision | None = None):
        if layer.pool and not halo_pools(params):
            raise ValueError(f"{self.name} {params}: this tile cannot fuse the pooling (TH even; TW 8, or a multiple "
                             "of 16 with each warp's rows a multiple of 2*TW)")
        self.p, self.layer = dict(params), layer
        self.scales = LayerScales(precision, weight, in_scale, out_scale, layer.last, out_codes)
        v = vec(precision)
        self.ck = HALO_ROW // precision.itemsize
        self.cpad = round_up(layer.cin, v)
        self.cpadk = round_up(self.cpad, self.ck)
        self.cstore = out_channels(layer, precision, self.scales)
        self.npad = round_up(layer.cout, params["BN"])
        self.threads = 32 * params["WARPS_M"] * params["WARPS_N"]
        self.groups_n = self.npad // params["BN"]
        self.wt = upload(ctx, tc_weights(self.scales.weight, self.cpadk, self.npad, 9 * self.cpadk, precision),
                         precision.storage)
        self.bias = padded_bias(ctx, bias, self.npad)
        self.scale_args = self.scales.args(ctx, self.npad)
        defines = {**{k: params[k] for k in HALO_TUNABLES}, "TF32": int(precision.tf32), "RELU": int(layer.relu),
                   "OUT_F32": int(layer.last), "POOL": int(layer.pool), **env.caps.mma_define,
                   **self.extra_defines(params), **self.scales.defines}
        self.kernel = Launch(cl.Kernel(self.program(cache, env, defines), "conv_tc_halo"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        return halo_enqueue(self, queue, src, (self.wt,), dst, n, h, w, self.scale_args)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9

    def describe(self) -> str:
        p = self.p
        return (f"{self.name} {p['TH']}x{p['TW']} pixels x {p['BN']} channels, warps {p['WARPS_M']}x{p['WARPS_N']}, "
                f"{p['STAGES']} stages{', 2x2 max-pool in the store' if self.layer.pool else ''}"
                f"{self.scales.describe()}")


class TensorCoreHalo(_TensorCoreAlgorithm):
    name = "tc_halo"
    kinds = ("conv3x3",)
    tunables = HALO_TUNABLES
    kernel_file = HALO_FILE
    tiles, tile_keys, default_params = HALO_TILES, HALO_TUNABLES, HALO_DEFAULT
    valid, local_mem_of = staticmethod(halo_valid), staticmethod(halo_local_mem)

    def fuses_pool(self, params):
        return halo_pools(params)

    def candidates(self, caps, precision, layer):
        """The general tiles, with the fitted ones that cover this layer's image better than the default block
        right after the first (the default), so that a tune limited to a few candidates still tries them."""
        general = super().candidates(caps, precision, layer)
        floor = halo_coverage(HALO_DEFAULT, layer.size)
        fitted = [p for p in (dict(ALGO=self.name, **dict(zip(self.tile_keys, t))) for t in HALO_FITTED_TILES)
                  if halo_coverage(p, layer.size) > floor and self.valid(p) and self.fits(p, caps, precision)]
        return general[:1] + fitted + general[1:]

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None, in_scale=None,
             out_scale=None, out_codes=None):
        return HaloLayer(ctx, cache, params, precision, layer, weight, bias, env, in_scale=in_scale,
                         out_scale=out_scale, out_codes=out_codes)


HALO_ALGORITHM = register(TensorCoreHalo())


# ---- conv_tc_halo.cl with WGMMA = 1: halo tiles on wgmma, A (the patch rows) in registers, built through PTX ---------
HALO_WGMMA_TUNABLES = HALO_TUNABLES + ("WG_INFLIGHT",)
HALO_WGMMA_DEFAULT = {"ALGO": "tc_halo_wgmma", "TH": 8, "TW": 16, "BN": 128, "WARPS_M": 8, "WARPS_N": 1, "STAGES": 3,
                      "WG_INFLIGHT": 0}
# (TH, TW, BN, WARPS_M, WARPS_N, STAGES, WG_INFLIGHT): one or two warpgroups of 64 block rows, the whole BN per
# warpgroup; TW = 8 blocks can fuse the pooling (a window's rows within one warp's 16), 8x8 tiles 56-pixel images
# exactly; WG_INFLIGHT 1 keeps a step's wgmma running across the next step's barrier and ldmatrix (A registers
# double-buffered), at the cost of one step of prefetch
HALO_WGMMA_TILES = [(8, 16, 128, 8, 1, 3, 0), (8, 16, 128, 8, 1, 3, 1), (16, 8, 128, 8, 1, 3, 0),
                    (16, 8, 128, 8, 1, 3, 1), (8, 8, 128, 4, 1, 4, 0), (8, 8, 128, 4, 1, 4, 1),
                    (4, 16, 256, 4, 1, 2, 0), (8, 8, 256, 4, 1, 2, 0), (8, 16, 192, 8, 1, 2, 0),
                    (8, 16, 64, 8, 1, 4, 1), (4, 16, 128, 4, 1, 4, 1)]


def halo_wgmma_valid(params: dict) -> bool:
    """conv_tc_halo.cl's shape rules under WGMMA = 1 (its #error lines): one m16 tile per warp, 64 rows a warpgroup."""
    bm, bn, wm = params["TH"] * params["TW"], params["BN"], params["WARPS_M"]
    inflight = params.get("WG_INFLIGHT", 0)
    return (params["WARPS_N"] == 1 and bm == 16 * wm and wm % 4 == 0 and bn % 64 == 0 and bn <= 256
            and inflight in (0, 1) and params["STAGES"] >= 2 + inflight and halo_valid(params))


class HaloWgmmaLayer(OnWgmma, HaloLayer):
    """A HaloLayer on wgmma."""

    name, kernel_file = "tc_halo_wgmma", HALO_FILE


class TensorCoreHaloWgmma(NeedsWgmma, TensorCoreHalo):
    name = "tc_halo_wgmma"
    tunables = HALO_WGMMA_TUNABLES
    tiles, tile_keys, default_params = HALO_WGMMA_TILES, HALO_WGMMA_TUNABLES, HALO_WGMMA_DEFAULT
    valid = staticmethod(halo_wgmma_valid)

    def fuses_pool(self, params):
        return self.valid(params) and halo_pools(params)

    def candidates(self, caps, precision, layer):
        return _TensorCoreAlgorithm.candidates(self, caps, precision, layer)  # no fitted blocks: 64 rows a warpgroup

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None):
        return HaloWgmmaLayer(ctx, cache, params, precision, layer, weight, bias, env)


HALO_WGMMA_ALGORITHM = register(TensorCoreHaloWgmma())
