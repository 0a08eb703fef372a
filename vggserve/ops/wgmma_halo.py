"""3x3 convolutions on Hopper's wgmma with the weights in registers (kernels/conv_wg_halo.cl, `wgmma_halo`).

The weights are wgmma's A, loaded from global memory as mma.sync's A fragments; the pixels of a TH x 8 block are its
N, read through a descriptor from the input patch, the only thing in local memory. Built through the driver's patched
PTX like the other wgmma entries (tensorcore.OnWgmma), emulated on PoCL; FP16, TF32, and the 8-bit precisions (FP8:
e4m3 x e4m3; INT8: s8 weights x u8 activations) with ops/eightbit.py's scales, which need wgmma's native 8-bit forms
(mma.sync's e4m3 is emulated through FP16 on sm_90: BENCHMARKS.md, seventeenth session).
"""

import os

import numpy as np
import pyopencl as cl

from .launch import Launch, round_up
from .precision import Precision
from .registry import BuildEnv, LayerSpec, register
from .tensorcore import (HALO_ROW, NeedsWgmma, OnWgmma, _TensorCoreAlgorithm, halo_enqueue, out_channels, padded_bias,
                         tc_weights, vec)
from .eightbit import LayerScales

KERNEL_FILE = "conv_wg_halo.cl"
TUNABLES = ("TH", "WGS")
DEFAULT = {"ALGO": "wgmma_halo", "TH": 14, "WGS": 2}
# (TH, WGS): blocks of TH x 8 pixels (wgmma's N = 8 TH) for one or two warpgroups of 64 channels; 28 and 14 rows
# divide every VGG16 image side (224 to 14), the others leave a ragged last block on some. 14 rows and two
# warpgroups won every 3x3 layer but one on an H200 at batch 64 (BENCHMARKS.md, twenty-third session)
TILES = [(14, 2), (14, 1), (28, 1), (28, 2), (16, 1), (32, 1), (32, 2), (24, 1), (16, 2), (8, 1), (8, 2)]
# FP8 promotes each tap's sum into FP32 accumulators (conv_wg_halo.cl, PROMOTE): two sets of accumulators, so
# blocks past 16 rows spill (ptxas: 166 registers at 14 rows, 179 at 16; 28 rows spill); on an H200 14 rows won the
# 512-channel layers and 8 rows (one warpgroup) the 256-channel ones (BENCHMARKS.md, twenty-fourth session)
FP8_TILES = [(14, 2), (8, 1), (14, 1), (16, 2), (16, 1), (8, 2)]
# and each with two taps' sums promoted at a time (PROMOTE 2: 128 products a promotion, CUTLASS's default
# interval of 4 k-steps of 32, and DeepSeek-V3's; 5 waits for a chunk's 9 taps instead of 9; ptxas: the same
# registers). On an H200 at batch 64 it took four of its 3x3 layers from 1.150 to 0.979 ms, its best tile 8 rows
# with two warpgroups, the slowest of the six with PROMOTE 1 there (BENCHMARKS.md, twenty-sixth session): so all six
FP8_PAIRED = len(FP8_TILES)
SIDES = (8, 14, 16, 24, 28, 32)
PW = 10  # patch width: TW = 8 output columns and the halo
KSTEPS = 2  # 32-byte k-steps per 64-byte chunk


ACCUMULATE_ENV = "VGGSERVE_FP8_ACCUMULATE"
ACCUMULATE_MODES = ("fp32", "fast")


def fp8_promotes(params: dict) -> int:
    """conv_wg_halo.cl's PROMOTE at FP8: the table's "PROMOTE" where it names one, else 1 (each tap's sum promoted
    into FP32 accumulators, the default) unless VGGSERVE_FP8_ACCUMULATE=fast (0: the tensor cores accumulate the
    whole sum, as CUTLASS's FP8 "fast accumulation" kernels; BENCHMARKS.md, twenty-fourth session)."""
    if "PROMOTE" in params:
        return int(params["PROMOTE"])
    mode = os.environ.get(ACCUMULATE_ENV, "").strip().lower() or "fp32"
    if mode not in ACCUMULATE_MODES:
        raise ValueError(f"{ACCUMULATE_ENV} must be one of {', '.join(ACCUMULATE_MODES)}, not {mode!r}")
    return int(mode == "fp32")


def valid(params: dict) -> bool:
    """conv_wg_halo.cl's #error rules (PROMOTE, FP8's only: 0, or 1 to 9 taps a promotion)."""
    return params["TH"] in SIDES and params["WGS"] in (1, 2) and 0 <= int(params.get("PROMOTE", 1)) <= 9


def local_mem(params: dict) -> int:
    """Two patches of (TH + 2) x 10 pixels, 64 bytes each."""
    return 2 * (params["TH"] + 2) * PW * HALO_ROW


def layout_defines(th: int) -> dict:
    """The patch's descriptor layout (wgmma.clh): planes of PROWS 16-byte pieces, 8-pixel groups PW pieces apart."""
    prows = (th + 2) * PW
    return {"BN": 8 * th, "WG_LBO": 16 * prows, "WG_SBO": 16 * PW, "WG_ADV": 2 * prows}


def pack_fragments(wt: np.ndarray, cpadk: int, itemsize: int) -> np.ndarray:
    """tc_weights' (npad, 9 * cpadk) matrix of a halo layer (column tap * cpadk + ci, npad a multiple of 64) as the
    A fragments conv_wg_halo.cl loads: uint32 [npad / 64][chunk][tap][k-step][warp][lane][4], where lane (g, t4) of
    warp w holds 4-byte unit t4 of rows 16 w + g, 16 w + g + 8, then unit t4 + 4 of the same rows, of the k-step's 32
    bytes (mma.clh: mma.sync's A fragment, wgmma's register fragment of A)."""
    npad = wt.shape[0]
    nchunks = cpadk * itemsize // HALO_ROW
    units = np.ascontiguousarray(wt).view(np.uint32)  # (npad, 9 * nchunks * 16): tap, chunk, k-step, half, t4
    u = units.reshape(npad // 64, 4, 2, 8, 9, nchunks, KSTEPS, 2, 4)  # [m, w, h, g, tap, chunk, ks, hi, t4]
    return np.ascontiguousarray(u.transpose(0, 5, 4, 6, 1, 3, 8, 7, 2)).reshape(-1)  # [m, c, tap, ks, w, g, t4, hi, h]


class WgmmaHaloLayer(OnWgmma):
    """One 3x3 convolution on conv_wg_halo.cl (NHWC; FP16, TF32, or FP8 / INT8 with in_scale / out_scale /
    out_codes as tensorcore.HaloLayer); with `layer.pool` the 2x2/2 max-pool that follows is fused into the store."""

    name, kernel_file = "wgmma_halo", KERNEL_FILE

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv, in_scale: float | None = None, out_scale: float | None = None,
                 out_codes: Precision | None = None):
        if not valid(params):
            raise ValueError(f"{self.name} {params}: TH one of {SIDES}, WGS 1 or 2, PROMOTE 0 to 9")
        self.p, self.layer = dict(params, TW=8), layer
        self.scales = LayerScales(precision, weight, in_scale, out_scale, layer.last, out_codes)
        self.cpad = round_up(layer.cin, vec(precision))
        self.cpadk = round_up(self.cpad, HALO_ROW // precision.itemsize)
        self.cstore = out_channels(layer, precision, self.scales)
        bn = 64 * params["WGS"]
        self.npad = round_up(layer.cout, bn)
        self.threads = 128 * params["WGS"]
        self.groups_n = self.npad // bn
        wt = tc_weights(self.scales.weight, self.cpadk, self.npad, 9 * self.cpadk, precision)
        wt = wt.astype(precision.storage, copy=False)
        frags = pack_fragments(wt, self.cpadk, precision.itemsize)
        self.wt = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=frags)
        self.bias = padded_bias(ctx, bias, self.npad)
        self.scale_args = self.scales.args(ctx, self.npad)
        defines = {"TH": params["TH"], "WGS": params["WGS"], **layout_defines(params["TH"]),
                   "TF32": int(precision.tf32), "RELU": int(layer.relu), "OUT_F32": int(layer.last),
                   "POOL": int(layer.pool), **env.caps.mma_define, **self.extra_defines(params),
                   **self.scales.defines}
        self.promote = fp8_promotes(params) if precision.fp8 else None
        if self.promote is not None:
            defines["PROMOTE"] = self.promote
        self.kernel = Launch(cl.Kernel(self.program(cache, env, defines), "conv_wg_halo"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        return halo_enqueue(self, queue, src, (self.wt,), dst, n, h, w, self.scale_args)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9

    def describe(self) -> str:
        p = self.p
        return (f"{self.name} {p['TH']}x8 pixels x {64 * p['WGS']} channels ({p['WGS']} warpgroups, weights in "
                f"registers){', 2x2 max-pool in the store' if self.layer.pool else ''}{self.scales.describe()}"
                f"{', sums accumulated in the tensor cores (fast)' if self.promote == 0 else ''}"
                f"{f', sums promoted every {self.promote} taps' if self.promote and self.promote > 1 else ''}")


class WgmmaHalo(NeedsWgmma, _TensorCoreAlgorithm):
    name = "wgmma_halo"
    experimental = False  # offered wherever the device has wgmma (runtime/caps.py)
    precisions = ("fp16", "tf32", "fp8", "int8")
    kinds = ("conv3x3",)
    tunables = TUNABLES
    kernel_file = KERNEL_FILE
    tiles, tile_keys, default_params = TILES, TUNABLES, DEFAULT
    valid, local_mem_of = staticmethod(valid), staticmethod(local_mem)

    def work_group_size(self, params):
        return 128 * params["WGS"]

    def candidates(self, caps, precision, layer):
        if not precision.fp8:
            return super().candidates(caps, precision, layer)
        ps = [{"ALGO": self.name, **dict(zip(self.tile_keys, t))} for t in FP8_TILES]
        ps += [{**p, "PROMOTE": 2} for p in ps[:FP8_PAIRED]]
        return [p for p in ps if self.fits(p, caps, precision)]

    def fuses_pool(self, params):
        return valid(params)  # TH is even: a window's four values are in one lane

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None, in_scale=None,
             out_scale=None, out_codes=None):
        return WgmmaHaloLayer(ctx, cache, params, precision, layer, weight, bias, env, in_scale=in_scale,
                              out_scale=out_scale, out_codes=out_codes)


ALGORITHM = register(WgmmaHalo())
