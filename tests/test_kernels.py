"""Each kernel against numpy, on awkward sizes: 1, odd, and not multiples of any tile."""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.ops.gemm import GemmLayer, SplitKGemm, check_conv_params, split_for
from vggserve.ops.gemv import GemvLayer, gemv_span
from vggserve.ops.pixels import PixelInput
from vggserve.ops.pool import MaxPool
from vggserve.ops.relayout import DeviceRelayout, relayout
from vggserve.ops.softmax import Softmax
from vggserve.model.reference import conv3x3_relu, maxpool2x2
from vggserve.predictions import softmax as np_softmax
from vggserve.preprocess import normalize_pixels
from vggserve.runtime import devices as devs
from vggserve.runtime.params import CPU_DEFAULT, GPU_DEFAULT
from vggserve.runtime.programs import ProgramCache

from clbuffers import poisoned, read, rel_err, to_device

MF = cl.mem_flags
# the design card's reference variant, the CPU default, and shapes that exercise every B-gather branch
CONV_PARAMS = [
    GPU_DEFAULT["conv"],
    CPU_DEFAULT["conv"],
    dict(TM=32, TN=128, TK=32, WM=32, WN=8, LPAD=0),   # work-group smaller than TN
    dict(TM=32, TN=32, TK=8, WM=2, WN=2, LPAD=1),      # work-group larger than TN
    dict(TM=128, TN=64, TK=16, WM=8, WN=4, LPAD=1),
]
CONV_SHAPES = [  # (batch, cin, cout, h, w)
    (1, 1, 1, 1, 1),
    (1, 3, 5, 7, 9),
    (2, 17, 65, 13, 11),
    (3, 64, 70, 5, 3),
    (1, 130, 129, 15, 15),
]


@pytest.fixture(scope="module")
def cl_env(test_device):
    info = devs.resolve(test_device)
    device = devs.cl_device(info)
    ctx = cl.Context([device])
    return ctx, cl.CommandQueue(ctx), ProgramCache(ctx, device)


@pytest.mark.parametrize("params", CONV_PARAMS, ids=lambda p: "{TM}x{TN}x{TK}_{WM}x{WN}".format(**p))
@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_conv_gemm_matches_numpy(cl_env, rng, params, shape):
    ctx, queue, cache = cl_env
    n, cin, cout, h, w = shape
    weight = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    layer = GemmLayer(ctx, cache.build("conv_gemm.cl", {**params, "KS": 3, "PAD": 1, "RELU": 1}), params, weight, bias)
    dst = poisoned(ctx, queue, n * cout * h * w)
    layer.enqueue(queue, to_device(ctx, x), dst, n, h, w)
    out = read(queue, dst, (n, cout, h, w))
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
    assert not np.isnan(out).any()
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("batch,fin,fout", [(1, 1, 1), (5, 37, 3), (7, 300, 130), (33, 129, 65)])
def test_fc_gemm_matches_numpy(cl_env, rng, relu, batch, fin, fout):
    ctx, queue, cache = cl_env
    params = GPU_DEFAULT["conv"]
    weight = rng.standard_normal((fout, fin)).astype(np.float32)
    bias = rng.standard_normal(fout).astype(np.float32)
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    prog = cache.build("conv_gemm.cl", {**params, "KS": 1, "PAD": 0, "RELU": relu})
    layer = GemmLayer(ctx, prog, params, weight, bias)
    dst = poisoned(ctx, queue, batch * fout)
    layer.enqueue(queue, to_device(ctx, x), dst, batch)
    ref = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
    ref = np.maximum(ref, 0) if relu else ref
    assert rel_err(read(queue, dst, (batch, fout)), ref) < 1e-5


@pytest.mark.parametrize("params", [GPU_DEFAULT["conv"], CPU_DEFAULT["conv"], CONV_PARAMS[3]],
                         ids=lambda p: "{TM}x{TN}x{TK}".format(**p))
@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("batch,fin,fout", [(1, 300, 1), (5, 1000, 3), (7, 2049, 130), (33, 1300, 65)])
def test_split_k_fc_gemm_matches_numpy(cl_env, rng, params, relu, batch, fin, fout):
    ctx, queue, cache = cl_env
    weight = rng.standard_normal((fout, fin)).astype(np.float32)
    bias = rng.standard_normal(fout).astype(np.float32)
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    gemm = GemmLayer(ctx, cache.build("conv_gemm.cl", {**params, "KS": 1, "PAD": 0, "RELU": relu}), params, weight, bias)
    split_prog = cache.build("conv_gemm.cl", {**params, "KS": 1, "PAD": 0, "RELU": 0, "SPLITK": 1})
    reduce_prog = cache.build("fc_gemv.cl", {**{k: v for k, v in GPU_DEFAULT["gemv"].items() if k.startswith("GEMV_")},
                                             "RELU": relu})
    layer = SplitKGemm(ctx, split_prog, reduce_prog, gemm, max_n=batch, target_groups=10_000)
    assert layer.used_for(batch) and layer.splits[batch][0] > 1
    dst = poisoned(ctx, queue, batch * fout)
    layer.enqueue(queue, to_device(ctx, x), dst, batch)
    ref = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
    ref = np.maximum(ref, 0) if relu else ref
    assert rel_err(read(queue, dst, (batch, fout)), ref) < 1e-5


@pytest.mark.parametrize("k,tk,groups,target", [(25088, 16, 64, 264), (4096, 16, 64, 264), (17, 16, 1, 100),
                                                (1000, 8, 3, 1000), (4096, 16, 512, 264)])
def test_split_k_chunks_cover_k_once_in_whole_slices(k, tk, groups, target):
    splits, kchunk = split_for(k, tk, groups, target, min(64, k // (8 * tk)))  # SplitKGemm's cap
    assert kchunk % tk == 0 or splits == 1
    assert (splits - 1) * kchunk < k <= splits * kchunk
    assert splits == 1 or kchunk >= 8 * tk
    assert splits * groups <= max(target, groups) + groups  # about the target, never far past it


GEMV_PARAMS = [GPU_DEFAULT["gemv"], CPU_DEFAULT["gemv"],
               dict(GEMV_LM=16, GEMV_LK=2, GEMV_WM=4, GEMV_NB=2, ksplit_target=7)]  # local reduction + WM > 1


@pytest.mark.parametrize("gemv_params", GEMV_PARAMS, ids=["gpu", "cpu", "mixed"])
@pytest.mark.parametrize("batch,fin,fout", [(1, 1, 1), (1, 1000, 70), (3, 257, 129), (4, 4099, 1000)])
def test_fc_gemv_matches_numpy(cl_env, rng, gemv_params, batch, fin, fout):
    ctx, queue, cache = cl_env
    batch = min(batch, gemv_params["GEMV_NB"])
    conv = GPU_DEFAULT["conv"]
    weight = rng.standard_normal((fout, fin)).astype(np.float32)
    bias = rng.standard_normal(fout).astype(np.float32)
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    defs = {k: v for k, v in gemv_params.items() if k.startswith("GEMV_")}
    gemm = GemmLayer(ctx, cache.build("conv_gemm.cl", {**conv, "KS": 1, "PAD": 0, "RELU": 1}), conv, weight, bias,
                     m_multiple=gemv_span(gemv_params))
    gemv = GemvLayer(ctx, cache.build("fc_gemv.cl", {**defs, "RELU": 1}), gemv_params, gemm)
    dst = poisoned(ctx, queue, batch * fout)
    gemv.enqueue(queue, to_device(ctx, x), dst, batch)
    ref = np.maximum(x.astype(np.float64) @ weight.T.astype(np.float64) + bias, 0)
    assert rel_err(read(queue, dst, (batch, fout)), ref) < 1e-5


@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (2, 3, 7, 9), (1, 5, 224, 224), (3, 2, 1, 5)])
def test_maxpool_matches_numpy_including_odd_sizes(cl_env, rng, shape):
    ctx, queue, cache = cl_env
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(np.float32)
    oh, ow = h // 2, w // 2
    dst = poisoned(ctx, queue, n * c * oh * ow)
    MaxPool(cache.build("maxpool.cl", {}), {}).enqueue(queue, to_device(ctx, x), dst, n, c, h, w)
    if oh * ow:
        np.testing.assert_array_equal(read(queue, dst, (n, c, oh, ow)), maxpool2x2(x))


@pytest.mark.parametrize("rows,ncls", [(1, 1), (3, 1000), (2, 257)])
def test_softmax_matches_numpy_and_sums_to_one(cl_env, rng, rows, ncls):
    ctx, queue, cache = cl_env
    z = (rng.standard_normal((rows, ncls)) * 20).astype(np.float32)
    dst = poisoned(ctx, queue, rows * ncls)
    Softmax(cache.build("softmax.cl", {}), {}).enqueue(queue, to_device(ctx, z), dst, rows, ncls)
    out = read(queue, dst, (rows, ncls))
    np.testing.assert_allclose(out, np_softmax(z), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_relayout_is_transposed_and_zero_padded(rng):
    w = rng.standard_normal((5, 2, 3, 3)).astype(np.float32)
    wt = relayout(w, tk=16, tm=64)
    assert wt.shape == (32, 64)
    np.testing.assert_array_equal(wt[:18, :5], w.reshape(5, 18).T)
    assert not wt[18:].any() and not wt[:, 5:].any()


@pytest.mark.parametrize("shape,tk,tm", [((1, 1), 1, 1), ((1, 1), 16, 64), ((5, 2, 3, 3), 16, 64), ((33, 31), 8, 32),
                                         ((65, 97), 16, 128), ((70, 3, 3, 3), 1, 1), ((129, 300), 16, 64)])
def test_device_relayout_equals_the_numpy_relayout(cl_env, rng, shape, tk, tm):
    ctx, queue, cache = cl_env
    w = rng.standard_normal(shape).astype(np.float32)
    buf, (kpad, mpad) = DeviceRelayout(ctx, queue, cache.build("relayout.cl", {}))(w, tk, tm)
    expected = relayout(w, tk, tm)
    assert (kpad, mpad) == expected.shape
    np.testing.assert_array_equal(read(queue, buf, expected.shape), expected)


def test_weights_pass_through_pinned_memory_in_chunks_unchanged(cl_env, rng, monkeypatch):
    ctx, queue, cache = cl_env
    monkeypatch.setattr(DeviceRelayout, "STAGE_FLOATS", 64)  # halves of 32 floats: many chunks, both halves reused
    w = rng.standard_normal((37, 50)).astype(np.float32)
    mover = DeviceRelayout(ctx, queue, cache.build("relayout.cl", {}))
    buf, shape = mover(w, 16, 64)
    raw = mover.upload(w[:, :7])
    mover.close()
    np.testing.assert_array_equal(read(queue, buf, shape), relayout(w, 16, 64))
    np.testing.assert_array_equal(read(queue, raw, (37, 7)), w[:, :7])


@pytest.mark.parametrize("mode", ["torchvision", "caffe"])
@pytest.mark.parametrize("n,h,w", [(1, 1, 1), (3, 7, 5), (2, 224, 224)])
def test_pixels_kernel_equals_normalize_pixels_bit_for_bit(cl_env, rng, mode, n, h, w):
    ctx, queue, cache = cl_env
    px = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    px[0, 0, 0] = (0, 255, 128)  # both ends of the byte range
    src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=px)
    dst = poisoned(ctx, queue, n * 3 * h * w)
    op = PixelInput(ctx, cache.build("pixels.cl", PixelInput.defines(mode)), mode)
    op.enqueue(queue, src, dst, n, h * w)
    expected = np.stack([normalize_pixels(p, mode) for p in px])
    np.testing.assert_array_equal(read(queue, dst, (n, 3, h, w)), expected)


@pytest.mark.parametrize("bad", [dict(TM=64, TN=64, TK=16, WM=3, WN=4), dict(TM=64, TN=64, TK=1, WM=4, WN=4),
                                 dict(TM=64, TN=48, TK=16, WM=4, WN=4)])
def test_invalid_conv_params_are_refused_with_the_rule(bad):
    with pytest.raises(ValueError, match="conv params"):
        check_conv_params(bad)


@pytest.mark.parametrize("name", ["conv_gemm.cl", "conv_winograd.cl"])
def test_included_kernel_files_are_expanded_into_the_source(name):
    import re

    from vggserve.runtime.programs import kernel_source

    source = kernel_source(name, {"TM": 64})
    assert source.startswith("#define TM 64\n")
    assert "#define GEMM_K_LOOP(" in source and "GEMM_K_LOOP(" in source.split("#define GEMM_K_LOOP(")[1]
    assert not re.search(r"^#include", source, re.MULTILINE)  # nothing left for the compiler to look up


def portable_fc(cl_env, weight, bias, max_batch, splitk_groups):
    """ops.fc.PortableFc through the gemm entry, with the CPU's gemv table and `splitk_groups` work-groups wanted."""
    from vggserve.ops import registry
    from vggserve.ops.precision import FP32
    from vggserve.ops.registry import BuildEnv, LayerSpec
    from vggserve.runtime.caps import of

    ctx, _, cache = cl_env
    env = BuildEnv(caps=of(ctx.devices[0], "cpu", "test"), max_batch=max_batch,
                   tables={"gemv": CPU_DEFAULT["gemv"], "splitk_groups": splitk_groups})
    layer = LayerSpec("fc", weight.shape[1], weight.shape[0], relu=True)
    return registry.get("gemm").make(ctx, cache, CPU_DEFAULT["conv"], FP32, layer, weight, bias, env)


def test_portable_fc_picks_gemv_split_k_or_gemm_by_batch_and_each_matches_numpy(cl_env, rng):
    ctx, queue, _ = cl_env
    weight = rng.standard_normal((70, 2049)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    fc = portable_fc(cl_env, weight, bias, max_batch=9, splitk_groups=10_000)
    assert fc.split is not None and fc.split.used_for(9)
    for n in (1, 4, 5, 9):  # fc_gemv up to GEMV_NB = 4, split K above
        x = rng.standard_normal((n, 2049)).astype(np.float32)
        dst = poisoned(ctx, queue, n * 70)
        fc.enqueue(queue, to_device(ctx, x), dst, n)
        ref = np.maximum(x.astype(np.float64) @ weight.T.astype(np.float64) + bias, 0)
        assert rel_err(read(queue, dst, (n, 70)), ref) < 1e-5, n


def test_portable_fc_builds_no_split_k_where_fc_gemv_takes_every_batch(cl_env, rng):
    weight = rng.standard_normal((70, 2049)).astype(np.float32)
    fc = portable_fc(cl_env, weight, np.zeros(70, np.float32), max_batch=CPU_DEFAULT["gemv"]["GEMV_NB"],
                     splitk_groups=10_000)
    assert fc.split is None  # its program and partial-sum buffer would never be used
