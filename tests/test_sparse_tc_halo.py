"""The halo-tile 2:4 kernel (kernels/conv_tc_halo_sparse.cl, entry tc_halo_sparse24): conv_tc_halo.cl's patch reuse
with the compressed weights as mma.sp's sparse A operand, against float64 on awkward sizes (odd and tiny images,
odd batches, channels off the 32-channel chunk and off the channel tile, all-zero filters), its K order and
compression, its candidates (tc_halo's tiles carried over), and the engine's choice between the two 2:4 kernels.

Here and in CI it runs on PoCL through mma.clh's software model of mma.sp (VGGSERVE_EMULATE_MMA=1); with
VGGSERVE_TEST_DEVICE=gpu on an NVIDIA GPU, the real instruction. The whole FP16 network on it:
tests/test_sparse_tc.py::test_pruned_2_4_network_at_fp16_matches_float64.
"""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.ops import registry, sparse24, sparse_select as sel
from vggserve.ops.precision import FP16
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import HALO_TILES, tc_weights
from vggserve.ops.tensorcore_sparse import (HALO_DEFAULT, HALO_NAME, HALO_TUNABLES, HaloSparseLayer,
                                            halo_local_mem, halo_valid)

from test_sparse_tc import check, check_sparser_than_2_4, run_layer as run_sparse_layer, weights_2_4
from test_tensorcore import tc_env  # noqa: F401 - the fixture: tensor cores, native or emulated

MF = cl.mem_flags
CONFIGS = [  # (TH, TW, BN, WARPS_M, WARPS_N, STAGES): 1-2 warps each way, 2-4 stages, blocks of 16-32 pixels
    (2, 8, 32, 2, 1, 2),
    (4, 8, 32, 1, 2, 3),
    (3, 8, 16, 1, 1, 4),
]
SHAPES = [  # (n, cin, cout, h, w)
    (1, 3, 8, 5, 7),  # conv1's 3 channels (one partial chunk), odd image
    (3, 40, 21, 6, 5),  # odd batch; 2 chunks, the second partial; channels off the tile
    (1, 72, 70, 9, 1),  # one-pixel-wide image; 3 chunks (27 steps through the stages)
    (2, 13, 5, 1, 3),  # one-pixel-high image, 5 channels
    (1, 8, 33, 3, 3),  # 3x3 image, 33 channels
]


def params_of(cfg):
    return dict(zip(HALO_TUNABLES, cfg), ALGO=HALO_NAME)


def run_layer(tc_env, params, shape, weight, rng):
    """test_sparse_tc.run_layer on conv_tc_halo_sparse.cl."""
    return run_sparse_layer(tc_env, params, shape, weight, rng, layer_cls=HaloSparseLayer)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "{}x{}_n{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_halo_sparse_layer_matches_numpy(tc_env, rng, cfg, shape):
    got, ref, op = run_layer(tc_env, params_of(cfg), shape, weights_2_4(rng, shape[2], shape[1]), rng)
    check(got, ref, shape[2])
    assert op.cpadk % 32 == 0 and op.cpadk >= op.cpad


def test_the_default_tile_on_several_chunks_and_blocks(tc_env, rng):
    """tc_halo's H100 winner (8x16 pixels x 128 channels, 4 warps): weights and metadata of 128 rows by several
    copies per work-item, 3 chunks of channels, blocks cut by the image's edge, 2 channel groups."""
    shape = (2, 70, 150, 11, 19)
    got, ref, _ = run_layer(tc_env, dict(HALO_DEFAULT), shape, weights_2_4(rng, 150, 70), rng)
    check(got, ref, 150)


@pytest.mark.parametrize("sparsity", [0.9, 1.0])
def test_sparser_than_2_4_and_all_zero_filters(tc_env, rng, sparsity):
    check_sparser_than_2_4(lambda shape, w: run_layer(tc_env, params_of(CONFIGS[1]), shape, w, rng), rng,
                           (3, 40, 19, 5, 6), sparsity, [0, 11, 12, 13])


def test_weights_are_compressed_in_the_halo_k_order(tc_env, rng):
    """Taps of CpadK = whole chunks of 32 channels: every 2:4 group stays in one (chunk, tap) step; half the bytes."""
    ctx, _, cache, caps = tc_env
    w = weights_2_4(rng, 21, 40)
    op = HaloSparseLayer(ctx, cache, params_of(CONFIGS[1]), FP16, LayerSpec("conv3x3", 40, 21, 6), w,
                         np.zeros(21, np.float32), BuildEnv(caps=caps, max_batch=1))
    assert (op.cpad, op.cpadk, op.npad) == (40, 64, 32)
    dense = tc_weights(w, 64, 32, 9 * 64, FP16)
    values = np.empty((32, 9 * 64 // 2), np.float16)
    meta = np.empty((2, 9 * 64 // 32, 16), np.uint32)
    cl.enqueue_copy(tc_env[1], values, op.wv)
    cl.enqueue_copy(tc_env[1], meta, op.meta)
    assert np.array_equal(sparse24.decompress(values, meta), dense)
    assert op.format_bytes == dense.nbytes // 2 + meta.nbytes


def test_candidates_carry_tc_halo_tiles_over_and_fit(tc_env):
    caps = tc_env[3]
    algo = registry.get(HALO_NAME)
    assert algo.sparse and algo.family == "tensorcore" and algo.precisions == ("fp16",)
    layer = LayerSpec("conv3x3", 64, 64, 56)
    cands = algo.candidates(caps, FP16, layer)
    assert cands and all(halo_valid(p) and algo.fits(p, caps, FP16) for p in cands)
    tiles = {tuple(p[k] for k in HALO_TUNABLES) for p in cands}
    # the H100's FP16 batch-64 tc_halo winners (vggserve/data/tuned_params.json)
    for tile in [(8, 16, 128, 2, 2, 3), (12, 16, 64, 2, 2, 3), (8, 16, 64, 2, 2, 4)]:
        assert tile in tiles and tile in HALO_TILES
    assert halo_valid(HALO_DEFAULT) and halo_local_mem(HALO_DEFAULT) <= 48 * 1024
    assert not halo_valid({**HALO_DEFAULT, "BN": 24}) and not halo_valid({**HALO_DEFAULT, "TH": 3, "TW": 5})
    assert HALO_NAME in [a.name for a in registry.for_layer(caps, FP16, layer, sparse=True)]


def test_the_engine_takes_the_faster_2_4_kernel_per_shape(tc_env, rng):
    caps = tc_env[3]
    conv = LayerSpec("conv3x3", 64, 64, 56)
    w24 = weights_2_4(rng, 64, 64)

    def curves(halo, gemm):
        return {"sparse": {"curves": {"64": {conv.shape_key: {sel.TC_HALO_SPARSE24: [[0.5, halo]],
                                                              sel.TC_SPARSE24: [[0.5, gemm]]}}}}}

    assert sel.for_layer(curves(1.4, 1.1), caps, FP16, conv, w24, 64).algo == sel.TC_HALO_SPARSE24
    assert sel.for_layer(curves(0.9, 1.1), caps, FP16, conv, w24, 64).algo == sel.TC_SPARSE24
    slower = sel.for_layer(curves(0.9, 0.95), caps, FP16, conv, w24, 64)
    assert slower.algo == sel.DENSE and "0.90x tuned" in slower.reason and "0.95x tuned" in slower.reason
    # measured for one kernel only: the other on its default crossover (GPUs: never, until measured)
    only = {"sparse": {"curves": {"64": {conv.shape_key: {sel.TC_SPARSE24: [[0.5, 1.02]]}}}}}
    expect = sel.TC_HALO_SPARSE24 if caps.kind == "cpu" else sel.TC_SPARSE24
    assert sel.for_layer(only, caps, FP16, conv, w24, 64).algo == expect
