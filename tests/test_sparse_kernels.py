"""The sparse kernels (pad.cl, conv_sparse_codegen.cl, conv_sparse_compressed.cl, fc_sparse.cl) against float64
numpy on awkward sizes, at sparsity 0, 0.5, 0.9, 0.99 and 1 (all-zero filters), with NaN-poisoned outputs.

Bound: max |out - ref| / max |ref| < 1e-4 (FP32 against float64; measured <= 1e-6 here). Codegen programs are
built per weight set and PoCL takes ~5 ms per non-zero to build one, so the codegen cases are fewer and smaller.
"""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.model.reference import conv3x3_relu
from vggserve.ops import sparse_conv as sc
from vggserve.ops.sparse_fc import SparseFc, default_params as fc_defaults
from vggserve.runtime import devices as devs
from vggserve.runtime.programs import Generated, ProgramCache
from vggserve.weights.prune import prune_unstructured

from clbuffers import poisoned, read, rel_err, to_device

MF = cl.mem_flags
TOL = 1e-4
SPARSITIES = [0.0, 0.5, 0.9, 0.99, 1.0]
CONV_SHAPES = [  # (batch, cin, cout, h, w): 1x1 images, odd sizes, channels and batches off every group and strip
    (1, 1, 1, 1, 1),
    (1, 3, 5, 7, 9),
    (2, 17, 33, 13, 11),
    (3, 20, 19, 5, 3),
]
COMPRESSED = [
    sc.default_params("cpu", sc.COMPRESSED),
    sc.default_params("gpu", sc.COMPRESSED),   # local-memory chunks, 64 work-items
    {**sc.default_params("gpu", sc.COMPRESSED), "SP_PX": 4, "SP_OCG": 3, "SP_WG": 8, "SP_CHUNK": 20},  # many chunks
    {**sc.default_params("cpu", sc.COMPRESSED), "SP_PX": 2, "SP_OCG": 16, "SP_MEM": 2, "SP_BRANCHLESS": 1},
]
CODEGEN = [
    sc.default_params("cpu", sc.CODEGEN),
    sc.default_params("gpu", sc.CODEGEN),
    {**sc.default_params("cpu", sc.CODEGEN), "SP_PX": 4, "SP_OCG": 5, "SP_WG": 4},
]


def pid(p):
    return "{ALGO}_px{SP_PX}_g{SP_OCG}_wg{SP_WG}".format(**p) + (
        "_mem{SP_MEM}_ch{SP_CHUNK}_skip{SP_SKIP_ZERO}_bl{SP_BRANCHLESS}".format(**p)
        if p["ALGO"] == sc.COMPRESSED else "")


@pytest.fixture(scope="module")
def cl_env(test_device, tmp_path_factory):
    device = devs.cl_device(devs.resolve(test_device))
    ctx = cl.Context([device])
    return ctx, cl.CommandQueue(ctx), ProgramCache(ctx, device, folder=tmp_path_factory.mktemp("programs"))


def conv_case(rng, shape, sparsity):
    n, cin, cout, h, w = shape
    weight = prune_unstructured((rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32),
                                sparsity)
    bias = (rng.standard_normal(cout) * 0.05).astype(np.float32)
    x = np.maximum(rng.standard_normal((n, cin, h, w)), 0).astype(np.float32)  # ReLU outputs: half zero
    return weight, bias, x


def run_conv(cl_env, params, weight, bias, x, **kw):
    ctx, queue, cache = cl_env
    n, _, h, w = x.shape
    m = weight.shape[0]
    layer = sc.sparse_conv(ctx, cache, params, weight, bias, max_batch=kw.pop("max_batch", n),
                           max_h=kw.pop("max_h", h), max_w=kw.pop("max_w", w), **kw)
    dst = poisoned(ctx, queue, n * m * h * w)
    first, last = layer.enqueue(queue, to_device(ctx, x), dst, n, h, w)
    assert isinstance(first, cl.Event) and isinstance(last, cl.Event)
    return layer, read(queue, dst, (n, m, h, w))


def check_conv(cl_env, rng, params, shape, sparsity):
    weight, bias, x = conv_case(rng, shape, sparsity)
    layer, out = run_conv(cl_env, params, weight, bias, x)
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
    assert not np.isnan(out).any(), "some outputs were never written"
    assert rel_err(out, ref) < TOL
    assert layer.nnz == np.count_nonzero(weight)


@pytest.mark.parametrize("params", COMPRESSED, ids=pid)
@pytest.mark.parametrize("shape", CONV_SHAPES, ids=str)
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_compressed_conv_matches_float64(cl_env, rng, params, shape, sparsity):
    check_conv(cl_env, rng, params, shape, sparsity)


@pytest.mark.parametrize("shape", CONV_SHAPES[:3], ids=str)
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_codegen_conv_matches_float64(cl_env, rng, shape, sparsity):
    check_conv(cl_env, rng, CODEGEN[0], shape, sparsity)


@pytest.mark.parametrize("params", CODEGEN[1:], ids=pid)
@pytest.mark.parametrize("shape", CONV_SHAPES[1:], ids=str)
def test_codegen_conv_other_tunables_match_float64(cl_env, rng, params, shape):
    check_conv(cl_env, rng, params, shape, 0.9)


@pytest.mark.parametrize("params", [COMPRESSED[0], COMPRESSED[2], COMPRESSED[3]], ids=pid)
def test_compressed_conv_skips_zero_inputs_without_changing_the_result(cl_env, rng, params):
    weight, bias, x = conv_case(rng, (2, 24, 10, 9, 20), 0.5)
    x[:, ::2] = 0  # whole channels of zeros
    x[:, :, 3:7] = 0  # and a band of rows in every channel
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
    outs = [run_conv(cl_env, {**params, "SP_SKIP_ZERO": skip}, weight, bias, x)[1] for skip in (0, 1)]
    np.testing.assert_array_equal(outs[0], outs[1])  # the skipped terms were exactly zero
    assert rel_err(outs[1], ref) < TOL


def test_smaller_calls_than_the_workspace_and_a_shared_workspace(cl_env, rng):
    ctx, queue, cache = cl_env
    params = COMPRESSED[2]
    ws = sc.PadWorkspace(ctx, cache, 8)
    weight, bias, x = conv_case(rng, (3, 5, 6, 12, 10), 0.5)
    weight2, bias2, _ = conv_case(rng, (3, 6, 4, 12, 10), 0.5)
    a = sc.sparse_conv(ctx, cache, params, weight, bias, max_batch=3, max_h=12, max_w=10, workspace=ws)
    b = sc.sparse_conv(ctx, cache, params, weight2, bias2, max_batch=3, max_h=12, max_w=10, workspace=ws)
    mid, out = poisoned(ctx, queue, 2 * 6 * 7 * 5), poisoned(ctx, queue, 2 * 4 * 7 * 5)
    a.enqueue(queue, to_device(ctx, x[:2, :, :7, :5]), mid, 2, 7, 5)  # fewer images, smaller than max_h x max_w
    b.enqueue(queue, mid, out, 2, 7, 5)
    f64 = np.float64
    ref = conv3x3_relu(conv3x3_relu(x[:2, :, :7, :5].astype(f64), weight.astype(f64), bias.astype(f64)),
                       weight2.astype(f64), bias2.astype(f64))
    assert rel_err(read(queue, out, ref.shape), ref) < TOL
    with pytest.raises(ValueError, match="raise max_batch"):
        a.enqueue(queue, to_device(ctx, x), mid, 4, 12, 10)


def test_constant_memory_that_does_not_fit_is_refused(cl_env, rng):
    ctx, _, cache = cl_env
    limit = ctx.devices[0].max_constant_buffer_size
    if limit > 64 << 20:
        pytest.skip(f"this device's constant buffer holds {limit} bytes: nothing small enough to test overflows it")
    weight = np.ones((16, 4000, 3, 3), np.float32)
    with pytest.raises(ValueError, match="constant buffer"):
        sc.sparse_conv(ctx, cache, COMPRESSED[3], weight, np.zeros(16, np.float32), max_batch=1, max_h=1, max_w=1)


def test_bad_params_are_refused():
    with pytest.raises(ValueError, match="SP_PX"):
        sc.check_params({**COMPRESSED[0], "SP_PX": 3})
    with pytest.raises(ValueError, match="SP_OCG <= 16"):
        sc.check_params({**COMPRESSED[0], "SP_OCG": 17})


def test_codegen_program_comes_from_the_cache_without_writing_the_source(cl_env, rng, tmp_path):
    ctx, queue, _ = cl_env
    weight, bias, x = conv_case(rng, (1, 3, 4, 5, 6), 0.5)
    first = ProgramCache(ctx, ctx.devices[0], folder=tmp_path, binaries=True)  # pad.cl's binary too, not a note
    run_conv((ctx, queue, first), CODEGEN[1], weight, bias, x)
    assert first.compiles == 1 + 1  # pad.cl and the generated program

    def refuse(self, *a, **k):
        raise AssertionError("a cached binary was expected: nothing should be compiled or generated")

    second = ProgramCache(ctx, ctx.devices[0], folder=tmp_path, binaries=True)
    second._compile = refuse.__get__(second)
    import vggserve.ops.sparse_conv as module

    original = module.codegen_cases
    module.codegen_cases = refuse
    try:
        layer, out = run_conv((ctx, queue, second), CODEGEN[1], weight, bias, x)
    finally:
        module.codegen_cases = original
    assert second.hits == 2 and second.compiles == 0
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
    assert rel_err(out, ref) < TOL and layer.binary_bytes > 0
    other = weight.copy()
    other[other != 0] *= 2  # different weights: a different key
    g1 = Generated("conv_sparse_weights.gen", sc.weights_digest(weight, "conv3x3", 4), lambda: "")
    g2 = Generated("conv_sparse_weights.gen", sc.weights_digest(other, "conv3x3", 4), lambda: "")
    assert g1.key != g2.key


FC_SHAPES = [  # (batch, K, M)
    (1, 1, 1),
    (3, 7, 5),
    (4, 100, 33),    # SPMV_NB
    (5, 300, 65),    # first batch past fc_spmv
    (17, 129, 40),   # not a multiple of any vector width
]
FC_PARAMS = [fc_defaults("cpu"), fc_defaults("gpu"),
             {**fc_defaults("gpu"), "SPMV_LK": 8, "SPMV_LM": 2, "SPMV_NB": 2, "SPMM_NV": 4, "SPMM_WG": 4, "TR_WG": 8}]


def run_fc(cl_env, params, shape, sparsity, relu, rng):
    ctx, queue, cache = cl_env
    n, k, m = shape
    weight = prune_unstructured((rng.standard_normal((m, k)) * np.sqrt(2 / k)).astype(np.float32), sparsity)
    bias = (rng.standard_normal(m) * 0.05).astype(np.float32)
    x = np.maximum(rng.standard_normal((n, k)), 0).astype(np.float32)
    layer = SparseFc(ctx, cache, params, weight, bias, relu=relu, max_batch=n)
    dst = poisoned(ctx, queue, n * m)
    layer.enqueue(queue, to_device(ctx, x), dst, n)
    ref = x.astype(np.float64) @ weight.astype(np.float64).T + bias
    if relu:
        ref = np.maximum(ref, 0)
    return read(queue, dst, (n, m)), ref, layer


@pytest.mark.parametrize("params", FC_PARAMS, ids=lambda p: "lk{SPMV_LK}_nb{SPMV_NB}_nv{SPMM_NV}".format(**p))
@pytest.mark.parametrize("shape", FC_SHAPES, ids=str)
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_sparse_fc_matches_float64(cl_env, rng, params, shape, sparsity):
    out, ref, layer = run_fc(cl_env, params, shape, sparsity, 1, rng)
    assert not np.isnan(out).any() and rel_err(out, ref) < TOL
    assert layer.nnz == shape[1] * shape[2] - round(sparsity * shape[1] * shape[2])


@pytest.mark.parametrize("n", [1, 6])
def test_sparse_fc_with_32_bit_columns_and_no_relu(cl_env, rng, n):
    out, ref, layer = run_fc(cl_env, FC_PARAMS[2], (n, 70000, 3), 0.9, 0, rng)
    assert (ref < 0).any() and rel_err(out, ref) < TOL


def test_sparse_fc_reads_fewer_weight_bytes_as_sparsity_grows(cl_env, rng):
    sizes = [run_fc(cl_env, FC_PARAMS[0], (1, 1000, 64), s, 1, rng)[2].weight_bytes_read() for s in (0.5, 0.9, 0.99)]
    dense = 4 * 1000 * 64
    assert sizes[0] < dense and sizes[1] < 0.16 * dense and sizes[2] < 0.02 * dense
