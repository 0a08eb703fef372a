"""Whole networks on pruned weights against the float64 reference on the same weights, the engine's per-layer kernel
choice from the measured sparsity (vggserve/ops/sparse_select.py), and the sparse tuner (vggserve/sparse_tuning.py)."""

import numpy as np
import pytest

from vggserve.model.vgg16 import VGG16
from vggserve.model.reference import reference_logits
from vggserve.ops import sparse_select as sel
from vggserve.ops.sparse_select import CODEGEN, COMPRESSED, CSR, DENSE, choose, sparse_table, speedup_at
from vggserve.weights.prune import prune

from conftest import TEST_DEVICE

TOL = 1e-4  # the FP32 bound on logits


def max_rel_err(out, ref):
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def top5(scores):
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


def run_pruned(tensors, batches, monkeypatch, **table):
    """Logits of the engine on `tensors` for each batch size, with the untuned table's entries replaced by `table`,
    and {layer name: the kernel it got, and why}."""
    crossover = table.pop("crossover", {})
    for kind in ("cpu", "gpu"):
        entry = {**sel.DEFAULTS[kind], **table}
        entry["crossover"] = {**entry["crossover"], **crossover}
        monkeypatch.setitem(sel.DEFAULTS, kind, entry)
    # a tuned "sparse" entry in this machine's cache (vggserve tune --sparse) would override the table under test
    untuned = sel.sparse_table
    monkeypatch.setattr(sel, "sparse_table", lambda params, kind: untuned(
        {k: v for k, v in params.items() if k != "sparse"}, kind))
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((n, 3, 224, 224)).astype(np.float32) for n in batches]
    with VGG16.load(tensors, device=TEST_DEVICE, max_batch_size=max(batches)) as model:
        outs = [model.logits(x) for x in xs]
        choices = {k["name"]: k["kernel"] for k in model.kernel_plan() if not k["name"].startswith("pool")}
    return xs, outs, choices


def algos(choices, prefix=""):
    return {how.split()[0] for name, how in choices.items() if name.startswith(prefix)}


@pytest.fixture(scope="module")
def pruned90(tiny_tensors):
    return prune(tiny_tensors, 0.9).tensors


def test_pruned_network_on_generated_kernels_matches_float64(tiny_tensors, monkeypatch):
    # 98%: 4.6 k non-zeros in the convolutions, whose programs PoCL builds in ~30 s (90%: 23 k, over 2 minutes)
    pruned = prune(tiny_tensors, 0.98).tensors
    xs, outs, choices = run_pruned(pruned, [1, 5], monkeypatch)
    assert algos(choices, "features") == {CODEGEN} and algos(choices, "classifier") == {CSR}
    for x, out in zip(xs, outs):  # batch 1: fc_spmv; batch 5: fc_spmm
        ref = reference_logits(pruned, x)
        assert max_rel_err(out, ref) < TOL
        np.testing.assert_array_equal(top5(out), top5(ref))


def test_pruned_network_on_compressed_kernels_matches_float64(pruned90, monkeypatch):
    # the GPU's default crossover for this kernel is 0.95: lower it so that the 90% layers take it on every device
    xs, outs, choices = run_pruned(pruned90, [2], monkeypatch, codegen_max_nnz=0, crossover={COMPRESSED: 0.5})
    assert algos(choices, "features") == {COMPRESSED}
    ref = reference_logits(pruned90, xs[0])
    assert max_rel_err(outs[0], ref) < TOL
    np.testing.assert_array_equal(top5(outs[0]), top5(ref))


def test_only_the_pruned_layers_get_sparse_kernels(tiny_tensors, monkeypatch):
    tensors = prune(tiny_tensors, 0.95, layers="fc").tensors
    xs, outs, choices = run_pruned(tensors, [1], monkeypatch)
    assert not algos(choices, "features") & {CODEGEN, COMPRESSED} and algos(choices, "classifier") == {CSR}
    assert "sparsity" not in choices["features.0"] and "sparsity 0.950" in choices["classifier.0"]
    assert max_rel_err(outs[0], reference_logits(tensors, xs[0])) < TOL


def test_unpruned_weights_stay_dense(tiny_tensors, monkeypatch):
    _, _, choices = run_pruned(tiny_tensors, [1], monkeypatch)
    assert not algos(choices) & {CODEGEN, COMPRESSED, CSR}
    assert not any("sparsity" in how for how in choices.values())


# ---- the choice alone (no device) -----------------------------------------------------------------------------

def table(**tuned):
    return sparse_table({"sparse": tuned} if tuned else {}, "gpu")


def test_default_crossovers_decide_without_measurements():
    cpu = sparse_table({}, "cpu")
    assert choose(cpu, "conv3x3", "512x512x14", 1, 0.3, 10).algo == DENSE
    assert choose(cpu, "conv3x3", "512x512x14", 1, 0.6, 10).algo == CODEGEN
    assert choose(cpu, "conv3x3", "512x512x14", 1, 0.6, 10**7).algo == DENSE  # codegen too big to build
    assert choose(cpu, "conv3x3", "512x512x14", 1, 0.85, 10**7).algo == COMPRESSED  # past its own crossover
    assert choose(cpu, "fc", "25088x4096x1", 1, 0.9, 10**7).algo == CSR
    assert choose(cpu, "fc", "25088x4096x1", 1, 0.3, 10**7).algo == DENSE
    gpu = table()  # the H100's measurements: codegen from 0.95, the compressed kernel never, CSR from 0.5
    assert choose(gpu, "conv3x3", "512x512x14", 64, 0.9, 10).algo == DENSE
    assert choose(gpu, "conv3x3", "512x512x14", 64, 0.97, 10).algo == CODEGEN
    assert choose(gpu, "conv3x3", "512x512x14", 64, 0.999, 10**7).algo == DENSE
    assert choose(gpu, "fc", "25088x4096x1", 1, 0.6, 10**7).algo == CSR


def test_tuned_curves_override_the_defaults_and_pick_the_fastest():
    curves = {"1": {"256x256x56": {CODEGEN: [[0.5, 0.6], [0.9, 1.4], [0.99, 4.0]],
                                   COMPRESSED: [[0.5, 0.3], [0.9, 1.1], [0.99, 5.0]]}}}
    t = table(curves=curves)
    assert choose(t, "conv3x3", "256x256x56", 1, 0.7, 10).algo == DENSE  # codegen at 1.0x, compressed 0.7x
    c = choose(t, "conv3x3", "256x256x56", 1, 0.9, 10)
    assert c.algo == CODEGEN and "1.40x tuned" in c.reason and "1.10x tuned" in c.reason
    assert choose(t, "conv3x3", "256x256x56", 2, 0.99, 10).algo == COMPRESSED  # batch 2 uses batch 1's curves
    assert choose(t, "conv3x3", "512x512x14", 1, 0.97, 10).algo == CODEGEN  # no curve: default crossover 0.95


def test_speedup_interpolates_and_is_unknown_below_the_measured_range():
    curve = [[0.9, 2.0], [0.5, 1.0]]
    assert speedup_at(curve, 0.7) == pytest.approx(1.5)
    assert speedup_at(curve, 0.1) is None and speedup_at(curve, 0.99) == 2.0
    assert speedup_at(curve, 0.4999999) == 1.0  # a layer pruned to 0.5, as its zeros measure it
    t = table(curves={"1": {"8x8x8": {CODEGEN: [[0.99, 5.0]]}}})  # codegen measured only from 0.99 on
    c = choose(t, "conv3x3", "8x8x8", 1, 0.97, 10)
    assert c.algo == DENSE and "not measured this dense" in c.reason  # the compressed kernel: never by default
    c = choose(sparse_table({"sparse": {"curves": {"1": {"8x8x8": {CODEGEN: [[0.99, 5.0]]}}}}}, "cpu"),
               "conv3x3", "8x8x8", 1, 0.97, 10)
    assert c.algo == COMPRESSED and "not measured this dense" in c.reason  # CPU default crossover 0.8


# ---- the measurement that tunes the choice ----------------------------------------------------------------------

def test_measured_curves_are_stored_and_then_used(tiny_tensors, tmp_path, monkeypatch):
    from vggserve import sparse_tuning
    from vggserve.runtime.params import params_for

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=2, profile=True) as model:
        runs = sparse_tuning.measure(model, tiny_tensors, 2, sparsities=(0.5, 0.99), iterations=1,
                                   codegen_max_nnz=400, shapes=["64x64x14", "512x1000x1"], progress=lambda _: None)
        label, kind = model.device_info.label, model.device_info.kind
    assert [r.shape for r in runs] == ["64x64x14", "512x1000x1"]
    conv, fc = runs
    assert conv.layers == ["features.24", "features.26", "features.28"] and conv.dense_ms > 0
    assert {(p.sparsity, p.algo) for p in conv.points} == {(s, a) for s in (0.5, 0.99) for a in (CODEGEN, COMPRESSED)}
    skipped = next(p for p in conv.points if p.algo == CODEGEN and p.sparsity == 0.5)
    assert skipped.ms is None and "non-zeros > 400" in skipped.note  # 18 k non-zeros: too big a build
    built = next(p for p in conv.points if p.algo == CODEGEN and p.sparsity == 0.99)
    assert built.ms > 0 and built.build_s > 0 and built.binary_bytes > 0 and built.nnz == 369
    for p in conv.points + fc.points:
        assert p.ms is None or (p.err < TOL and p.speedup == pytest.approx(conv.dense_ms / p.ms if p in conv.points
                                                                           else fc.dense_ms / p.ms))
    assert {p.algo for p in fc.points} == {CSR}
    curves = sparse_tuning.curves(runs)
    assert set(curves["64x64x14"]) == {CODEGEN, COMPRESSED} and len(curves["64x64x14"][CODEGEN]) == 1
    sparse_tuning.store(label, curves, 2)
    stored = sparse_table(params_for(kind, label), kind)["curves"]
    assert stored["2"] == curves  # beside any curves shipped for this device at other batches


def test_a_point_whose_output_missed_float64_never_enters_the_curves():
    """The tuners keep only kernels that computed the layer correctly: a fast but wrong one is left out, so the engine
    cannot choose it (FP16 tolerance for the 2:4 kernels, FP32 for the others, as the dense tuner's)."""
    from vggserve.sparse_tuning import LayerRun, Point, best_2_4, curves

    def run(shape, *points):
        return LayerRun(shape, ["features.x"], "conv", 64, 64, 56, 64, 1.0, "dense", points=list(points))

    tile = {"TH": 8}
    runs = [run("64x64x56", Point(0.9, CSR, 1.0, speedup=2.0, err=1e-6), Point(0.9, CODEGEN, 0.5, speedup=4.0, err=0.3),
                Point(0.95, COMPRESSED, 0.5, speedup=3.0, err=float("nan")), Point(0.95, CSR, 0.7, speedup=2.5)),
            run("64x64x56+pool", Point(0.5, sel.TC_HALO_SPARSE24, 1.0, speedup=1.3, err=2e-3, params=tile),
                Point(0.5, sel.TC_SPARSE24, 0.4, speedup=3.0, err=0.5, params=tile))]
    assert curves(runs) == {"64x64x56": {CSR: [[0.9, 2.0], [0.95, 2.5]]},
                            "64x64x56+pool": {sel.TC_HALO_SPARSE24: [[0.5, 1.3]]}}
    params, best = best_2_4(runs)
    assert params == {sel.TC_HALO_SPARSE24: tile} and best == {"64x64x56+pool": {sel.TC_HALO_SPARSE24: [[0.5, 1.3]]}}


def test_crossover_is_where_the_kernel_wins_from_on():
    from vggserve.sparse_tuning import crossover

    assert crossover([[0.5, 0.4], [0.9, 1.2], [0.99, 3.0]]) == 0.9
    assert crossover([[0.5, 1.1], [0.8, 0.9], [0.99, 3.0]]) == 0.99  # a dip: it wins for good only from 0.99
    assert crossover([[0.5, 0.4], [0.99, 0.9]]) is None


# ---- the command line ---------------------------------------------------------------------------------------------

def test_bench_on_pruned_weights_says_which_kernel_each_layer_got_and_why(tiny_weights_path, tmp_path, capsys):
    from vggserve.cli import main

    pruned = tmp_path / "fc95.safetensors"
    assert main(["weights", "prune", "--sparsity", "0.95", "--layers", "fc", str(tiny_weights_path), str(pruned)]) == 0
    capsys.readouterr()
    assert main(["bench", "--weights", str(pruned), "--device", TEST_DEVICE, "--iterations", "1"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("features.", "classifier."))}
    assert len(rows) == 16
    for name in ("classifier.0", "classifier.3", "classifier.6"):
        assert f"{CSR} " in rows[name] and "sparsity 0.950" in rows[name] and "wins" in rows[name]
    assert CSR not in rows["features.0"] and "sparsity" not in rows["features.0"]


def test_tune_sparse_stores_curves_the_engine_then_uses(tiny_tensors, tmp_path, monkeypatch, capsys):
    import json

    from vggserve import sparse_tuning
    from vggserve.cli import main
    from vggserve.runtime import devices as devs
    from vggserve.runtime.params import params_for
    from vggserve.weights import init as init_module

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(init_module, "init_weights", lambda seed: tiny_tensors)  # the tiny net, not VGG16
    measure = sparse_tuning.measure
    monkeypatch.setattr(sparse_tuning, "measure", lambda *a, **k: measure(
        *a, **{**k, "sparsities": (0.9, 0.99), "shapes": ["64x64x14", "512x512x1"]}))
    assert main(["tune", "--sparse", "--device", TEST_DEVICE, "--batch-size", "1", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["curves"]) == {"64x64x14", "512x512x1"}
    assert set(out["curves"]["64x64x14"]) == {CODEGEN, COMPRESSED} and set(out["curves"]["512x512x1"]) == {CSR}
    info = devs.resolve(TEST_DEVICE)
    stored = params_for(info.kind, info.label)["sparse"]["curves"]["1"]  # beside any shipped for this device
    assert {shape: stored[shape] for shape in out["curves"]} == out["curves"]


def test_measured_curves_add_to_the_shipped_ones(tmp_path, monkeypatch):
    import json

    from vggserve.runtime import params as params_module

    shipped, user = tmp_path / "shipped.json", tmp_path / "cache" / "tuned.json"
    user.parent.mkdir()
    shipped.write_text(json.dumps({"dev": {"sparse": {"curves": {
        "64": {"a": {CODEGEN: [[0.9, 0.8]]}, "b": {CODEGEN: [[0.9, 1.5]]}}}, "crossover": {CSR: 0.6}}}}))
    user.write_text(json.dumps({"dev": {"sparse": {"curves": {
        "64": {"a": {CODEGEN: [[0.9, 1.2]]}, "b": {"tc_sparse24": [[0.5, 1.1]]}}, "1": {"c": {CSR: [[0.9, 3.0]]}}}}}}))
    monkeypatch.setattr(params_module, "shipped_file", lambda: shipped)
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(user.parent))
    got = params_module.params_for("gpu", "dev")["sparse"]
    assert got["curves"] == {"64": {"a": {CODEGEN: [[0.9, 1.2]]},
                                    "b": {CODEGEN: [[0.9, 1.5]], "tc_sparse24": [[0.5, 1.1]]}},
                             "1": {"c": {CSR: [[0.9, 3.0]]}}}
    assert got["crossover"] == {CSR: 0.6}


def test_sparsity_is_counted_only_where_a_sample_shows_zeros(rng):
    from vggserve.ops.sparse_select import measured
    from vggserve.weights.prune import prune_unstructured

    dense = rng.standard_normal((300, 1000)).astype(np.float32)
    assert measured(dense) == (0.0, dense.size)
    pruned = prune_unstructured(dense, 0.9)
    assert measured(pruned) == (pytest.approx(0.9), 30000)
    few = dense.copy()
    few[0, 1:4] = 0  # 3 zeros in 300,000 between the sampled ones (every 4th): counted as unpruned
    assert measured(few) == (0.0, few.size)


def test_a_layer_pruned_to_a_default_crossover_wins_there_though_rounding_leaves_it_a_hair_below():
    from vggserve.ops.sparse_select import measured
    from vggserve.weights.prune import prune_unstructured

    # 1,728 weights (conv1's count) pruned to 0.8: round(1382.4) = 1,382 zeros, measured 0.79977
    weight = prune_unstructured(np.random.default_rng(3).standard_normal((64, 27)).astype(np.float32), 0.8)
    sparsity, nnz = measured(weight)
    assert sparsity < 0.8
    cpu = sparse_table({}, "cpu")  # CSR and the compressed kernel win from 0.8 on
    assert choose(cpu, "fc", "27x64x1", 1, sparsity, nnz).algo == CSR
    assert choose(cpu, "conv3x3", "3x64x224", 1, sparsity, 10**7).algo == COMPRESSED
    assert choose(cpu, "fc", "27x64x1", 1, 0.79, nnz).algo == DENSE  # a real 0.79 still loses
