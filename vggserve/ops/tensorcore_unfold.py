"""The first convolution on tensor cores as a 1x1 GEMM over each pixel's unfolded 3x3 neighbourhood ("tc_unfold").

VGG16's first layer has 3 input channels. The other tensor-core kernels pad a pixel's channels to a whole chunk
(tc_halo: 32 FP16 channels per tap, so K = 9 x 32 = 288 for 27 real terms; tc_gemm: 9 x 8 = 72) and spend their
MMAs on zeros. Here kernels/nhwc.cl's `unfold3x3` first writes each pixel's 27 neighbours as K = 9C channels
(rounded up to 16 bytes: 32 FP16, 28 TF32) into a workspace, and conv_tc.cl then runs the layer as a 1x1
convolution over them (TensorCoreLayer with KS = 1): the same products in FP32 accumulation, a ninth of tc_halo's
MMAs, for one extra pass that writes n x H x W x K values.

Where it applies: 3x3 layers of at most MAX_CIN input channels (where 9C fits in two chunks of K; for wider
layers the unfolded activation would be 9x the input for no saving). The tuner tries it next to tc_gemm and
tc_halo (its candidates are tc_gemm's tiles) and the tables name it per shape ("ALGO": "tc_unfold").
"""

from dataclasses import replace

import numpy as np
import pyopencl as cl

from . import nhwc
from .launch import MF, Launch, round_up
from .precision import Precision
from .registry import BuildEnv, LayerSpec, register
from .tensorcore import DEFAULT, TILES, TUNABLES, TensorCoreLayer, _TensorCoreAlgorithm, local_mem, valid, vec

MAX_CIN = 7  # 9 x 7 = 63 unfolded channels: at most two 64-byte chunks of FP16


def unfolded_weights(weight: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) -> (M, 9C), column (ky*3 + kx)*C + c: the order unfold3x3 writes a pixel's neighbours in."""
    w = np.asarray(weight, dtype=np.float32)
    return w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1)


class UnfoldWorkspace:
    """One buffer for the unfolded activation of a model's tc_unfold layers (they run one after another on one
    queue), grown while layers are built, never per call."""

    def __init__(self, ctx):
        self.ctx, self.nbytes, self.buffer = ctx, 0, None

    def reserve(self, nbytes: int) -> None:
        """Grow to nbytes (a replaced buffer is freed by OpenCL once the launches that use it are done)."""
        if nbytes > self.nbytes:
            self.nbytes = nbytes
            self.buffer = cl.Buffer(self.ctx, MF.READ_WRITE, nbytes)


class UnfoldLayer:
    """One 3x3 convolution of few input channels: unfold3x3 (NHWC with `cpad` channels -> K channels per pixel in
    the workspace), then conv_tc.cl as a 1x1 convolution (NHWC out, `cstore` channels, bias and ReLU fused)."""

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv):
        if layer.cin > MAX_CIN or layer.kind != "conv3x3":
            raise ValueError(f"tc_unfold computes 3x3 layers of at most {MAX_CIN} input channels, not {layer}")
        self.p, self.layer = dict(params), layer
        v = vec(precision)
        self.cpad = round_up(layer.cin, v)  # the NHWC input's channels
        self.k = round_up(9 * layer.cin, v)  # the unfolded pixel's channels
        self.gemm = TensorCoreLayer(ctx, cache, params, precision, replace(layer, kind="fc", cin=9 * layer.cin),
                                    unfolded_weights(weight), bias, env, cpad=self.k)
        self.cstore = self.gemm.cstore
        self.unfold = Launch(cl.Kernel(cache.build(nhwc.KERNEL_FILE, nhwc.defines(precision)), "unfold3x3"))
        self.item = precision.itemsize
        self.ws = env.workspace("tc_unfold", lambda: UnfoldWorkspace(ctx))
        self.ws.reserve(env.max_batch * layer.size * layer.size * self.k * self.item)

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        total = n * h * w * self.k
        self.ws.reserve(total * self.item)  # nothing to do for the engine's calls (n <= max_batch, h = w = size)
        first = self.unfold(queue, (round_up(total, nhwc.WG),), (nhwc.WG,), src, self.ws.buffer, n, self.layer.cin,
                            h, w, self.cpad, self.k)
        last = self.gemm.enqueue(queue, self.ws.buffer, dst, n, h, w)
        return first, (last[-1] if isinstance(last, tuple) else last)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * h * w * self.layer.cout * self.layer.cin * 9

    def describe(self) -> str:
        return f"tc_unfold: 3x3 neighbourhoods as {self.k} channels, then {self.gemm.describe()} as a 1x1 convolution"


class TensorCoreUnfold(_TensorCoreAlgorithm):
    name = "tc_unfold"
    kinds = ("conv3x3",)
    tunables = TUNABLES
    kernel_file = "conv_tc.cl"
    tiles, tile_keys, default_params = TILES, TUNABLES, {**DEFAULT, "ALGO": "tc_unfold"}
    valid, local_mem_of = staticmethod(valid), staticmethod(local_mem)

    def candidates(self, caps, precision, layer):
        return super().candidates(caps, precision, layer) if layer.cin <= MAX_CIN else []

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None):
        return UnfoldLayer(ctx, cache, params, precision, layer, weight, bias, env)


ALGORITHM = register(TensorCoreUnfold())
