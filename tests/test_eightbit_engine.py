"""--precision fp8 and int8 end to end: the layer plan (features.0 and classifier.6 at FP16, the scales from the
calibration), the whole network on tensor cores (emulated on PoCL: VGGSERVE_EMULATE_MMA=1) against float64 and
FP32, VGG16.load's calibration beside the weights, and the command line's one-line refusals."""

import hashlib
import json

import numpy as np
import pytest

from conftest import TEST_DEVICE
from test_cli import IMAGES, vggserve

from vggserve.errors import CalibrationError
from vggserve.model.eightbit import FP16_LAYERS, layer_plans
from vggserve.model.reference import reference_logits
from vggserve.ops import precision as precisions
from vggserve.quant.calibrate import from_histograms, observe
from vggserve.quant.calibration import LAYERS, save, sidecar_path
from vggserve.quant.methods import DEFAULT_METHODS

# relative L2 error of each image's logits against float64 (width 1/16, seed 3; calibrated with max on 4 other
# inputs); measured here: INT8 0.021 to 0.023, FP8 0.108 to 0.133 (rounding compounding over 14 8-bit layers)
BOUND = {"int8": 0.06, "fp8": 0.2}


@pytest.fixture(scope="module")
def small_tensors():
    from vggserve.weights.init import init_weights

    return init_weights(seed=3, width=0.0625)


def calibration_of(tensors, method="max", seed=11, n=4):
    x = np.random.default_rng(seed).standard_normal((n, 3, 224, 224)).astype(np.float32)
    hists, images = observe(tensors, [x])
    return from_histograms(hists, images, "0" * 64, method)


def rel_err(got, ref):
    return np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)


def test_the_plan_keeps_features_0_and_classifier_6_at_fp16_and_chains_the_scales(small_tensors):
    cal = calibration_of(small_tensors, n=1)
    for prec, top in ((precisions.INT8, 255.0), (precisions.FP8, 448.0)):
        plans = layer_plans(prec, cal, list(LAYERS))
        assert FP16_LAYERS == ("features.0", "classifier.6")
        first, second, before_last, last = (plans[n] for n in ("features.0", "features.2", "classifier.3",
                                                                "classifier.6"))
        assert first.precision == precisions.FP16 and first.in_scale is None and first.out_codes == prec
        assert first.out_scale == second.in_scale == cal.amax["features.2"] / top
        assert second.precision == prec and second.out_scale == plans["features.5"].in_scale
        assert before_last.out_scale is None and before_last.out_codes is None  # FP16 into classifier.6
        assert last.precision == precisions.FP16 and last.in_scale is None and last.out_scale is None
        # what the engine passes to the kernels' make(): nothing for classifier.6, which any FP16 entry may run;
        # features.0 writes codes, so only an entry with 8-bit kernels may run it
        assert last.kwargs == {} and last.codes == precisions.FP16 and first.codes == prec
        assert first.kwargs == {"out_scale": first.out_scale, "out_codes": prec}


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_whole_network_at_8_bits_is_within_the_bound_of_float64_and_keeps_fp32s_top_5(small_tensors, monkeypatch,
                                                                                       name):
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    cal = calibration_of(small_tensors)
    x = np.random.default_rng(5).standard_normal((3, 3, 224, 224)).astype(np.float32)  # not calibrated on
    with VGG16.load(small_tensors, device=TEST_DEVICE, max_batch_size=2, precision=name, calibration=cal) as model:
        assert model.family == "tensorcore" and model.precision.name == name
        out = model.logits(x)  # two chunks: 2 + 1 images
        plan = {k["name"]: k["kernel"] for k in model.kernel_plan()}
    with VGG16.load(small_tensors, device=TEST_DEVICE, max_batch_size=3) as fp32:
        top1 = fp32.logits(x).argmax(1)
    ref = reference_logits(small_tensors, x)
    codes = "u8" if name == "int8" else "e4m3"
    assert f"fp16 in, {codes} out" in plan["features.0"] and f"{codes} in, {codes} out" in plan["features.2"]
    assert f"{codes} in, fp16 out" in plan["classifier.3"] and " in, " not in plan["classifier.6"]
    assert out.dtype == np.float32 and not np.isnan(out).any()
    assert np.all(rel_err(out, ref) < BOUND[name])
    top5 = np.argsort(-out, axis=1)[:, :5]
    assert all(t in row for t, row in zip(top1, top5)), "FP32's top-1 must be in the 8-bit top 5"


def test_8_bits_from_arrays_without_a_calibration_is_a_one_line_error(small_tensors, monkeypatch):
    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    with pytest.raises(CalibrationError) as err:
        VGG16.load(small_tensors, device=TEST_DEVICE, precision="int8")
    assert "\n" not in str(err.value) and "vggserve calibrate --precision int8" in str(err.value)


def test_load_reads_the_precisions_own_calibration_beside_the_weights(tmp_path, small_tensors, monkeypatch):
    from safetensors.numpy import save_file

    from vggserve import VGG16

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    path = tmp_path / "small.safetensors"
    save_file(small_tensors, str(path))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(CalibrationError, match=r"has no INT8 calibration .*small\.safetensors\.int8\.json does not "
                                               r"exist\); make one with `vggserve calibrate --weights .* --precision "
                                               r"int8 --images DIR`"):
        VGG16.load(path, device=TEST_DEVICE, precision="int8")
    cal = calibration_of(small_tensors, "percentile", n=1)
    save(type(cal)(sha, cal.method, cal.images, cal.percentile, cal.amax), sidecar_path(path, "int8"))
    assert sidecar_path(path, "int8").name == "small.safetensors.int8.json"
    with VGG16.load(path, device=TEST_DEVICE, max_batch_size=1, precision="int8") as model:
        assert model.calibration.weights_sha256 == sha and model.calibration.method == "percentile"
    with pytest.raises(CalibrationError, match="no FP8 calibration"):  # FP8 reads its own file
        VGG16.load(path, device=TEST_DEVICE, precision="fp8")


# ---- the command line ------------------------------------------------------------------------------------------------
def test_classify_at_int8_without_a_calibration_says_how_to_make_one_in_one_line(tiny_weights_path):
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--precision", "int8",
                 IMAGES[0], env={"VGGSERVE_EMULATE_MMA": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "has no INT8 calibration" in line
    assert f"vggserve calibrate --weights {tiny_weights_path} --precision int8 --images DIR" in line


def test_calibrate_defaults_to_the_precisions_recommended_method_and_file(tiny_weights_path, tmp_path):
    from pathlib import Path

    assert DEFAULT_METHODS == {"fp8": "max", "int8": "percentile"}
    out = tmp_path / "cal.json"
    r = vggserve("calibrate", "--weights", tiny_weights_path, "--images", Path(IMAGES[0]).parent, "--precision",
                 "int8", "--output", out, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "precision: int8" in r.stdout and "method: percentile (99.99th percentile)" in r.stdout
    assert json.loads(out.read_text())["method"] == "percentile"


def test_serve_at_int8_without_a_calibration_is_refused_before_it_starts(tiny_weights_path):
    r = vggserve("serve", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--precision", "int8",
                 "--host", "127.0.0.1", "--port", "0", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "has no INT8 calibration" in r.stderr and "--precision int8 --images DIR" in r.stderr


def test_bench_calibrates_generated_weights_by_the_precisions_method_and_reads_a_files_sidecar(small_tensors,
                                                                                               tiny_weights_path):
    from vggserve.cli.bench import GENERATED_SHA256, eight_bit_calibration
    from vggserve.weights import load_weights

    assert eight_bit_calibration("fp16", None, small_tensors) is None
    cal = eight_bit_calibration("int8", None, small_tensors)()  # called by the engine once the device runs int8
    assert cal.method == "percentile" and cal.images == 2 and cal.weights_sha256 == GENERATED_SHA256
    assert cal.amax["features.2"] > 0
    read = eight_bit_calibration("fp8", load_weights(tiny_weights_path), None)
    with pytest.raises(CalibrationError, match="has no FP8 calibration"):
        read()
