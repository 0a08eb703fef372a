"""kernels/conv_first.cl's host: the tensor-core family's first convolution, read straight from the model's float32
NCHW input (no `to_nhwc` step before it), FP16 or TF32 (an 8-bit model's first layer is FP16, writing the next
layer's codes). The engine runs it for features.0 of every tensor-core model (model/vgg16.py)."""

import numpy as np
import pyopencl as cl

from .eightbit import LayerScales
from .launch import MF, Launch, round_up
from .precision import Precision
from .registry import BuildEnv, LayerSpec
from .tensorcore import out_channels, padded_bias, rna_tf32
from ..wording import count

KERNEL_FILE = "conv_first.cl"
MAX_CIN = 4  # input channels it takes: each is 9 registers of every work-item


def rounded(weight: np.ndarray, precision: Precision) -> np.ndarray:
    """The weights as the layer's storage holds them (tensorcore.tc_weights' values), as float32."""
    w = np.asarray(weight, np.float32)
    return rna_tf32(w) if precision.tf32 else w.astype(np.float16).astype(np.float32)


def fits(layer: LayerSpec, precision: Precision) -> bool:
    """Whether conv_first.cl computes this layer at this precision."""
    return layer.kind == "conv3x3" and layer.cin <= MAX_CIN and not layer.pool and precision.name in ("fp16", "tf32")


PIXELS = 128  # pixels of a work-group (its staged outputs: 36 KB at most, TF32's)
# CF_PIX: pixels per work-item; CF_CONST: the weights from constant (1) or local memory (0); CF_MMA: on the tensor
# cores (mma.sync, one pixel a work-item, the weights as B fragments). The defaults are the fastest of VARIANTS on an
# H100 (benchmarks/first_conv.py, BENCHMARKS.md): the tensor cores, at batch 64 0.200 ms at FP16 and 0.367 at TF32
# against 0.423 and 0.550 for the best fma variants (eighteenth session). Among those, two pixels shared each weight
# read at FP16 and one at TF32 (seventeenth session); constant memory was slower everywhere (0.84 ms).
DEFAULT = {"fp16": {"CF_PIX": 1, "CF_CONST": 0, "CF_MMA": 1}, "tf32": {"CF_PIX": 1, "CF_CONST": 0, "CF_MMA": 1}}
VARIANTS = [{"CF_PIX": p, "CF_CONST": c, "CF_MMA": 0} for p in (1, 2) for c in (0, 1)] + \
    [{"CF_PIX": 1, "CF_CONST": 0, "CF_MMA": 1}]


def ulps_apart(got: np.ndarray, expect: np.ndarray, tf32: bool) -> np.ndarray:
    """Per element, how far `got` is from `expect` in units in the last place of the storage (TF32: 13 bits fewer
    than FP32), beyond 2^-20 (a sum near zero of terms near one): the fma variants and mma.sync's own sums may
    differ by one."""
    diff = np.abs(got.astype(np.float64) - expect.astype(np.float64))
    ulp = np.spacing(np.abs(expect)).astype(np.float64) * (2.0 ** 13 if tf32 else 1.0)
    return np.maximum(diff - 2.0 ** -20, 0) / ulp


def mma_fragments(laid: np.ndarray, precision: Precision) -> np.ndarray:
    """The weights (taps x channels padded to 8, rounded to the storage) as conv_first.cl's CF_MMA reads them: uint32
    registers [k-step][n8 tile][b0, b1][lane] of mma.clh's B fragment layout (lane = 4 g + t: column g of the tile,
    bytes 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 of the step's 32 bytes of k, the lower k in the low half); taps
    padded with zeros to whole k-steps."""
    taps, coutp = laid.shape
    per = 1 if precision.tf32 else 2  # k per register
    kps = 8 * per  # k per step
    steps = -(-taps // kps)
    w = np.zeros((steps * kps, coutp), np.float32)
    w[:taps] = laid
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    ks = np.arange(steps)[:, None, None, None]
    nt = np.arange(coutp // 8)[None, :, None, None]
    r = np.arange(2)[None, None, :, None]
    k0 = ks * kps + r * (kps // 2) + t * per  # [steps, 1, 2, 32]
    n = nt * 8 + g  # [1, nt, 1, 32]
    if precision.tf32:
        return np.ascontiguousarray(w[k0, n].view(np.uint32))
    bits = w.astype(np.float16).view(np.uint16).astype(np.uint32)
    return np.ascontiguousarray(bits[k0, n] | bits[k0 + 1, n] << 16)


class FirstConv:
    """One 3x3 convolution of a float32 NCHW input with at most MAX_CIN channels, to NHWC storage with `cstore`
    channels (out_scale, out_codes: 8-bit codes of the output for the next layer, as TensorCoreLayer). params: one of
    VARIANTS (default: DEFAULT's for the precision); every variant computes the same bytes."""

    name = "conv_first"

    def __init__(self, ctx, cache, precision: Precision, layer: LayerSpec, weight, bias, env: BuildEnv,
                 out_scale: float | None = None, out_codes: Precision | None = None, params: dict | None = None):
        if not fits(layer, precision):
            raise ValueError(f"conv_first.cl computes 3x3 layers of at most {MAX_CIN} input channels at FP16 or TF32, "
                             f"not {layer.shape_key} at {precision}")
        self.p = dict(params or DEFAULT[precision.name])
        if self.p not in VARIANTS:
            raise ValueError(f"conv_first.cl's parameters are one of {VARIANTS}, not {params}")
        self.precision, self.layer = precision, layer
        self.scales = LayerScales(precision, weight, None, out_scale, layer.last, out_codes)
        self.cstore = out_channels(layer, precision, self.scales)
        taps = layer.cin * 9  # the weights tap-major, channels padded to 8: wl[t * coutp + n] in the kernel
        laid = np.zeros((taps, round_up(layer.cout, 8)), np.float32)
        laid[:, :layer.cout] = rounded(weight, precision).reshape(layer.cout, taps).T
        if self.p["CF_MMA"]:
            laid = mma_fragments(laid, precision)
        self.wt = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=laid)
        self.bias = padded_bias(ctx, bias, round_up(layer.cout, 8))
        self.scale_args = self.scales.args(ctx, layer.cout)
        self.wg = PIXELS // self.p["CF_PIX"]
        defines = {"CF_CIN": layer.cin, "CF_COUT": layer.cout, "CF_CSTORE": self.cstore, "CF_WG": self.wg, **self.p,
                   "TF32": int(precision.tf32), "RELU": int(layer.relu), **env.caps.mma_define,
                   **self.scales.defines}
        self.kernel = Launch(cl.Kernel(cache.build(KERNEL_FILE, defines), "conv_first"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        npix = n * h * w
        groups = -(-npix // PIXELS)
        return self.kernel(queue, (groups * self.wg,), (self.wg,), src, self.wt, self.bias, *self.scale_args, dst,
                           h, w, npix)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9

    def describe(self) -> str:
        if self.p["CF_MMA"]:
            return f"conv_first (float32 NCHW in, on the tensor cores, mma.sync){self.scales.describe()}"
        return (f"conv_first (float32 NCHW in, {count(self.p['CF_PIX'], 'pixel')} x {self.layer.cout} channels a "
                f"work-item, weights in {'constant' if self.p['CF_CONST'] else 'local'} memory){self.scales.describe()}")
