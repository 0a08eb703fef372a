"""FP8 and INT8 on wgmma with the weights in registers (kernels/conv_wg_halo.cl with FP8 = 1 or INT8 = 1,
`wgmma_halo`): wgmma's native m64nNk32 e4m3 x e4m3 (FP32 sums) and s8 x u8 (int32 sums), which mma.sync on sm_90
only emulates (e4m3) or runs at half wgmma's rate (s8).

The weights are A (e4m3 codes, or INT8's s8 codes) in registers, the activations B (e4m3 codes, or u8) through the
patch's descriptor: the same bytes as FP16's, 32 bytes per k-step. On an H100/H200 (VGGSERVE_TEST_DEVICE=gpu) the
layers run real wgmma from the driver's patched PTX; here and in CI on PoCL through wgmma.clh's software model (A's
s8 or e4m3 bytes from the exchanged fragments, B's read through the descriptor's layout). Against numpy with
test_fp8_kernels' and test_int8_kernels' checks, on their awkward sizes, and INT8 against tc_halo bit for bit (both
sum exactly).
"""

from dataclasses import replace

import numpy as np
import pytest

import test_fp8_kernels as f8
import test_int8_kernels as i8
from test_tensorcore import tc_env  # noqa: F401 - the fixture

from vggserve.ops import precision as precisions
from vggserve.ops import registry
from vggserve.ops.registry import LayerSpec
from vggserve.ops.wgmma_halo import WgmmaHaloLayer
from vggserve.runtime import caps as device_caps
from vggserve.runtime import ptx

TILES = [(14, 2), (8, 1), (28, 1)]  # the default, the smallest, one warpgroup on 224 pixels
SHAPES = f8.HALO_SHAPES  # 1 image and 2, 3 to 70 channels (two 64-channel chunks), sides cut by the blocks
IDS = "th{}_wg{}".format


def params(tile):
    return {"ALGO": "wgmma_halo", "TH": tile[0], "WGS": tile[1]}


def fp8_layer(tile):
    """test_fp8_kernels.run's make: (ctx, cache, prec, layer, w, b, env, s_in, s_out)."""
    return lambda ctx, cache, prec, layer, w, b, env, s_in, s_out: WgmmaHaloLayer(
        ctx, cache, params(tile), prec, layer, w, b, env, in_scale=s_in, out_scale=s_out)


def int8_layer(tile):
    """test_int8_kernels.run's make: (ctx, cache, precision=, layer=, weight=, bias=, env=, in_scale=, ...)."""
    return lambda ctx, cache, **kw: WgmmaHaloLayer(ctx, cache, params(tile), **kw)


# ---- FP8 -----------------------------------------------------------------------------------------------------------
# Hopper's e4m3 wgmma accumulates in fewer bits than FP32 (conv_wg_halo.cl's banner; benchmarks/eightbit_sums.py):
# natively each tap's partial sum (64 products, promoted into FP32 after the tap) may part from the exact one by up to
# FP8_TAP_ERROR of its products' magnitudes, so a native layer's sum by that much of sum |products|; the software
# model sums in FP32 (test_fp8_kernels' bound)
FP8_TAP_ERROR = 2.0 ** -12


def fp8_bound(tc_env, bound, shape):
    """test_fp8_kernels.run's FP32 bound ((K - 1) 2^-24 sum |products|, scaled), widened natively by the tensor
    cores' own accumulation."""
    if tc_env[3].emulate_mma:
        return bound
    k = shape[1] * 9
    return bound * (1.0 + FP8_TAP_ERROR / ((k - 1) * 2.0 ** -24))


@pytest.mark.parametrize("tile", TILES, ids=lambda t: IDS(*t))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_wgmma_halo_writes_numpys_e4m3_codes(tc_env, rng, tile, shape):
    got, y, bound, s_out, op = f8.run(tc_env, fp8_layer(tile), (*shape, 3), rng)
    assert op.describe().endswith("e4m3 in, e4m3 out")
    f8.check(got, y, fp8_bound(tc_env, bound, shape), s_out, op)


@pytest.mark.parametrize("fp8_in, out", [(True, "fp16"), (False, "fp8")], ids=["e4m3_in_fp16_out", "fp16_in_e4m3_out"])
def test_fp8_wgmma_halo_input_and_output_storage_are_independent(tc_env, rng, fp8_in, out):
    shape = (2, 13, 21, 11, 17, 3)
    got, y, bound, s_out, op = f8.run(tc_env, fp8_layer((14, 2)), shape, rng, fp8_in=fp8_in, out=out)
    f8.check(got, y, bound if not fp8_in else fp8_bound(tc_env, bound, shape), s_out, op, out)


def test_fp8_wgmma_halo_exact_sums_match_numpy_to_a_tie(tc_env):
    """Integer operands: every sum exact in FP32 whatever the order, so in the software model only the epilogue's
    FP32 roundings remain (natively, the tensor cores' accumulation too)."""
    shape = (1, 70, 70, 9, 4, 3)
    got, y, bound, s_out, op = f8.run(tc_env, fp8_layer((8, 2)), shape, np.random.default_rng(3), exact=True)
    f8.check(got, y, fp8_bound(tc_env, bound, shape) - bound, s_out, op)


# ---- INT8 ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tile", TILES, ids=lambda t: IDS(*t))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_wgmma_halo_writes_numpys_u8_codes(tc_env, rng, tile, shape):
    got, value, window, op, _ = i8.run(tc_env, int8_layer(tile), (*shape, 3), rng)
    assert op.describe().endswith("u8 in, u8 out")
    i8.check_codes(got, value, window, op)


@pytest.mark.parametrize("u8_in, out", [(True, "fp16"), (False, "int8")], ids=["u8_in_fp16_out", "fp16_in_u8_out"])
def test_int8_wgmma_halo_input_and_output_storage_are_independent(tc_env, rng, u8_in, out):
    got, value, window, op, _ = i8.run(tc_env, int8_layer((14, 2)), (2, 13, 21, 11, 17, 3), rng, u8_in=u8_in, out=out)
    if out == "int8":
        i8.check_codes(got, value, window, op)
    else:
        i8.check_values(got, value, window, op, out)


def test_int8_wgmma_halo_stores_tc_halos_codes_bit_for_bit_past_2_to_the_24(tc_env):
    """Both sum u8 x s8 exactly (int32) and share the epilogue's arithmetic, so their codes are the same bytes, here
    with sums above 2^24 (codes near 255, positive weights), where float sums would round; with and without pooling."""
    shape = (1, 130, 24, 7, 6, 3)  # 144 channels: three chunks, the last partial
    for pool in (False, True):
        mine = i8.run(tc_env, int8_layer((8, 1)), shape, np.random.default_rng(8), out="fp16", big=True, pool=pool)
        theirs = i8.run(tc_env, i8.halo(f8.HALO_CONFIGS[0]), shape, np.random.default_rng(8), out="fp16", big=True,
                        pool=pool)
        assert mine[4] > 2 ** 24
        np.testing.assert_array_equal(mine[0], theirs[0])


@pytest.mark.parametrize("name", ["fp8", "int8"])
@pytest.mark.parametrize("tile", [(8, 1), (14, 2)], ids=lambda t: IDS(*t))
def test_8_bit_wgmma_halo_fused_pool_equals_pooling_the_unfused_codes(tc_env, name, tile):
    """The max of a window's sums before the epilogue (cs[n] > 0, 1 / s_out > 0, the rounding monotonic) is the max
    of the stored codes, byte for byte (both formats' codes order as their bytes above zero)."""
    run, layer = (f8.run, fp8_layer) if name == "fp8" else (i8.run, int8_layer)
    n, cin, cout, h, w = shape = (1, 13, 21, 11, 17)
    fused = run(tc_env, layer(tile), (*shape, 3), np.random.default_rng(5), pool=True)
    plain = run(tc_env, layer(tile), (*shape, 3), np.random.default_rng(5))
    codes = plain[0][:, :h // 2 * 2, :w // 2 * 2]
    np.testing.assert_array_equal(fused[0], codes.reshape(n, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4)))


# ---- the PTX and where the entry is offered ------------------------------------------------------------------------
def placeholder(kind, acc="add.f32 %f{i}, %f{i}, 0f00000000;"):
    body = "\n".join([acc.format(i=i) for i in range(56)] + [f"or.b32 z, %r{i}, 0;" for i in range(8)]
                     + ["mov.b64 t, %rd1;", "mov.b32 z, %r9;"])
    return f".version 7.8\n.target sm_90\n{{ // SLOT_WGSTAGE_RA_N112_KB64_{kind}_ADV240\n{body}\n}}\n"


def test_the_8_bit_placeholders_become_native_k32_wgmma():
    fp8 = ptx.patch(placeholder("E4M3"))
    assert fp8.count("wgmma.mma_async.sync.aligned.m64n112k32.f32.e4m3.e4m3 {%f0,") == 2
    assert "%wb, %wp, 1, 1;" in fp8 and "add.s64 %wb, %wb, 240;" in fp8 and ".version 8.0" in fp8
    s8 = ptx.patch(placeholder("S8U8", "add.s32 %r{i}, %r{i}, 0;"))
    assert s8.count("wgmma.mma_async.sync.aligned.m64n112k32.s32.s8.u8 {%r0,") == 2 and "%wb, %wp;" in s8
    assert ".version 8.4" in s8  # wgmma mixing s8 and u8 needs PTX ISA 8.4
    promoted = ptx.patch(placeholder("E4M3").replace("_ADV240", "_ADV240_Z"))  # FP8's partials: scale-d 0 first
    assert "%wb, %wp, 1, 1;" in promoted and "%wb, 1, 1, 1;" in promoted
    with pytest.raises(ptx.PtxPatchError):  # int32 accumulators counted like float ones: 56 of 56 wanted
        ptx.patch(placeholder("S8U8").replace("add.f32 %f55, %f55, 0f00000000;\n", ""))


def test_wgmma_halo_runs_both_8_bit_precisions_where_the_device_has_wgmma():
    ada = device_caps.Caps(kind="gpu", label="L40S", compute_units=142, local_mem=48 * 1024, max_work_group=1024,
                           tensor_cores=True, emulate_mma=False, fp8=True)
    hopper = replace(ada, wgmma=True)
    conv = LayerSpec("conv3x3", 64, 64, 56)
    for prec in (precisions.FP8, precisions.INT8):
        assert "wgmma_halo" in {a.name for a in registry.for_layer(hopper, prec, conv)}
        assert "wgmma_halo" not in {a.name for a in registry.for_layer(ada, prec, conv)}
    algo = registry.get("wgmma_halo")
    assert algo.candidates(hopper, precisions.INT8, conv) == algo.candidates(hopper, precisions.FP16, conv)
    # FP8's promoted sums take three sets of accumulators: only the blocks of up to 16 rows, which do not spill
    fp8 = algo.candidates(hopper, precisions.FP8, conv)
    assert fp8[0] == algo.default(hopper, precisions.FP8) and {p["TH"] for p in fp8} == {8, 14, 16}
    # and each tile again with two taps promoted at a time (CUTLASS's interval: 128 products), never unpromoted (fast)
    paired = [p for p in fp8 if "PROMOTE" in p]
    assert len(paired) == len(fp8) // 2 == 6 and {p["PROMOTE"] for p in paired} == {2}
    assert [{k: v for k, v in p.items() if k != "PROMOTE"} for p in paired] == fp8[:6]
    assert not algo.available(replace(hopper, fp8=False), precisions.FP8)


# ---- the whole network ---------------------------------------------------------------------------------------------
def eight_bit_model(tensors, monkeypatch, name, cal, table=None):
    import vggserve.engine.engine as engine
    from conftest import TEST_DEVICE
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    if table:
        real = engine.params_for
        monkeypatch.setattr(engine, "params_for", lambda kind, label: {**real(kind, label), **table})
    return VGG16.load(tensors, device=TEST_DEVICE, max_batch_size=2, precision=name, calibration=cal)


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_the_whole_network_at_8_bits_on_wgmma_halo(monkeypatch, name):
    """Every 3x3 layer after features.0 on wgmma_halo (its 8-bit codes in and out, the poolings fused), through a
    tuned table: INT8 stores the same logits as the default kernels (exact sums), bit for bit; FP8's are within
    test_eightbit_engine's bound of float64."""
    from test_eightbit_engine import BOUND, calibration_of, rel_err
    from test_wgmma_halo import network_table
    from vggserve.model.reference import reference_logits
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=3, width=0.0625)
    cal = calibration_of(tensors)
    x = np.random.default_rng(5).standard_normal((2, 3, 224, 224)).astype(np.float32)
    table = {f"conv_by_batch_{name}": {"2": network_table(tensors, (14, 2))}}
    with eight_bit_model(tensors, monkeypatch, name, cal, table) as model:
        plan = {k["name"]: k["kernel"] for k in model.kernel_plan()}
        out = model.logits(x)
    codes = "u8" if name == "int8" else "e4m3"
    convs = [k for n, k in plan.items() if n.startswith("features.")][1:]
    assert all(k.startswith("wgmma_halo 14x8") and f"{codes} in, {codes} out" in k for k in convs), plan
    assert sum("max-pool in the store" in k for k in convs) == 5, plan
    if name == "int8":
        monkeypatch.undo()
        with eight_bit_model(tensors, monkeypatch, name, cal) as default:
            assert not any(k["kernel"].startswith("wgmma_halo") for k in default.kernel_plan())
            np.testing.assert_array_equal(out, default.logits(x))
    assert np.all(rel_err(out, reference_logits(tensors, x)) < BOUND[name])


def test_the_tuner_takes_fp8_codes_a_step_apart_and_refuses_a_layout_error(rng):
    """tuning.outputs_agree for FP8: one e4m3 step anywhere (sums that part by a little move a value across one code),
    several steps near zero (within 2^-7 of the largest), never a permutation of the outputs or a NaN code."""
    from vggserve.quant import e4m3
    from vggserve.tuning import outputs_agree

    want = e4m3.encode(np.abs(rng.standard_normal(4096)).astype(np.float32) * 20).astype(np.int64)
    flips = want.copy()
    flips[::7] += rng.choice([-1, 1], flips[::7].shape)  # one step up or down, codes 0..0x7E stay in range
    flips = np.clip(flips, 0, 0x7E)
    f32 = lambda c: np.asarray(c, np.float32)  # noqa: E731 - codes as the tuner reads them back
    fp8 = precisions.FP8
    assert outputs_agree(fp8, f32(want), f32(want), 1.0, 1e-2)
    assert outputs_agree(fp8, f32(flips), f32(want), 1.0, 1e-2)
    small = want.copy()
    i = int(np.argmin(np.where(want > 8, want, 999)))  # a value near 2^-6: several codes within 2^-7 of the top
    small[i] = 0
    top = float(e4m3.decode(np.uint8(want.max())))
    assert float(e4m3.decode(np.uint8(want[i]))) <= 2 ** -7 * top and outputs_agree(fp8, f32(small), f32(want), 1, 0)
    assert not outputs_agree(fp8, f32(np.roll(want, 1)), f32(want), 1.0, 1e-2)
    nan = want.copy()
    nan[5] = 0x7F
    assert not outputs_agree(fp8, f32(nan), f32(want), 1.0, 1e-2)
    # the other precisions: within tol of the largest, as before
    assert outputs_agree(precisions.INT8, f32([10, 200]), f32([11, 200]), 200.0, 1e-2)
    assert not outputs_agree(precisions.INT8, f32([10, 200]), f32([13, 200]), 200.0, 1e-2)


# Natively, without the promotion each sum is the tensor cores' own over all its products (measured up to 1.1e-3 of
# sum |products| over 4,608 of them, benchmarks/eightbit_sums.py --fast)
FP8_FAST_ERROR = 2.0 ** -9


def test_fp8_fast_accumulation_is_opt_in_and_still_matches_numpy(tc_env, rng, monkeypatch):
    """VGGSERVE_FP8_ACCUMULATE=fast builds PROMOTE = 0 (the layer says so); fp32, the default, promotes; a table's
    PROMOTE wins over both; another value is a one-line error. The fast layer against numpy within the tensor cores'
    accumulation (natively) or FP32's (the software model)."""
    from vggserve.ops.wgmma_halo import fp8_promotes

    assert fp8_promotes({}) == 1 and fp8_promotes({"PROMOTE": 0}) == 0
    monkeypatch.setenv("VGGSERVE_FP8_ACCUMULATE", "fast")
    assert fp8_promotes({}) == 0 and fp8_promotes({"PROMOTE": 1}) == 1
    shape = (1, 70, 40, 9, 6, 3)
    got, y, bound, s_out, op = f8.run(tc_env, fp8_layer((8, 2)), shape, rng)
    assert op.promote == 0 and op.describe().endswith("sums accumulated in the tensor cores (fast)")
    if not tc_env[3].emulate_mma:
        bound = bound * (1.0 + FP8_FAST_ERROR / ((shape[1] * 9 - 1) * 2.0 ** -24))
    f8.check(got, y, bound, s_out, op)
    monkeypatch.setenv("VGGSERVE_FP8_ACCUMULATE", "fp16")
    with pytest.raises(ValueError, match="VGGSERVE_FP8_ACCUMULATE must be one of fp32, fast"):
        fp8_promotes({})
    monkeypatch.setenv("VGGSERVE_FP8_ACCUMULATE", "FP32")
    assert fp8_promotes({}) == 1


@pytest.mark.parametrize("promote", [2, 3, 9])
def test_fp8_sums_promoted_every_few_taps_match_numpy(tc_env, rng, promote):
    """PROMOTE = P (a table's, the tuner's FP8 candidates with P = 2): each group of P taps of a chunk summed in the
    tensor cores (the last group of the 9 shorter), then added into FP32; against numpy within FP32's bound (the
    software model) or P taps' worth of the tensor cores' own accumulation (natively), on two chunks of channels;
    the fused pooling stores the max of the unfused codes. An interval outside 0 .. 9 is refused before any build."""
    shape = (1, 70, 40, 8, 6, 3)
    p = {**params((8, 2)), "PROMOTE": promote}
    make = lambda ctx, cache, prec, layer, w, b, env, s_in, s_out: WgmmaHaloLayer(  # noqa: E731
        ctx, cache, p, prec, layer, w, b, env, in_scale=s_in, out_scale=s_out)
    got, y, bound, s_out, op = f8.run(tc_env, make, shape, np.random.default_rng(4))
    assert op.promote == promote and op.describe().endswith(f"sums promoted every {promote} taps")
    if not tc_env[3].emulate_mma:
        bound = bound * (1.0 + promote * FP8_TAP_ERROR / ((shape[1] * 9 - 1) * 2.0 ** -24))
    f8.check(got, y, bound, s_out, op)
    pooled, *_ = f8.run(tc_env, make, shape, np.random.default_rng(4), pool=True)
    np.testing.assert_array_equal(pooled, got.reshape(1, 4, 2, 3, 2, -1).max(axis=(2, 4)))
    ctx, _, cache, caps = tc_env
    with pytest.raises(ValueError, match="PROMOTE 0 to 9"):
        WgmmaHaloLayer(ctx, cache, {**p, "PROMOTE": 10}, precisions.FP8, LayerSpec("conv3x3", 8, 8, 8),
                       np.zeros((8, 8, 3, 3), np.float32), np.zeros(8, np.float32), None, in_scale=1.0)
