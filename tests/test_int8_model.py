"""INT8 (s8, exact integer sums): the rounding, the scales, the layer and the whole numpy network, and the entropy
method on INT8's grid."""

from pathlib import Path

import numpy as np
import pytest

from vggserve.quant import int8
from vggserve.quant.calibrate import entropy_amax, from_histograms, observe
from vggserve.quant.calibration import LAYERS, Calibration
from vggserve.quant.histogram import AbsHistogram
from vggserve.quant.reference import QuantizedWeights, fp8_layer, fp8_logits

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "images"
SHA = "cd" * 32


def _inputs(count=2):
    from vggserve.preprocessing import load_and_preprocess

    paths = sorted(EXAMPLES.iterdir())
    return np.stack([load_and_preprocess(paths[i % len(paths)]) for i in range(count)])


def _calibration(amax=3.0):
    return Calibration(SHA, "max", 3, None, {name: amax for name in LAYERS})


# --- rounding and scales -----------------------------------------------------------------------------------------

def test_to_int8_rounds_half_to_even_and_clips_to_127_like_numpy(rng):
    values = np.concatenate([rng.uniform(-300, 300, 100_000), np.arange(-130, 131) + 0.5, [-128, 127.4, 127.5, 1e30]])
    values = values.astype(np.float32)
    want = np.clip(np.rint(values.astype(np.float64)), -127, 127)
    np.testing.assert_array_equal(int8.to_int8(values), want)
    assert int8.to_int8(np.float32([0.5, 1.5, 2.5, -0.5, -2.5])).tolist() == [0, 2, 2, 0, -2]  # ties to even
    assert int8.to_int8(np.float32([-1e9])).tolist() == [-127]  # -128 is never used: the grid is symmetric


def test_to_int8_refuses_nan_naming_it():
    with pytest.raises(ValueError, match="NaN has no INT8 value"):
        int8.to_int8(np.float32([1.0, np.nan]))


def test_int8_weight_scales_are_each_output_channels_amax_over_127_against_numpy(rng):
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    w[2] = 0
    want = np.abs(w.reshape(5, -1)).max(axis=1) / np.float32(127)
    want[2] = 1.0
    np.testing.assert_array_equal(int8.weight_scales(w), want.astype(np.float32))
    codes = int8.quantize(w, int8.weight_scales(w))
    assert codes.dtype == np.int8 and np.abs(codes.reshape(5, -1)).max(axis=1).tolist() == [127, 127, 0, 127, 127]


def test_int8_round_trip_is_within_half_a_step_and_clips_at_127_steps(rng):
    scale = 0.05
    x = rng.uniform(-10, 10, 50_000).astype(np.float32)
    back = int8.dequantize(int8.quantize(x, scale), scale)
    inside = np.abs(x) <= 127 * scale
    assert np.all(np.abs(back[inside] - x[inside]) <= scale / 2 * (1 + 1e-5))
    np.testing.assert_allclose(back[~inside], np.sign(x[~inside]) * 127 * np.float32(scale), rtol=1e-6)
    np.testing.assert_array_equal(int8.quantize(x, scale), np.clip(np.rint(x * np.float32(1 / scale)), -127, 127))


# --- exact sums and the layer ------------------------------------------------------------------------------------

def test_exact_sum_is_the_integer_sum_even_past_float32s_exact_integers(rng):
    matmul = lambda a, w: a @ w.T  # noqa: E731
    big_a = np.full((2, 4608), 127, np.float32)  # VGG16's longest convolution sum, every product 127^2
    big_w = np.full((3, 4608), 127, np.float32)
    big_w[1, ::2] = -125
    want = big_a.astype(np.int64) @ big_w.astype(np.int64).T  # up to 7.4e7 > 2^24: float32 would round
    assert np.abs(want).max() > int8.EXACT_FLOAT32
    got = int8.exact_sum(matmul, big_a, big_w)
    np.testing.assert_array_equal(got, want)
    small_a = rng.integers(-20, 21, (4, 300)).astype(np.float32)
    small_w = rng.integers(-127, 128, (5, 300)).astype(np.float32)
    got = int8.exact_sum(matmul, small_a, small_w)  # within the bound: float32, and still exact
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, small_a.astype(np.int64) @ small_w.astype(np.int64).T)


def test_int8_layer_is_dequantised_input_times_dequantised_weights_plus_bias(tiny_tensors, rng):
    from vggserve.model.reference import conv3x3_relu

    cal = _calibration()
    layer = fp8_layer(QuantizedWeights(tiny_tensors), cal, fmt="int8")
    s_in = 3.0 / 127
    for name, shape in (("features.5", (2, 6, 5, 8)), ("classifier.3", (3, 512))):
        a = rng.standard_normal(shape).astype(np.float32) * 2  # some beyond 3.0: clipped
        w, b = tiny_tensors[f"{name}.weight"], tiny_tensors[f"{name}.bias"].astype(np.float64)
        s_w = int8.weight_scales(w)
        a64 = int8.dequantize(int8.quantize(a, s_in), s_in).astype(np.float64)
        w64 = int8.dequantize(int8.quantize(w, s_w), s_w).astype(np.float64)
        if w.ndim == 4:
            want = conv3x3_relu(a64.transpose(0, 3, 1, 2), w64, b, relu=False).transpose(0, 2, 3, 1)
        else:
            want = a64 @ w64.T + b
        np.testing.assert_allclose(layer(name, a), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


INT8_BOUND = 0.08  # relative L2 error of each image's logits, INT8 everywhere against float64 (width 1/8, max)


def test_int8_model_is_within_the_stated_bound_of_float64_and_all_fp16_brings_it_to_fp16s(tiny_tensors):
    from vggserve.model.reference import reference_logits

    x = _inputs(3)
    hists, images = observe(tiny_tensors, [x])
    cal = from_histograms(hists, images, SHA, "max")
    ref = reference_logits(tiny_tensors, x)
    weights = QuantizedWeights(tiny_tensors)
    error = lambda got: np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)  # noqa: E731
    assert np.all(error(fp8_logits(weights, x, cal, fmt="int8")) < INT8_BOUND)
    assert np.all(error(fp8_logits(weights, x, cal, fp16_layers=LAYERS, fmt="int8")) < 1e-3)


def test_unknown_8bit_format_is_refused_naming_the_formats(tiny_tensors):
    with pytest.raises(ValueError, match="no 8-bit format 'int4'; formats: fp8, int8"):
        fp8_logits(tiny_tensors, _inputs(1), _calibration(), fmt="int4")


def test_resuming_at_a_layer_from_its_input_equals_the_whole_pass(tiny_tensors):
    """What --sensitivity relies on: a pass started at layer k from the input `upto=k` returned is the same pass."""
    weights, cal, x = QuantizedWeights(tiny_tensors), _calibration(), _inputs(2)
    whole = fp8_logits(weights, x, cal, fmt="int8")
    for name in ("features.0", "features.7", "classifier.0", "classifier.6"):
        a = fp8_logits(weights, x, cal, fmt="int8", upto=name)
        np.testing.assert_array_equal(fp8_logits(weights, a, cal, fmt="int8", start=name), whole)


# --- entropy on INT8's grid --------------------------------------------------------------------------------------

def _hist(values):
    h = AbsHistogram()
    h.add(np.asarray(values, np.float32))
    return h


def test_int8_entropy_keeps_a_range_that_is_already_an_int8_grid(rng):
    step = 0.01
    levels = np.clip(np.rint(rng.normal(0, 30, 1_000_000)), -127, 127)  # every value on the grid, the ends rare
    levels = np.concatenate([levels, [127, -127]])
    hist = _hist(levels * step)
    assert entropy_amax(hist, grid="int8") == pytest.approx(127 * step, rel=1e-3)


def test_int8_entropy_clips_a_heavy_tail_and_keeps_a_uniform_range(rng):
    heavy = _hist(rng.standard_t(3, 2_000_000))
    assert entropy_amax(heavy, grid="int8") < 0.3 * heavy.max
    uniform = _hist(rng.uniform(-3, 3, 2_000_000))
    assert 0.98 * uniform.max <= entropy_amax(uniform, grid="int8") <= uniform.max


def test_unknown_entropy_grid_is_refused():
    with pytest.raises(ValueError, match="no entropy grid 'int4'; grids: fp8, int8"):
        entropy_amax(_hist([1.0, 2.0]), grid="int4")
