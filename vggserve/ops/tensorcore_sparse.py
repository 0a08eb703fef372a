"""2:4 structured sparsity on sparse tensor cores (mma.sp m16n8k32): the hosts of one 3x3 convolution with 2:4
weights, FP16 in the tensor-core family (NHWC in and out, like tc_gemm and tc_halo), and their registry entries
(sparse: the engine takes one only for weights that are 2:4 per tap, and where ops/sparse_select.py says it wins;
docs/sparse.md):
- "tc_sparse24" (kernels/conv_tc_sparse.cl): implicit GEMM, the activations gathered per tap as conv_tc.cl does;
- "tc_halo_sparse24" (kernels/conv_tc_halo_sparse.cl): halo tiles as conv_tc_halo.cl, each input patch fetched
  once per chunk of 32 channels for all nine taps; like tc_halo it can fuse the 2x2 max-pool that follows a layer
  into its store (`fuses_pool`), so a 2:4 network gets "+pool" steps where it is chosen.

At load the weights are laid out in the kernel's K order (tensorcore.tc_weights: k = (ky*3 + kx)*Cpad + ci, rows
padded to the channel tile; the halo kernel's taps padded to CpadK = whole chunks) and compressed (ops/sparse24.py):
the kept values (Npad x K/2 FP16) and the mma.sp metadata words. Either order keeps a 2:4 group (4 consecutive
input channels of one tap) inside one 32-k mma.sp step.
"""

import numpy as np
import pyopencl as cl

from . import sparse24
from .launch import Launch, round_up, upload
from .precision import FP16, Precision
from .registry import BuildEnv, LayerSpec, register
from .tensorcore import HALO_ROW, HALO_TUNABLES, _TensorCoreAlgorithm, halo_enqueue, padded_bias, tc_weights, vec

NAME = "tc_sparse24"
KERNEL_FILE = "conv_tc_sparse.cl"
TUNABLES = ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB")
# BM channels x BN pixels, warps, stages, activation bytes per k-tile. The default's per-warp tile (64 channels x 32
# pixels, 16 mma.sp per 32 k) mirrors tc_gemm's default, with half its k-steps; untimed until the GPU run.
DEFAULT = {"ALGO": NAME, "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "STAGES": 3, "KB": 64}
TILES = [(128, 128, 2, 4, 3, 64), (128, 128, 2, 2, 3, 64), (128, 256, 2, 4, 2, 64), (64, 128, 2, 2, 4, 64),
         (128, 64, 2, 2, 4, 64), (64, 64, 2, 2, 3, 128), (256, 128, 4, 2, 2, 64)]


def local_mem(params: dict) -> int:
    kb = params["KB"]
    return params["STAGES"] * (params["BN"] * kb + params["BM"] * kb // 2 + params["BM"] * kb // 16)


def valid(params: dict) -> bool:
    """conv_tc_sparse.cl's shape rules (its #error line)."""
    bm, bn, wm, wn, kb = (params[k] for k in ("BM", "BN", "WARPS_M", "WARPS_N", "KB"))
    threads = 32 * wm * wn
    return (kb in (64, 128) and params["STAGES"] >= 2 and bm % wm == 0 and bn % wn == 0 and (bm // wm) % 16 == 0
            and (bn // wn) % 8 == 0 and (bn * kb // 16) % threads == 0)


def compressed_weights(weight: np.ndarray, cpad: int, npad: int, kpad: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, metadata) of (M, C, 3, 3) 2:4 weights for conv_tc_sparse.cl; ValueError if they are not 2:4 in the
    K order (ky*3 + kx)*cpad + ci (weights prune --pattern 2:4 makes them so)."""
    return sparse24.compress(tc_weights(weight, cpad, npad, kpad, FP16))


class _Compressed24:
    """What both 2:4 layers share: FP16 3x3 convolutions only, NHWC FP16 in with `cpad` channels and out with
    `cstore` = round_up(cout, 8), the compressed weights and padded bias uploaded, the dense convolution's flops."""

    name = ""

    def _setup(self, params: dict, precision: Precision, layer: LayerSpec) -> None:
        if not precision.half or layer.kind != "conv3x3" or layer.last:
            raise ValueError(f"{self.name} computes FP16 3x3 convolutions only, not {layer.kind} at {precision.name}")
        self.p, self.layer = dict(params), layer
        self.cpad = round_up(layer.cin, vec(precision))
        self.cstore = round_up(layer.cout, vec(precision))
        self.threads = 32 * params["WARPS_M"] * params["WARPS_N"]

    def _upload(self, ctx, weight, bias, cpad: int, kpad: int) -> None:
        """The weights in the K order (ky*3 + kx)*cpad + ci, npad x kpad, compressed; the bias padded to npad."""
        values, meta = compressed_weights(weight, cpad, self.npad, kpad)
        self.format_bytes = values.nbytes + meta.nbytes
        self.wv = upload(ctx, values, np.float16)
        self.meta = upload(ctx, meta, np.uint32)
        self.bias = padded_bias(ctx, bias, self.npad)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        """The dense convolution's (so GFLOP/s compare with the dense layers'; the tensor cores do half)."""
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9


class SparseTensorCoreLayer(_Compressed24):
    """One 3x3 convolution with 2:4 weights on conv_tc_sparse.cl (see _Compressed24)."""

    name = NAME

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv):
        self._setup(params, precision, layer)
        self.kpad = round_up(9 * self.cpad, params["KB"] // 2)
        self.npad = round_up(layer.cout, params["BM"])
        self.groups_m = self.npad // params["BM"]
        self._upload(ctx, weight, bias, self.cpad, self.kpad)
        defines = {**{k: params[k] for k in TUNABLES}, "RELU": int(layer.relu), **env.caps.mma_define}
        self.kernel = Launch(cl.Kernel(cache.build(KERNEL_FILE, defines), "conv_tc_sparse"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        npix = n * h * w
        groups = -(-npix // self.p["BN"]) * self.groups_m
        return self.kernel(queue, (groups * self.threads,), (self.threads,), src, self.wv, self.meta, self.bias, dst,
                           self.cpad, h, w, npix, self.cstore, self.kpad, self.groups_m)

    def describe(self) -> str:
        p = self.p
        return (f"{NAME} (mma.sp 2:4) {p['BM']} channels x {p['BN']} pixels, warps {p['WARPS_M']}x{p['WARPS_N']}, "
                f"{p['STAGES']} stages {p['KB']}-byte rows")


class SparseTensorCore(_TensorCoreAlgorithm):
    name = NAME
    kinds = ("conv3x3",)
    precisions = ("fp16",)
    tunables = TUNABLES
    kernel_file = KERNEL_FILE
    sparse = True
    tiles, tile_keys, default_params = TILES, TUNABLES, DEFAULT
    valid, local_mem_of = staticmethod(valid), staticmethod(local_mem)

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None):
        return SparseTensorCoreLayer(ctx, cache, {**DEFAULT, **params}, precision, layer, weight, bias, env)


ALGORITHM = register(SparseTensorCore())


# ---- conv_tc_halo_sparse.cl: halo tiles with 2:4 weights -----------------------------------------------------------
HALO_NAME = "tc_halo_sparse24"
HALO_FILE = "conv_tc_halo_sparse.cl"
# the tunables mean what tc_halo's do (TH x TW pixels, BN channels; WARPS_M along the pixels), so its tiles carry
# over: tc_halo's general H100 FP16 winners at batch 64 before its blocks fitted to the image (8x16 x 128 and 64
# channels, 12x16 x 64), its other 128-channel shapes, and three the sparse kernel's halved A fragments leave
# registers for (ptxas sm_90: 123-225 registers, no spills); the fitted blocks (TW 14, 28) are tc_halo's only
HALO_DEFAULT = {"ALGO": HALO_NAME, "TH": 8, "TW": 16, "BN": 128, "WARPS_M": 2, "WARPS_N": 2, "STAGES": 3}
HALO_SPARSE_TILES = [(8, 16, 128, 2, 2, 3), (12, 16, 64, 2, 2, 3), (8, 16, 64, 2, 2, 4), (8, 16, 128, 2, 4, 3),
                     (16, 8, 128, 2, 2, 3), (8, 16, 128, 4, 1, 3), (8, 16, 128, 2, 2, 4), (16, 16, 64, 4, 2, 2)]
SPARSE_ROW = 36  # bytes per output channel and step: 32 of kept values + 4 of metadata


def halo_local_mem(params: dict) -> int:
    return HALO_ROW * 2 * (params["TH"] + 2) * (params["TW"] + 2) + params["STAGES"] * params["BN"] * SPARSE_ROW


def halo_sparse_pools(params: dict) -> bool:
    """conv_tc_halo_sparse.cl's POOL rule: blocks start at even pixels (TH even), a window's pixel pair lies in one
    8-pixel tile (TW a multiple of 8) and its two rows in one warp (WTM a multiple of 2*TW)."""
    th, tw = params["TH"], params["TW"]
    wtm = th * tw // params["WARPS_M"]
    return halo_valid(params) and th % 2 == 0 and tw % 8 == 0 and wtm % (2 * tw) == 0


def halo_valid(params: dict) -> bool:
    """conv_tc_halo_sparse.cl's shape rules (its #error line) and STAGES - 1 < 9."""
    th, tw, bn, wm, wn = (params[k] for k in ("TH", "TW", "BN", "WARPS_M", "WARPS_N"))
    bp = th * tw
    return (2 <= params["STAGES"] <= 9 and bp % wm == 0 and bn % wn == 0 and (bp // wm) % 8 == 0
            and (bn // wn) % 16 == 0)


class HaloSparseLayer(_Compressed24):
    """One 3x3 convolution with 2:4 weights on conv_tc_halo_sparse.cl (see _Compressed24); its taps padded to
    whole chunks of 32 channels (cpadk). With `layer.pool`, the 2x2/2 max-pool that follows is fused into the store
    (as tc_halo's): the output is the (h/2) x (w/2) image."""

    name = HALO_NAME

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv):
        if layer.pool and not halo_sparse_pools(params):
            raise ValueError(f"{HALO_NAME} {params}: this tile cannot fuse the pooling (TH even, TW a multiple of 8, "
                             "each warp's pixels a multiple of 2*TW)")
        self._setup(params, precision, layer)
        self.cpadk = round_up(self.cpad, HALO_ROW // precision.itemsize)
        self.npad = round_up(layer.cout, params["BN"])
        self.groups_n = self.npad // params["BN"]
        self._upload(ctx, weight, bias, self.cpadk, 9 * self.cpadk)
        defines = {**{k: params[k] for k in HALO_TUNABLES}, "RELU": int(layer.relu), "POOL": int(layer.pool),
                   **env.caps.mma_define}
        self.kernel = Launch(cl.Kernel(cache.build(HALO_FILE, defines), "conv_tc_halo_sparse"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        return halo_enqueue(self, queue, src, (self.wv, self.meta), dst, n, h, w)

    def describe(self) -> str:
        p = self.p
        return (f"{HALO_NAME} (mma.sp 2:4, halo) {p['TH']}x{p['TW']} pixels x {p['BN']} channels, warps "
                f"{p['WARPS_M']}x{p['WARPS_N']}, {p['STAGES']} stages"
                f"{', 2x2 max-pool in the store' if self.layer.pool else ''}")


class HaloSparseTensorCore(_TensorCoreAlgorithm):
    name = HALO_NAME
    kinds = ("conv3x3",)
    precisions = ("fp16",)
    tunables = HALO_TUNABLES
    kernel_file = HALO_FILE
    sparse = True
    tiles, tile_keys, default_params = HALO_SPARSE_TILES, HALO_TUNABLES, HALO_DEFAULT
    valid, local_mem_of = staticmethod(halo_valid), staticmethod(halo_local_mem)

    def fuses_pool(self, params):
        return halo_sparse_pools({**HALO_DEFAULT, **params})

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None):
        return HaloSparseLayer(ctx, cache, {**HALO_DEFAULT, **params}, precision, layer, weight, bias, env)


HALO_ALGORITHM = register(HaloSparseTensorCore())
