"""The whole network on the OpenCL engine against the float64 numpy reference, and the engine's mechanics."""

import re

import numpy as np
import pytest

from vggserve import VGG16
from vggserve.errors import DeviceError
from vggserve.model.reference import reference_logits
from vggserve.runtime import devices as devs
from vggserve.runtime.programs import ProgramCache

from conftest import TEST_DEVICE


def max_rel_err(out, ref):
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def top5(scores):
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


@pytest.fixture(scope="module")
def tiny_model(tiny_weights_path):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as model:
        yield model


@pytest.mark.parametrize("batch", [1, 3, 4, 9])  # gemv path, gemm path, exactly max, chunked past max
def test_tiny_network_matches_float64_reference(tiny_model, tiny_tensors, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    out = tiny_model.logits(x)
    ref = reference_logits(tiny_tensors, x)
    assert out.shape == (batch, 1000) and out.dtype == np.float32
    assert max_rel_err(out, ref) < 1e-4
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_full_vgg16_matches_float64_reference(full_tensors):
    x = np.random.default_rng(7).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with VGG16.load(full_tensors, device=TEST_DEVICE, max_batch_size=2) as model:
        out = model.logits(x)
    ref = reference_logits(full_tensors, x)
    assert max_rel_err(out, ref) < 1e-4
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_probabilities_are_the_softmax_of_the_logits(tiny_model):
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224)).astype(np.float32)
    z = tiny_model.logits(x).astype(np.float64)
    p = tiny_model.probabilities(x)
    expected = np.exp(z - z.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(p, expected, rtol=1e-4, atol=1e-7)


def test_repeated_calls_reuse_buffers_and_give_identical_results(tiny_model):
    x = np.random.default_rng(4).standard_normal((3, 3, 224, 224)).astype(np.float32)
    first = tiny_model.logits(x)
    buffers = (*((n.ping, n.pong) for n in tiny_model.lanes), *(s.input for s in tiny_model.slots),
               *(s.host_out.ctypes.data for s in tiny_model.slots))
    tiny_model.logits(x[:1])
    np.testing.assert_array_equal(tiny_model.logits(x), first)
    assert (*((n.ping, n.pong) for n in tiny_model.lanes), *(s.input for s in tiny_model.slots),
            *(s.host_out.ctypes.data for s in tiny_model.slots)) == buffers


def test_wrong_input_shape_is_a_clear_error(tiny_model):
    with pytest.raises(ValueError, match=r"logits takes normalised float32 \(N, 3, 224, 224\), got float32 "):
        tiny_model.logits(np.zeros((1, 3, 32, 32), np.float32))


@pytest.mark.parametrize("call, array, own, other", [
    ("logits", np.zeros((1, 3, 224, 224), np.uint8), r"normalised float32 \(N, 3, 224, 224\)", "logits_from_pixels"),
    ("probabilities", np.zeros((1, 224, 224, 3), np.float32), r"normalised float32 \(N, 3, 224, 224\)",
     "probabilities_from_pixels"),
    ("probabilities_from_pixels", np.zeros((1, 224, 224, 3), np.float32), r"uint8 RGB crops \(N, 224, 224, 3\)",
     "probabilities"),
    ("logits_from_pixels", np.zeros((1, 3, 224, 224), np.uint8), r"uint8 RGB crops \(N, 224, 224, 3\)", "logits"),
])
def test_an_input_of_the_wrong_form_names_its_own_shape_and_the_other_function(tiny_model, call, array, own, other):
    """logits(uint8 NCHW) quoted the pixel functions' (N, 224, 224, 3), probabilities_from_pixels(float32 NHWC)
    the tensor functions' (N, 3, 224, 224): each now says what it takes and which function takes the other form."""
    got = re.escape(f"got {array.dtype} {array.shape}")
    with pytest.raises(ValueError, match=rf"^{call} takes {own}, {got}; for .* use {other}$"):
        getattr(tiny_model, call)(array)


def test_a_model_ends_its_program_cache_run_when_its_start_is_over(tiny_tensors, monkeypatch):
    """The summary of a long run of compiles ("compiled 13 OpenCL programs in 128.3 s") comes at the end of the
    model's start (runtime/buildprogress.py); nothing else would end the run."""
    finished = []
    monkeypatch.setattr(ProgramCache, "finish", lambda self: finished.append(self))
    with VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        assert finished == [model.program_cache]


def test_weights_info_names_the_file_and_its_checksum(tiny_model, tiny_weights_path):
    import hashlib

    info = tiny_model.weights_info
    assert info["path"] == str(tiny_weights_path) and info["format"] == "safetensors"
    assert info["sha256"] == hashlib.sha256(tiny_weights_path.read_bytes()).hexdigest()


def test_second_start_loads_programs_from_the_cache_without_compiling(tiny_tensors, tmp_path, monkeypatch):
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    first = VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1)
    assert first.startup.programs_compiled > 0 and first.startup.programs_cached == 0
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = first.logits(x)

    def refuse(*_):
        raise AssertionError("a miss although the cache holds the program (its binary, or a note of a build that "
                             "PoCL's own cache holds)")

    monkeypatch.setattr(ProgramCache, "_compile_and_store", refuse)
    second = VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1)
    assert second.startup.programs_compiled == 0 and second.startup.programs_cached == first.startup.programs_compiled
    np.testing.assert_array_equal(second.logits(x), expected)


def test_device_specs_resolve_or_explain():
    cpu = devs.resolve("cpu")
    assert cpu.kind == "cpu" and cpu.usable
    assert devs.resolve(cpu.spec) == cpu
    assert devs.resolve("auto").usable
    with pytest.raises(DeviceError, match="bad device spec"):
        devs.resolve("tpu")
    with pytest.raises(DeviceError, match="no CPU device number 99"):
        devs.resolve("cpu:99")
    if not any(d.kind == "gpu" and d.usable for d in devs.list_devices()):
        with pytest.raises(DeviceError, match="no usable GPU device"):
            devs.resolve("gpu")


def test_a_platform_and_device_spec_that_selects_nothing_says_which_part_is_wrong():
    """`--device 5:0` used to say "no OpenCL 5:0 device number 0"."""
    devices = devs.list_devices()
    platforms = {d.platform_index for d in devices}
    missing_platform = max(platforms, default=-1) + 1
    with pytest.raises(DeviceError, match=rf"^no OpenCL device {missing_platform}:0: there is no OpenCL platform "
                                          rf"{missing_platform} with devices \(usable devices: "):
        devs.resolve(f"{missing_platform}:0")
    if devices:
        platform = devices[0].platform_index
        count = sum(d.platform_index == platform for d in devices)
        with pytest.raises(DeviceError, match=rf"^no OpenCL device {platform}:{count}: platform {platform} has "
                                              rf"{count} device{'' if count == 1 else 's'}, numbered from 0 \("):
            devs.resolve(f"{platform}:{count}")


def test_nvidia_driver_without_icd_is_diagnosed_with_the_fix(monkeypatch, tmp_path):
    lib = tmp_path / "libnvidia-opencl.so.1"
    lib.write_bytes(b"")
    monkeypatch.setattr(devs, "NVIDIA_LIB_DIRS", (str(tmp_path),))
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path / "vendors"))
    notes = devs.diagnose(devices=())
    assert any(str(lib) in n and "nvidia.icd" in n and "OCL_ICD_VENDORS" in n for n in notes)
    assert any("no OpenCL platform found" in n for n in notes)


def test_ping_pong_buffers_hold_exactly_the_largest_activation(tiny_model):
    from vggserve.model.vgg16 import activation_sizes

    sizes = activation_sizes(tiny_model.spec)
    assert max(sizes) == 8 * 224 * 224  # conv1 output of the width-1/8 network
    lane = tiny_model.lanes[0]
    assert lane.ping.size == lane.pong.size == 4 * max(sizes) * tiny_model.max_batch_size


def crops(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)


@pytest.mark.parametrize("n", [1, 3, 9])  # gemv path, gemm path, chunked past max_batch_size
def test_pixels_give_exactly_the_logits_of_host_normalised_input(tiny_model, n):
    from vggserve.preprocess import normalize_pixels

    px = crops(n)
    x = np.stack([normalize_pixels(p, "torchvision") for p in px])
    np.testing.assert_array_equal(tiny_model.logits_from_pixels(px), tiny_model.logits(x))
    np.testing.assert_array_equal(tiny_model.probabilities_from_pixels(px), tiny_model.probabilities(x))


def test_caffe_models_normalise_pixels_in_bgr(tiny_tensors):
    from vggserve.preprocess import normalize_pixels

    px = crops(2, seed=1)
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=2, preprocessing="caffe") as model:
        x = np.stack([normalize_pixels(p, "caffe") for p in px])
        np.testing.assert_array_equal(model.logits_from_pixels(px), model.logits(x))


def test_submitted_batches_overlap_and_each_gets_its_own_result(tiny_model):
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal((n, 3, 224, 224)).astype(np.float32) for n in (4, 1, 3)] + [crops(2, seed=3)]
    expected = [tiny_model.logits(b) if b.dtype != np.uint8 else tiny_model.logits_from_pixels(b) for b in batches]
    pending = [tiny_model.submit(b) for b in batches]  # four in flight through two slots: the third collects the first
    for p, e in zip(reversed(pending), reversed(expected)):  # collected out of order
        np.testing.assert_array_equal(p.result(), e)
    assert all(p.done() for p in pending)
    probs = tiny_model.submit(batches[0], want="probabilities").result()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("bad,match", [(np.zeros((5, 3, 224, 224), np.float32), "1 to max_batch_size=4"),
                                       (np.zeros((1, 224, 224, 4), np.uint8), r"uint8 pixels of shape"),
                                       (np.zeros((1, 3, 224, 224), np.uint8), r"uint8 pixels of shape")])
def test_submit_refuses_what_it_cannot_run(tiny_model, bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_model.submit(bad)


def test_submit_refuses_an_unknown_output(tiny_model):
    with pytest.raises(ValueError, match="want must be"):
        tiny_model.submit(np.zeros((1, 3, 224, 224), np.float32), want="logit")
    np.testing.assert_array_equal(tiny_model.logits(np.zeros((1, 3, 224, 224), np.float32)),
                                  tiny_model.logits(np.zeros((1, 3, 224, 224), np.float32)))


def test_fully_connected_layers_split_over_k_match_float64(tiny_tensors, monkeypatch):
    import vggserve.engine.engine as engine

    real = engine.params_for
    monkeypatch.setattr(engine, "params_for", lambda kind, label: {**real(kind, label), "splitk_groups": 10_000})
    x = np.random.default_rng(11).standard_normal((6, 3, 224, 224)).astype(np.float32)
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=6) as model:
        assert all(fc.split.used_for(6) for _, fc in model.fcs)
        out = model.logits(x)
    ref = reference_logits(tiny_tensors, x)
    assert max_rel_err(out, ref) < 1e-4
    np.testing.assert_array_equal(top5(out), top5(ref))


def test_classify_names_the_image_of_a_list_that_cannot_be_read(tiny_tensors, tmp_path):
    from PIL import Image

    from vggserve.images import ImageDecodeError

    good = tmp_path / "good.png"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(good)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=4) as model:
        with pytest.raises(ImageDecodeError, match=r"^images\[2\]: .*bad\.jpg") as info:
            model.classify([good, Image.open(good), bad, good])
        assert info.value.index == 2
        assert len(model.classify([good, Image.open(good)], top_k=2)) == 2


@pytest.mark.parametrize("single", ["cat.jpg", b"\xff\xd8", "path", "image"])
def test_classify_of_one_image_not_in_a_list_is_a_type_error_saying_to_pass_a_list(tiny_model, tmp_path, single):
    """classify("cat.jpg") read the string letter by letter: `images[0]: file 'c' does not exist`."""
    from pathlib import Path

    from PIL import Image

    single = {"path": Path("cat.jpg"), "image": Image.new("RGB", (8, 8))}.get(single, single)
    with pytest.raises(TypeError, match=r"classify takes a list of images .*: pass \[image\]"):
        tiny_model.classify(single)


def test_submit_survives_another_thread_collecting_the_slot_between_its_look_and_its_wait(tiny_tensors):
    """Pending.result() from the caller's thread clears slot.pending; submit (and close) must read it once."""
    from vggserve.engine.staging import Slot

    class CollectedMeanwhile(Slot):  # another thread collects the batch just after submit has looked at it
        @property
        def pending(self):
            value = self.__dict__["pending"]
            if value is not None and not self.__dict__.get("collecting"):
                self.__dict__["collecting"] = True  # result() itself looks at slot.pending
                value.result()
                self.__dict__["collecting"] = False
            return value

        @pending.setter
        def pending(self, value):
            self.__dict__["pending"] = value

    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1) as model:
        expected = model.logits(x)
        first = [model.submit(x), model.submit(x)]  # both slots hold a batch
        for slot in model.slots:
            slot.__class__ = CollectedMeanwhile
        later = [model.submit(x), model.submit(x)]
        for p in first + later:
            np.testing.assert_array_equal(p.result(), expected)
        model.submit(x)
        model.close()  # collects what is in flight, through the same look


def test_a_closed_engine_says_so(tiny_tensors):
    model = VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1)
    model.close()
    model.close()  # twice is harmless
    x = np.zeros((1, 3, 224, 224), np.float32)
    for call in (lambda: model.submit(x), lambda: model.logits(x), lambda: model.resize_matches_pillow()):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_kernel_plan_says_tuned_only_where_the_table_used_has_the_shape(tiny_tensors, monkeypatch):
    """Tables are per batch and the one nearest max_batch_size is used: a shape tuned at another batch only is not
    what runs, and the plan must not say it is."""
    import vggserve.engine.engine as engine

    tile = {"TM": 32, "TN": 32, "TK": 8, "WM": 2, "WN": 2, "LPAD": 1}
    tables = {"conv_by_batch": {"1": {"3x8x224": tile}, "16": {"8x16x112": tile}}}
    real = engine.params_for
    monkeypatch.setattr(engine, "params_for", lambda kind, label: {**real(kind, label), **tables})
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=16) as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
    assert "tuned for this shape" in plan["features.5"]  # 8x16x112: in the batch-16 table
    assert "family default (no tuned entry)" in plan["features.0"], plan["features.0"]  # 3x8x224: batch 1 only


def test_a_tuned_entry_for_the_other_kernel_family_falls_back_to_the_default(tiny_tensors, monkeypatch):
    """An FP16 table written for the other kernel family, e.g. tuned with VGGSERVE_EMULATE_MMA=1 (tensor-core
    entries) and read by a plain FP16 start (portable kernels) on the same device, or a portable entry read where FP16
    runs on tensor cores: the layer runs on its family's default instead of failing with a KeyError."""
    import vggserve.engine.engine as engine
    from vggserve.ops import precision as precisions, registry
    from vggserve.runtime import caps as device_caps, devices as devs

    info = devs.resolve(TEST_DEVICE)
    family = registry.family_for(device_caps.of(devs.cl_device(info), info.kind, info.label), precisions.FP16)
    foreign = ({"ALGO": "tc_halo", "BM": 64, "BN": 64, "WARPS_M": 2, "WARPS_N": 2, "STAGES": 2}
               if family == "portable" else {"ALGO": "winograd", "WINO_M": 2})
    real = engine.params_for
    # the tensor cores run features.0 on conv_first.cl, which no table entry chooses: there the next two layers
    first, second = ("features.0", "features.2") if family == "portable" else ("features.2", "features.5")
    keys = ("3x8x224", "8x8x224") if family == "portable" else ("8x8x224", "8x16x112")
    monkeypatch.setattr(engine, "params_for",
                        lambda kind, label: {**real(kind, label), "conv_by_batch_fp16": {"1": {
                            keys[0]: foreign, keys[1]: {"ALGO": "from_a_newer_version"}}}})
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=1, precision="fp16") as model:
        assert model.family == family
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
        out = model.logits(x)
    assert "family default" in plan[first] and foreign["ALGO"] in plan[first], plan[first]
    assert "family default" in plan[second] and "from_a_newer_version" in plan[second], plan[second]
    ref = reference_logits(tiny_tensors, x)
    assert max_rel_err(out, ref) < 1e-2


def test_a_batch_beyond_what_the_kernels_index_is_a_one_line_setting_error(tiny_weights_path, monkeypatch):
    """The kernels count a batch's activation values in 32-bit ints (full width: 669 images); the cap is scaled
    down here so that the tiny network meets it at batch 5."""
    from vggserve.engine import engine
    from vggserve.errors import SettingError

    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=1) as one:
        per_image = max(s.out_bytes for s in one.steps[:-1]) // one.precision.itemsize
    monkeypatch.setattr(engine, "INDEX_LIMIT", 4 * per_image)
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as four:
        assert four.max_batch_size == 4
    with pytest.raises(SettingError, match=r"max_batch_size=5 is more than .* at most 4 images per batch") as info:
        VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=5)
    assert isinstance(info.value, ValueError) and info.value.exit_code == 2
