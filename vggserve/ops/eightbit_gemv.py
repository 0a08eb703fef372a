"""tc_gemv8 (kernels/fc_eightbit_gemv.cl): the tensor-core family's 8-bit fully connected layers as matrix-vector
products, for small batches. tc_gemv's counterpart at FP8 and INT8: a layer there is bound by reading its weights
once, and classifier.0's are 103 MB of codes (205 MB at FP16), which tc_gemm reads through tiles of 128 rows that
1 to 4 images leave nearly empty.

It reads and writes what tc_gemm's 8-bit FC layers read and write (ops/eightbit.py's LayerScales: codes of x / s_in
in, the next layer's codes, FP16 or the float32 logits out; `cpad` codes per image), so the tuner can put an 8-bit FC
layer on it shape by shape and batch by batch. INT8's sums are exact integers, so its outputs are tc_gemm's bit for
bit; FP8's are FP32 sums of exact products (in another order than the tensor cores').

Plain OpenCL C plus two PTX instructions where the device is native (dp4a for INT8, the e4m3x2 conversion for FP8),
each with its exact software form under MMA_EMULATE, so PoCL runs the same arithmetic. Batch: as tc_gemv, images past
NB are further work-groups that read the weights again; `suits` keeps it to models of at most MAX_BATCH images.
"""

from .registry import register
from .tensorcore_gemv import MAX_BATCH as GEMV_MAX_BATCH, GemvAlgorithm, GemvLayer
from .tensorcore_gemv import local_mem as gemv_local_mem, valid as gemv_valid

KERNEL_FILE = "fc_eightbit_gemv.cl"
TUNABLES = ("WG", "ROWS", "NB", "TC")
MAX_BATCH = GEMV_MAX_BATCH  # as tc_gemv (GemvAlgorithm.suits): a batch-1 table's FC layers stay off larger models
DEFAULT = {"ALGO": "tc_gemv8", "WG": 256, "ROWS": 4, "NB": 4, "TC": 0}
# (WG, ROWS, NB, TC): tc_gemv's shapes, with 16 codes a piece (a work-item of 256 covers 4 KB of a row per pass); NB
# 1 and 2 for tables tuned at batch 1 or 2 (fewer registers: more work-groups resident), 4 at batch 4. TC 1: the
# products on mma.sync, 8 outputs a work-group, its WG / 32 warps splitting K (the kernel's banner)
TILES = [(256, 4, 4, 0), (256, 4, 1, 0), (256, 2, 1, 0), (256, 1, 1, 0), (128, 4, 1, 0), (128, 2, 1, 0), (512, 4, 1, 0),
         (256, 8, 1, 0), (128, 1, 1, 0), (512, 2, 1, 0), (64, 4, 1, 0), (256, 2, 2, 0), (128, 4, 2, 0), (256, 4, 2, 0),
         (128, 2, 4, 0), (256, 8, 4, 0),
         (256, 8, 1, 1), (128, 8, 1, 1), (512, 8, 1, 1), (256, 8, 4, 1), (128, 8, 2, 1)]


def valid(params: dict) -> bool:
    """tc_gemv's rules (WG a power of 2, at least one row and one image per work-group; TC 1: whole warps, ROWS 8, NB
    at most 8), without LD16: fc_eightbit_gemv.cl loads its 16-byte pieces one way."""
    return "LD16" not in params and gemv_valid(params)


local_mem = gemv_local_mem  # tc_gemv's (GemvAlgorithm.local_mem): 4-byte sums, int or float, the same count


class GemvEightBitLayer(GemvLayer):
    """One 8-bit FC layer on fc_eightbit_gemv.cl: `cpad` codes per image in; out, as LayerScales says, the next
    layer's codes, FP16, or float32 when `layer.last`."""

    name, kernel_file, entry, tunables = "tc_gemv8", KERNEL_FILE, "fc_eightbit_gemv", TUNABLES
    rules = "WG must be a power of 2, ROWS and NB at least 1; with TC 1, WG at least 32, ROWS 8 and NB at most 8"
    valid = staticmethod(valid)

    def check_precision(self, precision):
        if not precision.eight_bit:
            raise ValueError(f"tc_gemv8 computes FP8 and INT8 layers, not {precision} (tc_gemv: FP16)")


class EightBitGemv(GemvAlgorithm):
    name = "tc_gemv8"
    precisions = ("fp8", "int8")
    layer_class, tiles, default_params = GemvEightBitLayer, TILES, DEFAULT

    def available(self, caps, precision):
        """Where tc_gemm runs the precision: tensor cores, and FP8's (compute capability 8.9+, whose PTX has the
        e4m3x2 conversion) for FP8."""
        return caps.tensor_cores and precision.name in self.precisions and (caps.fp8 or not precision.fp8)


ALGORITHM = register(EightBitGemv())
