"""kernels/conv_first.cl (ops/first_conv.py): the tensor-core family's first convolution from the float32 NCHW input,
bit for bit against a numpy model of its arithmetic, on awkward sizes, and as features.0 of the engine."""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.ops import precision as precisions
from vggserve.ops.first_conv import VARIANTS, FirstConv, fits, mma_fragments, ulps_apart
from vggserve.ops.launch import MF
from vggserve.ops.registry import BuildEnv, LayerSpec
from vggserve.ops.tensorcore import rna_tf32
from vggserve.quant import e4m3
from vggserve.runtime import devices as devs

from conftest import TEST_DEVICE
from test_tensorcore import stored, tc_env  # noqa: F401 - tc_env, the fixture: (ctx, queue, cache, caps)

SHAPES = [  # (n, cin, cout, h, w)
    (1, 3, 64, 1, 1),
    (2, 3, 21, 5, 7),     # an odd cout: a pair with a padding channel, then zeros to 24
    (1, 1, 8, 9, 4),
    (3, 4, 70, 13, 11),
    (1, 3, 64, 16, 16),
]


def model(x, w, b, prec, relu=True):
    """The kernel's arithmetic in numpy float32: inputs and weights rounded to the storage, each product exact in
    float32 (11-bit significands), summed in the order (c, ky, kx) from 0 (an fma of an exact product is one
    rounded add), then + bias and ReLU: float32 NHWC (n, h, w, cout)."""
    xs, ws = stored(x, prec).astype(np.float32), stored(w, prec).astype(np.float32)
    n, c, h, wd = x.shape
    pad = np.pad(xs, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((n, h, wd, w.shape[0]), np.float32)
    for ci in range(c):
        for ky in range(3):
            for kx in range(3):
                acc = (acc + pad[:, ci, ky:ky + h, kx:kx + wd, None] * ws[:, ci, ky, kx]).astype(np.float32)
    out = (acc + b).astype(np.float32)
    return np.maximum(out, np.float32(0)) if relu else out


def run(tc_env, prec, shape, rng, out_scale=None, out_codes=None, relu=True, params=None):
    ctx, queue, cache, caps = tc_env
    n, cin, cout, h, w = shape
    layer = LayerSpec("conv3x3", cin, cout, h, relu=relu)
    weight = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    op = FirstConv(ctx, cache, prec, layer, weight, bias, BuildEnv(caps=caps, max_batch=n), out_scale=out_scale,
                   out_codes=out_codes, params=params)
    store = op.scales.out_precision.storage
    out = np.full((n * h * w, op.cstore), 0xFF, np.uint8).view(store) if store == np.uint8 else \
        np.full((n * h * w, op.cstore), np.nan, store)
    src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
    dst = cl.Buffer(ctx, MF.READ_WRITE | MF.COPY_HOST_PTR, hostbuf=out)
    op.enqueue(queue, src, dst, n, h, w)
    cl.enqueue_copy(queue, out, dst)
    queue.finish()
    return out.reshape(n, h, w, op.cstore), model(x, weight, bias, prec, relu), op


@pytest.mark.parametrize("prec", [precisions.FP16, precisions.TF32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_first_conv_matches_the_numpy_model_bit_for_bit(tc_env, rng, prec, shape):
    got, want, op = run(tc_env, prec, shape, rng)
    assert op.p == {"CF_PIX": 1, "CF_CONST": 0, "CF_MMA": 1}  # the H100's fastest (BENCHMARKS.md, eighteenth session)
    cout = shape[2]
    expect = rna_tf32(want) if prec.tf32 else want.astype(np.float16)
    assert_stored_equal(got[..., :cout], expect, op.p, tc_env[3])
    assert not got[..., cout:].view(np.uint8).any(), "the padding channels must be zero (the next layer reads them)"
    assert op.cstore == -(-cout // (4 if prec.tf32 else 8)) * (4 if prec.tf32 else 8)


def variant_id(p):
    return "mma" if p["CF_MMA"] else f"pix{p['CF_PIX']}_const{p['CF_CONST']}"


def assert_stored_equal(got, expect, params, caps):
    """Bit for bit; but mma.sync on the hardware sums in its own way (not an fma chain): there, within one unit in
    the last place of the storage type, beyond 2^-20 (a sum near zero of terms near one), nine in ten exact."""
    if params["CF_MMA"] and not caps.emulate_mma:
        off = ulps_apart(got, expect, expect.dtype == np.float32)
        diff = np.abs(got.astype(np.float64) - expect.astype(np.float64))
        assert off.max() <= 1 and (diff == 0).mean() > 0.9, (off.max(), (diff == 0).mean())
    else:
        np.testing.assert_array_equal(got.view(np.uint8), expect.view(np.uint8))


@pytest.mark.parametrize("params", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("prec", [precisions.FP16, precisions.TF32], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 21, 5, 7), (3, 3, 64, 13, 11), (1, 4, 70, 9, 13), (1, 1, 8, 3, 2)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_variant_computes_the_same_bytes(tc_env, prec, shape, params):
    """Two pixels a work-item, the weights from constant memory, the tensor cores: the same arithmetic, the same bytes
    (a work-group of 128 pixels cut by NPIX = 150, 429, 117 and 6; 4 input channels: 36 taps, 3 FP16 k-steps, one
    of them partly padding; one channel: 9 taps, one step)."""
    got, want, _ = run(tc_env, prec, shape, np.random.default_rng(3), params=params)
    expect = rna_tf32(want) if prec.tf32 else want.astype(np.float16)
    assert_stored_equal(got[..., :shape[2]], expect, params, tc_env[3])
    assert not got[..., shape[2]:].view(np.uint8).any()


@pytest.mark.parametrize("prec", [precisions.FP16, precisions.TF32], ids=str)
def test_the_weights_as_mma_fragments(prec):
    """mma_fragments against mma.clh's B layout, element by element: lane 4 g + t holds column g of its n8 tile and
    k = 4t / ELEM + e, then 16 / ELEM more, of each k-step; taps past the layer's are zeros."""
    rng = np.random.default_rng(5)
    taps, coutp = 27, 16
    laid = rng.standard_normal((taps, coutp)).astype(np.float32)
    laid = rna_tf32(laid) if prec.tf32 else laid.astype(np.float16).astype(np.float32)
    frag = mma_fragments(laid, prec)
    per, kps = (1, 8) if prec.tf32 else (2, 16)
    assert frag.shape == (-(-taps // kps), coutp // 8, 2, 32) and frag.dtype == np.uint32
    for ks in range(frag.shape[0]):
        for nt in range(frag.shape[1]):
            for r in range(2):
                for lane in range(32):
                    g, t = divmod(lane, 4)
                    for e in range(per):
                        k = ks * kps + r * kps // 2 + t * per + e
                        want = laid[k, nt * 8 + g] if k < taps else 0.0
                        word = int(frag[ks, nt, r, lane])
                        got = np.uint32(word).view(np.float32) if prec.tf32 else \
                            np.uint16((word >> (16 * e)) & 0xFFFF).view(np.float16)
                        assert float(got) == float(want), (ks, nt, r, lane, e)


def test_first_conv_without_relu_keeps_the_negatives(tc_env, rng):
    got, want, _ = run(tc_env, precisions.FP16, (2, 3, 16, 6, 5), rng, relu=False)
    assert (want < 0).any()
    np.testing.assert_array_equal(got.view(np.uint8), want.astype(np.float16).view(np.uint8))


@pytest.mark.parametrize("codes", [precisions.INT8, precisions.FP8], ids=str)
def test_first_conv_writes_the_next_layers_8_bit_codes(tc_env, rng, codes):
    """An 8-bit model's features.0: FP16 arithmetic, the output scaled by 1 / s_out into u8 or e4m3 codes."""
    s_out = 0.013
    for params in (None, {"CF_PIX": 1, "CF_CONST": 0, "CF_MMA": 1}):
        got, want, op = run(tc_env, precisions.FP16, (2, 3, 21, 7, 5), np.random.default_rng(11), out_scale=s_out,
                            out_codes=codes, params=params)
        scaled = (want * np.float32(1 / s_out)).astype(np.float32)
        expect = np.clip(np.rint(scaled), 0, 255).astype(np.uint8) if codes.int8 else e4m3.encode(scaled)
        assert op.cstore == 32
        if params and not tc_env[3].emulate_mma:  # mma.sync's own sums: a code may round the other way
            step = np.abs(got[..., :21].astype(np.int16) - expect.astype(np.int16))
            assert step.max() <= 1 and (step == 0).mean() > 0.99
        else:
            np.testing.assert_array_equal(got[..., :21], expect)
        assert not got[..., 21:].any()


def test_what_it_takes():
    fp16 = precisions.FP16
    assert fits(LayerSpec("conv3x3", 3, 64, 224), fp16) and fits(LayerSpec("conv3x3", 3, 64, 224), precisions.TF32)
    assert not fits(LayerSpec("conv3x3", 64, 64, 224), fp16)  # 9 registers an input channel: a few only
    assert not fits(LayerSpec("conv3x3", 3, 64, 224), precisions.INT8)  # an 8-bit model's features.0 is FP16
    assert not fits(LayerSpec("conv3x3", 3, 64, 224, pool=True), fp16)
    with pytest.raises(ValueError, match="conv_first.cl computes"):
        FirstConv(None, None, fp16, LayerSpec("conv3x3", 64, 64, 224), None, None, None)
    with pytest.raises(ValueError, match="parameters are one of"):
        FirstConv(None, None, fp16, LayerSpec("conv3x3", 3, 8, 4), np.zeros((8, 3, 3, 3), np.float32),
                  np.zeros(8, np.float32), None, params={"CF_PIX": 3, "CF_CONST": 0})


def test_the_tuner_leaves_the_first_convolution_to_conv_first(tc_env):
    """A tensor-core model never runs features.0 on a tuned tile, so `vggserve tune` skips that shape, saying why."""
    from vggserve import tuning

    info = devs.resolve(TEST_DEVICE)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] in ("3x8x224", "8x16x112")]
    said = []
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=1, repeats=1, shapes=shapes,
                                  progress=said.append, precision="fp16")
    assert set(winners) == {"8x16x112"} and {t.shape for t in trials} == {"8x16x112"}
    assert any(line.strip().startswith("3x8x224") and "conv_first.cl" in line for line in said), said
