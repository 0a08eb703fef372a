"""INT8 on tensor cores: the precision, the devices that run it, its layer scales, and its kernels against numpy.

Kernels run here on PoCL through their exact software model (VGGSERVE_EMULATE_MMA=1, as test_tensorcore.py does):
mma.sync m16n8k32 u8 x s8 with int32 sums (integer arithmetic, exact like the hardware's), the epilogue's float
conversion, fma and u8 rounding (convert_uchar_sat_rte) as numpy computes them.
"""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.errors import DeviceError
from vggserve.ops import eightbit, nhwc, precision as precisions
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import HaloLayer, TensorCoreLayer
from vggserve.quant import int8
from vggserve.runtime import caps as device_caps

from test_tensorcore import enqueue_on, tc_env  # noqa: F401 - the fixture

INT8, FP16 = precisions.INT8, precisions.FP16


# ---- the precision and the devices ---------------------------------------------------------------------------------
def test_int8_is_stored_as_bytes_and_is_neither_fp8_nor_half():
    assert INT8.itemsize == 1 and INT8.int8 and INT8.eight_bit and INT8.tensor_cores
    assert not INT8.fp8 and not INT8.half and not INT8.tf32
    assert precisions.FP8.eight_bit and not precisions.FP8.int8 and not FP16.eight_bit
    # where an 8-bit model's activations are not codes (features.0's input, a layer writing none) they are FP16
    assert INT8.floats == precisions.FP8.floats == FP16
    assert [p.floats for p in (FP16, precisions.TF32, precisions.FP32)] == [FP16, precisions.TF32, precisions.FP32]


def test_a_device_without_tensor_cores_refuses_int8_in_one_line():
    with pytest.raises(DeviceError) as err:
        precisions.check(INT8, False, "a CPU")
    message = str(err.value)
    assert "\n" not in message and "cannot run precision int8" in message and "8.0 or newer" in message
    precisions.check(INT8, True, "NVIDIA A100", fp8=False)  # s8 mma.sync: Ampere has it, e4m3 or not


def test_int8_runs_on_tc_gemm_and_tc_halo_wherever_there_are_tensor_cores():
    from dataclasses import replace

    from vggserve.ops import registry

    ampere = device_caps.Caps(kind="gpu", label="A100", compute_units=108, local_mem=48 * 1024, max_work_group=1024,
                              tensor_cores=True, emulate_mma=False, fp8=False)
    hopper = replace(ampere, wgmma=True, fp8=True)
    conv, fc = LayerSpec("conv3x3", 64, 64, 56), LayerSpec("fc", 4096, 1000, last=True)
    for caps in (ampere, hopper):  # mma.sync everywhere; Hopper's wgmma_halo too (test_wgmma_eightbit.py)
        extra = {"wgmma_halo"} if caps.wgmma else set()
        assert {a.name for a in registry.for_layer(caps, INT8, conv)} == {"tc_gemm", "tc_halo"} | extra
        assert {a.name for a in registry.for_layer(caps, INT8, fc)} == {"tc_gemm", "tc_gemv8"}
    assert registry.family_for(ampere, INT8) == "tensorcore"
    for name in ("tc_gemm", "tc_halo"):  # tiles in bytes: the same candidates as FP16
        algo = registry.get(name)
        assert algo.candidates(ampere, INT8, conv) == algo.candidates(ampere, FP16, conv)


# ---- weights and scales ----------------------------------------------------------------------------------------------
def test_int8_weights_are_the_numpy_models_per_channel_s8_codes(rng):
    from vggserve.quant.reference import QuantizedWeights

    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    w[3] = 0.0
    codes, s_w = eightbit.int8_weights(w)
    assert codes.dtype == np.int8 and codes.min() >= -127
    amax = np.abs(w.reshape(6, -1)).max(axis=1)
    live = [0, 1, 2, 4, 5]
    np.testing.assert_array_equal(s_w[live], (amax / np.float32(127))[live])
    assert s_w[3] == 1.0 and np.all(codes[3] == 0)
    assert np.all(np.abs(codes[live]).reshape(5, -1).max(axis=1) == 127), "each amax becomes 127"
    model = QuantizedWeights({"features.0.weight": w}).eight_bit("features.0", "int8")  # the oracle's weights
    np.testing.assert_array_equal(codes, model[0])
    np.testing.assert_array_equal(s_w, model[1])


def test_u8_codes_round_to_even_and_saturate_at_0_and_255():
    x = np.array([-3.0, -0.0, 0.5, 1.5, 2.5, 254.49, 254.5, 255.5, 1e9], np.float32)
    np.testing.assert_array_equal(eightbit.u8_codes(x, 1.0), [0, 0, 0, 2, 2, 254, 254, 255, 255])


def test_int8_layer_scales_name_their_storage_and_refuse_mixing_formats():
    from vggserve.ops.eightbit import LayerScales

    w = np.ones((4, 8), np.float32)
    s = LayerScales(INT8, w, 0.5, 0.25, False)
    assert s.describe() == ", u8 in, u8 out" and s.defines == {"INT8": 1, "OUT_INT8": 1}
    np.testing.assert_array_equal(s.cs, np.float32(0.5) * np.float32(1 / 127))
    np.testing.assert_array_equal(s.weight, 127.0)
    assert LayerScales(INT8, w, 0.5, None, False).describe() == ", u8 in, fp16 out"
    assert LayerScales(INT8, w, 0.5, None, True).describe() == ", u8 in, float32 logits"
    first = LayerScales(FP16, w, None, 0.25, False, out_codes=INT8)
    assert first.describe() == ", fp16 in, u8 out" and first.defines == {"OUT_INT8": 1} and first.cs is None
    with pytest.raises(ValueError, match="writes int8 codes, not fp8") as err:
        LayerScales(INT8, w, 0.5, 0.25, False, out_codes=precisions.FP8)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="needs in_scale"):
        LayerScales(INT8, w, None, None, False)


# ---- kernels against numpy -------------------------------------------------------------------------------------------
# The sums are exact (int32 on the device, int64 here). The epilogue is y = fma(float32(sum), cs[n], bias[n]) in
# float32, ReLU, y * float32(1 / s_out), then rint to 0 .. 255; numpy takes the fma in float64 (the product of two
# float32 is exact there) and rounds once to float32. A stored code must equal numpy's, except where numpy's value
# lies within 1e-5 of a tie (x.5): there the fma's single rounding may pick either neighbour. FP16 inputs (a first
# convolution) are summed in FP32 on the device: there codes may differ by one step where the value lies within the
# FP32 sum's error bound of a tie.
from test_fp8_kernels import (  # noqa: E402 - the same tiles and awkward sizes as the FP8 kernels
    GEMM_CONFIGS, GEMM_KEYS, GEMM_SHAPES, HALO_CONFIGS, HALO_KEYS, HALO_SHAPES)


def gemm(cfg, **extra):
    params = dict(zip(GEMM_KEYS, cfg), ALGO="tc_gemm", **extra)
    return lambda *args, **kw: TensorCoreLayer(*args, params=params, **kw)


def halo(cfg):
    params = dict(zip(HALO_KEYS, cfg), ALGO="tc_halo")
    return lambda *args, **kw: HaloLayer(*args, params=params, **kw)


def conv_sum(x, w, ks):
    """sum over taps and channels of x (n, h, w, cin) and w (cout, cin, ks, ks), zero padded, in x's dtype."""
    n, h, wd, _ = x.shape
    pad = ks // 2
    a = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = np.zeros((n, h, wd, len(w)), x.dtype)
    for ky in range(ks):
        for kx in range(ks):
            out += a[:, ky:ky + h, kx:kx + wd, :] @ w[:, :, ky, kx].T.astype(x.dtype)
    return out


def epilogue(acc, cs, bias, relu, out_scale):
    """The kernels' epilogue in numpy: (float32 value before the u8 rounding, or the output itself)."""
    y = (acc.astype(np.float32).astype(np.float64) * cs.astype(np.float64) + bias).astype(np.float32)
    y = np.maximum(y, np.float32(0)) if relu else y
    return y if out_scale is None else y * np.float32(1.0 / out_scale)


def run(tc_env, make, shape, rng, u8_in=True, out="int8", relu=True, pool=False, big=False):
    """(stored output NHWC, numpy's value before rounding (u8 codes) or the output, the tie window, the layer, the
    largest sum) of one layer on random data; out: "int8" (u8 codes), "fp16" or "f32" (the last layer's logits).
    big: positive weights and codes near the top of their ranges (sums past 2^24)."""
    ctx, _, cache, caps = tc_env
    n, cin, cout, h, w, ks = shape
    if big:
        weight = rng.uniform(0.5, 1.0, (cout, cin, ks, ks)).astype(np.float32)
    else:
        weight = (rng.standard_normal((cout, cin, ks, ks)) / np.sqrt(cin * ks * ks)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    if u8_in:
        x = rng.integers(200 if big else 0, 256, (n, h, w, cin)).astype(np.uint8)
        in_scale = 0.02
        q, s_w = eightbit.int8_weights(weight)
        acc = conv_sum(x.astype(np.int64), q.astype(np.int64), ks)
        cs = (np.float32(in_scale) * s_w).astype(np.float32)
        pre, window = epilogue(acc, cs, bias, False, None), 0.0
        top = float(acc.max())
    else:  # FP16 in: FP32 sums on the device
        x = rng.standard_normal((n, h, w, cin)).astype(np.float16)
        in_scale = None
        w16 = weight.astype(np.float16).astype(np.float64)
        pre = conv_sum(x.astype(np.float64), w16, ks) + bias
        window = (cin * ks * ks) * 2.0 ** -24 * conv_sum(np.abs(x.astype(np.float64)), np.abs(w16), ks)
        top = float(np.abs(pre).max())
    out_scale = float(np.maximum(pre, 0).max()) / 255 * 0.9 if out == "int8" else None  # a few values saturate
    layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, h if ks == 3 else 1, relu=relu, last=out == "f32",
                      pool=pool)
    prec = INT8 if u8_in else FP16
    op = make(ctx, cache, precision=prec, layer=layer, weight=weight if ks == 3 else weight[:, :, 0, 0], bias=bias,
              env=BuildEnv(caps=caps, max_batch=n), in_scale=in_scale, out_scale=out_scale,
              out_codes=INT8 if out == "int8" else None)
    xin = np.zeros((n, h, w, op.cpad), x.dtype)
    xin[..., :cin] = x
    oh, ow = (h // 2, w // 2) if pool else (h, w)
    dtype = {"int8": np.uint8, "fp16": np.float16, "f32": np.float32}[out]
    poison = np.full((n * oh * ow, op.cstore), 0xAB if out == "int8" else np.nan, dtype)
    got = enqueue_on(tc_env, op, xin, poison, n, h, w).reshape(n, oh, ow, op.cstore)
    if u8_in:
        value = epilogue(acc, cs, bias, relu, out_scale)
    else:
        inv = np.float32(1.0 / out_scale) if out_scale else 1.0
        value, window = (np.maximum(pre, 0) if relu else pre) * inv, window * inv
    return got, value, window, op, top


def check_codes(got, value, window, op):
    """u8 codes against numpy's rint(value) clipped to 0 .. 255, ties (within window + 1e-5) either way."""
    cout = op.layer.cout
    assert np.all(got[..., cout:] == 0), "the padding channels must be code 0 (the next layer reads them)"
    got = got[..., :cout].astype(np.int64)
    value = np.asarray(value, np.float64)
    ref = np.clip(np.rint(value), 0, 255)
    near_tie = np.abs(np.abs(value - np.floor(value)) - 0.5) <= window + 1e-5
    lo, hi = np.clip(np.floor(value - window - 1e-5), 0, 255), np.clip(np.ceil(value + window + 1e-5), 0, 255)
    assert np.all((got == ref) | (near_tie & (got >= lo) & (got <= hi))), "a code differs from numpy's"


def check_values(got, value, window, op, out):
    cout = op.layer.cout
    assert not np.isnan(got.astype(np.float32)).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0)
    err = np.abs(got[..., :cout].astype(np.float64) - value)
    rounding = 2.0 ** -11 if out == "fp16" else 0.0
    assert np.all(err <= (rounding + 1e-6) * np.abs(value) + window)


@pytest.mark.parametrize("cfg", GEMM_CONFIGS, ids=lambda c: "{}x{}_w{}x{}_s{}_k{}".format(*c))
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_gemm_writes_numpys_u8_codes(tc_env, rng, cfg, shape):
    got, value, window, op, _ = run(tc_env, gemm(cfg), shape, rng)
    check_codes(got, value, window, op)


@pytest.mark.parametrize("u8_in, out", [(True, "fp16"), (False, "int8"), (True, "f32")],
                         ids=["u8_in_fp16_out", "fp16_in_u8_out", "u8_in_logits"])
@pytest.mark.parametrize("shape", [GEMM_SHAPES[1], GEMM_SHAPES[4]], ids=lambda s: "x".join(map(str, s)))
def test_int8_gemm_input_and_output_storage_are_independent(tc_env, rng, u8_in, out, shape):
    relu = out != "f32"
    got, value, window, op, _ = run(tc_env, gemm(GEMM_CONFIGS[0]), shape, rng, u8_in=u8_in, out=out, relu=relu)
    unit = {"fp16": 8, "int8": 16, "f32": 4}[out]  # 16 bytes of the output
    assert op.cstore == -(-shape[2] // unit) * unit
    assert op.describe().endswith(op.scales.describe()) and op.scales.describe()
    if out == "int8":
        check_codes(got, value, window, op)
    else:
        check_values(got, value, window, op, out)


@pytest.mark.parametrize("cfg", HALO_CONFIGS, ids=lambda c: "{}x{}x{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", HALO_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_halo_writes_numpys_u8_codes(tc_env, rng, cfg, shape):
    got, value, window, op, _ = run(tc_env, halo(cfg), (*shape, 3), rng)
    check_codes(got, value, window, op)


def test_int8_halo_takes_fp16_in_and_writes_u8(tc_env, rng):
    got, value, window, op, _ = run(tc_env, halo(HALO_CONFIGS[0]), (2, 13, 21, 11, 17, 3), rng, u8_in=False)
    check_codes(got, value, window, op)


def test_int8_split_k_equals_one_pass_bit_for_bit(tc_env):
    """The int32 partial sums travel as bits and are added as ints: split and one pass store the same codes, here
    with sums above 2^24 (u8 codes near 255, 576 terms of s8 up to 127), where float partial sums would round."""
    shape = (1, 128, 24, 3, 3, 3)  # 18 k-tiles of 64 bytes, split to fill 64 work-groups
    split = run(tc_env, gemm(GEMM_CONFIGS[0], GROUPS_TARGET=64), shape, np.random.default_rng(7), out="f32",
                relu=False, big=True)
    one = run(tc_env, gemm(GEMM_CONFIGS[0], GROUPS_TARGET=1), shape, np.random.default_rng(7), out="f32", relu=False,
              big=True)
    assert split[3].plans[1][0] > 1 and one[3].plans[1][0] == 1 and split[4] > 2 ** 24
    np.testing.assert_array_equal(split[0], one[0])
    np.testing.assert_array_equal(split[0][..., :24], split[1])  # the logits: numpy's epilogue, bit for bit


def test_the_software_model_sums_u8_times_s8_exactly(tc_env):
    """An FC layer whose scales are 1 (every channel's amax 127, s_in 1) and bias 0: the logits are the integer sums
    of u8 x s8 products, every code 0 .. 255 against weights -127 .. 127, bit for bit."""
    ctx, _, cache, caps = tc_env
    codes = np.arange(256, dtype=np.uint8).reshape(8, 32)
    w = np.random.default_rng(2).integers(-127, 128, (16, 32)).astype(np.float32)
    w[:, 0] = 127.0  # amax 127: s_w = 1
    layer = LayerSpec("fc", 32, 16, 1, relu=False, last=True)
    op = TensorCoreLayer(ctx, cache, dict(zip(GEMM_KEYS, GEMM_CONFIGS[0]), ALGO="tc_gemm"), INT8, layer, w,
                         np.zeros(16, np.float32), BuildEnv(caps=caps, max_batch=8), in_scale=1.0)
    np.testing.assert_array_equal(op.scales.cs, 1.0)
    got = enqueue_on(tc_env, op, codes, np.full((8, op.cstore), np.nan, np.float32), 8, 1, 1)
    want = codes.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(got[:, :16], want.astype(np.float32))


# ---- pooling on u8 codes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [(8, 8, 32, 2, 1, 2), (8, 16, 64, 2, 2, 3)], ids=["tw8", "tw16"])
def test_int8_fused_pool_equals_pooling_the_unfused_codes(tc_env, cfg):
    shape = (1, 13, 21, 11, 17)
    n, cin, cout, h, w = shape
    fused = run(tc_env, halo(cfg), (*shape, 3), np.random.default_rng(5), pool=True)
    plain = run(tc_env, halo(cfg), (*shape, 3), np.random.default_rng(5))
    codes = plain[0][:, :h // 2 * 2, :w // 2 * 2]
    np.testing.assert_array_equal(fused[0], codes.reshape(n, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4)))


def test_nhwc_int8_pooling_is_the_max_of_the_u8_codes(tc_env, rng):
    ctx, queue, cache, _ = tc_env
    prog = cache.build(nhwc.KERNEL_FILE, nhwc.defines(INT8))
    n, h, w, cpad = 2, 7, 9, 32
    codes = rng.integers(0, 256, (n, h, w, cpad), dtype=np.uint8)
    src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=codes)
    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * (h // 2) * (w // 2) * cpad)
    nhwc.MaxPoolNhwc(prog, INT8).enqueue(queue, src, dst, n, cpad, h, w)
    got = np.empty((n, h // 2, w // 2, cpad), np.uint8)
    cl.enqueue_copy(queue, got, dst)
    windows = codes[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, cpad)
    np.testing.assert_array_equal(got, windows.max(axis=(2, 4)))


def test_nhwc_int8_input_is_numpys_u8_codes(tc_env, rng):
    ctx, queue, cache, _ = tc_env
    x = np.concatenate([rng.uniform(-1, 300, 61), [0.5, 1.5, 2.5, -0.0, 255.5, 1e9]]).astype(np.float32)
    x = x.reshape(1, 1, 1, -1)  # NCHW: one image, one channel
    width = x.shape[3]
    prog = cache.build(nhwc.KERNEL_FILE, nhwc.defines(INT8))
    src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, width * 16)
    nhwc.NhwcInput(prog, 1, 16, scale=0.5).enqueue(queue, src, dst, 1, 1, width)
    got = np.empty((width, 16), np.uint8)
    cl.enqueue_copy(queue, got, dst)
    np.testing.assert_array_equal(got[:, 0], eightbit.u8_codes(x[0, 0, 0], 0.5))
    assert np.all(got[:, 1:] == 0)
    assert int8.MAX == 127  # the weights' range; the activations' is eightbit.U8_MAX


# ---- the tuner -----------------------------------------------------------------------------------------------------
def test_the_tuner_times_and_checks_int8_candidates_of_every_tensor_core_algorithm(tmp_path, monkeypatch):
    """`tune --precision int8`: the registry's INT8 candidates (mma.sync, wgmma), each held to the default's codes."""
    from vggserve import tuning
    from vggserve.runtime import devices as devs
    from vggserve.runtime import params as params_module

    from conftest import TEST_DEVICE

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(params_module, "shipped_file", lambda: tmp_path / "none.json")
    info = devs.resolve(TEST_DEVICE)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.0625) if s[0] in ("32x32x14", "256x256x1")]
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=2, repeats=1, shapes=shapes,
                                  progress=lambda _: None, precision="int8")
    algos = {"tc_gemm", "tc_halo", "wgmma_halo", "tc_gemv8"}  # tc_gemv8: the FC shape (256x256x1) at batch 1
    assert {t.params["ALGO"] for t in trials} == algos and all(t.ok for t in trials)
    assert {t.params["ALGO"] for t in trials if t.shape == "256x256x1"} == {"tc_gemm", "tc_gemv8"}
    assert set(winners) == {"32x32x14", "256x256x1"}
