"""Winograd F(2x2, 3x3) and F(4x4, 3x3) (kernels/conv_winograd.cl, vggserve/ops/winograd.py) against the
float64 direct convolution: the matrices and the algorithm in numpy, the kernels on awkward shapes with
NaN-poisoned outputs, chunking and the shared workspace, and whole networks with every conv layer on either
Winograd variant."""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.model import vgg16 as vgg16_module
from vggserve.ops import winograd
from vggserve.ops.gemm import GemmLayer
from vggserve.model.reference import conv3x3_relu, reference_logits
from vggserve.ops.winograd import WinogradLayer, WinogradWorkspace
from vggserve.runtime import devices as devs
from vggserve.runtime.programs import ProgramCache

from conftest import TEST_DEVICE
from clbuffers import poisoned, read, rel_err, to_device

MF = cl.mem_flags
SHAPES = [  # (batch, cin, cout, h, w): 1x1 images, odd sizes, channels off every tile, VGG's 14x14 block
    (1, 1, 1, 1, 1),
    (1, 3, 5, 7, 9),
    (2, 17, 65, 13, 11),
    (3, 64, 70, 5, 3),
    (1, 130, 129, 15, 15),
    (2, 512, 512, 14, 14),
    (2, 33, 31, 10, 6),     # sizes 2 mod 4: F(4x4)'s last tile row/column half outside (float2 row stores)
    (1, 2, 3, 4, 8),        # sizes multiples of 4: no dropped outputs
    (1, 5, 6, 7, 12),       # W a multiple of 4 (F(4x4)'s float4 row stores), H not (the last tile row dropped)
]
PARAMS = [
    winograd.GPU_DEFAULT,
    winograd.CPU_DEFAULT,
    dict(ALGO="winograd", TM=32, TN=32, TK=8, WM=2, WN=2, LPAD=1, XWG=32),     # small tiles, many tails
    dict(ALGO="winograd", TM=128, TN=64, TK=16, WM=8, WN=4, LPAD=1, XWG=64),   # tall tile, 2 B loads / item
]
PARAMS4 = [{**p, "WINO_M": 4} for p in PARAMS] + [winograd.GPU_DEFAULT4]  # the same tiles on F(4x4, 3x3)
# max |err| / max |ref| against float64 (He-scaled weights, unit-normal inputs). F(2x2,3x3) in float32 measures
# <= 1.0e-6 on the shapes here. F(4x4,3x3) is less accurate (transform coefficients up to 8 in A^T, 5 in B^T,
# 1/6 and 1/24 in G: V and M values are sums of terms many times larger than the result, whose rounding errors
# the output transform does not cancel): it measures <= 1.6e-5 here (the 512-channel shape; 1.7e-5 at 512x512
# 28x28) and grows with Cin, so its single layers are held to TOL4 = 1e-4 (6x margin, the tuner's acceptance
# threshold too; a sign error in one coefficient of B^T gives errors of order 1).
# Whole networks: logits within 4e-6 of float64 for both (errors of single outputs average out in the FC
# layers), so both are held to TOL there, and to the same top-5.
TOL = 1e-4
TOL4 = 1e-4


def tol(params):
    return TOL4 if winograd.tile_size(params) == 4 else TOL


def pid(p):
    return "F{m}_{TM}x{TN}x{TK}_{WM}x{WN}_x{XWG}".format(m=winograd.tile_size(p), **p)


def top5(scores):
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


@pytest.fixture(scope="module")
def cl_env(test_device):
    device = devs.cl_device(devs.resolve(test_device))
    ctx = cl.Context([device])
    return ctx, cl.CommandQueue(ctx), ProgramCache(ctx, device)


def problem(rng, shape):
    n, cin, cout, h, w = shape
    weight = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin))).astype(np.float32)
    bias = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
    return x, weight, bias, ref


def run_layer(cl_env, params, x, weight, bias, **kw):
    ctx, queue, cache = cl_env
    n, _, h, w = x.shape
    kw = {"max_batch": n, "max_h": h, "max_w": w, **kw}
    layer = WinogradLayer(ctx, cache.build(winograd.KERNEL_FILE, winograd.defines(params)), params, weight, bias,
                          **kw)
    dst = poisoned(ctx, queue, n * weight.shape[0] * h * w)
    layer.enqueue(queue, to_device(ctx, x), dst, n, h, w)
    return layer, read(queue, dst, (n, weight.shape[0], h, w))


# ---- the algorithm ------------------------------------------------------------------------------------------
def correlation_identity_error(bt, g, at, m):
    """max |A^T ((G g) .* (B^T d)) - correlation(d, g)| over the basis (1-D F(m, 3)): entry [k, l, j] of
    sum_i A^T[k, i] G[i, l] B^T[i, j] must be 1 where j == k + l, else 0."""
    t = np.einsum("ki,il,ij->klj", at, g, bt)
    want = np.zeros((m, 3, m + 2))
    for k in range(m):
        for l in range(3):
            want[k, l, k + l] = 1
    return float(np.abs(t - want).max())


def test_f4_matrices_are_lavin_and_grays_derived_from_the_points():
    pts = np.array([0.0, 1.0, -1.0, 2.0, -2.0])
    # A^T: the Vandermonde matrix of the points, rows p^k (k = 0..3), and the point at infinity
    at = np.zeros((4, 6))
    at[:, :5] = pts[None, :] ** np.arange(4)[:, None]
    at[3, 5] = 1
    np.testing.assert_array_equal(winograd.AT4, at)
    # G: rows [1, p, p^2] / prod_{q != p} (p - q) (Lagrange denominators), and [0, 0, 1] for infinity
    g = np.zeros((6, 3))
    for i, p in enumerate(pts):
        g[i] = np.array([1, p, p * p]) / np.prod([p - q for q in pts if q != p])
    g[5, 2] = 1
    np.testing.assert_allclose(winograd.G4, g, rtol=0, atol=1e-16)
    # B^T: the unique solution of the bilinear identity given A^T and G (72 equations, 36 unknowns)
    coeff = np.einsum("ki,il->kli", at, g).reshape(12, 6)       # per (k, l): row over i
    want = np.zeros((4, 3, 6))
    for k in range(4):
        for l in range(3):
            want[k, l, k + l] = 1
    # sum_i coeff[(k,l), i] * BT[i, j] = want[k, l, j] for every j
    bt, _, rank, _ = np.linalg.lstsq(coeff, want.reshape(12, 6), rcond=None)
    assert rank == 6
    np.testing.assert_allclose(bt, winograd.BT4, rtol=0, atol=1e-12)
    assert correlation_identity_error(winograd.BT4, winograd.G4, winograd.AT4, 4) < 1e-15
    assert correlation_identity_error(winograd.BT, winograd.G, winograd.AT, 2) == 0
    assert winograd.MATRICES == {2: (winograd.BT, winograd.G, winograd.AT), 4: (winograd.BT4, winograd.G4, winograd.AT4)}


@pytest.mark.parametrize("m", winograd.TILE_SIZES)
@pytest.mark.parametrize("shape", SHAPES[:5] + SHAPES[6:], ids=lambda s: "x".join(map(str, s)))
def test_numpy_winograd_equals_direct_convolution_in_float64(rng, shape, m):
    x, weight, bias, _ = problem(rng, shape)
    ref = conv3x3_relu(x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64), relu=False)
    out = winograd.winograd_numpy(x, weight, bias, relu=False, m=m)
    assert rel_err(out, ref) < 1e-13


def test_weight_transform_layout_and_padding(rng):
    g = rng.standard_normal((5, 3, 3, 3))
    u = winograd.transform_weights(g)
    assert u.shape == (16, 3, 5)
    for m, c in ((0, 0), (4, 2), (2, 1)):
        np.testing.assert_allclose(u[:, c, m].reshape(4, 4), winograd.G @ g[m, c] @ winograd.G.T, rtol=0, atol=1e-14)
    padded = winograd.relayout_u(u, tk=8, tm=32)
    assert padded.shape == (16, 8, 32) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:, :3, :5], u.astype(np.float32))
    assert not padded[:, 3:].any() and not padded[:, :, 5:].any()


def test_f4_weight_transform_layout_and_padding(rng):
    g = rng.standard_normal((5, 3, 3, 3))
    u = winograd.transform_weights(g, m=4)
    assert u.shape == (36, 3, 5)
    for m, c in ((0, 0), (4, 2), (2, 1)):
        np.testing.assert_allclose(u[:, c, m].reshape(6, 6), winograd.G4 @ g[m, c] @ winograd.G4.T, rtol=0,
                                   atol=1e-14)
    padded = winograd.relayout_u(u, tk=8, tm=32)
    assert padded.shape == (36, 8, 32) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:, :3, :5], u.astype(np.float32))
    assert not padded[:, 3:].any() and not padded[:, :, 5:].any()


# ---- the kernels --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,c,tk,tm", [(1, 1, 1, 1), (5, 3, 8, 32), (70, 33, 16, 64), (129, 65, 16, 128)])
def test_device_weight_transform_equals_the_host_one(cl_env, rng, m, c, tk, tm):
    from vggserve.ops.relayout import DeviceRelayout

    ctx, queue, cache = cl_env
    g = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    buf, (cpad, mpad) = DeviceRelayout(ctx, queue, cache.build("relayout.cl", {})).winograd(g, tk, tm)
    expected = winograd.relayout_u(winograd.transform_weights(g), tk, tm)
    assert (16, cpad, mpad) == expected.shape
    out = np.empty(expected.shape, np.float32)
    cl.enqueue_copy(queue, out, buf)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    assert not out[:, c:].any() and not out[:, :, m:].any()


@pytest.mark.parametrize("m,c,tk,tm", [(1, 1, 1, 1), (5, 3, 8, 32), (70, 33, 16, 64), (129, 65, 16, 128)])
def test_device_f4_weight_transform_equals_the_host_one(cl_env, rng, m, c, tk, tm):
    from vggserve.ops.relayout import DeviceRelayout

    ctx, queue, cache = cl_env
    g = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    on_device = DeviceRelayout(ctx, queue, cache.build("relayout.cl", {}))
    buf, (cpad, mpad) = on_device.winograd(g, tk, tm, tile=4)
    expected = winograd.relayout_u(winograd.transform_weights(g, m=4), tk, tm)
    assert (36, cpad, mpad) == expected.shape
    out = np.empty(expected.shape, np.float32)
    cl.enqueue_copy(queue, out, buf)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    assert not out[:, c:].any() and not out[:, :, m:].any()


@pytest.mark.parametrize("params", PARAMS + PARAMS4, ids=pid)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_winograd_layer_matches_float64_direct_convolution(cl_env, rng, params, shape):
    x, weight, bias, ref = problem(rng, shape)
    layer, out = run_layer(cl_env, params, x, weight, bias)
    assert layer.tile == winograd.tile_size(params) and len(layer.events) == 3
    assert not np.isnan(out).any(), "an output element was never written"
    assert rel_err(out, ref) < tol(params)


def test_f4_is_less_accurate_than_f2_but_within_its_tolerance(cl_env, rng):
    """The accuracy figures docs/winograd.md quotes: a 512-channel layer, He-scaled weights, float64 reference."""
    x, weight, bias, ref = problem(rng, (1, 512, 512, 28, 28))
    _, out2 = run_layer(cl_env, PARAMS[1], x, weight, bias)
    _, out4 = run_layer(cl_env, PARAMS4[1], x, weight, bias)
    e2, e4 = rel_err(out2, ref), rel_err(out4, ref)
    assert e2 < 3e-6 and e4 < TOL4 / 2 and e4 > e2


@pytest.mark.parametrize("params", [winograd.GPU_DEFAULT, PARAMS4[0]], ids=pid)
def test_batches_past_the_workspace_run_in_chunks_with_the_same_result(cl_env, rng, params):
    x, weight, bias, ref = problem(rng, (5, 9, 11, 7, 6))
    _, whole = run_layer(cl_env, params, x, weight, bias)
    layer, chunked = run_layer(cl_env, params, x, weight, bias, max_batch=2)
    assert len(layer.events) == 3 * 3  # 3 launches for each of the chunks 2 + 2 + 1
    assert not np.isnan(chunked).any() and rel_err(chunked, ref) < tol(params)
    np.testing.assert_array_equal(chunked, whole)


@pytest.mark.parametrize("params", [winograd.GPU_DEFAULT, PARAMS4[0]], ids=pid)
def test_a_buffer_cap_means_smaller_chunks_not_a_failed_allocation(cl_env, rng, params):
    x, weight, bias, ref = problem(rng, (4, 6, 10, 8, 8))
    m = winograd.tile_size(params)
    t = (8 // m) ** 2  # tiles per 8x8 image: 16 (F(2x2)), 4 (F(4x4))
    per_image = 4 * winograd.points(m) * 10 * t  # bytes of M (the larger of V and M) for one image
    layer, out = run_layer(cl_env, params, x, weight, bias, max_buffer_bytes=2 * per_image + 5)
    assert layer.max_tiles == 2 * t and layer.ws.m_floats * 4 == 2 * per_image and len(layer.events) == 2 * 3
    assert not np.isnan(out).any() and rel_err(out, ref) < tol(params)


@pytest.mark.parametrize("params", [winograd.GPU_DEFAULT, PARAMS4[0]], ids=pid)
def test_smaller_images_fit_a_workspace_built_for_larger_ones(cl_env, rng, params):
    x, weight, bias, ref = problem(rng, (3, 4, 6, 5, 3))
    _, out = run_layer(cl_env, params, x, weight, bias, max_batch=1, max_h=14, max_w=14)
    assert not np.isnan(out).any() and rel_err(out, ref) < tol(params)


@pytest.mark.parametrize("params,msg", [(winograd.GPU_DEFAULT, "needs 25 tiles; this layer's workspace holds 4"),
                                        (PARAMS4[0], "needs 9 tiles; this layer's workspace holds 1")], ids=["F2", "F4"])
def test_an_image_larger_than_the_workspace_is_a_clear_error(cl_env, rng, params, msg):
    ctx, queue, cache = cl_env
    x, weight, bias, _ = problem(rng, (1, 2, 2, 9, 9))
    p = params
    layer = WinogradLayer(ctx, cache.build(winograd.KERNEL_FILE, winograd.defines(p)), p, weight, bias,
                          max_batch=1, max_h=4, max_w=4)
    with pytest.raises(ValueError, match=msg):
        layer.enqueue(queue, to_device(ctx, x), poisoned(ctx, queue, 162), 1, 9, 9)


def test_layers_sharing_a_workspace_size_it_once_for_the_largest(cl_env, rng):
    ctx, queue, cache = cl_env
    p = winograd.GPU_DEFAULT
    prog = cache.build(winograd.KERNEL_FILE, winograd.defines(p))
    ws = WinogradWorkspace(ctx)
    x1, w1, b1, _ = problem(rng, (2, 3, 8, 12, 12))
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)
    b2 = np.zeros(4, np.float32)
    first = WinogradLayer(ctx, prog, p, w1, b1, max_batch=2, max_h=12, max_w=12, workspace=ws)
    second = WinogradLayer(ctx, prog, p, w2, b2, max_batch=2, max_h=12, max_w=12, workspace=ws)
    tiles = 2 * 6 * 6
    assert ws.v_floats == 16 * 8 * tiles and ws.m_floats == 16 * 8 * tiles  # second layer's V, first one's M
    mid, dst = poisoned(ctx, queue, 2 * 8 * 144), poisoned(ctx, queue, 2 * 4 * 144)
    used = []
    for _ in range(2):  # a second call reuses the same buffers and gives the same answer
        first.enqueue(queue, to_device(ctx, x1), mid, 2, 12, 12)
        second.enqueue(queue, mid, dst, 2, 12, 12)
        used.append((ws.v.get(queue), ws.m.get(queue)))
    assert used[0] == used[1] and len(ws.v.buffers) == len(ws.m.buffers) == 1
    y1 = conv3x3_relu(x1.astype(np.float64), w1.astype(np.float64), b1.astype(np.float64))
    ref = conv3x3_relu(y1, w2.astype(np.float64), b2.astype(np.float64))
    assert rel_err(read(queue, dst, (2, 4, 12, 12)), ref) < TOL


def test_f2_and_f4_layers_share_one_workspace_sized_for_the_larger_request(cl_env, rng):
    ctx, queue, cache = cl_env
    ws = WinogradWorkspace(ctx)
    p2, p4 = winograd.GPU_DEFAULT, PARAMS4[0]
    x1, w1, b1, _ = problem(rng, (2, 3, 8, 12, 12))
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)
    b2 = np.zeros(4, np.float32)
    first = WinogradLayer(ctx, cache.build(winograd.KERNEL_FILE, winograd.defines(p4)), p4, w1, b1, max_batch=2,
                          max_h=12, max_w=12, workspace=ws)
    second = WinogradLayer(ctx, cache.build(winograd.KERNEL_FILE, winograd.defines(p2)), p2, w2, b2, max_batch=2,
                           max_h=12, max_w=12, workspace=ws)
    # F(4x4): 36 x 8 x (2 * 3 * 3) = 5184 floats of M; F(2x2): 16 x 8 x (2 * 6 * 6) = 9216 of V
    assert (first.tile, second.tile) == (4, 2) and ws.v_floats == 16 * 8 * 72 and ws.m_floats == 36 * 8 * 18
    mid, dst = poisoned(ctx, queue, 2 * 8 * 144), poisoned(ctx, queue, 2 * 4 * 144)
    first.enqueue(queue, to_device(ctx, x1), mid, 2, 12, 12)
    second.enqueue(queue, mid, dst, 2, 12, 12)
    y1 = conv3x3_relu(x1.astype(np.float64), w1.astype(np.float64), b1.astype(np.float64))
    ref = conv3x3_relu(y1, w2.astype(np.float64), b2.astype(np.float64))
    assert rel_err(read(queue, dst, (2, 4, 12, 12)), ref) < TOL4


@pytest.mark.parametrize("params,gemm_flops", [(winograd.GPU_DEFAULT, 2.0 * 16 * 2 * 3 * 2 * 7 * 5),
                                               (PARAMS4[0], 2.0 * 36 * 2 * 2 * 1 * 7 * 5)], ids=["F2", "F4"])
def test_enqueue_returns_first_and_last_event_and_flops_count_the_direct_convolution(cl_env, rng, params,
                                                                                       gemm_flops):
    x, weight, bias, _ = problem(rng, (2, 5, 7, 6, 4))
    layer, _ = run_layer(cl_env, params, x, weight, bias)
    ctx, queue, _ = cl_env
    first, last = layer.enqueue(queue, to_device(ctx, x), poisoned(ctx, queue, 2 * 7 * 24), 2, 6, 4)
    assert (first, last) == (layer.events[0], layer.events[-1]) and len(layer.events) == 3
    assert layer.flops(2, 6, 4) == 2.0 * 2 * 6 * 4 * 7 * 5 * 9
    assert layer.gemm_flops(2, 6, 4) == gemm_flops


@pytest.mark.parametrize("bad", [dict(TM=64, TN=64, TK=16, WM=3, WN=4), dict(TM=64, TN=64, TK=1, WM=4, WN=4),
                                 dict(TM=64, TN=64, TK=16, WM=4, WN=4, WINO_M=3)])
def test_invalid_winograd_params_are_refused_with_the_rule(bad):
    with pytest.raises(ValueError, match="winograd params"):
        winograd.check_params({"ALGO": "winograd", **bad})


def test_every_tuning_candidate_is_valid_and_algo_is_not_a_define():
    for kind in ("gpu", "cpu"):
        cands = winograd.candidates(kind, local_mem=48 * 1024, max_wg=1024)
        assert cands[0] == winograd.default_params(kind) and len(cands) >= 3
        for p in cands:
            assert winograd.is_winograd(p) and "ALGO" not in winograd.defines(p)
            assert winograd.defines(p)["WINO_M"] == winograd.tile_size(p)
        f4 = [p for p in cands if winograd.tile_size(p) == 4]
        assert len(f4) >= 2 and all(p["WINO_M"] == 4 for p in f4)
        assert all("WINO_M" not in p for p in cands if p not in f4)  # F(2x2) entries as tables always stored them
    assert winograd.defines(winograd.GPU_DEFAULT) == winograd.defines({**winograd.GPU_DEFAULT, "WINO_M": 2})


# ---- whole networks -----------------------------------------------------------------------------------------
def force_winograd(monkeypatch, kind_params=None):
    """Every 3x3 layer (size > 1) of the engine gets Winograd params; FC layers keep theirs."""
    original = vgg16_module.conv_params_for

    def patched(params, cin, cout, size, *rest, **kw):
        if size > 1:
            return dict(kind_params or winograd.default_params(devs.resolve(TEST_DEVICE).kind))
        return original(params, cin, cout, size, *rest, **kw)

    monkeypatch.setattr(vgg16_module, "conv_params_for", patched)


@pytest.mark.parametrize("m", winograd.TILE_SIZES, ids=lambda m: f"F{m}")
def test_tiny_network_with_every_conv_on_winograd_matches_float64(tiny_tensors, monkeypatch, m):
    force_winograd(monkeypatch, winograd.default_params(devs.resolve(TEST_DEVICE).kind, m))
    x = np.random.default_rng(11).standard_normal((3, 3, 224, 224)).astype(np.float32)
    with vgg16_module.VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=2) as model:  # chunks of 2 + 1
        assert all(isinstance(layer, WinogradLayer) and layer.tile == m for _, layer in model.convs)
        out = model.logits(x)
    ref = reference_logits(tiny_tensors, x)
    assert not np.isnan(out).any() and rel_err(out, ref) < TOL
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_selection_through_the_tuned_table_and_defaults_unchanged(tiny_tensors, monkeypatch, tmp_path):
    from vggserve import tuning
    from vggserve.runtime.params import shape_key

    from vggserve.runtime import params as params_module

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(params_module, "shipped_file", lambda: tmp_path / "no-shipped-table.json")
    with vgg16_module.VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        assert all(type(layer) is GemmLayer for _, layer in model.convs)  # the code's defaults never pick Winograd
    spec = model.spec
    chosen = {shape_key(spec.convs[1].cin, spec.convs[1].cout, 224), shape_key(spec.convs[12].cin,
                                                                                 spec.convs[12].cout, 14)}
    tuning.store(devs.resolve(TEST_DEVICE).label, {k: winograd.default_params("gpu") for k in chosen}, batch=1)
    x = np.random.default_rng(12).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with vgg16_module.VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        kinds = [type(layer).__name__ for _, layer in model.convs]
        out = model.logits(x)
    # features.2 (its own 224x224 key) and the three 14x14 layers features.24/26/28 (one key)
    assert [i for i, k in enumerate(kinds) if k == "WinogradLayer"] == [1, 10, 11, 12]
    ref = reference_logits(tiny_tensors, x)
    assert rel_err(out, ref) < TOL
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_a_tuned_entry_with_wino_m_4_runs_that_layer_on_f4(tiny_tensors, monkeypatch, tmp_path):
    from vggserve import tuning
    from vggserve.runtime import params as params_module
    from vggserve.runtime.params import shape_key

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(params_module, "shipped_file", lambda: tmp_path / "no-shipped-table.json")
    spec = vgg16_module.vgg16_spec(0.125)
    key28 = shape_key(spec.convs[8].cin, spec.convs[8].cout, 28)   # features.19/21
    key14 = shape_key(spec.convs[12].cin, spec.convs[12].cout, 14)  # features.24/26/28
    f2, f4 = winograd.default_params("gpu"), winograd.default_params("gpu", 4)
    assert f4["WINO_M"] == 4 and "WINO_M" not in f2
    tuning.store(devs.resolve(TEST_DEVICE).label, {key28: f2, key14: f4}, batch=1)
    x = np.random.default_rng(14).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with vgg16_module.VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        tiles = [getattr(layer, "tile", None) for _, layer in model.convs]
        out = model.logits(x)
    # the stored table means F(2x2) where it has no WINO_M and F(4x4) where it says 4; GEMM elsewhere
    assert tiles == [None] * 8 + [2, 2, 4, 4, 4]
    ref = reference_logits(tiny_tensors, x)
    assert not np.isnan(out).any() and rel_err(out, ref) < TOL
    np.testing.assert_array_equal(top5(out), top5(ref))


@pytest.mark.parametrize("m", winograd.TILE_SIZES, ids=lambda m: f"F{m}")
def test_full_vgg16_with_every_conv_on_winograd_matches_float64(full_tensors, monkeypatch, m):
    force_winograd(monkeypatch, winograd.default_params(devs.resolve(TEST_DEVICE).kind, m))
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with vgg16_module.VGG16(full_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        assert all(isinstance(layer, WinogradLayer) and layer.tile == m for _, layer in model.convs)
        out = model.logits(x)
    ref = reference_logits(full_tensors, x)
    assert not np.isnan(out).any() and rel_err(out, ref) < TOL
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_tune_with_winograd_times_its_candidates_and_a_winograd_winner_runs_in_the_engine(tiny_tensors, monkeypatch,
                                                                                           tmp_path):
    from vggserve import tuning
    from vggserve.runtime.params import params_for

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    info = devs.resolve(TEST_DEVICE)
    device = devs.cl_device(info)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] in ("64x64x14", "512x1000x1")]
    winners, trials = tuning.tune(info, device, batch=1, limit=2, repeats=1, shapes=shapes,
                                  progress=lambda _: None, winograd_too=True)
    n_wino = len(winograd.candidates(info.kind, device.local_mem_size, device.max_work_group_size))
    wino_trials = [t for t in trials if winograd.is_winograd(t.params)]
    assert len(wino_trials) == n_wino and {t.shape for t in wino_trials} == {"64x64x14"}  # 3x3 shapes only
    assert all(t.ok and t.ms > 0 for t in trials)
    # whatever won, store a Winograd entry for the 14x14 layers and check the engine's logits
    tuning.store(info.label, {"64x64x14": wino_trials[0].params, "512x1000x1": winners["512x1000x1"]}, batch=1)
    assert winograd.is_winograd(params_for(info.kind, info.label)["conv_by_batch"]["1"]["64x64x14"])
    x = np.random.default_rng(13).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with vgg16_module.VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        assert sum(isinstance(layer, WinogradLayer) for _, layer in model.convs) == 3
        out = model.logits(x)
    assert rel_err(out, reference_logits(tiny_tensors, x)) < TOL
