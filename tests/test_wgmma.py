"""Hopper's wgmma engine (kernels/conv_tc.cl and kernels/conv_tc_halo.cl with WGMMA = 1, kernels/wgmma.clh,
vggserve/runtime/ptx.py).

On an H100/H200 (VGGSERVE_TEST_DEVICE=gpu) the layers run real wgmma from programs built out of the driver's patched
PTX; here and in CI they run on PoCL through wgmma.clh's software model, which reads the tiles through the same
core-matrix layout the descriptors describe. Each case is compared with numpy on awkward sizes (1 image, odd channel
counts, pixels and channels not multiples of the tile), inputs rounded to the storage type first.
"""

import os
import re

import numpy as np
import pytest

from vggserve.ops import precision as precisions, registry
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import (HALO_TUNABLES, HALO_WGMMA_TILES, HALO_WGMMA_TUNABLES, WGMMA_TILES, HaloWgmmaLayer,
                                     WgmmaLayer, halo_wgmma_valid, wgmma_valid)
from vggserve.runtime import caps as device_caps, ptx

from clbuffers import rel_err
from test_tc_pool import check_pool_case
from test_tensorcore import HALO_SHAPES, TC_PRECISIONS, run_layer, tc_env  # noqa: F401 - the fixture

KEYS = ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB", "WG_INFLIGHT")
CONFIGS = [(64, 64, 4, 1, 3, 64, 0), (128, 128, 8, 1, 2, 128, 0), (64, 256, 4, 1, 3, 32, 1), (64, 192, 4, 1, 2, 64, 0),
           (128, 64, 8, 1, 4, 64, 1)]
SHAPES = [  # (n, cin, cout, h, w, ks)
    (1, 3, 8, 5, 7, 3),
    (2, 13, 21, 6, 5, 3),
    (1, 40, 70, 9, 4, 3),
    (3, 24, 33, 1, 1, 1),
]


def wgmma_layer(cfg):
    p = dict(zip(KEYS, cfg), ALGO="tc_wgmma")
    assert wgmma_valid(p)
    return lambda ctx, cache, prec, layer, w, b, env: WgmmaLayer(ctx, cache, p, prec, layer,
                                                                   w if layer.ks == 3 else w[:, :, 0, 0], b, env)


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "{}x{}_w{}x{}_s{}_k{}_f{}".format(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_layer_matches_numpy(tc_env, rng, prec, cfg, shape):
    got, ref, _ = run_layer(tc_env, prec, None, shape, rng, make=wgmma_layer(cfg))
    cout = shape[2]
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    assert rel_err(got[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
def test_wgmma_split_k_sums_the_same_as_one_pass(tc_env, rng, prec):
    cfg = CONFIGS[0]
    p = dict(zip(KEYS, cfg), ALGO="tc_wgmma", GROUPS_TARGET=64)
    make = lambda ctx, cache, prec, layer, w, b, env: WgmmaLayer(ctx, cache, p, prec, layer, w, b, env)  # noqa: E731
    got, ref, op = run_layer(tc_env, prec, None, (1, 64, 24, 3, 3, 3), rng, make=make)
    assert op.plans[1][0] > 1, "this layer should have been split"
    assert rel_err(got[..., :24].transpose(0, 3, 1, 2), ref) < 2e-3


# ---- conv_tc_halo.cl with WGMMA = 1: A from the patch in registers, B through a descriptor ------------------------
# tc_halo's awkward shapes (n, cin, cout, h, w): blocks cut by the image's edges, channels below one chunk and not a
# multiple of it, 1 and 2 images, 9 and 18 steps (one chunk; two FP16, three TF32); and three FP16 chunks, five TF32
# (the patch buffers reused, an odd number of steps after the double-buffered pairs of WG_INFLIGHT = 1)
HALO_WG_SHAPES = HALO_SHAPES[:3] + [(1, 70, 20, 6, 9)]
HALO_WG_IDS = "{}x{}x{}_w{}x{}_s{}_f{}".format


def halo_wgmma_params(cfg):
    p = dict(zip(HALO_WGMMA_TUNABLES, cfg), ALGO="tc_halo_wgmma")
    assert halo_wgmma_valid(p)
    return p


def halo_wgmma_layer(p):
    return lambda ctx, cache, prec, layer, w, b, env: HaloWgmmaLayer(ctx, cache, p, prec, layer, w, b, env)


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", HALO_WGMMA_TILES, ids=lambda c: HALO_WG_IDS(*c))
@pytest.mark.parametrize("shape", HALO_WG_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_halo_wgmma_layer_matches_numpy(tc_env, rng, prec, cfg, shape):
    """Every tc_halo_wgmma tile: each warp's A fragments from the patch by ldmatrix, wgmma's software model (the
    fragments exchanged through local memory, B read through the core-matrix layout)."""
    got, ref, _ = run_layer(tc_env, prec, None, (*shape, 3), rng, make=halo_wgmma_layer(halo_wgmma_params(cfg)))
    cout = shape[2]
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    assert rel_err(got[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


HALO_WG_POOL_SHAPES = [(1, 3, 8, 5, 7), (3, 13, 21, 11, 17), (2, 16, 16, 1, 3), (1, 40, 70, 9, 4)]
# TW = 8, the tiles that fuse: one and two warpgroups, A single- and double-buffered (BN changes only the accumulators'
# count, not the windows)
HALO_WG_POOL_TILES = [(8, 8, 128, 4, 1, 4, 0), (16, 8, 128, 8, 1, 3, 1)]


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", HALO_WG_POOL_TILES, ids=lambda c: HALO_WG_IDS(*c))
@pytest.mark.parametrize("shape", HALO_WG_POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_halo_wgmma_fused_pool_matches_numpy_and_the_unfused_layer(tc_env, rng, prec, cfg, shape):
    """TW = 8 tiles pool in the store: a window's rows are g and g + 8 of one warp's fragment, as in tc_halo."""
    assert cfg in HALO_WGMMA_TILES
    p = halo_wgmma_params(cfg)
    assert registry.get("tc_halo_wgmma").fuses_pool(p)
    check_pool_case(tc_env, rng, prec, p, shape, HaloWgmmaLayer)


def test_only_halo_wgmma_tiles_8_pixels_wide_fuse_the_pooling(tc_env):
    """One m16 tile a warp: a 16-wide block's row below lies in the next warp, so only TW = 8 blocks can pool."""
    ctx, _, cache, caps = tc_env
    algo = registry.get("tc_halo_wgmma")
    assert [algo.fuses_pool(halo_wgmma_params(t)) for t in HALO_WGMMA_TILES] == [t[1] == 8 for t in HALO_WGMMA_TILES]
    assert any(t[1] == 8 for t in HALO_WGMMA_TILES) and any(t[1] == 16 for t in HALO_WGMMA_TILES)
    assert not algo.fuses_pool(dict(zip(HALO_TUNABLES, (8, 8, 128, 2, 2, 3))))  # tc_halo's shape, not a warpgroup's
    with pytest.raises(ValueError, match="tc_halo_wgmma .* cannot fuse"):
        HaloWgmmaLayer(ctx, cache, halo_wgmma_params((8, 16, 128, 8, 1, 3, 0)), precisions.FP16,
                       LayerSpec("conv3x3", 8, 16, 8, pool=True), np.zeros((16, 8, 3, 3), np.float32),
                       np.zeros(16, np.float32), BuildEnv(caps=caps, max_batch=1))


def test_every_halo_wgmma_tile_keeps_the_kernels_shape_rules_and_fits_48_kb():
    caps = device_caps.Caps(kind="gpu", label="H100", compute_units=132, local_mem=48 * 1024, max_work_group=1024,
                            tensor_cores=True, emulate_mma=False, wgmma=True, wgmma_experimental=True)
    algo = registry.get("tc_halo_wgmma")
    for size in (224, 28):  # no blocks fitted to the image: 64 block rows a warpgroup
        cands = algo.candidates(caps, precisions.FP16, LayerSpec("conv3x3", 512, 512, size))
        assert [tuple(p[k] for k in HALO_WGMMA_TUNABLES) for p in cands] == HALO_WGMMA_TILES
        assert all(halo_wgmma_valid(p) and algo.local_mem(p, precisions.FP16) <= 48 * 1024 for p in cands)
    assert algo.kinds == ("conv3x3",)
    invalid = [(4, 28, 128, 7, 1, 3, 0),   # 112 rows: not 64 a warpgroup
               (8, 16, 128, 4, 2, 3, 0),   # two warps across N
               (8, 16, 96, 8, 1, 3, 0),    # BN not a multiple of 64
               (8, 16, 128, 8, 1, 2, 1)]   # a step's wgmma left running needs a third stage
    assert not any(halo_wgmma_valid(dict(zip(HALO_WGMMA_TUNABLES, t))) for t in invalid)
    assert {t[-1] for t in HALO_WGMMA_TILES} == {0, 1}


def test_every_wgmma_tile_keeps_the_kernels_shape_rules_and_fits_48_kb():
    caps = device_caps.Caps(kind="gpu", label="H100", compute_units=132, local_mem=48 * 1024, max_work_group=1024,
                            tensor_cores=True, emulate_mma=False, wgmma=True, wgmma_experimental=True)
    algo = registry.get("tc_wgmma")
    cands = algo.candidates(caps, precisions.FP16, LayerSpec("conv3x3", 512, 512, 28))
    assert len(cands) == len(WGMMA_TILES)
    assert all(wgmma_valid(p) and algo.local_mem(p, precisions.FP16) <= 48 * 1024 for p in cands)
    assert not wgmma_valid(dict(zip(KEYS, (128, 128, 4, 2, 3, 64, 0))))  # two warps across N: not a warpgroup's shape
    assert not wgmma_valid(dict(zip(KEYS, (128, 128, 8, 1, 2, 64, 1))))  # a wgmma group in flight needs 3 stages


class Device:
    """An OpenCL device as runtime/caps.py reads it: NVIDIA's attribute query answering compute capability `cc`."""

    extensions = "cl_nv_device_attribute_query"
    max_compute_units, local_mem_size, max_work_group_size = 132, 48 * 1024, 1024

    def __init__(self, cc):
        self.compute_capability_major_nv, self.compute_capability_minor_nv = cc


@pytest.mark.parametrize("name", ["tc_wgmma", "tc_halo_wgmma"])
def test_wgmma_is_offered_only_where_the_device_has_it(monkeypatch, name):
    """sm_90a code runs on compute capability 9.0 only; these two entries (slower than mma.sync) natively only with
    VGGSERVE_WGMMA=1; VGGSERVE_WGMMA=0 turns them off, the software model's too."""
    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    monkeypatch.delenv("VGGSERVE_WGMMA", raising=False)
    algo = registry.get(name)
    assert not algo.available(device_caps.of(Device((9, 0)), "gpu", "H100"), precisions.FP16)  # opt-in
    monkeypatch.setenv("VGGSERVE_WGMMA", "1")
    assert algo.available(device_caps.of(Device((9, 0)), "gpu", "H100"), precisions.FP16)
    for cc in ((8, 0), (8, 9), (10, 0)):
        caps = device_caps.of(Device(cc), "gpu", "GPU")
        assert caps.tensor_cores and not algo.available(caps, precisions.FP16)
    monkeypatch.setenv("VGGSERVE_WGMMA", "0")
    assert not algo.available(device_caps.of(Device((9, 0)), "gpu", "H100"), precisions.FP16)
    pocl = Device((0, 0))
    pocl.extensions = ""  # no NVIDIA attributes: a CPU
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    assert not algo.available(device_caps.of(pocl, "cpu", "PoCL"), precisions.FP16)  # still VGGSERVE_WGMMA=0
    monkeypatch.delenv("VGGSERVE_WGMMA")
    assert algo.available(device_caps.of(pocl, "cpu", "PoCL"), precisions.FP16)  # the software model


def test_the_committed_slot_header_is_the_generators():
    from vggserve.runtime.programs import kernels_dir

    assert (kernels_dir() / "wgmma_slots.clh").read_text() == ptx.slot_header()


# what NVIDIA's compiler leaves of the placeholders (inline asm, registers substituted), in a minimal PTX
DRIVER_PTX = """//
.version 7.8
.target sm_90
.address_size 64
.entry k(){
.reg .f32 %f<8>;
.reg .b64 %rd<4>;
.reg .b32 %r<4>;
// begin inline asm
{ // SLOT_WGPROXY
.reg .b32 z;
}
// end inline asm
// begin inline asm
{ // SLOT_WGSTAGE_N8_KB64_F16
.reg .b64 t;
.reg .b32 z;
add.f32 %f1, %f1, 0f00000000;
add.f32 %f2, %f2, 0f00000000;
add.f32 %f3, %f3, 0f00000000;
add.f32 %f4, %f4, 0f00000000;
xor.b64 t, %rd1, %rd2;
mov.b32 z, %r1;
}
// end inline asm
// begin inline asm
{ // SLOT_WGWAIT_0
add.f32 %f1, %f1, 0f00000000;
add.f32 %f2, %f2, 0f00000000;
add.f32 %f3, %f3, 0f00000000;
add.f32 %f4, %f4, 0f00000000;
}
// end inline asm
ret;
}
"""


def test_the_patch_puts_wgmma_on_the_placeholders_registers():
    out = ptx.patch(DRIVER_PTX)
    assert ".target sm_90a" in out and ".version 8.0" in out and "SLOT_" not in out
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n8k16\.f32\.f16\.f16 \{([^}]*)\}, (%\w+), (%\w+)", out)
    assert len(mmas) == 2  # KB 64 = two k16 steps
    assert all(m[0] == "%f1, %f2, %f3, %f4" for m in mmas)
    assert "mov.b64 %wa, %rd1;" in out and "mov.b64 %wb, %rd2;" in out and "setp.ne.b32 %wp, %r1, 0;" in out
    assert out.count("add.s64 %wa, %wa, 16;") == 1  # the second step reads 256 bytes further along K
    assert out.index("fence.proxy.async.shared::cta;") < out.index("wgmma.fence") < out.index("commit_group") \
        < out.index("wgmma.wait_group.sync.aligned 0;")


def test_a_placeholder_the_patch_cannot_read_is_an_error_not_a_wrong_program():
    broken = DRIVER_PTX.replace("add.f32 %f4, %f4, 0f00000000;\nxor", "xor")  # an accumulator lost
    with pytest.raises(ptx.PtxPatchError, match="3 accumulators"):
        ptx.patch(broken)
    with pytest.raises(ptx.PtxPatchError, match="no wgmma placeholder"):
        ptx.patch(".version 7.8\n.target sm_90\n")
    tf32 = ptx.patch(DRIVER_PTX.replace("KB64_F16", "KB128_TF32"))
    assert tf32.count("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32") == 4


# an A-in-registers stage (conv_tc_halo.cl's) as the driver leaves it: BN 8 (4 accumulators), KB 64 (two k-steps of
# 4 A registers each), B's descriptor, the scale word
DRIVER_PTX_RA = """//
.version 7.8
.target sm_90
.address_size 64
.entry k(){
.reg .f32 %f<8>;
.reg .b64 %rd<4>;
.reg .b32 %r<16>;
// begin inline asm
{ // SLOT_WGSTAGE_RA_N8_KB64_F16
.reg .b64 t;
.reg .b32 z;
add.f32 %f1, %f1, 0f00000000;
add.f32 %f2, %f2, 0f00000000;
add.f32 %f3, %f3, 0f00000000;
add.f32 %f4, %f4, 0f00000000;
or.b32 z, %r1, 0;
or.b32 z, %r2, 0;
or.b32 z, %r3, 0;
or.b32 z, %r4, 0;
or.b32 z, %r5, 0;
or.b32 z, %r6, 0;
or.b32 z, %r7, 0;
or.b32 z, %r8, 0;
mov.b64 t, %rd3;
mov.b32 z, %r9;
}
// end inline asm
// begin inline asm
{ // SLOT_WGWAIT_0
add.f32 %f1, %f1, 0f00000000;
add.f32 %f2, %f2, 0f00000000;
add.f32 %f3, %f3, 0f00000000;
add.f32 %f4, %f4, 0f00000000;
}
// end inline asm
ret;
}
"""


def test_the_patch_feeds_each_k_step_the_next_four_a_registers_and_advances_b():
    out = ptx.patch(DRIVER_PTX_RA)
    assert ".target sm_90a" in out and "SLOT_" not in out
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n8k16\.f32\.f16\.f16 \{([^}]*)\}, \{([^}]*)\}, (%\w+), "
                      r"(%\w+), 1, 1, 0;", out)
    assert [m[1] for m in mmas] == ["%r1, %r2, %r3, %r4", "%r5, %r6, %r7, %r8"]  # k-step 0, then 1
    assert all(m[0] == "%f1, %f2, %f3, %f4" and m[2:] == ("%wb", "%wp") for m in mmas)
    assert "mov.b64 %wb, %rd3;" in out and "setp.ne.b32 %wp, %r9, 0;" in out
    assert out.count("add.s64 %wb, %wb, 16;") == 1  # the second k-step's B: 256 bytes further along K
    assert out.index("wgmma.fence") < out.index("mma_async") < out.index("commit_group") < out.index("wait_group")
    tf32 = ptx.patch(DRIVER_PTX_RA.replace("_F16", "_TF32"))  # tf32: no transpose operand
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n8k8\.f32\.tf32\.tf32 \{[^}]*\}, \{[^}]*\}, %wb, %wp, "
                          r"1, 1;", tf32)) == 2


def test_an_a_in_registers_placeholder_the_patch_cannot_read_is_an_error():
    lost_a = DRIVER_PTX_RA.replace("or.b32 z, %r8, 0;\n", "")
    with pytest.raises(ptx.PtxPatchError, match="7 A registers \\(want 8\\)"):
        ptx.patch(lost_a)
    with pytest.raises(ptx.PtxPatchError, match="B descriptor missing"):
        ptx.patch(DRIVER_PTX_RA.replace("mov.b64 t, %rd3;\n", ""))
    with pytest.raises(ptx.PtxPatchError, match="3 accumulators"):
        ptx.patch(DRIVER_PTX_RA.replace("add.f32 %f4, %f4, 0f00000000;\nor.b32", "or.b32"))
    with pytest.raises(ptx.PtxPatchError, match="unknown placeholder SLOT_WGSTAGE_RA_N8_KB64_BF16"):
        ptx.patch(DRIVER_PTX_RA.replace("_F16", "_BF16"))


def test_the_slot_header_numbers_the_a_registers_after_the_accumulators():
    header = ptx.slot_header()
    assert '#define WG_RA_IN_BODY_16_2 "or.b32 z, %64, 0;\\n"' in header  # 64 accumulators: A starts at %64
    assert '"or.b32 z, %71, 0;\\n" "mov.b64 t, %72;\\n" "mov.b32 z, %73;\\n"' in header
    assert '#define WG_RA_OPS_2(AF_) "r"(AF_[0][0]),' in header and '"r"(AF_[1][3])\n' in header


def model_on_wgmma(tiny_tensors, monkeypatch, precision, tables=None, every_layer=True, batch=2):
    """A tiny VGG16 at FP16/TF32 on the tensor-core family (emulated without a GPU) whose layers run tc_wgmma: all
    of them (the family's default made tc_wgmma), or those `tables` name."""
    import vggserve.engine.engine as engine
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    if "VGGSERVE_WGMMA" not in os.environ:  # natively opt-in (runtime/caps.py)
        monkeypatch.setenv("VGGSERVE_WGMMA", "1")
    if every_layer:
        monkeypatch.setitem(registry.DEFAULT_ALGO, "tensorcore", "tc_wgmma")
    if tables:
        real = engine.params_for
        monkeypatch.setattr(engine, "params_for", lambda kind, label: {**real(kind, label), **tables})
    from conftest import TEST_DEVICE

    return VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=batch, precision=precision)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_the_whole_network_on_wgmma_matches_float64(tiny_tensors, monkeypatch, precision):
    from vggserve.model.reference import reference_logits

    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with model_on_wgmma(tiny_tensors, monkeypatch, precision) as model:
        plan = [p["kernel"] for p in model.kernel_plan()]
        out = model.logits(x)
    layers = [k for k in plan if k.startswith("tc_")]
    # features.0 reads the float32 input on conv_first.cl; the other 12 convolutions and the 3 FC layers on wgmma
    assert plan[0].startswith("conv_first") and len(layers) == 15, plan
    assert all(k.startswith("tc_wgmma") for k in layers), plan
    ref = reference_logits(tiny_tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2


def test_the_whole_network_on_halo_wgmma_fuses_the_poolings_and_matches_float64(tiny_tensors, monkeypatch):
    """Every 3x3 layer on tc_halo_wgmma (16x8 blocks, a step's wgmma left running: WG_INFLIGHT 1) through the tuned
    table, each pooling in the store of the convolution before it; the FC layers stay on tc_gemm."""
    from vggserve.model.reference import reference_logits
    from vggserve.runtime.params import shape_key
    from vggserve.weights.spec import infer_width, vgg16_spec

    tile = halo_wgmma_params((16, 8, 128, 8, 1, 3, 1))
    spec, size, table = vgg16_spec(infer_width(tiny_tensors)), 224, {}
    for c in spec.convs:
        table[shape_key(c.cin, c.cout, size)] = dict(tile)
        size //= 2 if c.pool_after else 1
    x = np.random.default_rng(5).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with model_on_wgmma(tiny_tensors, monkeypatch, "fp16", tables={"conv_by_batch_fp16": {"2": table}},
                        every_layer=False) as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
        out = model.logits(x)
    convs = [k for name, k in plan.items() if name.startswith("features.")]
    assert len(convs) == 13 and convs[0].startswith("conv_first"), plan
    assert all(k.startswith("tc_halo_wgmma 16x8") for k in convs[1:]), plan
    assert sum("max-pool in the store" in k for k in convs) == 5 and not any("pool after" in n for n in plan), plan
    assert all(plan[f"classifier.{i}"].startswith("tc_gemm") for i in (0, 3, 6)), plan
    ref = reference_logits(tiny_tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2


def test_a_wgmma_program_that_fails_to_build_gives_way_to_the_default_with_one_logged_line(tiny_tensors, monkeypatch,
                                                                                          caplog):
    """The driver may refuse a patched PTX program (another driver, another GPU): the layer then runs on the family's
    default kernel, the model works, and the log says so once per layer."""
    from vggserve.errors import KernelBuildError
    from vggserve.model.reference import reference_logits

    def refuse(self, cache, env, defines):
        raise KernelBuildError("building the PTX program of kernels/conv_tc.cl failed: ptxas error (a test)")

    monkeypatch.setattr(WgmmaLayer, "program", refuse)
    table = {"conv_by_batch_fp16": {"1": {"8x8x224": dict(zip(KEYS, CONFIGS[0]), ALGO="tc_wgmma")}}}  # features.2
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with caplog.at_level("WARNING", logger="vggserve.model"):
        with model_on_wgmma(tiny_tensors, monkeypatch, "fp16", tables=table, every_layer=False, batch=1) as model:
            plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
            out = model.logits(x)
    assert plan["features.2"].startswith("tc_gemm") and "tc_wgmma failed to build" in plan["features.2"]
    lines = [r.getMessage() for r in caplog.records if "failed to build" in r.getMessage()]
    assert len(lines) == 1 and "tc_wgmma" in lines[0] and "ptxas error (a test)" in lines[0]
    ref = reference_logits(tiny_tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2


def test_a_table_naming_wgmma_on_a_device_without_it_runs_the_default(tiny_tensors, monkeypatch):
    monkeypatch.setenv("VGGSERVE_WGMMA", "0")
    table = {"conv_by_batch_fp16": {"1": {"8x8x224": dict(zip(KEYS, CONFIGS[0]), ALGO="tc_wgmma")}}}  # features.2
    with model_on_wgmma(tiny_tensors, monkeypatch, "fp16", tables=table, every_layer=False, batch=1) as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
    assert plan["features.2"].startswith("tc_gemm") and "does not run" in plan["features.2"], plan["features.2"]


def test_wgmma_diag_times_every_variant_and_the_full_kernel_agrees(monkeypatch, tmp_path):
    """benchmarks/wgmma_diag.py on the test device (the software model on PoCL, wgmma on an H100): each WG_DIAG
    variant builds and runs and the whole kernel (WG_DIAG 0) matches the engine's current kernel. On the model the
    variant without the proxy fence gives the same sums too (there the fence does nothing; on the hardware leaving
    it out is what the diagnosis measures, so its sums are not asserted)."""
    import json
    import sys
    from pathlib import Path

    from conftest import TEST_DEVICE

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    if TEST_DEVICE == "cpu":
        monkeypatch.delenv("VGGSERVE_WGMMA", raising=False)
    elif "VGGSERVE_WGMMA" not in os.environ:  # natively opt-in (runtime/caps.py)
        monkeypatch.setenv("VGGSERVE_WGMMA", "1")
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    import vggserve.tuning as tuning
    import wgmma_diag

    monkeypatch.setattr(tuning, "layer_shapes", lambda batch, pooled=False: [("16x64x6", 16, 64, 6, 3)])
    monkeypatch.setattr(wgmma_diag, "TILES", {"tc_wgmma": ["64x64s6k64f1"], "tc_halo_wgmma": ["8x8x128s4f0"]})
    out = tmp_path / "diag.json"
    assert wgmma_diag.main(["--device", TEST_DEVICE, "--batch", "1", "--shapes", "16x64x6", "--repeats", "1",
                            "--json", str(out)]) == 0
    tiles = json.loads(out.read_text())["rows"][0]["tiles"]
    assert {t["algo"] for t in tiles} == {"tc_wgmma", "tc_halo_wgmma"}
    for t in tiles:
        assert set(wgmma_diag.VARIANTS) <= set(t) and t["err"] < 2e-2, t
        assert t["nofence_same"] or TEST_DEVICE != "cpu", t
    sys.modules.pop("wgmma_diag", None)
