"""FP8 (e4m3) on tensor cores: the precision, the devices that run it, and its kernels against numpy.

Kernels run here on PoCL through their exact software model (VGGSERVE_EMULATE_MMA=1, as test_tensorcore.py does):
mma.sync m16n8k32 e4m3 decoded exactly and multiplied in FP32, the e4m3 rounding of the epilogue bit for bit as
quant/e4m3.encode (round to nearest even, saturate to 448).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from vggserve.errors import DeviceError
from vggserve.ops import precision as precisions
from vggserve.runtime import caps as device_caps


def fake_device(cc=None):
    """What caps.of reads of an OpenCL device; cc: NVIDIA's compute capability, or None (not NVIDIA)."""
    return SimpleNamespace(extensions="cl_nv_device_attribute_query" if cc else "", max_compute_units=132,
                           local_mem_size=48 * 1024, max_work_group_size=1024,
                           compute_capability_major_nv=cc and cc[0], compute_capability_minor_nv=cc and cc[1])


@pytest.mark.parametrize("cc, fp8", [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True),
                                     ((10, 0), True), (None, False)])
def test_e4m3_tensor_cores_need_compute_capability_8_9(monkeypatch, cc, fp8):
    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    caps = device_caps.of(fake_device(cc), "gpu", "a GPU")
    assert caps.fp8 is fp8 and caps.tensor_cores is (cc is not None)


def test_the_software_model_runs_fp8_anywhere(monkeypatch):
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    caps = device_caps.of(fake_device(None), "cpu", "a CPU")
    assert caps.fp8 and caps.emulate_mma


def test_a_device_without_e4m3_tensor_cores_refuses_fp8_in_one_line():
    with pytest.raises(DeviceError) as err:
        precisions.check(precisions.FP8, True, "NVIDIA A100", fp8=False)
    message = str(err.value)
    assert "\n" not in message and "cannot run precision fp8" in message and "8.9" in message
    assert message.endswith("this device supports fp32, tf32, fp16, int8")
    precisions.check(precisions.FP8, True, "NVIDIA H100", fp8=True)
    with pytest.raises(DeviceError, match=r"8\.0 or newer\); this device supports fp32, fp16$"):
        precisions.check(precisions.TF32, False, "a CPU")  # tf32's refusal as before


def test_fp8_is_stored_as_bytes_and_is_neither_half_nor_tf32():
    fp8 = precisions.FP8
    assert fp8.itemsize == 1 and fp8.fp8 and fp8.tensor_cores and not fp8.half and not fp8.tf32
    assert precisions.TF32.tf32 and not precisions.FP16.fp8 and not precisions.FP16.tf32


# ---- quantisation and the layer objects' scales -------------------------------------------------------------------
def test_weight_scales_are_each_channels_amax_over_448_and_the_codes_round_trip(rng):
    from vggserve.ops import eightbit as fp8
    from vggserve.quant import e4m3

    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    w[2] = 0.0
    codes, s = fp8.quantise_weights(w)
    amax = np.abs(w.reshape(5, -1)).max(axis=1)
    live = [0, 1, 3, 4]
    np.testing.assert_array_equal(s[live], (amax / np.float32(448)).astype(np.float32)[live])
    assert s[2] == 1.0 and np.all(codes[2] == 0), "a channel of zeros: scale 1 (positive), codes 0"
    sw = s.astype(np.float64)[:, None, None, None]
    np.testing.assert_array_equal(codes, e4m3.encode(w / sw))
    assert np.all(np.abs(e4m3.decode(codes[live])).reshape(4, -1).max(axis=1) == 448), "each amax becomes 448"
    back = e4m3.decode(codes) * sw  # within half an e4m3 step: 2^-4 relative (normals), 2^-10 s_w (subnormals)
    assert np.all(np.abs(back - w) <= 2.0 ** -4 * np.abs(w) + 2.0 ** -10 * sw)


def test_layer_scales_refuse_what_a_layer_cannot_use_in_one_line():
    from vggserve.ops.eightbit import LayerScales

    w = np.ones((4, 8), np.float32)
    cases = [((precisions.FP8, w, None, None, False), "needs in_scale"),
             ((precisions.FP16, w, 0.1, None, False), "takes none"),
             ((precisions.FP8, w, 0.1, 0.2, True), "float32 logits"),
             ((precisions.FP8, w, 0.0, None, False), "finite scale above 0"),
             ((precisions.FP8, w, float("nan"), None, False), "finite scale above 0"),
             ((precisions.FP16, w, None, -1.0, False), "finite scale above 0")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            LayerScales(*args)
        assert "\n" not in str(err.value)


def test_layer_scales_name_the_storage_in_and_out():
    from vggserve.ops.eightbit import LayerScales

    w = np.ones((4, 8), np.float32)
    fp8, fp16 = precisions.FP8, precisions.FP16
    assert LayerScales(fp8, w, 0.5, 0.25, False).describe() == ", e4m3 in, e4m3 out"
    assert LayerScales(fp8, w, 0.5, None, False).describe() == ", e4m3 in, fp16 out"
    assert LayerScales(fp16, w, None, 0.25, False).describe() == ", fp16 in, e4m3 out"
    assert LayerScales(fp8, w, 0.5, None, True).describe() == ", e4m3 in, float32 logits"
    plain = LayerScales(fp16, w, None, None, False)
    assert plain.describe() == "" and plain.defines == {} and not plain.active
    s = LayerScales(fp8, w, 0.5, 0.25, False)
    assert s.defines == {"FP8": 1, "OUT_FP8": 1} and s.cs.dtype == np.float32
    np.testing.assert_array_equal(s.cs, np.float32(0.5 / 448))


def test_the_logits_are_1000_a_row_whatever_the_last_layers_input():
    """The engine's logits buffer holds 1000 floats an image: an e4m3-input last layer (VEC 16) must not pad to 1008."""
    from vggserve.ops.eightbit import LayerScales
    from vggserve.ops.registry import LayerSpec
    from vggserve.ops.tensorcore import out_channels

    last = LayerSpec("fc", 4096, 1000, last=True)
    w = np.ones((1000, 8), np.float32)
    for prec, s_in in ((precisions.FP8, 0.5), (precisions.FP16, None), (precisions.TF32, None)):
        assert out_channels(last, prec, LayerScales(prec, w, s_in, None, True)) == 1000
    hidden = LayerSpec("fc", 4096, 1000)
    assert out_channels(hidden, precisions.FP8, LayerScales(precisions.FP8, w, 0.5, 0.5, False)) == 1008  # e4m3 out
    assert out_channels(hidden, precisions.FP8, LayerScales(precisions.FP8, w, 0.5, None, False)) == 1000  # FP16 out


def test_fp8_runs_on_tc_gemm_and_tc_halo_where_the_device_has_e4m3_tensor_cores():
    from dataclasses import replace

    from vggserve.ops import registry
    from vggserve.ops.registry import LayerSpec

    ada = device_caps.Caps(kind="gpu", label="L40S", compute_units=142, local_mem=48 * 1024, max_work_group=1024,
                           tensor_cores=True, emulate_mma=False, fp8=True)
    hopper, ampere = replace(ada, wgmma=True), replace(ada, fp8=False)
    conv, fc = LayerSpec("conv3x3", 64, 64, 56), LayerSpec("fc", 4096, 1000, last=True)
    for caps in (ada, hopper):  # Hopper also wgmma_halo, natively e4m3 (test_wgmma_eightbit.py)
        extra = {"wgmma_halo"} if caps.wgmma else set()
        assert {a.name for a in registry.for_layer(caps, precisions.FP8, conv)} == {"tc_gemm", "tc_halo"} | extra
        assert {a.name for a in registry.for_layer(caps, precisions.FP8, fc)} == {"tc_gemm", "tc_gemv8"}
    assert registry.for_layer(ampere, precisions.FP8, conv) == registry.for_layer(ampere, precisions.FP8, fc) == []
    assert registry.family_for(ada, precisions.FP8) == "tensorcore"
    for name in ("tc_gemm", "tc_halo"):  # tiles in bytes: the same candidates at every precision
        algo = registry.get(name)
        assert algo.candidates(ada, precisions.FP8, conv) == algo.candidates(ada, precisions.FP16, conv)


# ---- kernels against numpy ---------------------------------------------------------------------------------------
# Inputs are e4m3 codes already (or FP16 values), the weights quantised per channel by ops/eightbit.py, so the numpy
# model (float64 sums of the decoded operands, then the epilogue: sum * cs[n] + bias[n], ReLU, times 1 / s_out) differs
# from the kernels only by FP32 accumulation order and the output's rounding. A stored e4m3 code must equal numpy's
# e4m3.encode of its pre-rounding value, except where that value lies within 1e-5 relative of a rounding tie (the
# midpoint of two adjacent e4m3 values) widened by the FP32 accumulation's error bound, (K - 1) 2^-24 sum_k |a w| scaled
# like the value: there either neighbour is right. FP16 outputs: within one FP16 rounding (2^-11 relative) of the value
# and that window; float32 logits: within the window.
import pyopencl as cl  # noqa: E402

from vggserve.ops import eightbit as fp8, nhwc  # noqa: E402
from vggserve.ops.registry import BuildEnv, LayerSpec  # noqa: E402
from vggserve.ops.tensorcore import HaloLayer, TensorCoreLayer  # noqa: E402
from vggserve.quant import e4m3  # noqa: E402

from test_tensorcore import enqueue_on, tc_env  # noqa: E402,F401 - the fixture

GEMM_KEYS = ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB")
HALO_KEYS = ("TH", "TW", "BN", "WARPS_M", "WARPS_N", "STAGES")
GEMM_CONFIGS = [(64, 64, 2, 2, 3, 64), (32, 64, 1, 2, 2, 128), (128, 64, 2, 2, 4, 32)]  # 32/64/128-byte rows
GEMM_SHAPES = [  # (n, cin, cout, h, w, ks): 1 image, odd channels, pixels and K off the tiles; FC layers (ks = 1)
    (1, 3, 8, 5, 7, 3),      # cin 3: cpad 16, K = 144 (a partial 64- and 128-byte k-tile)
    (2, 13, 21, 6, 5, 3),
    (1, 40, 70, 9, 4, 3),    # cpad 48, K = 432
    (3, 24, 33, 1, 1, 1),    # FC: K = 32
    (2, 200, 37, 1, 1, 1),   # FC: K = 208
]
HALO_CONFIGS = [(8, 16, 64, 2, 2, 3), (8, 8, 32, 2, 1, 2), (4, 28, 32, 1, 2, 3), (7, 16, 32, 1, 2, 2)]
HALO_SHAPES = [(1, 3, 8, 5, 7), (2, 13, 21, 11, 17), (1, 70, 40, 9, 6)]  # cin 70: cpad 80, two 64-channel chunks


def gemm_params(cfg, **extra):
    return dict(zip(GEMM_KEYS, cfg), ALGO="tc_gemm", **extra)


def halo_params(cfg):
    return dict(zip(HALO_KEYS, cfg), ALGO="tc_halo")


def e4m3_integers(limit):
    """The e4m3 values that are integers of magnitude <= limit (sums of their products are exact in FP32)."""
    v = e4m3.VALUES[np.isfinite(e4m3.VALUES)].astype(np.float64)
    return np.unique(v[(v == np.round(v)) & (np.abs(v) <= limit)])


def random_case(shape, rng, fp8_in, exact=False):
    """(x NHWC float32 of e4m3 or FP16 values, in_scale, weight, bias). exact: integer operands (activations up to
    16, quantised weights up to 448, one 448 a channel), so every sum is exact in FP32 whatever its order."""
    n, cin, cout, h, w, ks = shape
    if exact:
        x = rng.choice(e4m3_integers(16), (n, h, w, cin)).astype(np.float32)
        q = rng.choice(e4m3_integers(448), (cout, cin, ks, ks))
        q.reshape(cout, -1)[:, 0] = 448.0
        weight = (q * 2.0 ** -7).astype(np.float32)  # s_w = 2^-7 exactly, codes = q
        in_scale = 0.05
    else:
        x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
        weight = (rng.standard_normal((cout, cin, ks, ks)) / np.sqrt(cin * ks * ks)).astype(np.float32)
        in_scale = float(np.abs(x).max()) / 448
        x = e4m3.round_trip(x / in_scale) if fp8_in else x.astype(np.float16).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return x, (in_scale if fp8_in else None), weight, bias


def model(x, weight, bias, cs, ks):
    """numpy's y = sum * cs + bias (float64, before the ReLU) and the FP32 accumulation's error bound on y."""
    n, h, w, cin = x.shape
    codes, _ = fp8.quantise_weights(weight) if cs is not None else (None, None)
    wq = (e4m3.decode(codes) if cs is not None else weight.astype(np.float16)).astype(np.float64)
    pad = ks // 2
    a = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    acc, mag = np.zeros((n, h, w, len(weight))), np.zeros((n, h, w, len(weight)))
    for ky in range(ks):
        for kx in range(ks):
            tap = a[:, ky:ky + h, kx:kx + w, :]
            acc += tap @ wq[:, :, ky, kx].T
            mag += np.abs(tap) @ np.abs(wq[:, :, ky, kx]).T
    scale = 1.0 if cs is None else cs[:len(weight)].astype(np.float64)
    k = cin * ks * ks
    return acc * scale + bias, (k - 1) * 2.0 ** -24 * mag * scale


def device_input(x, cpad, fp8_in):
    n, h, w, c = x.shape
    xin = np.zeros((n, h, w, cpad), np.uint8 if fp8_in else np.float16)
    xin[..., :c] = e4m3.encode(x) if fp8_in else x.astype(np.float16)
    return xin


def run(tc_env, make, shape, rng, fp8_in=True, out="fp8", exact=False, relu=True, pool=False):
    """(stored output NHWC, numpy's y before the ReLU, its error bound, out_scale, the layer) of one layer on random
    data; make(ctx, cache, precision, layer, weight, bias, env, in_scale, out_scale); out: "fp8", "fp16" or "f32"
    (the last layer's logits)."""
    ctx, _, cache, caps = tc_env
    n, cin, cout, h, w, ks = shape
    x, in_scale, weight, bias = random_case(shape, rng, fp8_in, exact)
    prec = precisions.FP8 if fp8_in else precisions.FP16
    layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, h if ks == 3 else 1, relu=relu, last=out == "f32",
                      pool=pool)
    cs = fp8.LayerScales(prec, weight, in_scale, None, False).cs
    y, bound = model(x, weight, bias, cs, ks)
    out_scale = float(np.maximum(y, 0).max()) / 448 * 0.9 if out == "fp8" else None  # a few values saturate
    op = make(ctx, cache, prec, layer, weight if ks == 3 else weight[:, :, 0, 0], bias,
              BuildEnv(caps=caps, max_batch=n), in_scale, out_scale)
    oh, ow = (h // 2, w // 2) if pool else (h, w)
    dtype = {"fp8": np.uint8, "fp16": np.float16, "f32": np.float32}[out]
    poison = np.full((n * oh * ow, op.cstore), 0xFF if out == "fp8" else np.nan, dtype)
    got = enqueue_on(tc_env, op, device_input(x, op.cpad, fp8_in), poison, n, h, w).reshape(n, oh, ow, op.cstore)
    return got, y, bound, out_scale, op


def gemm(cfg, **extra):
    return lambda ctx, cache, prec, layer, w, b, env, s_in, s_out: TensorCoreLayer(
        ctx, cache, gemm_params(cfg, **extra), prec, layer, w, b, env, in_scale=s_in, out_scale=s_out)


def halo(cfg):
    return lambda ctx, cache, prec, layer, w, b, env, s_in, s_out: HaloLayer(
        ctx, cache, halo_params(cfg), prec, layer, w, b, env, in_scale=s_in, out_scale=s_out)


def assert_codes_match(got, y, bound, out_scale, relu=True):
    """Device codes against numpy's e4m3.encode of y / s_out (after the ReLU), tie windows as the section says."""
    inv = np.float64(np.float32(1.0 / out_scale))
    v, win = y * inv, bound * inv
    win = win + 1e-5 * np.abs(v)
    act = (lambda a: np.maximum(a, 0)) if relu else (lambda a: a)
    ref = e4m3.encode(act(v))
    lo, hi = e4m3.decode(e4m3.encode(act(v - win))), e4m3.decode(e4m3.encode(act(v + win)))
    value = e4m3.decode(got)
    assert np.all((value >= lo) & (value <= hi)), "a code differs from numpy's beyond a rounding tie"
    assert np.mean(got == ref) > 0.97, "most codes must equal numpy's exactly"
    return ref


def check(got, y, bound, out_scale, op, out="fp8", relu=True):
    cout = op.layer.cout
    if out == "fp8":
        assert np.all(got[..., cout:] == 0), "the padding channels must be code 0 (the next layer reads them)"
        assert_codes_match(got[..., :cout], y, bound, out_scale, relu)
        return
    assert not np.isnan(got.astype(np.float32)).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0)
    ref = np.maximum(y, 0) if relu else y
    rounding = 2.0 ** -11 if out == "fp16" else 0.0
    err = np.abs(got[..., :cout].astype(np.float64) - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * np.abs(ref) + bound)


@pytest.mark.parametrize("cfg", GEMM_CONFIGS, ids=lambda c: "{}x{}_w{}x{}_s{}_k{}".format(*c))
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_gemm_writes_numpys_e4m3_codes(tc_env, rng, cfg, shape):
    got, y, bound, s_out, op = run(tc_env, gemm(cfg), shape, rng)
    check(got, y, bound, s_out, op)


@pytest.mark.parametrize("fp8_in, out", [(True, "fp16"), (False, "fp8"), (True, "f32")],
                         ids=["e4m3_in_fp16_out", "fp16_in_e4m3_out", "e4m3_in_logits"])
@pytest.mark.parametrize("shape", [GEMM_SHAPES[1], GEMM_SHAPES[4]], ids=lambda s: "x".join(map(str, s)))
def test_fp8_gemm_input_and_output_storage_are_independent(tc_env, rng, fp8_in, out, shape):
    relu = out != "f32"
    got, y, bound, s_out, op = run(tc_env, gemm(GEMM_CONFIGS[0]), shape, rng, fp8_in=fp8_in, out=out, relu=relu)
    unit = {"fp16": 8, "fp8": 16, "f32": 4}[out]  # 16 bytes of the output
    assert op.cstore == -(-shape[2] // unit) * unit
    assert op.describe().endswith(op.scales.describe()) and op.scales.describe()
    check(got, y, bound, s_out, op, out, relu)


@pytest.mark.parametrize("cfg", HALO_CONFIGS, ids=lambda c: "{}x{}x{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", HALO_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_halo_writes_numpys_e4m3_codes(tc_env, rng, cfg, shape):
    got, y, bound, s_out, op = run(tc_env, halo(cfg), (*shape, 3), rng)
    check(got, y, bound, s_out, op)


@pytest.mark.parametrize("fp8_in, out", [(True, "fp16"), (False, "fp8")], ids=["e4m3_in_fp16_out", "fp16_in_e4m3_out"])
def test_fp8_halo_input_and_output_storage_are_independent(tc_env, rng, fp8_in, out):
    got, y, bound, s_out, op = run(tc_env, halo(HALO_CONFIGS[0]), (2, 13, 21, 11, 17, 3), rng, fp8_in=fp8_in, out=out)
    check(got, y, bound, s_out, op, out)


@pytest.mark.parametrize("out", ["fp8", "fp16"])
def test_fp8_split_k_equals_one_pass_bit_for_bit(tc_env, out):
    """Integer operands make every sum exact, so the split sums (added up by tc_reduce, then scaled) and one pass's
    are the same float, and so are the stored codes."""
    shape = (1, 64, 24, 3, 3, 3)  # 9 k-tiles of 64 bytes, split to fill 64 work-groups
    split = run(tc_env, gemm(GEMM_CONFIGS[0], GROUPS_TARGET=64), shape, np.random.default_rng(7), out=out, exact=True)
    one = run(tc_env, gemm(GEMM_CONFIGS[0], GROUPS_TARGET=1), shape, np.random.default_rng(7), out=out, exact=True)
    assert split[-1].plans[1][0] > 1 and one[-1].plans[1][0] == 1
    np.testing.assert_array_equal(split[0], one[0])
    check(*split[:4], split[-1], out)


def test_the_software_model_decodes_every_e4m3_code_exactly(tc_env):
    """An identity FC layer (weights 448 on the diagonal after quantisation) over every finite code: the logits are
    decode(code) * 448 * cs, one FP32 rounding, bit for bit."""
    ctx, _, cache, caps = tc_env
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    codes[(codes & 0x7F) == 0x7F] = 0  # NaN
    layer = LayerSpec("fc", 16, 16, 1, relu=False, last=True)
    op = TensorCoreLayer(ctx, cache, gemm_params(GEMM_CONFIGS[0]), precisions.FP8, layer, np.eye(16, dtype=np.float32),
                         np.zeros(16, np.float32), BuildEnv(caps=caps, max_batch=16), in_scale=1.0)
    got = enqueue_on(tc_env, op, codes, np.full((16, op.cstore), np.nan, np.float32), 16, 1, 1)
    want = (e4m3.decode(codes) * np.float32(448)) * op.scales.cs[None, :]  # float32 arithmetic
    np.testing.assert_array_equal(got[:, :16], want)


def test_the_exact_case_matches_numpy_to_a_tie(tc_env):
    """Exact sums (integer operands): only the epilogue's two FP32 roundings separate the codes from numpy's."""
    got, y, bound, s_out, op = run(tc_env, halo(HALO_CONFIGS[0]), (1, 40, 70, 9, 4, 3), np.random.default_rng(3),
                                   exact=True)
    check(got, y, np.zeros_like(bound), s_out, op)


# ---- pooling on e4m3 codes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [(8, 8, 32, 2, 1, 2), (8, 16, 64, 2, 2, 3)], ids=["tw8", "tw16"])
@pytest.mark.parametrize("shape", [(1, 13, 21, 11, 17), (2, 40, 24, 6, 8)], ids=lambda s: "x".join(map(str, s)))
def test_fp8_fused_pool_equals_pooling_the_unfused_codes(tc_env, cfg, shape):
    """The max of the accumulators before the epilogue (cs[n] > 0, 1 / s_out > 0, e4m3 rounding monotonic) is the
    max of the stored codes, bit for bit."""
    n, cin, cout, h, w = shape
    fused = run(tc_env, halo(cfg), (*shape, 3), np.random.default_rng(5), pool=True)
    plain = run(tc_env, halo(cfg), (*shape, 3), np.random.default_rng(5))
    codes = plain[0][:, :h // 2 * 2, :w // 2 * 2]
    pooled = codes.reshape(n, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4))  # unsigned byte max of the codes
    np.testing.assert_array_equal(fused[0], pooled)


def test_nhwc_fp8_pooling_is_the_unsigned_byte_max_and_the_max_of_the_values(tc_env, rng):
    ctx, queue, cache, _ = tc_env
    prog = cache.build(nhwc.KERNEL_FILE, nhwc.defines(precisions.FP8))
    n, h, w, cpad = 2, 7, 9, 32
    codes = rng.integers(0, 0x7F, (n, h, w, cpad), dtype=np.uint8)  # codes of values >= 0 (0x7F: NaN, left out)
    src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=codes)
    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * (h // 2) * (w // 2) * cpad)
    nhwc.MaxPoolNhwc(prog, precisions.FP8).enqueue(queue, src, dst, n, cpad, h, w)
    got = np.empty((n, h // 2, w // 2, cpad), np.uint8)
    cl.enqueue_copy(queue, got, dst)
    windows = codes[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, cpad)
    np.testing.assert_array_equal(got, windows.max(axis=(2, 4)))
    np.testing.assert_array_equal(e4m3.decode(got), e4m3.decode(windows).max(axis=(2, 4)))


def test_nhwc_fp8_input_rounds_as_e4m3_encode_bit_for_bit(tc_env):
    """to_nhwc's software e4m3 rounding (e4m3.clh, also the epilogue's model) on every code's value, every midpoint
    between neighbours (ties to even), values just off them, subnormals, past 448, infinities, NaN and -0."""
    ctx, queue, cache, _ = tc_env
    v = e4m3.VALUES[np.isfinite(e4m3.VALUES)].astype(np.float64)
    pos = np.unique(np.abs(v))
    mid = (pos[1:] + pos[:-1]) / 2
    mid32 = mid.astype(np.float32)
    x = np.concatenate([v, mid, -mid, np.nextafter(mid32, 0), np.nextafter(mid32, 1e9),
                        [448.5, 464, 480, 1e6, -1e6, np.inf, -np.inf, np.nan, -0.0, 2.0 ** -11, 2.0 ** -10, 1e-30]])
    x = x.astype(np.float32)
    c = 3
    x = np.concatenate([x, np.zeros(-len(x) % c, np.float32)]).reshape(1, c, 1, -1)  # NCHW: 1 image, 3 channels
    prog = cache.build(nhwc.KERNEL_FILE, nhwc.defines(precisions.FP8))
    src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    width = x.shape[3]
    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, width * 16)
    nhwc.NhwcInput(prog, c, 16, scale=1.0).enqueue(queue, src, dst, 1, 1, width)
    got = np.empty((width, 16), np.uint8)
    cl.enqueue_copy(queue, got, dst)
    np.testing.assert_array_equal(got[:, :c], e4m3.encode(x[0, :, 0, :].T))
    assert np.all(got[:, c:] == 0)
