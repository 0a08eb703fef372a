"""FP8 calibration: scales, quantise/dequantise, the three calibration methods, the sidecar beside the weights,
`vggserve calibrate` on good and bad input, and the numpy FP8 model of the whole network."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from vggserve.cli import main
from vggserve.errors import CalibrationError, VggserveError
from vggserve.quant import e4m3
from vggserve.quant.calibrate import entropy_amax, from_histograms, kl_best_bins, observe
from vggserve.quant.calibration import (LAYERS, Calibration, dequantize, load_for, quantize, reciprocal, save,
                                        sidecar_path, weight_scales)
from vggserve.quant.histogram import AbsHistogram
from vggserve.quant.reference import QuantizedWeights, fp8_layer, fp8_logits
from vggserve.quant.rounding import to_e4m3

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "images"
SHA = "ab" * 32


def _same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(b)
    return np.array_equal(np.isnan(a), nan) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


def _calibration(**changes):
    fields = dict(weights_sha256=SHA, method="max", images=3, percentile=None,
                  amax={name: 1.0 + i for i, name in enumerate(LAYERS)})
    return Calibration(**{**fields, **changes})


# --- rounding and scales -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 2.0 ** -10, 3.0, 2.0 ** 6, 1 / 448])
def test_fast_e4m3_rounding_is_round_trip_bit_for_bit_on_every_float16(scale):
    with np.errstate(invalid="ignore"):  # NaN * scale
        values = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32) * np.float32(scale)
    assert _same_bits(to_e4m3(values), e4m3.round_trip(values))


def test_fast_e4m3_rounding_matches_on_ties_specials_and_random_float32(rng):
    finite = e4m3.VALUES[np.isfinite(e4m3.VALUES)]
    ordered = np.unique(finite)
    ties = ((ordered[1:].astype(np.float64) + ordered[:-1]) / 2).astype(np.float32)  # halfway: exact in float32
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 479.9, 480.0, 1e30, -1e30,
                         2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -10 * 3, 1e-45], np.float32)
    randoms = (rng.standard_normal(200_000) * np.exp(rng.uniform(-12, 7, 200_000))).astype(np.float32)
    for values in (ties, -ties, specials, randoms):
        assert _same_bits(to_e4m3(values), e4m3.round_trip(values))


def test_weight_scales_are_each_output_channels_amax_over_448_against_numpy(rng):
    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32) * np.arange(1, 7, dtype=np.float32)[:, None, None, None]
    w[3] = 0
    scales = weight_scales(w)
    expected = np.abs(w).max(axis=(1, 2, 3)) / np.float32(448)
    expected[3] = 1.0  # a channel of zeros: no division by zero
    assert scales.dtype == np.float32
    np.testing.assert_array_equal(scales, expected.astype(np.float32))
    codes = quantize(w, scales)
    amax_codes = codes.reshape(6, -1)[np.arange(6), np.abs(w.reshape(6, -1)).argmax(axis=1)]
    assert set(amax_codes[[0, 1, 2, 4, 5]] & 0x7F) == {0x7E}  # each channel's largest weight becomes +-448


def test_quantize_is_e4m3_of_x_times_the_float32_reciprocal_per_tensor_and_per_channel(rng):
    x = rng.standard_normal((4, 7, 3, 3)).astype(np.float32) * 5
    np.testing.assert_array_equal(quantize(x, 0.03), e4m3.encode(x * np.float32(1 / 0.03)))
    per_channel = np.array([0.01, 0.02, 0.5, 3.0], np.float32)
    codes = quantize(x, per_channel)
    for n in range(4):
        np.testing.assert_array_equal(codes[n], quantize(x[n], per_channel[n]))
        np.testing.assert_array_equal(dequantize(codes, per_channel)[n], e4m3.decode(codes[n]) * per_channel[n])
    assert codes.dtype == np.uint8
    np.testing.assert_array_equal(reciprocal(per_channel), (1 / per_channel.astype(float)).astype(np.float32))


def test_quantize_dequantize_round_trip_is_within_e4m3s_half_step_and_saturates(rng):
    x = rng.uniform(-10, 10, 100_000).astype(np.float32)
    scale = 10 / 448
    back = dequantize(quantize(x, scale), scale)
    normal = np.abs(x) >= scale * e4m3.MIN_NORMAL
    # 3 mantissa bits: the nearest value is within 2^-4 of x (relative); subnormals within half of 2^-9 (absolute)
    assert np.all(np.abs(back - x)[normal] <= np.abs(x[normal]) * 2.0 ** -4 * (1 + 1e-6))
    assert np.all(np.abs(back - x)[~normal] <= scale * 2.0 ** -10 * (1 + 1e-6))
    saturated = dequantize(quantize([25.0, -1e9], scale), scale)
    np.testing.assert_array_equal(saturated, np.float32([448, -448]) * np.float32(scale))


def test_activation_scale_is_amax_over_448_and_one_for_an_all_zero_input():
    cal = _calibration(amax={**{name: 2.24 for name in LAYERS}, "classifier.6": 0.0})
    assert cal.scale("features.0") == 2.24 / 448
    assert cal.scale("classifier.6") == 1.0
    with pytest.raises(KeyError, match="features.1'"):
        cal.scale("features.1")


# --- histograms and methods ---------------------------------------------------------------------------------------

def test_histogram_keeps_the_exact_max_and_percentiles_within_a_bin_of_numpy(rng):
    data = rng.standard_normal(1_000_000).astype(np.float32) * 3
    data[: 300_000] = 0  # as after a ReLU: zeros count in the percentile
    h = AbsHistogram()
    for part in np.array_split(data, 9):
        h.add(part)
    assert h.max == float(np.abs(data).max()) and h.total == data.size and h.zeros == 300_000
    for p in (10.0, 50.0, 99.0, 99.99, 100.0):
        assert abs(h.percentile(p) - np.percentile(np.abs(data), p)) <= h.width, p


def test_histogram_merged_batch_by_batch_equals_one_pass_whatever_the_order(rng):
    """The range grows by doubling and merging bin pairs: exact, so the order of the batches does not matter."""
    small, large = rng.uniform(0, 0.01, 50_000).astype(np.float32), rng.uniform(0, 700, 50_000).astype(np.float32)
    one, forward, backward = AbsHistogram(), AbsHistogram(), AbsHistogram()
    one.add(np.concatenate([small, large]))
    forward.add(small), forward.add(large)
    backward.add(large), backward.add(small)
    for h in (forward, backward):
        assert h.range == one.range == 1024.0
        np.testing.assert_array_equal(h.counts, one.counts)


def test_histogram_refuses_values_that_are_not_finite():
    with pytest.raises(ValueError, match="not finite"):
        AbsHistogram().add(np.array([1.0, np.nan], np.float32))


def _hist(values) -> AbsHistogram:
    h = AbsHistogram()
    h.add(np.asarray(values, np.float32))
    return h


def test_max_and_percentile_methods_read_the_known_answer(rng):
    data = rng.standard_normal((40, 1000)).astype(np.float32)
    hists = {name: _hist(data * (i + 1)) for i, name in enumerate(LAYERS)}
    cal = from_histograms(hists, 40, SHA, "max")
    assert cal.amax["features.2"] == float(np.abs(data * 2).max()) and cal.percentile is None
    cal = from_histograms(hists, 40, SHA, "percentile", 99.0)
    assert cal.percentile == 99.0
    for i, name in enumerate(LAYERS):
        want = np.percentile(np.abs(data * (i + 1)), 99.0)
        assert abs(cal.amax[name] - want) <= hists[name].width
    assert from_histograms(hists, 40, SHA, "percentile").percentile == 99.99  # the default


def test_entropy_clips_a_heavy_tail_well_below_its_max_and_keeps_a_uniform_range(rng):
    heavy = _hist(rng.standard_t(3, 2_000_000))
    assert entropy_amax(heavy) < 0.3 * heavy.max
    uniform = _hist(rng.uniform(-3, 3, 2_000_000))
    assert entropy_amax(uniform) >= 0.98 * uniform.max
    assert entropy_amax(uniform) <= uniform.max  # never past the largest value


def test_entropy_ignores_exact_zeros_that_would_pull_the_threshold_down(rng):
    values = rng.uniform(0, 3, 1_000_000).astype(np.float32)
    with_zeros = np.concatenate([values, np.zeros(1_000_000, np.float32)])  # a ReLU's output
    assert entropy_amax(_hist(with_zeros)) == entropy_amax(_hist(values))


def test_kl_keeps_every_bin_when_there_are_no_more_bins_than_levels():
    assert kl_best_bins(np.ones(100), levels=128) == 100
    assert kl_best_bins(np.ones(300), levels=128) == 300  # flat: nothing worth clipping


def test_observe_histograms_every_layers_input_over_all_batches(tiny_tensors, rng):
    x = rng.standard_normal((3, 3, 224, 224)).astype(np.float32)
    seen = []
    hists, images = observe(tiny_tensors, [x[:2], x[2:]], progress=seen.append)
    assert images == 3 and seen == [2, 1] and set(hists) == set(LAYERS)
    assert hists["features.0"].max == float(np.abs(x).max())
    assert hists["features.0"].total == x.size
    assert hists["classifier.0"].total == 3 * 512 // 8 * 49  # the flattened pooled features of width 1/8


def test_unknown_method_is_refused(rng):
    with pytest.raises(ValueError, match="max, percentile, entropy"):
        from_histograms({}, 1, SHA, "minmax")


# --- the sidecar --------------------------------------------------------------------------------------------------

def test_sidecar_sits_beside_the_weights_and_round_trips(tmp_path):
    weights = tmp_path / "vgg16.safetensors"
    assert sidecar_path(weights) == tmp_path / "vgg16.safetensors.fp8.json"
    cal = _calibration(method="percentile", percentile=99.99)
    save(cal, sidecar_path(weights))
    assert load_for(weights, SHA) == cal
    assert os.listdir(tmp_path) == ["vgg16.safetensors.fp8.json"]  # no temporary file left
    assert json.loads(sidecar_path(weights).read_text())["format"] == "vggserve-fp8-calibration"


def test_missing_sidecar_says_how_to_calibrate_in_one_line(tmp_path):
    with pytest.raises(CalibrationError) as info:
        load_for(tmp_path / "my weights.safetensors", SHA)
    message = str(info.value)
    assert "\n" not in message and "does not exist" in message
    assert f"vggserve calibrate --weights '{tmp_path / 'my weights.safetensors'}' --images DIR" in message
    assert info.value.exit_code == 2 and isinstance(info.value, VggserveError)


def test_sidecar_of_other_weights_is_refused_naming_both_hashes(tmp_path):
    weights = tmp_path / "w.safetensors"
    save(_calibration(), sidecar_path(weights))
    with pytest.raises(CalibrationError, match=f"made for other weights \\(sha256 {SHA}, .* has {'cd' * 32}\\)"):
        load_for(weights, "cd" * 32)


@pytest.mark.parametrize("damage, said", [
    (lambda text: text[: len(text) // 2], "not JSON"),
    (lambda text: "[]", "not a vggserve FP8 calibration"),
    (lambda text: text.replace('"version": 1', '"version": 2'), "version 2; this vggserve reads version 1"),
    (lambda text: text.replace('"features.2"', '"features.3"'), "amax must name exactly the layers"),
    (lambda text: text.replace('"features.0": 1.0', '"features.0": -1.0'), "amax of features.0 must be"),
    (lambda text: text.replace('"method": "max"', '"method": "mse"'), "method must be one of"),
    (lambda text: text.replace('"images": 3', '"images": 0'), "images must be"),
    (lambda text: text.replace('"images": 3,', ''), "missing 1 required positional argument: 'images'"),
    (lambda text: text.replace(SHA, "xyz"), "weights_sha256 must be 64"),
])
def test_damaged_sidecar_is_refused_in_one_line_saying_what_is_wrong(tmp_path, damage, said):
    weights = tmp_path / "w.safetensors"
    sidecar_path(weights).write_text(damage(_calibration().to_json()))
    with pytest.raises(CalibrationError) as info:
        load_for(weights, SHA)
    assert "is damaged" in str(info.value) and said in str(info.value) and "\n" not in str(info.value)
    assert "vggserve calibrate --weights" in str(info.value)


def test_percentile_is_recorded_only_for_the_percentile_method():
    with pytest.raises(CalibrationError, match="percentile must be null"):
        _calibration(percentile=99.9)
    with pytest.raises(CalibrationError, match=r"percentile must be in \(0, 100\]"):
        _calibration(method="percentile", percentile=None)


# --- vggserve calibrate -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """Weights of width 1/16 made by `vggserve weights init` (fast), in a folder of their own."""
    path = tmp_path_factory.mktemp("w") / "vgg16.safetensors"
    assert main(["weights", "init", "--seed", "0", "--width", "0.0625", "--output", str(path)]) == 0
    return path


@pytest.fixture
def weights_file(tiny_file, tmp_path):
    path = tmp_path / "weights" / "vgg16.safetensors"
    path.parent.mkdir()
    shutil.copy(tiny_file, path)
    return path


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    shutil.copytree(EXAMPLES, folder)
    return folder


def _calibrate(capsys, *argv):
    code = main(["calibrate", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_stores_the_scales_beside_the_weights(capsys, weights_file, images):
    from vggserve.weights import sha256_file

    code, out, _ = _calibrate(capsys, "--weights", str(weights_file), "--images", str(images), "--batch-size", "2")
    assert code == 0
    assert f"path: {sidecar_path(weights_file)}" in out and "images: 3" in out
    cal = load_for(weights_file, sha256_file(weights_file))
    assert cal.method == "max" and cal.images == 3 and cal.percentile is None
    assert all(cal.amax[name] > 0 for name in LAYERS)
    assert sorted(os.listdir(weights_file.parent)) == ["vgg16.safetensors", "vgg16.safetensors.fp8.json"]


def test_calibrate_method_percentile_limit_and_output(capsys, weights_file, images, tmp_path):
    out_file = tmp_path / "elsewhere.json"
    code, out, _ = _calibrate(capsys, "--weights", str(weights_file), "--images", str(images), "--limit", "2",
                              "--method", "percentile", "--percentile", "99.9", "--output", str(out_file))
    assert code == 0 and "99.9th percentile" in out
    cal = Calibration.from_json(out_file.read_text())
    assert (cal.method, cal.percentile, cal.images) == ("percentile", 99.9, 2)
    assert not sidecar_path(weights_file).exists()


def test_calibrate_entropy_gives_ranges_no_wider_than_max(capsys, weights_file, images, tmp_path):
    for method in ("max", "entropy"):
        assert _calibrate(capsys, "--weights", str(weights_file), "--images", str(images), "--method", method,
                          "--output", str(tmp_path / f"{method}.json"))[0] == 0
    high, clipped = (Calibration.from_json((tmp_path / f"{m}.json").read_text()) for m in ("max", "entropy"))
    assert all(0 < clipped.amax[name] <= high.amax[name] for name in LAYERS)


def _tree(*folders):
    return {str(p) for folder in folders for p in Path(folder).rglob("*")}


def _fails(capsys, code_wanted, said, *argv, folders):
    before = _tree(*folders)
    code, out, err = _calibrate(capsys, *argv)
    assert code == code_wanted, err
    assert err.count("\n") == 1 and err.startswith("vggserve: error: ") and said in err, err
    assert out == "" and _tree(*folders) == before  # nothing written
    return err


def test_calibrate_with_no_images_fails_in_one_line_writing_nothing(capsys, weights_file, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no pictures here")
    _fails(capsys, 2, f"--images {empty}: no image files below it", "--weights", str(weights_file),
           "--images", str(empty), folders=[weights_file.parent, empty])
    _fails(capsys, 2, f"--images {tmp_path / 'nowhere'} does not exist", "--weights", str(weights_file),
           "--images", str(tmp_path / "nowhere"), folders=[weights_file.parent])


@pytest.mark.parametrize("bad, said", [
    (b"this is not an image", "is not a recognised image"),
    (None, "is truncated"),  # a valid header, its data cut short: found in the pass, not in the header check
])
def test_calibrate_stops_at_an_unreadable_image_naming_it_and_writes_nothing(capsys, weights_file, images, bad, said):
    target = images / "zz_broken.jpg"
    target.write_bytes(bad if bad is not None else (EXAMPLES / "sunset.jpg").read_bytes()[:3000])
    err = _fails(capsys, 5, f"file '{target}' {said}", "--weights", str(weights_file), "--images", str(images),
                 folders=[weights_file.parent, images])
    assert "calibration stopped and nothing was written" in err


def test_calibrate_refuses_weights_that_are_not_vgg16_or_missing(capsys, weights_file, images, tmp_path):
    from safetensors.numpy import save_file

    from vggserve.weights import load_weights

    tensors = dict(load_weights(weights_file).tensors)
    tensors["features.2.weight"] = tensors["features.2.weight"][:, :3]  # wrong shape
    wrong = tmp_path / "weights" / "wrong.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(wrong))
    _fails(capsys, 4, "features.2.weight", "--weights", str(wrong), "--images", str(images),
           folders=[wrong.parent, images])
    missing = tmp_path / "none.safetensors"
    _fails(capsys, 4, f"weights file {missing} does not exist", "--weights", str(missing), "--images", str(images),
           folders=[tmp_path / "weights", images])


def test_calibrate_refuses_a_percentile_without_the_percentile_method(capsys, weights_file, images):
    _fails(capsys, 2, "--percentile applies to --method percentile", "--weights", str(weights_file),
           "--images", str(images), "--percentile", "99.9", folders=[weights_file.parent])


def test_calibrate_refuses_an_output_in_a_missing_folder_before_the_pass(capsys, weights_file, images, tmp_path):
    _fails(capsys, 2, "does not exist; create it first", "--weights", str(weights_file), "--images", str(images),
           "--output", str(tmp_path / "no" / "cal.json"), folders=[tmp_path])


# --- the numpy FP8 model ------------------------------------------------------------------------------------------

def _inputs(count=2):
    from vggserve.preprocessing import load_and_preprocess

    paths = sorted(EXAMPLES.iterdir())
    return np.stack([load_and_preprocess(paths[i % len(paths)]) for i in range(count)])


def test_channels_last_forward_equals_the_float64_reference(tiny_tensors):
    from vggserve.model.reference import dense_layer, reference_logits, staged_logits
    from vggserve.weights.spec import vgg16_spec

    x = _inputs()
    got = staged_logits(vgg16_spec(0.125), x, dense_layer(tiny_tensors, np.float64))
    np.testing.assert_allclose(got, reference_logits(tiny_tensors, x), rtol=0, atol=1e-10)


def test_fp8_model_with_every_layer_fp16_equals_an_fp16_rounding_model(tiny_tensors):
    """The independent model: the NCHW float64 reference with each layer's input and weights rounded to float16.
    Layer by layer, on the same input, the two agree to float32's accumulation; over the whole network a sum that
    lands beside a float16 tie rounds the other way now and then and the 1-ulp differences travel on, so the logits
    agree to FP16's own precision (about 6e-4 here, against 9e-4 between either and unrounded float64)."""
    from vggserve.model.reference import conv3x3_relu, maxpool2x2, staged_logits
    from vggserve.weights.spec import vgg16_spec

    x, t = _inputs(), tiny_tensors
    half = lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float64)  # noqa: E731
    fp16 = fp8_layer(QuantizedWeights(t), _calibration(), fp16_layers=LAYERS)
    worst = {}

    def independent(name, a):  # a: channels last, as staged_logits passes it
        w, b = half(t[f"{name}.weight"]), t[f"{name}.bias"].astype(np.float64)
        if w.ndim == 4:
            out = conv3x3_relu(half(a).transpose(0, 3, 1, 2), w, b, relu=False).transpose(0, 2, 3, 1)
        else:
            out = half(a) @ w.T + b
        worst[name] = np.abs(fp16(name, a.astype(np.float32)) - out).max() / np.abs(out).max()
        return out

    staged_logits(vgg16_spec(0.125), x.astype(np.float64), independent)
    assert set(worst) == set(LAYERS) and max(worst.values()) < 1e-5, worst

    spec, a = vgg16_spec(0.125), x
    for conv in spec.convs:
        a = conv3x3_relu(half(a), half(t[f"{conv.name}.weight"]), t[f"{conv.name}.bias"].astype(np.float64))
        a = maxpool2x2(a) if conv.pool_after else a
    a = a.reshape(len(a), -1)
    for fc in spec.fcs:
        a = half(a) @ half(t[f"{fc.name}.weight"]).T + t[f"{fc.name}.bias"]
        a = np.maximum(a, 0) if fc.relu else a
    got = fp8_logits(t, x, _calibration(), fp16_layers=LAYERS)
    assert np.all(np.linalg.norm(got - a, axis=1) < 2e-3 * np.linalg.norm(a, axis=1))


def test_fp8_layer_is_dequantised_input_times_dequantised_weights_plus_bias(tiny_tensors, rng):
    weights = QuantizedWeights(tiny_tensors)
    cal = _calibration(amax={name: 3.0 for name in LAYERS})
    layer = fp8_layer(weights, cal)
    for name, shape in (("features.5", (2, 6, 5, 8)), ("classifier.3", (3, 512))):
        a = rng.standard_normal(shape).astype(np.float32) * 2
        w, b = tiny_tensors[f"{name}.weight"], tiny_tensors[f"{name}.bias"].astype(np.float64)
        s_w = weight_scales(w)
        a64 = dequantize(quantize(a, cal.scale(name)), cal.scale(name)).astype(np.float64)
        w64 = e4m3.decode(quantize(w, s_w)).astype(np.float64) * s_w.reshape((-1,) + (1,) * (w.ndim - 1))
        if w.ndim == 4:
            from vggserve.model.reference import conv3x3_relu

            want = conv3x3_relu(a64.transpose(0, 3, 1, 2), w64, b, relu=False).transpose(0, 2, 3, 1)
        else:
            want = a64 @ w64.T + b
        np.testing.assert_allclose(layer(name, a), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


FP8_BOUND = 0.25  # relative L2 error of each image's logits, FP8 everywhere against float64 (width 1/8, max)


def test_fp8_model_is_within_the_stated_bound_of_float64_and_fp16_edges_bring_it_closer(tiny_tensors):
    from vggserve.model.reference import reference_logits

    x = _inputs(3)
    hists, images = observe(tiny_tensors, [x])
    cal = from_histograms(hists, images, SHA, "max")
    ref = reference_logits(tiny_tensors, x)
    weights = QuantizedWeights(tiny_tensors)
    error = lambda got: np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)  # noqa: E731
    fp8 = error(fp8_logits(weights, x, cal))
    assert np.all(fp8 < FP8_BOUND), fp8
    assert np.all(error(fp8_logits(weights, x, cal, fp16_layers=LAYERS)) < 1e-3)


def test_fp8_model_refuses_an_unknown_fp16_layer(tiny_tensors):
    with pytest.raises(ValueError, match="no layer features.1 in VGG16"):
        fp8_logits(tiny_tensors, _inputs(1), _calibration(), fp16_layers={"features.1"})
