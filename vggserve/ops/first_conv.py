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

KERNEL_FILE = "conv_first.cl"
WG = 128
MAX_CIN = 4  # input channels it takes: each is 9 registers of every work-item


def rounded(weight: np.ndarray, precision: Precision) -> np.ndarray:
    """The weights as the layer's storage holds them (tensorcore.tc_weights' values), as float32."""
    w = np.asarray(weight, np.float32)
    return rna_tf32(w) if precision.tf32 else w.astype(np.float16).astype(np.float32)


def fits(layer: LayerSpec, precision: Precision) -> bool:
    """Whether conv_first.cl computes this layer at this precision."""
    return layer.kind == "conv3x3" and layer.cin <= MAX_CIN and not layer.pool and precision.name in ("fp16", "tf32")


class FirstConv:
    """One 3x3 convolution of a float32 NCHW input with at most MAX_CIN channels, to NHWC storage with `cstore`
    channels (out_scale, out_codes: 8-bit codes of the output for the next layer, as TensorCoreLayer)."""

    name = "conv_first"

    def __init__(self, ctx, cache, precision: Precision, layer: LayerSpec, weight, bias, env: BuildEnv,
                 out_scale: float | None = None, out_codes: Precision | None = None):
        if not fits(layer, precision):
            raise ValueError(f"conv_first.cl computes 3x3 layers of at most {MAX_CIN} input channels at FP16 or TF32, "
                             f"not {layer.shape_key} at {precision}")
        self.precision, self.layer = precision, layer
        self.scales = LayerScales(precision, weight, None, out_scale, layer.last, out_codes)
        self.cstore = out_channels(layer, precision, self.scales)
        taps = layer.cin * 9  # the weights tap-major, channels padded to 8: wl[t * coutp + n] in the kernel
        laid = np.zeros((taps, round_up(layer.cout, 8)), np.float32)
        laid[:, :layer.cout] = rounded(weight, precision).reshape(layer.cout, taps).T
        self.wt = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=laid)
        self.bias = padded_bias(ctx, bias, round_up(layer.cout, 8))
        self.scale_args = self.scales.args(ctx, layer.cout)
        defines = {"CF_CIN": layer.cin, "CF_COUT": layer.cout, "CF_CSTORE": self.cstore, "CF_WG": WG,
                   "TF32": int(precision.tf32), "RELU": int(layer.relu), **env.caps.mma_define,
                   **self.scales.defines}
        self.kernel = Launch(cl.Kernel(cache.build(KERNEL_FILE, defines), "conv_first"))

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        npix = n * h * w
        return self.kernel(queue, (round_up(npix, WG),), (WG,), src, self.wt, self.bias, *self.scale_args, dst,
                           h, w, npix)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9

    def describe(self) -> str:
        return f"conv_first (float32 NCHW in, all {self.layer.cout} channels per work-item){self.scales.describe()}"
