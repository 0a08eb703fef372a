"""The 2x2/2 max-pool fused into the halo-tile 2:4 kernel's store (kernels/conv_tc_halo_sparse.cl, POOL=1, entry
tc_halo_sparse24), as tests/test_tc_pool.py checks it for the dense halo kernel.

Emulated on PoCL (VGGSERVE_EMULATE_MMA=1) and native on a GPU (VGGSERVE_TEST_DEVICE=gpu). A window's four pixels
lie in one lane here (columns 2t, 2t + 1 of two 8-pixel tiles), so no exchange between lanes takes part. Each layer
case is checked bit for bit against the same tile's unfused output pooled by numpy, against float64, and for what it
must not touch; the whole 2:4 network with its pooled steps against the unfused one (bit for bit) and float64; the
engine's and the tuner's "+pool" shape keys.
"""

import json

import numpy as np
import pytest

from vggserve.model.reference import reference_logits
from vggserve.ops import registry, sparse_select as sel
from vggserve.ops.precision import FP16
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore_sparse import (HALO_DEFAULT, HALO_NAME, HALO_SPARSE_TILES, HALO_TUNABLES,
                                            HaloSparseLayer, halo_sparse_pools, halo_valid)
from vggserve.weights.prune import prune

from clbuffers import rel_err
from conftest import TEST_DEVICE
from test_sparse_tc import weights_2_4
from test_tc_pool import check_fused, pooled_shape_keys, run_halo, run_with_tables
from test_tensorcore import nhwc_input, small_tensors, tc_env  # noqa: F401 - fixtures

POOL_CONFIGS = [  # (TH, TW, BN, WARPS_M, WARPS_N, STAGES)
    (4, 8, 32, 2, 1, 2),    # one 8-pixel tile an image row: the row below is the next tile
    (4, 16, 32, 2, 1, 3),   # two tiles an image row: the row below is tile pi + 2
    (2, 8, 16, 1, 1, 4),    # one warp, one window row
]
POOL_SHAPES = [  # (n, cin, cout, h, w): odd sides, odd batch, channels off the chunk and off the tile
    (1, 3, 8, 5, 7),
    (3, 13, 21, 11, 9),
    (1, 40, 70, 9, 4),      # two chunks of channels, two channel groups
    (2, 16, 16, 1, 3),      # pooled height 0: nothing to write
    (1, 8, 33, 3, 3),
]


def params_of(cfg):
    return dict(zip(HALO_TUNABLES, cfg), ALGO=HALO_NAME)


@pytest.mark.parametrize("cfg", POOL_CONFIGS, ids=lambda c: "{}x{}x{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_pool_matches_numpy_and_the_unfused_layer(tc_env, rng, cfg, shape):
    n, cin, cout, h, w = shape
    p = params_of(cfg)
    assert halo_valid(p) and halo_sparse_pools(p)
    weight = weights_2_4(rng, cout, cin)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    xin = nhwc_input(x, -(-cin // 8) * 8, FP16)
    layer = LayerSpec("conv3x3", cin, cout, h)

    def run(pool):
        return run_halo(tc_env, FP16, p, layer, weight, bias, xin, n, h, w, pool, layer_cls=HaloSparseLayer)

    fused, untouched = run(True)
    plain, _ = run(False)
    check_fused(fused, untouched, plain, FP16, x, weight, bias)


def test_which_tiles_fuse_and_a_tile_that_cannot_is_refused(tc_env):
    algo = registry.get(HALO_NAME)
    assert algo.fuses_pool(HALO_DEFAULT) and registry.pool_fused(algo, HALO_DEFAULT)
    assert not registry.pool_fused(algo, {**HALO_DEFAULT, "FUSE_POOL": 0})
    assert algo.fuses_pool({"ALGO": HALO_NAME})  # the default's tiles where a table names none
    assert all(algo.fuses_pool(params_of(t)) for t in HALO_SPARSE_TILES)  # every candidate: the tuner times them
    assert not algo.fuses_pool(params_of((3, 8, 16, 1, 1, 4)))    # odd TH: blocks start at odd rows
    assert not algo.fuses_pool(params_of((4, 8, 32, 4, 1, 2)))    # 8 pixels a warp: a window across two warps
    assert not algo.fuses_pool(params_of((2, 12, 16, 1, 1, 2)))   # TW 12: tiles straddle image rows
    assert not registry.get(sel.TC_SPARSE24).fuses_pool({"ALGO": sel.TC_SPARSE24})
    ctx, _, cache, caps = tc_env
    with pytest.raises(ValueError, match="cannot fuse"):
        HaloSparseLayer(ctx, cache, params_of((4, 8, 32, 4, 1, 2)), FP16, LayerSpec("conv3x3", 8, 16, 8, pool=True),
                        np.zeros((16, 8, 3, 3), np.float32), np.zeros(16, np.float32), BuildEnv(caps=caps, max_batch=1))


def test_pooled_layers_read_their_own_curves(tc_env, rng):
    caps = tc_env[3]
    conv = LayerSpec("conv3x3", 64, 64, 56)
    w24 = weights_2_4(rng, 64, 64)
    plain = {conv.shape_key: {sel.TC_HALO_SPARSE24: [[0.5, 0.9]], sel.TC_SPARSE24: [[0.5, 1.1]]}}
    pooled = {"64x64x56+pool": {sel.TC_HALO_SPARSE24: [[0.5, 1.3]], sel.TC_SPARSE24: [[0.5, 1.0]]}}
    tables = {"sparse": {"curves": {"64": {**plain, **pooled}}}}
    assert sel.for_layer(tables, caps, FP16, conv, w24, 64).algo == sel.TC_SPARSE24
    assert sel.for_layer(tables, caps, FP16, conv, w24, 64, pool=True).algo == sel.TC_HALO_SPARSE24
    # no "+pool" curve measured: a pooled layer reads the shape's own
    only_plain = {"sparse": {"curves": {"64": plain}}}
    assert sel.for_layer(only_plain, caps, FP16, conv, w24, 64, pool=True).algo == sel.TC_SPARSE24


def test_pruned_2_4_network_fuses_its_poolings_and_matches_float64(small_tensors, monkeypatch):
    """Every conv but conv1 on tc_halo_sparse24: the pooled ones as "+pool" steps; the same logits bit for bit as with
    fusion turned off (FUSE_POOL 0 in the 2:4 entry's tuned tile), within the FP16 bound of float64."""
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    for kind in ("cpu", "gpu"):
        monkeypatch.setitem(sel.DEFAULTS[kind]["crossover"], sel.TC_HALO_SPARSE24, 0.45)
        monkeypatch.setitem(sel.DEFAULTS[kind]["crossover"], sel.TC_SPARSE24, 1.01)
    pruned = prune(small_tensors, None, pattern="2:4", layers="conv").tensors
    spec = vgg16_spec(infer_width(pruned))
    x = np.random.default_rng(11).standard_normal((3, 3, 224, 224)).astype(np.float32)
    # "+pool" curves, as this device's tuner stores them: on a GPU that runs mma.sp itself the engine fuses a pooled
    # 2:4 step only where they exist (so there this test runs conv_tc_halo_sparse.cl POOL=1 natively)
    curves = {"2": {key: {HALO_NAME: [[0.5, 1.2]]} for key in pooled_shape_keys(spec)}}
    runs = run_with_tables(monkeypatch, pruned, x, {
        label: {"sparse": {"params": {HALO_NAME: tile}, "curves": curves}}
        for label, tile in (("fused", {}), ("unfused", {"FUSE_POOL": 0}))})
    fused, plan = runs["fused"]
    unfused, plain_plan = runs["unfused"]
    pooled = [c.name for c in spec.convs if c.pool_after]
    steps = {k["name"]: k["kernel"] for k in plan}
    assert [n for n in steps if "pool" in n] == [f"{n}+pool" for n in pooled], list(steps)
    assert all(steps[f"{n}+pool"].startswith(HALO_NAME) and "max-pool in the store" in steps[f"{n}+pool"]
               for n in pooled)
    assert [k["name"] for k in plain_plan if "pool" in k["name"]] == [f"pool after {n}" for n in pooled]
    np.testing.assert_array_equal(fused, unfused)
    ref = reference_logits(pruned, x)
    assert not np.isnan(fused).any() and rel_err(fused, ref) < 1e-2
    np.testing.assert_array_equal(fused.argmax(1), ref.argmax(1))


def test_the_2_4_tuner_times_a_pooled_shape_as_the_engine_runs_it(tmp_path, monkeypatch, capsys):
    """benchmarks/sparse_tc.py on one shape that both an unpooled and a pooled layer have (conv5_x at width 1/16):
    two runs, "32x32x14" and "32x32x14+pool"; on the latter the halo tile is timed with the pooling fused and checked
    against the pooled float64 reference, and the curves are stored under both keys."""
    import sparse_tc

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    tile = {"ALGO": HALO_NAME, "TH": 2, "TW": 8, "BN": 32, "WARPS_M": 1, "WARPS_N": 2, "STAGES": 2}
    assert halo_sparse_pools(tile)
    code = sparse_tc.main(["--device", TEST_DEVICE, "--batch", "1", "--width", "0.0625", "--shapes", "32x32x14",
                           "--candidates", json.dumps([tile]), "--iterations", "1", "--network-batches", "",
                           "--json", str(tmp_path / "s.json"), "--store"])
    assert code == 0
    out = json.loads((tmp_path / "s.json").read_text())
    by_shape = {r["shape"]: r for r in out["layers"]}
    assert set(by_shape) == {"32x32x14", "32x32x14+pool"}
    assert by_shape["32x32x14+pool"]["layers"] == ["features.28"]
    plain, fused = by_shape["32x32x14"]["points"][0], by_shape["32x32x14+pool"]["points"][0]
    assert plain["err"] < 2e-3 and fused["err"] < 2e-3 and fused["ms"] > 0
    assert "max-pool in the store" in fused["note"] and "max-pool" not in plain["note"]
    stored_curves = next(iter(json.loads((tmp_path / "tuned.json").read_text()).values()))["sparse"]["curves"]["1"]
    assert HALO_NAME in stored_curves["32x32x14"] and HALO_NAME in stored_curves["32x32x14+pool"]
    assert "32x32x14+pool" in capsys.readouterr().out


def test_natively_a_pooled_2_4_step_fuses_only_where_its_pooled_curve_was_measured(small_tensors, monkeypatch):
    """On a device that runs mma.sp itself, the fused pooled 2:4 step is taken only where this device's tuner has
    timed it and checked it against float64 ("+pool" curves); until then the layer runs conv, then the pooling."""
    import dataclasses

    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    for kind in ("cpu", "gpu"):
        monkeypatch.setitem(sel.DEFAULTS[kind]["crossover"], sel.TC_HALO_SPARSE24, 0.45)
        monkeypatch.setitem(sel.DEFAULTS[kind]["crossover"], sel.TC_SPARSE24, 1.01)
    pruned = prune(small_tensors, None, pattern="2:4", layers="conv").tensors
    with VGG16.load(pruned, device=TEST_DEVICE, max_batch_size=2, precision="fp16") as model:
        layer = model.spec.convs[1]  # features.2, at 224 x 224, a pooling after it
        assert layer.pool_after and layer.cin % 4 == 0
        spec = LayerSpec("conv3x3", layer.cin, layer.cout, 224)
        weight = pruned[f"{layer.name}.weight"]
        model.caps = dataclasses.replace(model.caps, emulate_mma=True)  # as this machine (on a GPU too)
        algo, params, _ = model._choose(spec, weight, pool=True)  # emulated: fused, as the whole-network test runs
        assert algo.name == HALO_NAME and registry.pool_fused(algo, params)
        model.caps = dataclasses.replace(model.caps, emulate_mma=False)  # as a GPU that runs mma.sp natively
        algo, params, why = model._choose(spec, weight, pool=True)
        assert algo.name == HALO_NAME and not registry.pool_fused(algo, params) and "not fused" in why
        pooled_key = f"{spec.shape_key}+pool"
        model.params = {**model.params, "sparse": {"curves": {"2": {pooled_key: {HALO_NAME: [[0.5, 1.2]]}}}}}
        algo, params, why = model._choose(spec, weight, pool=True)
        assert algo.name == HALO_NAME and registry.pool_fused(algo, params) and "not fused" not in why
