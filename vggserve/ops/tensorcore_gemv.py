"""tc_gemv (kernels/fc_half_gemv.cl): the tensor-core family's fully connected layers as FP16 matrix-vector products,
for small batches, where a layer is bound by reading its weights once (VGG16's classifier.0 is 205 MB of FP16) and
the tile GEMM (tc_gemm) spends its tensor cores on 1 to 8 rows of a 128-row tile.

Plain OpenCL C (no mma), so it runs wherever the family does; FP16 only. It reads and writes what TensorCoreLayer
reads and writes for an FC layer (NHWC with 1 x 1 pixels: cpad FP16 inputs, cstore outputs, FP16 or the float32
logits, padding channels zero), so the tuner can put any FC layer on it, shape by shape and batch by batch.

Batch: a work-group sums NB images; a launch covers any n, images past NB in further work-groups that read the
weights again. So a layer is correct at every batch the engine runs (a model reads the table tuned at the batch
nearest its largest, and runs smaller ones too), and the tuner's timings make it win only where n <= NB pays; a
model of more than MAX_BATCH images does not run it even where a table names it (`suits`).

8-bit models: the layers that stay FP16 there and are FC (classifier.6: FP16 in, float32 logits out) run it as in an
FP16 model; it takes no 8-bit scales (`make` refuses them), and `available` is FP16 only. A layer that reads 8-bit
codes has its own entry, tc_gemv8 (ops/eightbit_gemv.py, one byte a weight), which an FP8 or INT8 table may name.
"""

import pyopencl as cl

from .eightbit import LayerScales
from .launch import Launch, round_up, upload
from .precision import Precision
from .registry import Algorithm, BuildEnv, LayerSpec, register
from .tensorcore import out_channels, padded_bias, tc_weights, vec
from ..wording import count

KERNEL_FILE = "fc_half_gemv.cl"
TUNABLES = ("WG", "ROWS", "NB", "LD16", "TC")
MAX_BATCH = 4  # the largest batch where it beat tc_gemm on the H100 (benchmarks/fc_gemv.py; `suits`)
DEFAULT = {"ALGO": "tc_gemv", "WG": 256, "ROWS": 4, "NB": 8, "LD16": 0, "TC": 0}
# (WG, ROWS, NB, LD16, TC): few rows per work-group for the small layers (4096x1000: 1000 groups at ROWS 1), more
# for classifier.0 (ROWS 4: 1024 groups of 256, one wave of an H100's 132 SMs at 8 groups each); NB 4 and 16 for the
# register / local memory trade at the batch the table is tuned for, NB 1 and 2 for tables tuned at batch 1 or 2
# (registers and local memory for one image: more work-groups resident); LD16 1 the other way to load a piece; TC 1
# the products on mma.sync (8 outputs a work-group, its WG / 32 warps splitting K; the kernel's banner)
TILES = [(256, 4, 8, 0, 0), (256, 1, 8, 0, 0), (256, 2, 8, 0, 0), (128, 1, 8, 0, 0), (128, 2, 8, 0, 0),
         (128, 4, 8, 0, 0), (512, 2, 8, 0, 0), (256, 8, 4, 0, 0), (64, 4, 8, 0, 0), (128, 4, 16, 0, 0),
         (256, 2, 4, 0, 0), (512, 1, 4, 0, 0), (256, 4, 1, 0, 0), (256, 8, 1, 0, 0), (256, 1, 1, 0, 0),
         (512, 4, 1, 0, 0), (128, 2, 2, 0, 0), (256, 4, 8, 1, 0), (256, 1, 8, 1, 0), (128, 2, 8, 1, 0),
         (128, 4, 8, 1, 0), (256, 8, 1, 0, 1), (128, 8, 1, 0, 1), (512, 8, 1, 0, 1), (256, 8, 4, 0, 1),
         (128, 8, 2, 0, 1)]
TC_ROWS, TC_IMAGES, TC_K = 8, 8, 64  # TC 1: outputs a work-group (one n8 tile), images at most, K block bytes


def tc_valid(params: dict) -> bool:
    """TC 0, or TC 1 (the products on mma.sync, gemv_mma.clh) with whole warps, ROWS 8 and NB at most 8."""
    tc = params.get("TC", 0)
    return tc in (0, 1) and (not tc or (params["WG"] >= 32 and params["ROWS"] == TC_ROWS
                                        and params["NB"] <= TC_IMAGES))


def valid(params: dict) -> bool:
    """fc_half_gemv.cl's rules: WG a power of 2, at least one row and one image per work-group, LD16 0 or 1, TC's."""
    wg = params["WG"]
    return (wg >= 1 and wg & (wg - 1) == 0 and params["ROWS"] >= 1 and params["NB"] >= 1
            and params.get("LD16", 0) in (0, 1) and tc_valid(params))


def local_mem(params: dict) -> int:
    """The reduction's floats: ROWS x NB sums per work-item; TC 1: 64 per warp (8 images x 8 outputs), and the
    software model's fragment exchange, 6 words a work-item (the 8-bit entry's too)."""
    if params.get("TC", 0):
        return 4 * (64 + 6 * 32) * (params["WG"] // 32)
    return 4 * params["ROWS"] * params["NB"] * params["WG"]


class GemvLayer:
    """One FC layer as a matrix-vector product: what tc_gemv (GemvHalfLayer) and tc_gemv8 (ops/eightbit_gemv.py)
    share. Input: `cpad` features per image (the previous layer's cstore channels; classifier.0: the 7 x 7 x C NHWC
    flatten, its weights' columns permuted by the caller as for tc_gemm); output: `cstore` channels per image, as
    `scales` (ops/eightbit.py's LayerScales) says: the next layer's codes, FP16, or float32 when `layer.last`. A
    subclass names its kernel (`kernel_file`, `entry`), `tunables`, `valid` with its `rules` in words, and the
    precisions it takes (`check_precision`)."""

    name = kernel_file = entry = rules = ""
    tunables: tuple = ()

    @staticmethod
    def valid(params: dict) -> bool:
        raise NotImplementedError

    def check_precision(self, precision: Precision) -> None:
        raise NotImplementedError

    def __init__(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias,
                 env: BuildEnv, cpad: int | None = None, in_scale: float | None = None,
                 out_scale: float | None = None, out_codes: Precision | None = None):
        self.check_precision(precision)
        if layer.kind != "fc" or layer.pool:
            raise ValueError(f"{self.name} computes fully connected layers (no pooling)")
        if not self.valid(params):
            raise ValueError(f"{self.name} {params}: {self.rules}")
        self.p, self.precision, self.layer = dict(params), precision, layer
        # 8-bit: the weights' codes and cs (in_scale x the weights' scales); FP16: inactive (what _stored reads)
        self.scales = LayerScales(precision, weight, in_scale, out_scale, layer.last, out_codes)
        self.cpad = cpad or round_up(layer.cin, vec(precision))
        if self.cpad % vec(precision):
            raise ValueError(f"{self.name} reads 16-byte pieces: cpad {self.cpad} is not a multiple of "
                             f"{vec(precision)}")
        self.cstore = out_channels(layer, precision, self.scales)
        self.rows, self.nb, self.threads = params["ROWS"], params["NB"], params["WG"]
        self.tc = int(params.get("TC", 0))
        self.mpad = round_up(self.cstore, self.rows)
        self.groups_m = self.mpad // self.rows
        kw = round_up(self.cpad, TC_K // precision.itemsize) if self.tc else self.cpad  # TC 1: rows in 64-byte blocks
        self.wt = upload(ctx, tc_weights(self.scales.weight, self.cpad, self.mpad, kw, precision), precision.storage)
        self.bias = padded_bias(ctx, bias, self.mpad)
        self.scale_args = self.scales.args(ctx, self.mpad)  # 8-bit: cs, then out_scale_inv where it writes codes
        # mma.h's defines where the kernel uses them: TC 1, and the 8-bit kernel's dp4a / e4m3x2 (an FP16 TC 0
        # program's source stays as it was before TC existed)
        defines = {**{k: params.get(k, 0) for k in self.tunables}, "RELU": int(layer.relu), "OUT_F32": int(layer.last),
                   **(env.caps.mma_define if self.tc or precision.eight_bit else {}), **self.scales.defines}
        self.kernel = Launch(cl.Kernel(cache.build(self.kernel_file, defines), self.entry))

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        chunks = -(-n // self.nb)
        return self.kernel(queue, (self.groups_m * self.threads, chunks), (self.threads, 1), src, self.wt, self.bias,
                           *self.scale_args, dst, self.cpad, self.cstore, n)

    def flops(self, n: int, h: int = 1, w: int = 1) -> float:
        return 2.0 * n * self.layer.cout * self.layer.cin

    def describe(self) -> str:
        p = self.p
        load = ", on mma.sync" if self.tc else ", uint4 loads" if p.get("LD16") else ""
        return (f"{self.name} {count(p['ROWS'], 'row')} x {count(p['WG'], 'work-item')}, "
                f"{count(p['NB'], 'image')} a group{load}{self.scales.describe()}")


class GemvHalfLayer(GemvLayer):
    """One FP16 FC layer on fc_half_gemv.cl: FP16 features in, FP16 or the float32 logits out."""

    name, kernel_file, entry, tunables = "tc_gemv", KERNEL_FILE, "fc_half_gemv", TUNABLES
    rules = "WG must be a power of 2, ROWS and NB at least 1, LD16 0 or 1; with TC 1, WG at least 32, ROWS 8 and NB " \
            "at most 8"
    valid = staticmethod(valid)

    def check_precision(self, precision):
        if not precision.half:
            raise ValueError(f"tc_gemv computes FP16 layers, not {precision}")


class GemvAlgorithm(Algorithm):
    """What the matrix-vector FC entries share (tc_gemv here, tc_gemv8 in ops/eightbit_gemv.py): the tensor-core
    family's layouts, work-groups of WG work-items summing ROWS x NB values each, models of up to MAX_BATCH images.
    A subclass names its `layer_class` (a GemvLayer: the kernel file, `tunables` and `valid` are taken from it),
    its `tiles` (tuples in `tunables` order) and `default_params`."""

    family = "tensorcore"
    kinds = ("fc",)
    layer_class: type = GemvLayer
    tiles: list = []
    default_params: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        layer = cls.layer_class
        cls.tunables, cls.kernel_file, cls.valid = layer.tunables, layer.kernel_file, staticmethod(layer.valid)

    def suits(self, max_batch: int) -> bool:
        """Up to MAX_BATCH images: past it each weight feeds too many FP32 sums for the CUDA cores (H100, FC6 at
        batch 8: 0.35 ms against tc_gemm's 0.17), and a batch-1 table must not put a larger model's FC layers here."""
        return max_batch <= MAX_BATCH

    def default(self, caps, precision):
        return dict(self.default_params)

    def candidates(self, caps, precision, layer):
        out = [{"ALGO": self.name, **dict(zip(self.tunables, t))} for t in self.tiles]
        return [p for p in out if self.valid(p) and self.fits(p, caps, precision)]

    def local_mem(self, params, precision):
        return local_mem(params)

    def work_group_size(self, params):
        return params["WG"]

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None, in_scale=None,
             out_scale=None, out_codes=None):
        return self.layer_class(ctx, cache, params, precision, layer, weight, bias, env, cpad=cpad,
                                in_scale=in_scale, out_scale=out_scale, out_codes=out_codes)


class TensorCoreGemv(GemvAlgorithm):
    name = "tc_gemv"
    precisions = ("fp16",)
    layer_class, tiles, default_params = GemvHalfLayer, TILES, DEFAULT

    def available(self, caps, precision):
        return caps.tensor_cores and precision.name in self.precisions

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, cpad=None, in_scale=None,
             out_scale=None, out_codes=None):
        if in_scale is not None or out_scale is not None or out_codes is not None:
            raise ValueError("tc_gemv reads and writes FP16 (or the float32 logits): it takes no 8-bit scales")
        return super().make(ctx, cache, params, precision, layer, weight, bias, env, cpad=cpad)


ALGORITHM = register(TensorCoreGemv())
