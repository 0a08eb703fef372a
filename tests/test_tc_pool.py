"""The 2x2/2 max-pool fused into the halo-tile convolution's store (kernels/conv_tc_halo.cl, POOL=1).

Emulated on PoCL (VGGSERVE_EMULATE_MMA=1: the shuffle's model in local memory) and native on a GPU
(VGGSERVE_TEST_DEVICE=gpu: shfl.sync). Each case is checked three ways: against a float64 convolution + bias + ReLU +
pooling of the inputs rounded to the storage type; bit for bit against the same tile's unfused output pooled by numpy
(the max commutes with the bias, the ReLU and the rounding to storage, so nothing may differ); and for what it must
not touch (padding channels zero, nothing written past the pooled image).
"""

import numpy as np
import pytest

from vggserve.model.reference import conv3x3_relu, maxpool2x2
from vggserve.ops import precision as precisions, registry
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import HaloLayer, halo_pools, halo_valid

from clbuffers import rel_err
from conftest import TEST_DEVICE
from test_tensorcore import enqueue_on, nhwc_input, small_tensors, stored, tc_env  # noqa: F401 - fixtures

TC_PRECISIONS = [precisions.FP16, precisions.TF32]
KEYS = ("TH", "TW", "BN", "WARPS_M", "WARPS_N", "STAGES")
POOL_CONFIGS = [  # (TH, TW, BN, WARPS_M, WARPS_N, STAGES): both fragment layouts (TW 8; TW 16 and 32)
    (8, 8, 32, 2, 1, 2),      # TW = 8: the window's rows are the two halves of one fragment
    (8, 16, 64, 2, 2, 3),     # TW = 16: fragments mi and mi + 1, two pairs per warp
    (4, 32, 32, 2, 1, 2),     # TW = 32: fragments mi and mi + 2
    (14, 8, 32, 1, 2, 2),     # TW = 8, seven fragments a warp (a block fitted to 28- and 56-pixel images)
]
POOL_SHAPES = [  # (n, cin, cout, h, w): odd sides (the last row/column dropped), sides 1 and 3, odd batch,
    (1, 3, 8, 5, 7),          # channels below one chunk and cout not a multiple of the tile
    (3, 13, 21, 11, 17),
    (1, 40, 70, 9, 4),
    (2, 16, 16, 1, 3),        # pooled height 0: nothing to write
    (1, 8, 24, 3, 3),
    (1, 24, 40, 17, 34),
]


def params_of(cfg):
    return dict(zip(KEYS, cfg), ALGO="tc_halo")


def run_halo(tc_env, prec, p, layer, weight, bias, xin, n, h, w, pool, layer_cls=HaloLayer):
    """The layer's output as float64 NHWC (pooled or not), and whether the slack after it stayed untouched
    (layer_cls: another halo layer, e.g. the 2:4 one)."""
    ctx, _, cache, caps = tc_env
    spec = LayerSpec("conv3x3", layer.cin, layer.cout, layer.size, relu=True, pool=pool)
    op = layer_cls(ctx, cache, p, prec, spec, weight, bias, BuildEnv(caps=caps, max_batch=n))
    oh, ow = (h // 2, w // 2) if pool else (h, w)
    slack = 64  # elements past the output, which the kernel must leave alone
    out = np.full(n * oh * ow * op.cstore + slack, np.nan, prec.storage)
    enqueue_on(tc_env, op, xin, out, n, h, w)
    return out[:-slack].astype(np.float64).reshape(n, oh, ow, op.cstore), bool(np.isnan(out[-slack:]).all())


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", POOL_CONFIGS, ids=lambda c: "{}x{}x{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_pool_matches_numpy_and_the_unfused_layer(tc_env, rng, prec, cfg, shape):
    p = params_of(cfg)
    assert halo_valid(p) and halo_pools(p)
    check_pool_case(tc_env, rng, prec, p, shape)


def check_pool_case(tc_env, rng, prec, p, shape, layer_cls=HaloLayer):
    """Random weights, bias and input of shape (n, cin, cout, h, w); the layer with its pooling fused against the same
    tile unfused and numpy (check_fused)."""
    n, cin, cout, h, w = shape
    weight = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    cpad = -(-cin // (16 // prec.itemsize)) * (16 // prec.itemsize)
    xin = nhwc_input(x, cpad, prec)
    layer = LayerSpec("conv3x3", cin, cout, h)
    fused, untouched = run_halo(tc_env, prec, p, layer, weight, bias, xin, n, h, w, True, layer_cls)
    plain, _ = run_halo(tc_env, prec, p, layer, weight, bias, xin, n, h, w, False, layer_cls)
    check_fused(fused, untouched, plain, prec, x, weight, bias)


def check_fused(fused, untouched, plain, prec, x, weight, bias):
    """A fused layer's output (NHWC float64) against the same tile's unfused output pooled by numpy (bit for bit) and
    the float64 reference on the stored inputs; nothing written past it, padding channels zero."""
    cout, (h, w) = weight.shape[0], x.shape[2:]
    assert untouched, "the fused kernel wrote past the pooled image"
    assert fused.shape[1:3] == (h // 2, w // 2)
    assert not np.isnan(fused).any(), "a pooled output element was never written"
    assert np.all(fused[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    # the unfused layer's stored output, pooled: the same values, bit for bit
    np.testing.assert_array_equal(fused, maxpool2x2(plain.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1))
    if fused.size:
        ref = maxpool2x2(conv3x3_relu(stored(x, prec), stored(weight, prec), bias.astype(np.float64)))
        assert rel_err(fused[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


def test_only_tiles_whose_windows_stay_in_a_warp_fuse():
    algo = registry.get("tc_halo")
    assert algo.fuses_pool(params_of((8, 16, 128, 2, 2, 3)))       # the shipped tables' shape
    assert algo.fuses_pool(params_of((16, 8, 128, 2, 2, 3)))        # TF32's 16x8
    assert not algo.fuses_pool(params_of((12, 16, 64, 4, 1, 3)))    # 48 rows a warp: a window across two warps
    assert not algo.fuses_pool(params_of((9, 16, 64, 1, 2, 3)))     # odd TH: blocks start at odd rows
    assert not algo.fuses_pool(params_of((8, 24, 64, 1, 2, 3)))     # TW 24: fragments straddle image rows
    assert not algo.fuses_pool(params_of((4, 28, 128, 1, 4, 3)))    # TW 28 (fitted to 28 pixels): the same
    assert algo.fuses_pool(params_of((14, 8, 128, 1, 4, 3)))        # fitted to 56 and 28 pixels, TW 8
    assert not registry.get("tc_gemm").fuses_pool({"ALGO": "tc_gemm"})
    # a table entry may turn fusion off; an entry without the key fuses wherever the tile can
    assert registry.pool_fused(algo, params_of((8, 16, 128, 2, 2, 3)))
    assert not registry.pool_fused(algo, {**params_of((8, 16, 128, 2, 2, 3)), "FUSE_POOL": 0})


def test_a_tile_that_cannot_fuse_is_refused(tc_env, rng):
    ctx, _, cache, caps = tc_env
    layer = LayerSpec("conv3x3", 8, 16, 8, pool=True)
    with pytest.raises(ValueError, match="cannot fuse"):
        HaloLayer(ctx, cache, params_of((12, 16, 64, 4, 1, 3)), precisions.FP16, layer,
                  np.zeros((16, 8, 3, 3), np.float32), np.zeros(16, np.float32), BuildEnv(caps=caps, max_batch=1))


# ---- the whole network: the engine fuses each conv + pool pair where the chosen entry can ---------------------
NET_TILE = params_of((8, 16, 64, 2, 2, 3))


def halo_table(spec, pooled_entry: dict | None) -> dict:
    """A tuned FP16 table putting every 3x3 layer on NET_TILE; with pooled_entry, the "+pool" winners too."""
    from vggserve.runtime.params import shape_key

    table, size = {}, 224
    for c in spec.convs:
        table[shape_key(c.cin, c.cout, size)] = dict(NET_TILE)
        if c.pool_after:
            if pooled_entry is not None:
                table[shape_key(c.cin, c.cout, size, pool=True)] = {**NET_TILE, **pooled_entry}
            size //= 2
    return {"conv_by_batch_fp16": {"2": table}}


def pooled_shape_keys(spec) -> list[str]:
    """The "+pool" shape keys of a network's convolutions that a pooling follows, at their image sizes."""
    from vggserve.runtime.params import shape_key

    keys, size = [], 224
    for c in spec.convs:
        if c.pool_after:
            keys.append(shape_key(c.cin, c.cout, size, pool=True))
            size //= 2
    return keys


def run_with_tables(monkeypatch, tensors, x, extras: dict) -> dict:
    """{label: (FP16 logits of x, kernel plan)} of the network loaded with the device's parameter table updated by
    each of extras {label: table entries} (max batch 2: x of 3 images runs as two chunks)."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module

    original, runs = engine_module.params_for, {}
    for label, extra in extras.items():
        monkeypatch.setattr(engine_module, "params_for", lambda kind, name, e=extra: {**original(kind, name), **e})
        with VGG16.load(tensors, device=TEST_DEVICE, max_batch_size=2, precision="fp16") as model:
            runs[label] = (model.logits(x), model.kernel_plan())
    monkeypatch.setattr(engine_module, "params_for", original)
    return runs


def test_whole_fp16_network_fuses_the_poolings(small_tensors, monkeypatch):
    """Fused (the shape's entry, no "+pool" one: fusion is the default) against unfused ("+pool" entries saying
    FUSE_POOL 0) and float64: the same logits bit for bit, within the FP16 bound of the reference."""
    from vggserve.model.reference import reference_logits
    from vggserve.weights.spec import infer_width, vgg16_spec

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    spec = vgg16_spec(infer_width(small_tensors))
    x = np.random.default_rng(7).standard_normal((3, 3, 224, 224)).astype(np.float32)
    runs = run_with_tables(monkeypatch, small_tensors, x, {"fused": halo_table(spec, None),
                                                          "unfused": halo_table(spec, {"FUSE_POOL": 0})})
    fused, plan = runs["fused"]
    unfused, plain_plan = runs["unfused"]
    pooled = [c.name for c in spec.convs if c.pool_after]
    names = [k["name"] for k in plan]
    assert [n for n in names if "pool" in n] == [f"{n}+pool" for n in pooled], names
    assert all("tc_halo" in k["kernel"] and "max-pool in the store" in k["kernel"]
               for k in plan if k["name"].endswith("+pool"))
    plain_names = [k["name"] for k in plain_plan]
    assert [n for n in plain_names if "pool" in n] == [f"pool after {n}" for n in pooled]
    assert len(plain_names) == len(names) + len(pooled)
    assert "followed by a pool" in next(k["kernel"] for k in plain_plan if k["name"] == pooled[0])
    np.testing.assert_array_equal(fused, unfused)
    ref = reference_logits(small_tensors, x)
    assert not np.isnan(fused).any() and rel_err(fused, ref) < 1e-2
    np.testing.assert_array_equal(fused.argmax(1), ref.argmax(1))


def test_tuner_times_fused_and_unfused_for_a_pooled_shape(monkeypatch, tmp_path):
    """A shape a pool follows is its own table entry: unfused candidates pay the pooling kernel, fused ones are
    checked against the pooled reference, and the winner says FUSE_POOL; the engine reads it back."""
    from vggserve import tuning
    from vggserve.runtime import caps as device_caps, devices as devs
    from vggserve.runtime import params as params_module

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    info = devs.resolve(TEST_DEVICE)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    assert tuning.fusion_possible(caps, precisions.FP16)
    assert not tuning.fusion_possible(caps, precisions.FP32)  # the portable family: no "+pool" entries
    keys = [s[0] for s in tuning.layer_shapes(batch=1, width=0.125, pooled=True)]
    assert "64x64x14" in keys and "64x64x14+pool" in keys  # features.24/26, then features.28
    assert "8x8x224+pool" in keys and "8x8x224" not in keys  # features.2 only ever comes before a pool
    assert [s[0] for s in tuning.layer_shapes(batch=1, width=0.125)].count("8x8x224") == 1  # unchanged
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125, pooled=True) if s[0] == "64x64x14+pool"]
    winners, trials = tuning.tune(info, device, batch=1, limit=1, repeats=1, shapes=shapes, progress=lambda _: None,
                                  precision="fp16")
    fused = [t for t in trials if t.params.get("FUSE_POOL") == 1]
    unfused = [t for t in trials if t.params.get("FUSE_POOL") == 0]
    assert fused and unfused and all(t.ok for t in trials)
    fusers = {t.params["ALGO"] for t in fused}  # the halo entries whose first tile fuses (wgmma_halo's: 14x8)
    assert "tc_halo" in fusers and fusers <= {"tc_halo", "tc_halo_wgmma", "wgmma_halo"}, fusers
    assert ("wgmma_halo" in fusers) == caps.wgmma and "tc_gemm" in {t.params["ALGO"] for t in unfused}
    win = winners["64x64x14+pool"]
    assert win["FUSE_POOL"] in (0, 1) and win == min((t for t in trials if t.ok), key=lambda t: t.ms).params
    table = {"conv": {}, "conv_by_batch_fp16": {"1": {"64x64x14+pool": win, "64x64x14": {"ALGO": "tc_gemm"}}}}
    assert params_module.conv_params_for(table, 64, 64, 14, 1, "fp16", pool=True) == win
    assert params_module.conv_params_for(table, 64, 64, 14, 1, "fp16") == {"ALGO": "tc_gemm"}
    del table["conv_by_batch_fp16"]["1"]["64x64x14+pool"]  # a table from before fusion: the shape's own entry
    assert params_module.conv_params_for(table, 64, 64, 14, 1, "fp16", pool=True) == {"ALGO": "tc_gemm"}


def test_tune_takes_shape_keys_and_names_the_valid_ones(monkeypatch, capsys):
    from vggserve.cli import main

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    rc = main(["tune", "--device", TEST_DEVICE, "--precision", "fp16", "--batch-size", "1", "--shapes",
               "1x2x3+pool", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("vggserve: error: unknown shape 1x2x3+pool at fp16")
    assert "512x512x14+pool" in err[-1] and "64x64x224+pool" in err[-1]


def test_the_tuner_times_only_the_entries_algos_names(monkeypatch):
    """algos (`vggserve tune --algos`): only those entries' candidates are timed; the reference is still the
    family's default, so a winner is still checked against it."""
    from vggserve import tuning
    from vggserve.runtime import devices as devs

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    info = devs.resolve(TEST_DEVICE)
    device = devs.cl_device(info)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125, pooled=True) if s[0] == "64x64x14"]
    winners, trials = tuning.tune(info, device, batch=1, limit=2, repeats=1, shapes=shapes, progress=lambda _: None,
                                  precision="fp16", algos=["tc_halo"])
    assert trials and {t.params["ALGO"] for t in trials} == {"tc_halo"} and all(t.ok for t in trials)
    assert winners["64x64x14"]["ALGO"] == "tc_halo"


@pytest.mark.parametrize("algos,message", [("tc_halo,nosuch", "--algos nosuch: no such entry computes these shapes"),
                                           ("tc_gemv", "--algos tc_gemv: no such entry"), (" , ", "--algos names no")])
def test_tune_refuses_algos_that_compute_none_of_the_shapes_in_one_line(monkeypatch, capsys, tmp_path, algos,
                                                                        message):
    from vggserve.cli import main

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    rc = main(["tune", "--device", TEST_DEVICE, "--precision", "fp16", "--batch-size", "1", "--shapes",
               "512x512x14+pool", "--algos", algos])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("vggserve: error: ") and message in err[0], err
    if "names no" not in message:  # the entries that do compute the shape are named
        assert "tc_halo" in err[0] and "tc_gemm" in err[0]
    assert not (tmp_path / "tuned.json").exists()
