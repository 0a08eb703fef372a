"""tc_gemv8 (kernels/fc_eightbit_gemv.cl, ops/eightbit_gemv.py): FP8 and INT8 fully connected layers as
matrix-vector products in the tensor-core family.

On PoCL the kernel runs its two PTX instructions' exact software forms (MMA_EMULATE: dp4a's byte products, the e4m3
decode), so the arithmetic is the GPU's. Each case is compared with the numpy models of test_int8_kernels.py (exact
integer sums, then the epilogue) and test_fp8_kernels.py (float64 sums, FP32 accumulation's bound) on awkward sizes:
one input and one output, K and M off the pieces and the rows, more images than a work-group sums; INT8 also against
tc_gemm bit for bit, sums past 2^24 included; each both ways (TC 0: dp4a or the e4m3 decode and fma on the CUDA
cores; TC 1: mma.sync); then the tiny network with its 8-bit FC layers on tc_gemv8.
"""

import numpy as np
import pytest

import test_fp8_kernels as fp8_tests
import test_int8_kernels as int8_tests
from vggserve.ops import precision as precisions, registry
from vggserve.ops.eightbit_gemv import DEFAULT, MAX_BATCH, TILES, TUNABLES, GemvEightBitLayer, local_mem, valid
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import TensorCoreLayer

from clbuffers import rel_err
from conftest import TEST_DEVICE
from test_tensorcore import tc_env  # noqa: F401 - the fixture (ctx, queue, cache, caps)

FP8, INT8, FP16 = precisions.FP8, precisions.INT8, precisions.FP16

SHAPES = [  # (n, cin, cout, 1, 1, ks = 1)
    (3, 1, 2, 1, 1, 1),        # one input (cpad 16: one piece, 15 codes of padding), two outputs
    (3, 24, 33, 1, 1, 1),      # two pieces; 33 outputs
    (2, 200, 37, 1, 1, 1),     # K = 208
    (5, 300, 1000, 1, 1, 1),   # 5 images: past NB 4 and 2, a second group of images; 1000 % 3 != 0
    (1, 3136, 33, 1, 1, 1),    # pieces past one pass of the work-group at WG 64 and 128
]
# (WG, ROWS, NB, TC): 3 rows (1000 % 3 != 0), NB 2 and 4 below 5 images; TC 1: the products on mma.sync (its exact
# software model here), one warp and four splitting K, 2 and 8 images a group
CONFIGS = [(256, 4, 4, 0), (64, 1, 1, 0), (128, 3, 2, 0), (32, 8, 2, 1), (128, 8, 8, 1)]
SHAPE_ID = "n{}_k{}_m{}".format
CONFIG_ID = "wg{}_rows{}_nb{}_tc{}".format


def params_of(wg, rows, nb, tc=0):
    return {"ALGO": "tc_gemv8", "WG": wg, "ROWS": rows, "NB": nb, "TC": tc}


def int8_make(cfg):
    return lambda *args, **kw: GemvEightBitLayer(*args, params=params_of(*cfg), **kw)


def fp8_make(cfg):
    return lambda ctx, cache, prec, layer, w, b, env, s_in, s_out: GemvEightBitLayer(
        ctx, cache, params_of(*cfg), prec, layer, w, b, env, in_scale=s_in, out_scale=s_out)


def gemm_int8(*args, **kw):
    return TensorCoreLayer(*args, params=registry.get("tc_gemm").default(None, INT8), **kw)


# ---- INT8 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: CONFIG_ID(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: SHAPE_ID(*s[:3]))
def test_int8_writes_numpys_u8_codes(tc_env, rng, cfg, shape):
    got, value, window, op, _ = int8_tests.run(tc_env, int8_make(cfg), shape, rng)
    int8_tests.check_codes(got, value, window, op)


@pytest.mark.parametrize("cfg", [(128, 3, 2, 0), (64, 8, 4, 1)], ids=lambda c: CONFIG_ID(*c))
@pytest.mark.parametrize("out", ["int8", "fp16", "f32"])
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: SHAPE_ID(*s[:3]))
def test_int8_equals_tc_gemm_bit_for_bit(tc_env, shape, out, cfg):
    """Both sum the same integers exactly and share the epilogue's arithmetic: the same bytes out, codes, FP16 (an
    8-bit layer before classifier.6) or the logits (ReLU off); on the CUDA cores (dp4a) and on mma.sync."""
    relu = out != "f32"
    got, value, window, op, _ = int8_tests.run(tc_env, int8_make(cfg), shape, np.random.default_rng(7),
                                               out=out, relu=relu)
    want, *_ = int8_tests.run(tc_env, gemm_int8, shape, np.random.default_rng(7), out=out, relu=relu)
    np.testing.assert_array_equal(got, want)
    if out == "int8":
        int8_tests.check_codes(got, value, window, op)
    else:
        int8_tests.check_values(got, value, window, op, out)


def test_int8_sums_past_2_24_are_exact(tc_env):
    """Codes near the top of u8 and weights near +127 over 3,136 inputs: sums near 10^8, where an FP32 sum would
    round; the outputs are tc_gemm's bit for bit and numpy's exact sums'."""
    shape = (2, 3136, 40, 1, 1, 1)
    want, *_ = int8_tests.run(tc_env, gemm_int8, shape, np.random.default_rng(3), out="f32", big=True)
    for cfg in ((256, 4, 4, 0), (64, 8, 2, 1)):
        got, value, window, op, top = int8_tests.run(tc_env, int8_make(cfg), shape, np.random.default_rng(3),
                                                     out="f32", big=True)
        assert top > 2 ** 24
        np.testing.assert_array_equal(got, want)
        int8_tests.check_values(got, value, window, op, "f32")


# ---- FP8 -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: CONFIG_ID(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: SHAPE_ID(*s[:3]))
def test_fp8_writes_numpys_e4m3_codes(tc_env, rng, cfg, shape):
    got, y, bound, s_out, op = fp8_tests.run(tc_env, fp8_make(cfg), shape, rng)
    fp8_tests.check(got, y, bound, s_out, op)


@pytest.mark.parametrize("cfg", [(256, 4, 4, 0), (64, 8, 4, 1)], ids=lambda c: CONFIG_ID(*c))
@pytest.mark.parametrize("out", ["fp16", "f32"])
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: SHAPE_ID(*s[:3]))
def test_fp8_writes_fp16_and_the_logits_within_fp32s_bound(tc_env, rng, shape, out, cfg):
    relu = out != "f32"
    got, y, bound, s_out, op = fp8_tests.run(tc_env, fp8_make(cfg), shape, rng, out=out, relu=relu)
    fp8_tests.check(got, y, bound, s_out, op, out=out, relu=relu)


@pytest.mark.parametrize("cfg", [(64, 1, 1, 0), (64, 8, 4, 1)], ids=lambda c: CONFIG_ID(*c))
def test_fp8_integer_operands_give_exact_sums(tc_env, rng, cfg):
    """Integer e4m3 operands (activations up to 16, weight codes up to 448): every partial sum is exact in FP32
    whatever the order, so the logits are numpy's float64 value rounded once (to float32)."""
    got, y, bound, _, op = fp8_tests.run(tc_env, fp8_make(cfg), (3, 200, 37, 1, 1, 1), rng, out="f32",
                                         exact=True, relu=False)
    np.testing.assert_array_equal(got[..., :37].reshape(3, 37), y.reshape(3, 37).astype(np.float32))


# ---- the entry ---------------------------------------------------------------------------------------------------
def test_the_entry_is_8_bit_fc_only_where_tc_gemm_runs_the_precision(tc_env):
    from dataclasses import replace

    caps = tc_env[3]
    algo = registry.get("tc_gemv8")
    fc, conv = LayerSpec("fc", 4096, 1000), LayerSpec("conv3x3", 64, 64, 56)
    assert algo.family == "tensorcore" and algo.kinds == ("fc",) and algo.tunables == TUNABLES
    assert algo.available(caps, FP8) and algo.available(caps, INT8)
    assert not any(algo.available(caps, p) for p in (FP16, precisions.TF32, precisions.FP32))
    ampere = replace(caps, fp8=False)  # s8 but no e4m3 tensor cores (nor the e4m3x2 conversion)
    assert algo.available(ampere, INT8) and not algo.available(ampere, FP8)
    assert not algo.available(replace(caps, tensor_cores=False), INT8)
    for prec in (FP8, INT8):
        assert algo in registry.for_layer(caps, prec, fc) and algo not in registry.for_layer(caps, prec, conv)
        cands = algo.candidates(caps, prec, fc)
        assert cands and cands[0] == DEFAULT and all(valid(p) and algo.fits(p, caps, prec) for p in cands)
        assert len(cands) == sum(local_mem(p) <= caps.local_mem and p["WG"] <= caps.max_work_group
                                 for p in (params_of(*t) for t in TILES))
    assert not valid(params_of(96, 1, 1)) and not valid(params_of(64, 0, 1)) and not valid(params_of(64, 1, 0))
    # on mma.sync: one n8 tile of outputs, at most 8 images (A's rows g), whole warps
    assert valid(params_of(32, 8, 8, 1)) and not valid(params_of(16, 8, 1, 1))
    assert not valid(params_of(64, 4, 1, 1)) and not valid(params_of(64, 8, 9, 1)) and not valid(params_of(64, 8, 1, 2))
    assert {p["TC"] for p in algo.candidates(caps, INT8, fc)} == {0, 1}
    assert registry.choose({"ALGO": "tc_gemv8"}, "tensorcore", "fc") is algo
    assert registry.choose({"ALGO": "tc_gemv8"}, "tensorcore", "conv3x3").name == "tc_gemm"
    assert algo.suits(MAX_BATCH) and not algo.suits(MAX_BATCH + 1)


def test_it_refuses_other_precisions_pooling_and_a_missing_input_scale(tc_env):
    ctx, _, cache, caps = tc_env
    algo, env = registry.get("tc_gemv8"), BuildEnv(caps=caps, max_batch=1)
    layer, w, b = LayerSpec("fc", 16, 8), np.zeros((8, 16), np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="FP8 and INT8 layers, not fp16"):
        algo.make(ctx, cache, dict(DEFAULT), FP16, layer, w, b, env)
    with pytest.raises(ValueError, match="needs in_scale"):
        algo.make(ctx, cache, dict(DEFAULT), INT8, layer, w, b, env)
    with pytest.raises(ValueError, match="no pooling"):
        algo.make(ctx, cache, dict(DEFAULT), INT8, LayerSpec("fc", 16, 8, pool=True), w, b, env, in_scale=0.1)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        algo.make(ctx, cache, dict(DEFAULT), FP8, layer, w, b, env, cpad=24, in_scale=0.1)
    op = algo.make(ctx, cache, params_of(128, 2, 1), INT8, layer, w, b, env, in_scale=0.1, out_scale=0.2)
    assert op.describe() == "tc_gemv8 2 rows x 128 work-items, 1 image a group, u8 in, u8 out"
    with pytest.raises(ValueError, match="with TC 1, WG at least 32, ROWS 8 and NB at most 8"):
        algo.make(ctx, cache, params_of(128, 4, 1, 1), INT8, layer, w, b, env, in_scale=0.1)
    op = algo.make(ctx, cache, params_of(64, 8, 2, 1), FP8, layer, w, b, env, in_scale=0.1)
    assert op.describe() == "tc_gemv8 8 rows x 64 work-items, 2 images a group, on mma.sync, e4m3 in, fp16 out"


# ---- the tiny network with its 8-bit FC layers on tc_gemv8 ---------------------------------------------------------
def eight_bit_fc_table(spec, prec: str, fcs: dict) -> dict:
    """A tuned table of `prec` (at batch 2) putting the FC layers named in fcs on their parameters."""
    from vggserve.runtime.params import shape_key

    by_name = {f.name: f for f in spec.fcs}
    return {f"conv_by_batch_{prec}": {"2": {shape_key(by_name[n].fin, by_name[n].fout, 1): dict(p)
                                            for n, p in fcs.items()}}}


@pytest.mark.parametrize("prec", ["int8", "fp8"])
def test_the_tiny_networks_8_bit_fc_layers_on_it_give_tc_gemms_logits(monkeypatch, prec):
    """classifier.0 (u8 or e4m3 in, codes out; the NHWC flatten's permuted columns; on mma.sync) and classifier.3
    (codes in, FP16 out for classifier.6; on the CUDA cores) on tc_gemv8 from an 8-bit table: INT8's logits are the
    tc_gemm network's bit for bit; FP8's within FP32 summation order (the tensor cores sum in another order), with
    the same top-5."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.quant.calibrate import from_histograms, observe
    from vggserve.weights.init import init_weights
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    tensors = init_weights(seed=3, width=0.0625)
    hists, images = observe(tensors, [np.random.default_rng(11).standard_normal((2, 3, 224, 224)).astype(np.float32)])
    cal = from_histograms(hists, images, "0" * 64, "max")
    spec = vgg16_spec(infer_width(tensors))
    table = eight_bit_fc_table(spec, prec, {"classifier.0": params_of(64, 8, 2, 1),
                                            "classifier.3": params_of(64, 2, 1)})
    x = np.random.default_rng(5).standard_normal((3, 3, 224, 224)).astype(np.float32)
    original, runs = engine_module.params_for, {}
    for label, extra in (("gemv8", table), ("gemm", {})):
        monkeypatch.setattr(engine_module, "params_for", lambda kind, name, e=extra: {**original(kind, name), **e})
        with VGG16(tensors, device=TEST_DEVICE, max_batch_size=2, precision=prec, calibration=cal) as model:
            runs[label] = (model.logits(x), {p["name"]: p["kernel"] for p in model.kernel_plan()})
    monkeypatch.setattr(engine_module, "params_for", original)
    (out, plan), (plain, plain_plan) = runs["gemv8"], runs["gemm"]
    codes = "u8" if prec == "int8" else "e4m3"
    assert plan["classifier.0"].startswith("tc_gemv8 8 rows") and "on mma.sync" in plan["classifier.0"], plan
    assert f"{codes} in, {codes} out" in plan["classifier.0"], plan
    assert plan["classifier.3"].startswith("tc_gemv8 2 rows") and f"{codes} in, fp16 out" in plan["classifier.3"]
    assert plan["classifier.6"].startswith("tc_gemm") and all(plain_plan[f.name].startswith("tc_gemm")
                                                              for f in spec.fcs)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    if prec == "int8":
        np.testing.assert_array_equal(out, plain)
    else:
        assert rel_err(out, plain) < 1e-2
        top5 = lambda a: np.argsort(-a, axis=1)[:, :5]  # noqa: E731
        np.testing.assert_array_equal(top5(out), top5(plain))


@pytest.mark.parametrize("max_batch, expected", [(4, "tc_gemv8"), (8, "tc_gemm")])
def test_a_table_naming_it_is_followed_only_by_models_of_a_few_images(monkeypatch, max_batch, expected):
    """Past MAX_BATCH images every image reads the weights again: those models run tc_gemm, and say why."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.quant.calibrate import from_histograms, observe
    from vggserve.weights.init import init_weights
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    tensors = init_weights(seed=3, width=0.0625)
    hists, images = observe(tensors, [np.random.default_rng(11).standard_normal((1, 3, 224, 224)).astype(np.float32)])
    cal = from_histograms(hists, images, "0" * 64, "max")
    spec = vgg16_spec(infer_width(tensors))
    table = eight_bit_fc_table(spec, "int8", {"classifier.0": DEFAULT})
    original = engine_module.params_for
    monkeypatch.setattr(engine_module, "params_for", lambda kind, name: {**original(kind, name), **table})
    with VGG16(tensors, device=TEST_DEVICE, max_batch_size=max_batch, precision="int8", calibration=cal) as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
    assert plan["classifier.0"].startswith(expected), plan
    if max_batch > MAX_BATCH:
        assert f"the tuned entry is tc_gemv8, which does not pay at batch {max_batch}" in plan["classifier.0"]


def test_fc_gemv_benchmark_stores_each_layers_winner_in_the_tuned_table(tc_env, monkeypatch, tmp_path,  # noqa: F811
                                                                         capsys):
    """benchmarks/fc_gemv.py --store: each FC layer's fastest candidate that agrees with tc_gemm goes into the tuned
    table at the batch and precision measured, where it beats tc_gemm (as `vggserve tune` would store it), and
    nothing is stored without --store."""
    import json
    from pathlib import Path

    from vggserve import tuning

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fc_gemv

    argv = ["--device", TEST_DEVICE, "--width", "0.125", "--repeats", "1", "--batches", "1", "--precision", "int8"]
    assert fc_gemv.main(argv) == 0 and not (tmp_path / "tuned.json").exists()
    assert fc_gemv.main(argv + ["--store"]) == 0
    out = capsys.readouterr().out
    table = next(iter(json.loads((tmp_path / "tuned.json").read_text()).values()))["conv_by_batch_int8"]["1"]
    fcs = [s[0] for s in tuning.layer_shapes(1, 0.125) if s[4] == 1]
    assert "batch 1: stored " in out and set(table) <= set(fcs) and table, (out, table)
    algo = registry.get("tc_gemv8")
    for key, params in table.items():  # each one of the entry's candidates for its layer
        assert params["ALGO"] == "tc_gemv8" and valid(params)
        _, cin, cout, _, _ = next(s for s in tuning.layer_shapes(1, 0.125) if s[0] == key)
        assert params in algo.candidates(tc_env[3], precisions.INT8, LayerSpec("fc", cin, cout, 1))
