"""The tensor-core family (kernels/conv_tc.cl, kernels/nhwc.cl) and the precision option.

On a GPU (VGGSERVE_TEST_DEVICE=gpu, NVIDIA 8.0+) the kernels run their mma.sync / ldmatrix / cp.async code; here and
in CI they run on PoCL through the kernel's exact software model of those instructions (VGGSERVE_EMULATE_MMA=1),
which exercises the same tiling, swizzle, pipelining and fragment bookkeeping. Every kernel is compared with numpy
on awkward sizes (1, odd channel counts, pixels not a multiple of the tile), inputs rounded to the storage type
first, so a wrong index shows as a large error, not as rounding.
"""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.errors import DeviceError
from vggserve.model.reference import conv3x3_relu, maxpool2x2, reference_logits
from vggserve.ops import nhwc, precision as precisions, registry
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import (DEFAULT, TensorCoreLayer, nhwc_fc_weights, rna_tf32, tc_weights, valid, vec)
from vggserve.runtime import caps as device_caps, devices as devs
from vggserve.runtime.programs import ProgramCache

from clbuffers import rel_err
from conftest import TEST_DEVICE

MF = cl.mem_flags
TC_PRECISIONS = [precisions.FP16, precisions.TF32]
DEFAULT_CFG = tuple(DEFAULT[k] for k in ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB"))
CONFIGS = [  # (BM, BN, WARPS_M, WARPS_N, STAGES, KB): every local row width, 1 to 8 warps, 2 to 4 stages
    (64, 64, 2, 2, 3, 64),
    (32, 64, 1, 2, 2, 128),
    (128, 64, 2, 2, 4, 32),
]
SHAPES = [  # (n, cin, cout, h, w, ks)
    (1, 3, 8, 5, 7, 3),
    (2, 13, 21, 6, 5, 3),
    (1, 40, 70, 9, 4, 3),
    (3, 24, 33, 1, 1, 1),
]


@pytest.fixture(scope="module")
def tc_env():
    """(ctx, queue, cache, caps) with tensor cores: native on an NVIDIA GPU, else emulated."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VGGSERVE_EMULATE_MMA", "1")
    info = devs.resolve(TEST_DEVICE)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    ctx = cl.Context([device])
    yield ctx, cl.CommandQueue(ctx), ProgramCache(ctx, device), caps
    mp.undo()


def stored(a, prec):
    """What the device holds of a float array: float16, or float32 rounded to TF32."""
    return a.astype(np.float16).astype(np.float64) if prec.half else rna_tf32(a).astype(np.float64)


def nhwc_input(x, cpad, prec):
    """NCHW float32 x as a layer's NHWC input: channels zero-padded to cpad, rounded to prec's storage type."""
    n, cin, h, w = x.shape
    xin = np.zeros((n, h, w, cpad), np.float32)
    xin[..., :cin] = x.transpose(0, 2, 3, 1)
    return xin.astype(np.float16) if prec.half else rna_tf32(xin)


def enqueue_on(tc_env, op, xin, out, n, h, w):
    """Runs op on xin with out (NaN-poisoned by the caller) as its output buffer; returns out, read back."""
    ctx, queue = tc_env[:2]
    src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=xin)
    dst = cl.Buffer(ctx, MF.READ_WRITE | MF.COPY_HOST_PTR, hostbuf=out)
    op.enqueue(queue, src, dst, n, h, w)
    cl.enqueue_copy(queue, out, dst)
    queue.finish()
    return out


def params_of(cfg):
    return dict(zip(("BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "KB"), cfg), ALGO="tc_gemm")


def run_layer(tc_env, prec, cfg, shape, rng, splits_target=None, make=None):
    """(NHWC output as float64, float64 reference in NCHW, the layer) of one tensor-core layer on random data:
    TensorCoreLayer with params_of(cfg), or make(ctx, cache, prec, layer, weight, bias, env)."""
    ctx, _, cache, caps = tc_env
    n, cin, cout, h, w, ks = shape
    layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, h if ks == 3 else 1)
    weight = (rng.standard_normal((cout, cin, ks, ks)) / np.sqrt(cin * ks * ks)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    env = BuildEnv(caps=caps, max_batch=n)
    if make is None:
        p = params_of(cfg)
        if splits_target is not None:
            p["GROUPS_TARGET"] = splits_target
        op = TensorCoreLayer(ctx, cache, p, prec, layer, weight if ks == 3 else weight[:, :, 0, 0], bias, env)
    else:
        op = make(ctx, cache, prec, layer, weight, bias, env)
    out = enqueue_on(tc_env, op, nhwc_input(x, op.cpad, prec), np.full((n * h * w, op.cstore), np.nan, prec.storage),
                     n, h, w)
    got = out.astype(np.float64).reshape(n, h, w, op.cstore)
    xq, wq = stored(x, prec), stored(weight, prec)
    if ks == 3:
        ref = conv3x3_relu(xq, wq, bias.astype(np.float64))
    else:
        ref = np.maximum(xq.reshape(n, cin) @ wq.reshape(cout, cin).T + bias, 0).reshape(n, cout, 1, 1)
    return got, ref, op


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "{}x{}_w{}x{}_s{}_k{}".format(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tensor_core_layer_matches_numpy(tc_env, rng, prec, cfg, shape):
    got, ref, op = run_layer(tc_env, prec, cfg, shape, rng)
    cout = shape[2]
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    # one rounding of the output to the storage type (2^-11 relative), FP32 accumulation
    assert rel_err(got[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


HALO_CONFIGS = [(8, 16, 64, 2, 2, 3), (8, 8, 32, 2, 1, 2), (16, 8, 64, 2, 2, 4),
                (4, 28, 32, 1, 2, 3), (7, 16, 32, 1, 2, 2)]  # widths that are not multiples of 8, an odd height
HALO_SHAPES = [(1, 3, 8, 5, 7), (2, 13, 21, 11, 17), (1, 40, 70, 9, 4), (1, 16, 16, 8, 16), (1, 5, 9, 28, 14)]


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("cfg", HALO_CONFIGS, ids=lambda c: "{}x{}x{}_w{}x{}_s{}".format(*c))
@pytest.mark.parametrize("shape", HALO_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_halo_tile_layer_matches_numpy(tc_env, rng, prec, cfg, shape):
    """conv_tc_halo.cl: blocks cut by the image's edges, channel counts below one chunk and not a multiple of it."""
    from vggserve.ops.tensorcore import HaloLayer, halo_valid

    p = dict(zip(("TH", "TW", "BN", "WARPS_M", "WARPS_N", "STAGES"), cfg), ALGO="tc_halo")
    assert halo_valid(p)
    got, ref, _ = run_layer(tc_env, prec, None, (*shape, 3), rng,
                            make=lambda ctx, cache, prec, layer, w, b, env: HaloLayer(ctx, cache, p, prec, layer, w, b,
                                                                                       env))
    cout = shape[2]
    assert not np.isnan(got).any() and np.all(got[..., cout:] == 0)
    assert rel_err(got[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


def test_halo_blocks_fitted_to_the_image_are_candidates_where_they_cover_it_better():
    """8x16 blocks leave 23% of their rows past a 28- or 14-pixel image: there the tuner also tries blocks that fit
    (4x28, 14x8...), right after the default; at 224 and 112 pixels, where 8x16 fits, nothing is added."""
    from vggserve.ops.tensorcore import HALO_DEFAULT, HALO_TILES, halo_coverage

    caps = device_caps.Caps(kind="gpu", label="H100", compute_units=132, local_mem=48 * 1024, max_work_group=1024,
                            tensor_cores=True, emulate_mma=False)
    algo = registry.get("tc_halo")
    keys = ("TH", "TW", "BN", "WARPS_M", "WARPS_N", "STAGES")
    tiles = {size: [tuple(p[k] for k in keys) for p in algo.candidates(caps, precisions.FP16,
                                                                       LayerSpec("conv3x3", 512, 512, size))]
             for size in (224, 112, 56, 28, 14)}
    assert tiles[224] == tiles[112] == [tuple(t) for t in HALO_TILES]
    assert tiles[28][0] == tuple(HALO_DEFAULT[k] for k in keys) and tiles[28][1:3] == [(4, 28, 128, 1, 4, 3),
                                                                                       (14, 8, 128, 1, 4, 3)]
    for size in (56, 28, 14):
        extra = tiles[size][1:len(tiles[size]) - len(HALO_TILES) + 1]
        assert extra and all(halo_coverage(dict(zip(keys, t)), size) > halo_coverage(HALO_DEFAULT, size)
                             for t in extra)
    assert (4, 28, 128, 1, 4, 3) in tiles[56] and (4, 28, 128, 1, 4, 3) not in tiles[14]  # 28 wide on 14: worse
    assert halo_coverage({"TH": 4, "TW": 28}, 28) == 1.0 and halo_coverage(HALO_DEFAULT, 28) == 784 / 1024


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
def test_split_k_sums_the_same_as_one_pass(tc_env, rng, prec):
    shape = (1, 64, 24, 3, 3, 3)  # 18 k-tiles of 32 bytes... split to fill 64 work-groups
    got, ref, op = run_layer(tc_env, prec, CONFIGS[0], shape, rng, splits_target=64)
    assert op.plans[1][0] > 1, "this layer should have been split"
    assert rel_err(got[..., :24].transpose(0, 3, 1, 2), ref) < 2e-3


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
def test_split_k_over_many_tiles_repeats_bit_for_bit(tc_env, rng, prec):
    """Split K over 3 x 2 tiles, the last ones cut by NPIX (75 pixels of 32-row tiles) and by Cstore (72 channels of
    64-wide ones), three launches in a row on one queue: numpy's answer, and the same bytes each time (the partial
    sums' buffer is reused by every launch)."""
    shape = (3, 64, 72, 5, 5, 3)
    got, ref, op = run_layer(tc_env, prec, CONFIGS[1], shape, rng, splits_target=64)
    assert op.plans[3][0] > 1 and op.groups(75) == 3 * 2, "split over 3 x 2 tiles"
    assert rel_err(got[..., :72].transpose(0, 3, 1, 2), ref) < 2e-3
    xin = nhwc_input(rng.standard_normal((3, 64, 5, 5)).astype(np.float32), op.cpad, prec)
    outs = [enqueue_on(tc_env, op, xin, np.full((75, op.cstore), np.nan, prec.storage), 3, 5, 5) for _ in range(3)]
    assert not np.isnan(outs[0]).any()
    for out in outs[1:]:
        np.testing.assert_array_equal(out.view(np.uint8), outs[0].view(np.uint8))


def test_split_targets_give_every_other_split_of_k_once(tc_env, rng):
    """The tuner's alternatives for a layer that splits K (tensorcore.SPLITS_TRIED): each GROUPS_TARGET gives a
    plan of its own, one of them no split at all, every split keeps at least 4 k-tiles, and a layer built with
    that GROUPS_TARGET runs that plan and numpy's answer."""
    shape = (1, 1024, 64, 1, 1, 1)  # an FC layer of one image: one tile, 32 k-tiles of 64 bytes
    got, ref, op = run_layer(tc_env, precisions.FP16, DEFAULT_CFG, shape, rng, splits_target=8)
    assert op.plans[1] == (8, 4) and op.ntiles == 32
    targets = op.split_targets(1)
    plans = [op.plan_for(1, t) for t in targets]
    assert (1, 32) in plans and op.plans[1] not in plans and len(set(plans)) == len(plans) == 5, plans
    assert all(s == 1 or per >= 4 for s, per in plans) and {s for s, _ in plans} == {1, 2, 3, 4, 6}
    for target, plan in zip(targets, plans):
        got, ref, other = run_layer(tc_env, precisions.FP16, DEFAULT_CFG, shape, np.random.default_rng(5),
                                    splits_target=target)
        assert other.plans[1] == plan
        assert rel_err(got[..., :64].reshape(1, 64, 1, 1), ref) < 2e-3


def test_the_tuner_times_the_other_splits_of_a_layer_that_splits(tc_env):
    from vggserve import tuning

    info = devs.resolve(TEST_DEVICE)
    shapes = [("1024x64x1", 1024, 64, 1, 1)]
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=1, repeats=1, shapes=shapes,
                                  progress=lambda _: None, precision="fp16")
    gemm = [t for t in trials if t.params["ALGO"] == "tc_gemm"]
    targets = [t.params.get("GROUPS_TARGET") for t in gemm]
    assert targets[0] is None and len(targets) > 2 and None not in targets[1:]  # the candidate, then its splits
    assert all(t.ok for t in trials)
    assert winners["1024x64x1"] == min(trials, key=lambda t: t.ms).params


def test_nhwc_input_and_pooling_match_numpy(tc_env, rng):
    ctx, queue, cache, _ = tc_env
    for prec in TC_PRECISIONS:
        prog = cache.build(nhwc.KERNEL_FILE, nhwc.defines(prec))
        n, c, h, w = 2, 5, 7, 9
        cpad = -(-c // vec(prec)) * vec(prec)
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
        dst = cl.Buffer(ctx, MF.READ_WRITE, n * h * w * cpad * prec.itemsize)
        nhwc.NhwcInput(prog, c, cpad).enqueue(queue, src, dst, n, h, w)
        got = np.empty((n, h, w, cpad), prec.storage)
        cl.enqueue_copy(queue, got, dst)
        assert np.array_equal(got[..., :c].astype(np.float64), stored(x.transpose(0, 2, 3, 1), prec))
        assert np.all(got[..., c:] == 0)
        pooled = cl.Buffer(ctx, MF.READ_WRITE, n * (h // 2) * (w // 2) * cpad * prec.itemsize)
        nhwc.MaxPoolNhwc(prog, prec).enqueue(queue, dst, pooled, n, cpad, h, w)
        out = np.empty((n, h // 2, w // 2, cpad), prec.storage)
        cl.enqueue_copy(queue, out, pooled)
        ref = maxpool2x2(stored(x, prec))
        assert np.array_equal(out[..., :c].astype(np.float64).transpose(0, 3, 1, 2), ref)


def test_first_fc_columns_follow_the_nhwc_flatten(rng):
    c, cpad, side, out = 5, 8, 3, 4
    w = rng.standard_normal((out, c * side * side)).astype(np.float32)
    x = rng.standard_normal((1, c, side, side)).astype(np.float32)
    x_nhwc = np.zeros((1, side, side, cpad), np.float32)
    x_nhwc[..., :c] = x.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(nhwc_fc_weights(w, c, cpad, side) @ x_nhwc.reshape(-1), w @ x.reshape(-1),
                               rtol=1e-5, atol=1e-6)


def test_tc_weights_layout_and_rounding(rng):
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    out = tc_weights(w, cpad=4, npad=8, kpad=48, precision=precisions.TF32)
    assert out.shape == (8, 48) and out.dtype == np.float32
    # row n, column (ky*3 + kx)*cpad + ci
    assert out[2, (1 * 3 + 2) * 4 + 1] == rna_tf32(w[2, 1, 1, 2:3])[0]
    assert np.all(out[3:] == 0) and np.all(out[:, 36:] == 0) and np.all(out[:, [2, 3, 6, 7]] == 0)
    assert np.all((out.view(np.uint32) & 0x1FFF) == 0), "TF32 values keep 10 mantissa bits"
    half = tc_weights(w, cpad=8, npad=3, kpad=72, precision=precisions.FP16)
    assert half.dtype == np.float16 and half[1, 8 * 4 + 1] == np.float16(w[1, 1, 1, 1])


def test_rna_rounding_is_to_nearest_ties_away():
    x = np.array([1 + 2 ** -11, 1 + 2 ** -10 + 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -12], np.float32)
    np.testing.assert_array_equal(rna_tf32(x), np.array([1 + 2 ** -10, 1 + 2 ** -9, -(1 + 2 ** -10), 1], np.float32))


def test_every_candidate_is_a_valid_shape_that_fits(tc_env):
    caps = tc_env[3]
    algo = registry.get("tc_gemm")
    cands = algo.candidates(caps, precisions.FP16, LayerSpec("conv3x3", 64, 64, 56))
    assert cands and all(valid(p) and algo.fits(p, caps, precisions.FP16) for p in cands)
    assert valid(DEFAULT) and not valid({**DEFAULT, "KB": 48})


def test_registry_chooses_within_the_family():
    assert registry.choose({"ALGO": "winograd"}, "portable", "conv3x3").name == "winograd"
    assert registry.choose({"ALGO": "winograd"}, "portable", "fc").name == "gemm"  # winograd has no FC
    assert registry.choose({"ALGO": "winograd"}, "tensorcore", "conv3x3").name == "tc_gemm"
    assert registry.choose({}, "tensorcore", "fc").name == "tc_gemm"
    with pytest.raises(ValueError, match="known ones"):
        registry.get("nope")


# ---- whole network, precision option -----------------------------------------------------------------------
BOUND = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2}


@pytest.fixture(scope="module")
def small_tensors():
    from vggserve.weights.init import init_weights

    return init_weights(seed=3, width=0.0625)


@pytest.mark.parametrize("name", ["fp16", "tf32"])
def test_whole_network_on_tensor_cores_matches_float64(small_tensors, monkeypatch, name):
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    x = np.random.default_rng(5).standard_normal((3, 3, 224, 224)).astype(np.float32)
    with VGG16.load(small_tensors, device=TEST_DEVICE, max_batch_size=2, precision=name) as model:
        assert model.family == "tensorcore" and model.precision.name == name
        out = model.logits(x)  # two chunks: 2 + 1 images
        plan = model.kernel_plan()
    ref = reference_logits(small_tensors, x)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    assert rel_err(out, ref) < BOUND[name]
    np.testing.assert_array_equal(out.argmax(1), ref.argmax(1))
    # features.0 from the float32 input (conv_first.cl: no to_nhwc step), then the tensor-core kernels
    assert plan[0]["name"] == "features.0" and plan[0]["kernel"].startswith("conv_first")
    assert "tc_gemm" in plan[1]["kernel"] and not any("to_nhwc" in p["kernel"] for p in plan)


def test_fp16_storage_on_the_portable_kernels_matches_float64(small_tensors, monkeypatch):
    """FP16 storage with FP32 math (vload_half/vstore_half): the path every device runs."""
    from vggserve import VGG16

    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    x = np.random.default_rng(6).standard_normal((5, 3, 224, 224)).astype(np.float32)  # 5 > GEMV_NB: GEMM FCs too
    ref = reference_logits(small_tensors, x)
    with VGG16.load(small_tensors, device=TEST_DEVICE, max_batch_size=5, precision="fp16") as model:
        # on a device with tensor cores FP16 runs on them instead (a GPU run of this test checks that family)
        assert model.family == ("tensorcore" if model.caps.tensor_cores else "portable")
        out = model.logits(x)
        small = model.logits(x[:2])  # the GEMV path
    assert rel_err(out, ref) < BOUND["fp16"] and rel_err(small, ref[:2]) < BOUND["fp16"]
    np.testing.assert_array_equal(out.argmax(1), ref.argmax(1))


def test_a_precision_the_device_cannot_run_is_a_one_line_error(small_tensors, monkeypatch):
    from vggserve import VGG16

    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    info = devs.resolve(TEST_DEVICE)
    if device_caps.of(devs.cl_device(info), info.kind, info.label).tensor_cores:
        with VGG16.load(small_tensors, device=TEST_DEVICE, precision="tf32") as model:  # a GPU run: it can
            assert model.family == "tensorcore"
    else:
        with pytest.raises(DeviceError) as err:
            VGG16.load(small_tensors, device=TEST_DEVICE, precision="tf32")
        message = str(err.value)
        assert "\n" not in message and "tf32" in message and "fp32, fp16" in message
    with pytest.raises(ValueError, match="choose one of fp32, tf32, fp16"):
        VGG16.load(small_tensors, device=TEST_DEVICE, precision="bf16")
