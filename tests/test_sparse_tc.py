"""2:4 structured sparsity on sparse tensor cores: the compression and metadata packing (ops/sparse24.py), the kernel
(kernels/conv_tc_sparse.cl, mma.sp m16n8k32) against numpy, the engine's choice of it on `weights prune --pattern
2:4` weights and their logits against float64, and the one-instruction probe (benchmarks/mma_sp_probe.py).

Here and in CI the kernel runs on PoCL through mma.clh's software model of mma.sp (VGGSERVE_EMULATE_MMA=1); with
VGGSERVE_TEST_DEVICE=gpu on an NVIDIA GPU it runs the real instruction, and the probe then checks the documented
fragment and metadata layouts on the hardware itself.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from vggserve.model.reference import conv3x3_relu, reference_logits
from vggserve.ops import precision as precisions, registry, sparse24, sparse_select as sel
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import tc_weights
from vggserve.ops.tensorcore_sparse import (DEFAULT, NAME, SparseTensorCoreLayer, compressed_weights, local_mem,
                                            valid)
from vggserve.weights.prune import is_2_4, prune, prune_2_4, prune_unstructured

from conftest import TEST_DEVICE
from test_tensorcore import enqueue_on, nhwc_input, small_tensors, tc_env  # noqa: F401 - fixtures

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import mma_sp_probe  # noqa: E402

FP16 = precisions.FP16
BOUND_FP16 = 1e-2  # test_tensorcore.py's FP16 bound on logits
CONFIGS = [  # (BM channels, BN pixels, WARPS_M, WARPS_N, STAGES, KB): 2-4 warps, 2-4 stages, both row widths
    (32, 32, 1, 2, 2, 64),
    (64, 32, 2, 1, 3, 128),
    (32, 64, 2, 2, 4, 64),
]
SHAPES = [  # (n, cin, cout, h, w): channels and pixels off the tiles, conv1's 3 channels, odd batches
    (1, 3, 8, 5, 7),
    (2, 13, 21, 6, 5),
    (1, 40, 70, 9, 4),
    (3, 8, 5, 3, 3),
]


def params_of(cfg):
    return dict(zip(("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB"), cfg), ALGO=NAME)


def f64(a):
    """What the device holds of a float array, as float64: FP16-rounded."""
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def run_layer(tc_env, cfg, shape, weight, rng, layer_cls=SparseTensorCoreLayer):
    """(NHWC output as float64, float64 NCHW reference on the FP16-rounded inputs, the layer) of conv_tc_sparse.cl
    with params_of(cfg), or of layer_cls (another 2:4 layer) with the parameters cfg."""
    ctx, _, cache, caps = tc_env
    n, cin, cout, h, w = shape
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    params = params_of(cfg) if layer_cls is SparseTensorCoreLayer else cfg
    op = layer_cls(ctx, cache, params, FP16, LayerSpec("conv3x3", cin, cout, h), weight, bias,
                   BuildEnv(caps=caps, max_batch=n))
    out = enqueue_on(tc_env, op, nhwc_input(x, op.cpad, FP16), np.full((n * h * w, op.cstore), np.nan, np.float16),
                     n, h, w)
    got = out.astype(np.float64).reshape(n, h, w, op.cstore)
    return got, conv3x3_relu(f64(x), f64(weight), bias.astype(np.float64)), op


def check(got, ref, cout):
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    scale = max(np.abs(ref).max(), 1e-30)
    # one rounding of the output to FP16 (2^-11 relative), FP32 accumulation
    assert np.abs(got[..., :cout].transpose(0, 3, 1, 2) - ref).max() / scale < 2e-3


def weights_2_4(rng, cout, cin):
    return prune_2_4((rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32))


# ---- compression and metadata -----------------------------------------------------------------------------------
def test_compression_round_trip_and_metadata_layout(rng):
    dense = prune_2_4(rng.standard_normal((32, 96)).astype(np.float32)).astype(np.float16)
    dense[5] = 0  # an all-zero row
    dense[7, 8:12] = [0, 0, 0, 3]  # one non-zero in a chunk
    values, meta = sparse24.compress(dense)
    assert values.shape == (32, 48) and values.dtype == np.float16
    assert meta.shape == (2, 3, 16) and meta.dtype == np.uint32
    assert np.array_equal(sparse24.decompress(values, meta), dense)
    # word (mt, ks, 2g + h): row 16 mt + g in bits 0-15, row 16 mt + g + 8 in bits 16-31, k 32 ks + 16 h .. + 15
    pos = sparse24.positions(dense)  # (M, K/4, 2)
    for mt, ks, g, h in [(0, 0, 0, 0), (1, 2, 7, 1), (0, 1, 5, 0), (0, 0, 7, 1)]:
        word = int(meta[mt, ks, 2 * g + h])
        for half, row in enumerate((16 * mt + g, 16 * mt + g + 8)):
            for i in range(4):
                chunk = 8 * ks + 4 * h + i
                nibble = (word >> (16 * half + 4 * i)) & 0xF
                assert nibble == pos[row, chunk, 0] | (pos[row, chunk, 1] << 2)
    # kept positions: distinct and increasing (mma.sp::ordered_metadata); zeros fill from the lowest free one
    assert (pos[..., 0] < pos[..., 1]).all()
    assert pos[5, 0].tolist() == [0, 1] and pos[7, 2].tolist() == [0, 3]
    assert int(meta[0, 0, 2 * 5]) & 0xFFFF == 0x4444  # row 5, k 0-15: every chunk (0, 1)


def test_compression_refuses_weights_that_are_not_2_4(rng):
    dense = np.zeros((16, 32), np.float16)
    dense[3, 4:7] = 1
    with pytest.raises(ValueError, match="row 3, k 4..7"):
        sparse24.compress(dense)
    with pytest.raises(ValueError, match="multiple"):
        sparse24.compress(np.zeros((16, 40), np.float16))
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)  # dense: not 2:4
    with pytest.raises(ValueError, match="not 2:4"):
        compressed_weights(w, 16, 32, 160)


def test_weights_are_compressed_in_the_tensor_core_k_order(rng):
    w = weights_2_4(rng, 6, 13)
    values, meta = compressed_weights(w, cpad=16, npad=16, kpad=160)
    assert np.array_equal(sparse24.decompress(values, meta), tc_weights(w, 16, 16, 160, FP16))
    assert values.nbytes == tc_weights(w, 16, 16, 160, FP16).nbytes // 2  # half the weight bytes of dense


# ---- the kernel ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "{}x{}_w{}x{}_s{}_k{}".format(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sparse_tensor_core_layer_matches_numpy(tc_env, rng, cfg, shape):
    got, ref, op = run_layer(tc_env, cfg, shape, weights_2_4(rng, shape[2], shape[1]), rng)
    check(got, ref, shape[2])


def check_sparser_than_2_4(run, rng, shape, sparsity, zero_filters):
    """Groups with fewer than 2 non-zeros (zeros fill the kept slots), the filters zero_filters all zero, at sparsity
    1.0 a whole layer zero; run(shape, weight) is run_layer on one 2:4 kernel and tile."""
    cout, cin = shape[2], shape[1]
    w = prune_unstructured(weights_2_4(rng, cout, cin), sparsity)
    w[zero_filters] = 0
    assert is_2_4(w)
    got, ref, _ = run(shape, w)
    check(got, ref, cout)
    for f in zero_filters:  # bias + ReLU only
        assert np.allclose(got[..., f], ref[:, f], atol=1e-3)
    if sparsity == 1.0:
        assert np.allclose(got[..., :cout].transpose(0, 3, 1, 2), ref, atol=1e-3)


@pytest.mark.parametrize("sparsity", [0.9, 0.99, 1.0])
def test_sparser_than_2_4_and_all_zero_filters(tc_env, rng, sparsity):
    check_sparser_than_2_4(lambda shape, w: run_layer(tc_env, CONFIGS[0], shape, w, rng), rng, (2, 24, 19, 5, 6),
                           sparsity, [3, 11, 12, 13])


def test_every_candidate_is_a_valid_shape_that_fits(tc_env):
    caps = tc_env[3]
    algo = registry.get(NAME)
    assert algo.sparse and algo.family == "tensorcore" and algo.kinds == ("conv3x3",)
    cands = algo.candidates(caps, FP16, LayerSpec("conv3x3", 64, 64, 56))
    assert cands and all(valid(p) and algo.fits(p, caps, FP16) for p in cands)
    assert valid(DEFAULT) and local_mem(DEFAULT) <= 48 * 1024
    assert not valid({**DEFAULT, "KB": 32}) and not valid({**DEFAULT, "WARPS_M": 3})
    assert NAME in [a.name for a in registry.for_layer(caps, FP16, LayerSpec("conv3x3", 64, 64, 56), sparse=True)]
    assert NAME not in [a.name for a in registry.for_layer(caps, precisions.TF32, LayerSpec("conv3x3", 64, 64, 56),
                                                             sparse=True)]


# ---- the choice and the whole network ---------------------------------------------------------------------------
def test_the_choice_takes_2_4_only_for_2_4_convolutions_at_fp16(tc_env, rng):
    caps = tc_env[3]
    conv = LayerSpec("conv3x3", 64, 64, 56)
    w24 = weights_2_4(rng, 64, 64)
    untuned = sel.TC_HALO_SPARSE24 if caps.kind == "cpu" else sel.TC_SPARSE24  # GPUs: halo never until measured
    assert sel.for_layer({}, caps, FP16, conv, w24, 64).algo == untuned
    unstructured = sel.for_layer({}, caps, FP16, conv, prune_unstructured(rng.random((64, 64, 3, 3)), 0.6), 64)
    assert unstructured.algo == sel.DENSE and "not 2:4" in unstructured.reason
    assert sel.for_layer({}, caps, FP16, conv, rng.random((64, 64, 3, 3)), 64).algo == sel.DENSE  # unpruned
    conv1 = LayerSpec("conv3x3", 3, 64, 224)  # 2 of 3 channels kept per tap: 0.33 sparse, below the crossover
    assert sel.for_layer({}, caps, FP16, conv1, weights_2_4(rng, 64, 3), 64).algo == sel.DENSE
    assert sel.for_layer({}, caps, precisions.TF32, conv, w24, 64).algo == sel.DENSE  # mma.sp here is FP16 only
    slower = {"sparse": {"curves": {"64": {conv.shape_key: {sel.TC_SPARSE24: [[0.5, 0.8]],
                                                            sel.TC_HALO_SPARSE24: [[0.5, 0.7]]}}}}}
    choice = sel.for_layer(slower, caps, FP16, conv, w24, 64)
    assert choice.algo == sel.DENSE and "0.80x tuned" in choice.reason
    faster = {"sparse": {"curves": {"64": {conv.shape_key: {sel.TC_SPARSE24: [[0.5, 1.7]],
                                                            sel.TC_HALO_SPARSE24: [[0.5, 1.2]]}}}}}
    assert sel.for_layer(faster, caps, FP16, conv, w24, 64).algo == sel.TC_SPARSE24


@pytest.mark.parametrize("kernel", [NAME, sel.TC_HALO_SPARSE24])
def test_pruned_2_4_network_at_fp16_matches_float64(small_tensors, monkeypatch, kernel):
    """weights prune --pattern 2:4, then the FP16 engine: every conv but conv1 on one 2:4 kernel (the other's default
    crossover set out of reach), logits within the FP16 bound of the float64 reference on the same pruned weights."""
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    for kind in ("cpu", "gpu"):
        for algo in sel.TC24_ALGOS:
            monkeypatch.setitem(sel.DEFAULTS[kind]["crossover"], algo, 0.45 if algo == kernel else 1.01)
    pruned = prune(small_tensors, None, pattern="2:4", layers="conv").tensors
    x = np.random.default_rng(5).standard_normal((3, 3, 224, 224)).astype(np.float32)
    with VGG16.load(pruned, device=TEST_DEVICE, max_batch_size=2, precision="fp16") as model:
        assert model.family == "tensorcore"
        out = model.logits(x)  # two chunks: 2 + 1 images
        plan = {k["name"]: k["kernel"] for k in model.kernel_plan() if not k["name"].startswith("pool")}
    ref = reference_logits(pruned, x)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    assert np.abs(out - ref).max() / np.abs(ref).max() < BOUND_FP16
    np.testing.assert_array_equal(out.argmax(1), ref.argmax(1))
    convs = [name for name in plan if name.startswith("features")]
    assert len(convs) == 13
    assert plan[convs[0]].startswith("conv_first")  # conv1: 3 channels, dense, from the float32 input
    assert all(plan[name].startswith(kernel) and "sparsity 0.500" in plan[name] for name in convs[1:])
    assert all("sparse24" not in how for name, how in plan.items() if name.startswith("classifier"))


# ---- the probe --------------------------------------------------------------------------------------------------
def test_probe_one_mma_sp_matches_numpy_and_tells_conventions_apart(monkeypatch):
    """Emulated (CI): the model and the packing agree, and every alternative convention gives wrong sums. On an
    NVIDIA GPU: the hardware agrees with the documented convention."""
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    out = mma_sp_probe.probe(TEST_DEVICE, one_at_a_time=True, progress=lambda *a: None)
    assert out["documented_ok"], out["matching"]
    results = [r for r in out["results"] if r["op"] == "mma.sp"]
    assert len(results) == 6
    for r in results:
        changed = [k for k, v in mma_sp_probe.DOCUMENTED.items() if r[k] != v]
        if not out["native"]:  # the model: selector 1 (threads 2, 3 hold the metadata) is right too
            assert r["match"] == (changed in ([], ["selector"])), r
        elif not changed:
            assert r["match"]


def test_probe_script_runs_under_emulation(tmp_path, monkeypatch):
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    code = mma_sp_probe.main(["--device", TEST_DEVICE, "--one-at-a-time", "--json", str(tmp_path / "p.json")])
    assert code == 0 and (tmp_path / "p.json").exists()


def test_benchmark_runs_one_shape_under_emulation(tmp_path, monkeypatch, capsys):
    """benchmarks/sparse_tc.py end to end on one small shape and one tile (the GPU run times them all)."""
    import json

    import sparse_tc

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    tile = {"BM": 32, "BN": 32, "WARPS_M": 1, "WARPS_N": 2, "STAGES": 2, "KB": 64}
    code = sparse_tc.main(["--device", TEST_DEVICE, "--batch", "1", "--width", "0.0625", "--shapes", "16x32x28",
                           "--candidates", json.dumps([tile]), "--iterations", "1", "--network-batches", "",
                           "--json", str(tmp_path / "s.json"), "--store"])
    assert code == 0
    out = json.loads((tmp_path / "s.json").read_text())
    point = out["layers"][0]["points"][0]
    assert point["err"] < 2e-3 and point["ms"] > 0 and out["best_params"] == {NAME: tile}
    stored = json.loads((tmp_path / "tuned.json").read_text())
    entry = next(iter(stored.values()))["sparse"]
    assert entry["params"][NAME] == tile and NAME in entry["curves"]["1"]["16x32x28"]
    assert "16x32x28" in capsys.readouterr().out


def test_network_timer_reports_streamed_and_per_layer_times(small_tensors):
    """The network comparison's timer with detail: logits() and streamed images/s, per-layer device times and the
    kernel plans of both models, and the per-layer table sparse_tc.py prints (here on two small dense FP32 models:
    the FP16 ones run emulated, too slow for this)."""
    import sparse_tc
    from sparse_vs_dense import alternating

    from vggserve import VGG16

    load = lambda: VGG16.load(small_tensors, device=TEST_DEVICE, max_batch_size=1, profile=True)  # noqa: E731
    row = alternating({"dense": load, "2:4": load}, 1, 1, "2:4", detail=True)
    for label in ("dense", "2:4"):
        assert row[f"{label}_images_per_s"] > 0 and row[f"{label}_streamed_images_per_s"] > 0
        names = [name for name, _ in row["layers"][label]]
        assert "features.0" in names and "classifier.6" in names
        assert all(ms >= 0 for _, ms in row["layers"][label])
        assert set(names) <= set(row["plans"][label])
    text = sparse_tc.layer_table(row)
    assert "features.28" in text and "sum of kernels" in text
