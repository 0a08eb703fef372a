"""tc_gemv (kernels/fc_half_gemv.cl, ops/tensorcore_gemv.py): FP16 fully connected layers as matrix-vector
products in the tensor-core family.

The kernel is plain OpenCL C, so PoCL runs the very code a GPU runs. Each case is compared with float64 sums of the
FP16-rounded inputs and weights on awkward sizes (one input, 7 inputs in a piece of 8, one output, outputs that are
not a multiple of the rows per work-group, more images than a work-group sums); then the whole tiny network with its
FC layers on tc_gemv against float64 and against the same network on tc_gemm.
"""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.ops import precision as precisions, registry
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore_gemv import DEFAULT, TILES, TUNABLES, GemvHalfLayer, local_mem, valid
from vggserve.runtime import devices as devs

from clbuffers import rel_err
from conftest import TEST_DEVICE
from test_tensorcore import tc_env  # noqa: F401 - the fixture (ctx, queue, cache, caps)

MF = cl.mem_flags
FP16 = precisions.FP16




def params_of(wg, rows, nb, ld16=0, tc=0):
    return {"ALGO": "tc_gemv", "WG": wg, "ROWS": rows, "NB": nb, "LD16": ld16, "TC": tc}


def run_gemv(tc_env, rng, params, n, k, m, relu, last):
    """(output as float64 (n, cstore), float64 reference (n, m), the layer) on random FP16 data."""
    ctx, queue, cache, caps = tc_env
    layer = LayerSpec("fc", k, m, 1, relu=relu, last=last)
    weight = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(m)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32)
    op = GemvHalfLayer(ctx, cache, params, FP16, layer, weight, bias, BuildEnv(caps=caps, max_batch=n))
    xin = np.zeros((n, op.cpad), np.float16)
    xin[:, :k] = x
    out = np.full((n, op.cstore), np.nan, np.float32 if last else np.float16)
    src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=xin)
    dst = cl.Buffer(ctx, MF.READ_WRITE | MF.COPY_HOST_PTR, hostbuf=out)
    op.enqueue(queue, src, dst, n)
    cl.enqueue_copy(queue, out, dst)
    queue.finish()
    xq = x.astype(np.float16).astype(np.float64)
    wq = weight.astype(np.float16).astype(np.float64)
    ref = xq @ wq.T + bias.astype(np.float64)
    return out.astype(np.float64), (np.maximum(ref, 0) if relu else ref), op


CASES = [  # (n, K, M, relu, last)
    (1, 1, 1, False, True),
    (3, 7, 33, True, False),
    (8, 100, 1000, False, True),
    (1, 3136, 33, True, False),
    (3, 3136, 1000, False, True),
    (8, 7, 1, True, False),
    (1, 100, 1000, True, False),
    (8, 3136, 33, False, False),
    (3, 1, 1000, True, True),
]
# NB 4 with 8 images: two groups of images; 3 rows: 1000 % 3 != 0; both ways to load a piece; TC 1: the products on
# mma.sync (its exact software model here), one warp and four splitting K, 2 and 8 images a group
CONFIGS = [(256, 4, 8, 0, 0), (64, 1, 4, 0, 0), (128, 3, 8, 1, 0), (32, 8, 2, 0, 1), (128, 8, 8, 0, 1)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "wg{}_rows{}_nb{}_ld16_{}_tc{}".format(*c))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}_k{}_m{}_{}_{}".format(
    c[0], c[1], c[2], "relu" if c[3] else "linear", "last" if c[4] else "inner"))
def test_gemv_matches_float64(tc_env, rng, cfg, case):
    n, k, m, relu, last = case
    got, ref, op = run_gemv(tc_env, rng, params_of(*cfg), n, k, m, relu, last)
    assert op.cstore == (-(-m // 4) * 4 if last else -(-m // 8) * 8)  # as tc_gemm stores it (out_channels)
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[:, m:] == 0), "the padding channels must be zero (the next layer reads them)"
    # FP32 sums of exact FP16 products; the inner layers round once to FP16 (2^-11 relative)
    assert rel_err(got[:, :m], ref) < (1e-5 if last else 2e-3)
    if relu:
        assert np.all(got >= 0)


def test_more_images_than_a_group_sums_give_the_same_rows(tc_env):
    """Images past NB are further work-groups: each image's outputs do not depend on the others' (bit for bit), on
    the CUDA cores and on mma.sync."""
    a, _, _ = run_gemv(tc_env, np.random.default_rng(9), params_of(64, 2, 2), 5, 100, 33, True, False)
    b, _, _ = run_gemv(tc_env, np.random.default_rng(9), params_of(64, 2, 8), 5, 100, 33, True, False)
    np.testing.assert_array_equal(a, b)
    c, _, _ = run_gemv(tc_env, np.random.default_rng(9), params_of(64, 8, 2, tc=1), 5, 100, 33, True, False)
    d, _, op = run_gemv(tc_env, np.random.default_rng(9), params_of(64, 8, 8, tc=1), 5, 100, 33, True, False)
    np.testing.assert_array_equal(c, d)
    assert op.describe() == "tc_gemv 8 rows x 64 work-items, 8 images a group, on mma.sync"


def test_the_entry_is_fp16_fc_only_and_its_candidates_fit(tc_env):
    caps = tc_env[3]
    algo = registry.get("tc_gemv")
    fc = LayerSpec("fc", 4096, 1000)
    assert algo.family == "tensorcore" and algo.kinds == ("fc",) and algo.tunables == TUNABLES
    assert algo.available(caps, FP16) and not any(algo.available(caps, p) for p in
                                                  (precisions.TF32, precisions.FP8, precisions.INT8, precisions.FP32))
    assert algo in registry.for_layer(caps, FP16, fc)
    assert algo not in registry.for_layer(caps, FP16, LayerSpec("conv3x3", 64, 64, 56))
    assert algo not in registry.for_layer(caps, precisions.TF32, fc)
    cands = algo.candidates(caps, FP16, fc)
    assert cands and cands[0] == DEFAULT and all(valid(p) and algo.fits(p, caps, FP16) for p in cands)
    assert len(cands) == sum(local_mem(p) <= caps.local_mem and p["WG"] <= caps.max_work_group
                             for p in (params_of(*t) for t in TILES))
    assert not valid(params_of(96, 1, 8)) and not valid(params_of(64, 0, 8)) and not valid(params_of(64, 1, 8, 2))
    assert valid(params_of(32, 8, 8, tc=1)) and not valid(params_of(16, 8, 1, tc=1))
    assert not valid(params_of(64, 4, 1, tc=1)) and not valid(params_of(64, 8, 9, tc=1))
    assert {p["TC"] for p in cands} == {0, 1}
    assert registry.choose({"ALGO": "tc_gemv"}, "tensorcore", "fc").name == "tc_gemv"
    assert registry.choose({"ALGO": "tc_gemv"}, "tensorcore", "conv3x3").name == "tc_gemm"  # no 3x3 kernel
    assert registry.choose({"ALGO": "tc_gemv"}, "portable", "fc").name == "gemm"


def test_it_refuses_8_bit_scales_and_other_precisions(tc_env):
    ctx, _, cache, caps = tc_env
    algo, env = registry.get("tc_gemv"), BuildEnv(caps=caps, max_batch=1)
    layer, w, b = LayerSpec("fc", 16, 8), np.zeros((8, 16), np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="no 8-bit scales"):
        algo.make(ctx, cache, dict(DEFAULT), FP16, layer, w, b, env, out_scale=0.5)
    with pytest.raises(ValueError, match="FP16 layers, not tf32"):
        algo.make(ctx, cache, dict(DEFAULT), precisions.TF32, layer, w, b, env)


# ---- the whole tiny network with its FC layers on tc_gemv ------------------------------------------------------
def fc_table(spec, entries: dict) -> dict:
    """A tuned FP16 table (at batch 2) putting each FC layer (by name) on entries[name]."""
    from vggserve.runtime.params import shape_key

    return {"conv_by_batch_fp16": {"2": {shape_key(f.fin, f.fout, 1): dict(entries[f.name]) for f in spec.fcs}}}


def test_the_tiny_network_with_gemv_fc_layers_matches_float64_and_tc_gemm(tiny_tensors, monkeypatch):
    """FP16 (3x3 layers on tc_gemm, emulated on PoCL), classifier.0 (the NHWC flatten's permuted columns),
    classifier.3 with one image a group (two groups at batch 2) and classifier.6 (float32 logits) on tc_gemv:
    float64's logits within the FP16 bound and argmax, and the tc_gemm network's top-5."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.model.reference import reference_logits
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    spec = vgg16_spec(infer_width(tiny_tensors))
    table = fc_table(spec, {"classifier.0": DEFAULT, "classifier.3": params_of(64, 2, 1),
                            "classifier.6": params_of(128, 3, 8)})
    x = np.random.default_rng(11).standard_normal((3, 3, 224, 224)).astype(np.float32)
    original, runs = engine_module.params_for, {}
    for label, extra in (("gemv", table), ("gemm", {})):
        monkeypatch.setattr(engine_module, "params_for", lambda kind, name, e=extra: {**original(kind, name), **e})
        with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=2, precision="fp16") as model:
            runs[label] = (model.logits(x), {p["name"]: p["kernel"] for p in model.kernel_plan()})
    monkeypatch.setattr(engine_module, "params_for", original)
    out, plan = runs["gemv"]
    assert all(plan[f.name].startswith("tc_gemv") for f in spec.fcs), plan
    assert "tuned for this shape" in plan["classifier.0"] and "1 image a group" in plan["classifier.3"]
    gemm_out, gemm_plan = runs["gemm"]
    assert all(gemm_plan[f.name].startswith("tc_gemm") for f in spec.fcs), gemm_plan
    ref = reference_logits(tiny_tensors, x)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    assert rel_err(out, ref) < 1e-2
    np.testing.assert_array_equal(out.argmax(1), ref.argmax(1))
    top5 = lambda a: np.argsort(-a, axis=1)[:, :5]  # noqa: E731
    np.testing.assert_array_equal(top5(out), top5(gemm_out))


def test_the_tuner_times_it_against_tc_gemm_on_fc_shapes(monkeypatch):
    """`vggserve tune --precision fp16` on an FC shape: tc_gemv's candidates are timed beside tc_gemm's, each checked
    against the tc_gemm reference; the winner is one of the trials, and the engine would read it (a known entry)."""
    from vggserve import tuning

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    info = devs.resolve(TEST_DEVICE)
    device = devs.cl_device(info)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] == "512x1000x1"]  # classifier.6's
    assert len(shapes) == 1 and shapes[0][4] == 1
    winners, trials = tuning.tune(info, device, batch=3, limit=3, repeats=1, shapes=shapes, progress=lambda _: None,
                                  precision="fp16")
    for key, *_ in shapes:
        algos = {t.params["ALGO"] for t in trials if t.shape == key}
        assert {"tc_gemm", "tc_gemv"} <= algos, algos  # (and tc_wgmma where the device has it, or emulated)
        assert sum(t.params["ALGO"] == "tc_gemv" for t in trials if t.shape == key) == 3
        assert all(t.ok for t in trials if t.shape == key)
        assert winners[key] == min((t for t in trials if t.shape == key), key=lambda t: t.ms).params
        assert registry.get(winners[key]["ALGO"]).name == winners[key]["ALGO"]


def test_an_int8_model_runs_classifier_6_on_it_and_keeps_the_8_bit_layers_on_tc_gemm(monkeypatch):
    """At INT8 only classifier.6 is an FP16 FC layer (FP16 in, logits out): an FP16 table naming tc_gemv puts it
    there, and its logits are the plain INT8 model's up to FP32 summation order; an INT8 table naming tc_gemv for
    classifier.3 (u8 in) is not taken (the entry is FP16 only), nor the FP16 table for the INT8 layers."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.model.reference import reference_logits
    from vggserve.quant.calibrate import from_histograms, observe
    from vggserve.weights.init import init_weights
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    tensors = init_weights(seed=3, width=0.0625)
    hists, images = observe(tensors, [np.random.default_rng(11).standard_normal((2, 3, 224, 224)).astype(np.float32)])
    cal = from_histograms(hists, images, "0" * 64, "max")
    spec = vgg16_spec(infer_width(tensors))
    every = {f.name: DEFAULT for f in spec.fcs}
    table = {**fc_table(spec, every), "conv_by_batch_int8": fc_table(spec, every)["conv_by_batch_fp16"]}
    x = np.random.default_rng(5).standard_normal((3, 3, 224, 224)).astype(np.float32)
    original, runs = engine_module.params_for, {}
    for label, extra in (("gemv", table), ("plain", {})):
        monkeypatch.setattr(engine_module, "params_for", lambda kind, name, e=extra: {**original(kind, name), **e})
        with VGG16(tensors, device=TEST_DEVICE, max_batch_size=2, precision="int8", calibration=cal) as model:
            runs[label] = (model.logits(x), {p["name"]: p["kernel"] for p in model.kernel_plan()})
    monkeypatch.setattr(engine_module, "params_for", original)
    (out, plan), (plain, plain_plan) = runs["gemv"], runs["plain"]
    assert plan["classifier.6"].startswith("tc_gemv") and plain_plan["classifier.6"].startswith("tc_gemm"), plan
    assert plan["classifier.0"].startswith("tc_gemm") and "u8 in" in plan["classifier.0"], plan
    assert plan["classifier.3"].startswith("tc_gemm") and "which this device does not run" in plan["classifier.3"]
    assert not np.isnan(out).any() and rel_err(out, plain) < 1e-4
    ref = reference_logits(tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 0.1


@pytest.mark.parametrize("max_batch, expected", [(2, "tc_gemv"), (4, "tc_gemv"), (8, "tc_gemm")])
def test_a_table_naming_it_is_followed_only_by_models_of_a_few_images(tiny_tensors, monkeypatch, max_batch, expected):
    """A batch-1 table serves models up to batch 8 (the nearest table); past MAX_BATCH images tc_gemv loses to
    tc_gemm, so those models run the family default instead, and say why."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.ops.tensorcore_gemv import MAX_BATCH
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    spec = vgg16_spec(infer_width(tiny_tensors))
    table = fc_table(spec, {f.name: DEFAULT for f in spec.fcs})
    original = engine_module.params_for
    monkeypatch.setattr(engine_module, "params_for", lambda kind, name: {**original(kind, name), **table})
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=max_batch, precision="fp16") as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
    assert all(plan[f.name].startswith(expected) for f in spec.fcs), plan
    if max_batch > MAX_BATCH:
        assert f"the tuned entry is tc_gemv, which does not pay at batch {max_batch}" in plan["classifier.0"]
