"""vggserve.decoding: the exact decoder gives Pillow's pixels bit for bit on the realistic mix and on awkward files;
the fast mode scales JPEGs down in the DCT never below what Resize(256) needs, agrees with the exact mode, keeps
the exact mode's errors, and is chosen with --decode on every command."""

import io
import subprocess
import sys

import numpy as np
import pytest
from image_corpus import EXPECTED, Bad, build_corpus
from PIL import Image

from vggserve.decoding import check_decode, decode_input, decode_pixels, jpeg, model_input
from vggserve.decoding.corpus import MIX, Kind, photo_like, write_mix
from vggserve.images import dct_scale, open_image
from vggserve.modelinput import ModelInput, device_input
from vggserve.preprocess import center_crop, load_and_preprocess

CI_SCALE = 0.5  # the mix at half its sides (the 12 MP photos become 3 MP: still reduced by the fast mode)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return write_mix(tmp_path_factory.mktemp("mix"), scale=CI_SCALE)


@pytest.fixture(scope="module")
def awkward(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("awkward"))


def pixels_of(decoded) -> np.ndarray:
    return decoded if isinstance(decoded, np.ndarray) else np.asarray(decoded)


SMALL_KINDS = (Kind("plain", (64, 48), options=dict(quality=90)), Kind("turned", (64, 48), orientation=6),
               Kind("png", (40, 30), fmt="PNG"))


def test_write_mix_rewrites_files_of_another_scale_and_reuses_those_of_its_own(tmp_path):
    """A folder written at scale 1 was reused as it was for scale 0.5 (and the other way round)."""
    full = write_mix(tmp_path, scale=1.0, kinds=SMALL_KINDS)
    sizes = {name: Image.open(path).size for name, path in full.items()}
    assert sizes == {"plain.jpg": (64, 48), "turned.jpg": (48, 64), "png.png": (40, 30)}
    half = write_mix(tmp_path, scale=0.5, kinds=SMALL_KINDS)
    assert {name: Image.open(path).size for name, path in half.items()} == \
        {"plain.jpg": (32, 24), "turned.jpg": (24, 32), "png.png": (20, 16)}  # 16: the smallest side
    written = {name: path.stat().st_mtime_ns for name, path in half.items()}
    assert {name: path.stat().st_mtime_ns for name, path in write_mix(tmp_path, 0.5, SMALL_KINDS).items()} == written


def test_write_mix_killed_while_saving_leaves_nothing_for_the_next_run_to_reuse(tmp_path, monkeypatch):
    """A file was saved in place: a run killed part way left a truncated JPEG that the next run reused."""
    real_save = Image.Image.save

    def killed_half_way(image, fp, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(image, buffer, *args, **kwargs)
        data = buffer.getvalue()
        if isinstance(fp, (str, bytes)) or hasattr(fp, "__fspath__"):
            with open(fp, "wb") as handle:
                handle.write(data[: len(data) // 2])
        else:
            fp.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Image.Image, "save", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        write_mix(tmp_path, kinds=SMALL_KINDS[:1])
    monkeypatch.setattr(Image.Image, "save", real_save)
    files = write_mix(tmp_path, kinds=SMALL_KINDS[:1])
    Image.open(files["plain.jpg"]).load()  # whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.jpg"]


def test_simplejpeg_is_installed_and_adopted_here():
    """A dependency of the package: with it, JPEGs skip Pillow's decoder (the probe found the same pixels)."""
    assert jpeg.simplejpeg is not None and jpeg.adopted()


def test_the_exact_decoder_gives_pillows_pixels_on_the_realistic_mix(mix):
    assert {name.rsplit("_", 1)[0].split(".")[0] for name in mix} >= {"imagenet", "photo", "png", "progressive"}
    through_libjpeg = 0
    for name, path in mix.items():
        decoded = decode_pixels(path)
        through_libjpeg += isinstance(decoded, np.ndarray) or name.startswith("photo_12mp_sideways")
        want = np.asarray(open_image(path))
        assert np.array_equal(pixels_of(decoded), want), name
    assert through_libjpeg == sum(kind.count for kind in MIX if kind.fmt == "JPEG" and kind.mode != "CMYK")


@pytest.mark.parametrize("on_device", [True, False])
def test_model_inputs_are_the_pillow_paths_on_awkward_files_and_errors_read_the_same(awkward, on_device):
    for name, path in awkward.items():
        got, problem = decode_input(str(path), "torchvision", on_device=on_device)
        try:
            image = open_image(path)
        except Exception as exc:
            assert isinstance(EXPECTED[name], Bad)
            assert problem == (str(exc), type(exc).__name__), name
            continue
        want = device_input(image) if on_device else ModelInput.tensor(load_and_preprocess(path))
        assert got.form == want.form, name
        got, want = got.array, want.array
        assert got.dtype == want.dtype and np.array_equal(got, want), name


def test_a_decoder_that_disagrees_with_the_probe_leaves_every_jpeg_to_pillow(mix, monkeypatch):
    monkeypatch.setattr(jpeg, "_adopted", False)
    decoded = decode_pixels(mix["imagenet_0.jpg"])
    assert isinstance(decoded, Image.Image)
    assert np.array_equal(np.asarray(decoded), np.asarray(open_image(mix["imagenet_0.jpg"])))


def test_decoding_straight_into_given_memory_when_the_image_is_sent_as_it_is(mix):
    given = []

    def allocate(shape, dtype):
        given.append(np.zeros(shape, dtype))
        return given[-1]

    raw = model_input(mix["imagenet_0.jpg"], "torchvision", True, allocate=allocate)
    assert raw.form == "image" and raw.array.ctypes.data == given[0].ctypes.data
    crop = model_input(mix["photo_12mp.jpg"], "torchvision", True, allocate=allocate)  # too big to send: a crop
    assert crop.form == "crop" and crop.array.shape == (224, 224, 3) and len(given) == 1


# ---- the fast mode ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width, height", [(300, 200), (600, 400), (1023, 767), (1600, 1200), (4000, 3000),
                                           (3000, 4000), (4032, 3024), (5000, 600), (2048, 1536)])
def test_the_dct_scale_never_takes_the_shorter_side_below_256(width, height):
    scale = dct_scale(width, height, 256)
    assert scale in (1, 2, 4, 8)
    shorter = min(-(-width // scale), -(-height // scale))
    assert shorter >= 256 or scale == 1
    assert scale == 8 or min(-(-width // (2 * scale)), -(-height // (2 * scale))) < 256  # the largest such


def test_fast_mode_decodes_large_jpegs_smaller_and_other_images_whole(mix):
    assert pixels_of(decode_pixels(mix["photo_12mp.jpg"], "fast")).shape == (375, 500, 3)  # 2000x1500 at 1/4
    assert pixels_of(decode_pixels(mix["photo_12mp_sideways.jpg"], "fast")).shape == (375, 500, 3)  # upright
    assert pixels_of(decode_pixels(mix["thumb_2mp.jpg"], "fast")).shape == (300, 400, 3)  # 800x600 at 1/2
    for name in ("imagenet_0.jpg", "png.png", "cmyk.jpg"):  # small, or not a YCbCr JPEG: as the exact mode
        assert np.array_equal(pixels_of(decode_pixels(mix[name], "fast")), pixels_of(decode_pixels(mix[name]))), name


def test_fast_mode_gives_pillows_reduced_decode_whichever_library_decodes(mix, monkeypatch):
    path = mix["photo_12mp.jpg"]
    with Image.open(path) as reference:
        reference.draft(None, (reference.width // 4, reference.height // 4))
        want = np.asarray(reference.convert("RGB"))
    assert np.array_equal(pixels_of(decode_pixels(path, "fast")), want)
    monkeypatch.setattr(jpeg, "_adopted", False)
    assert np.array_equal(pixels_of(decode_pixels(path, "fast")), want)


def test_fast_mode_crops_stay_close_to_the_exact_crops(tmp_path):
    """The 224x224 inputs of the two modes differ by a fraction of a grey level on average, on phone-sized photos."""
    for seed, size in enumerate([(4000, 3000), (2000, 1500), (1280, 1706)]):
        buffer = io.BytesIO()
        photo_like(*size, seed=seed).save(buffer, "JPEG", quality=90)
        exact = center_crop(decode_pixels(buffer.getvalue())).astype(np.float64)
        fast = center_crop(decode_pixels(buffer.getvalue(), "fast")).astype(np.float64)
        assert np.abs(exact - fast).mean() < 2.0 and not np.array_equal(exact, fast), size


def test_fast_mode_agrees_with_the_exact_mode_on_the_network(tiny_tensors, test_device):
    """Top-5 classes of the tiny random network, over photo-like JPEGs of 1.4 to 12 MP. (Random weights give most
    images the same top class; benchmarks/decode_agreement.py reports the sharper measures over 512 photos.)"""
    from vggserve.model.vgg16 import VGG16

    rng = np.random.default_rng(4)
    exact, fast = [], []
    for seed in range(12):
        longer = int(rng.choice([1400, 2400, 4000]))
        buffer = io.BytesIO()
        photo_like(longer, longer * 3 // 4, seed=seed).save(buffer, "JPEG", quality=90)
        exact.append(model_input(buffer.getvalue(), "torchvision", False, "exact").array)
        fast.append(model_input(buffer.getvalue(), "torchvision", False, "fast").array)
    with VGG16(tiny_tensors, device=test_device, max_batch_size=12) as model:
        top_exact = np.argsort(-model.probabilities(np.stack(exact)), axis=1)[:, :5]
        top_fast = np.argsort(-model.probabilities(np.stack(fast)), axis=1)[:, :5]
    assert all(e[0] in f for e, f in zip(top_exact, top_fast))
    assert np.mean([len(set(e) & set(f)) for e, f in zip(top_exact, top_fast)]) >= 4.0


def test_fast_mode_reports_bad_files_exactly_as_the_exact_mode(awkward):
    for name, path in awkward.items():
        exact = decode_input(str(path), "torchvision", on_device=True)
        fast = decode_input(str(path), "torchvision", on_device=True, decode="fast")
        assert (exact[1] is None) == (fast[1] is None) and exact[1] == fast[1], name


def test_a_truncated_large_jpeg_is_an_error_in_fast_mode_too(tmp_path):
    buffer = io.BytesIO()
    photo_like(2000, 1500).save(buffer, "JPEG", quality=90)
    cut = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    for mode in ("exact", "fast"):
        _, problem = decode_input(cut, "torchvision", decode=mode)
        assert problem is not None and problem[1] == "ImageDecodeError" and "truncated" in problem[0], mode


def test_an_unknown_decode_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="exact, fast"):
        check_decode("quick")
    with pytest.raises(ValueError, match="exact, fast"):
        decode_pixels(b"\xff\xd8", "quick")


@pytest.mark.parametrize("command, modes", [(["classify", "x.jpg"], "exact,fast,gpu,auto"),
                                            (["batch", "--input", "x", "--output", "y.jsonl"], "exact,fast,gpu,auto"),
                                            (["serve"], "exact,fast,gpu,auto")])
def test_every_command_takes_decode_exact_or_fast_and_refuses_others(command, modes):
    done = subprocess.run([sys.executable, "-m", "vggserve", *command, "--decode", "quick"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--decode: invalid choice: 'quick'" in done.stderr
    helped = subprocess.run([sys.executable, "-m", "vggserve", command[0], "--help"], capture_output=True, text=True,
                            timeout=120)
    assert f"--decode {{{modes}}}" in helped.stdout  # every command: also the device JPEG decoder's


def test_classify_decode_fast_prints_the_same_classes_for_a_small_image(tiny_weights_path, mix):
    """A 500x375 JPEG is decoded whole in both modes: identical output."""
    outputs = []
    for mode in ("exact", "fast"):
        done = subprocess.run([sys.executable, "-m", "vggserve", "classify", "--json", "--device", "cpu", "--weights",
                               str(tiny_weights_path), "--decode", mode, str(mix["imagenet_1.jpg"])],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and '"predictions"' in outputs[0]


def test_the_service_setting_is_checked():
    from vggserve.serving import Settings, SettingsError

    assert Settings(decode="fast").decode == "fast" and Settings().decode == "exact"
    with pytest.raises(SettingsError, match="--decode must be one of exact, fast, gpu, auto"):
        Settings(decode="quick")


def test_the_device_decoder_is_asked_for_by_gpu_and_by_auto_on_a_gpu_and_one_that_does_not_build_is_left_out(caplog):
    """decodes_on_device, the batch job's and classify's rule: auto (the default) asks only a GPU model; a decoder
    that fails to build is logged once per model, and the CPU decodes instead (never an error where exact works)."""
    from types import SimpleNamespace

    from vggserve.decoding import asks_device_decoding, decodes_on_device

    class Model:
        device_name = "Stand-in GPU"

        def __init__(self, kind: str, builds: bool):
            self.device_info, self.builds, self.built = SimpleNamespace(kind=kind), builds, 0

        def jpeg_decoder(self):
            self.built += 1
            if not self.builds:
                raise RuntimeError("clBuildProgram failed\nthe build log")

    gpu, cpu, broken = Model("gpu", True), Model("cpu", True), Model("gpu", False)
    assert decodes_on_device(gpu, "auto") and decodes_on_device(gpu, "gpu") and gpu.built == 2
    assert not decodes_on_device(cpu, "auto") and cpu.built == 0  # auto off a GPU: exact, nothing built
    assert decodes_on_device(cpu, "gpu") and cpu.built == 1
    assert not any(decodes_on_device(gpu, mode) for mode in ("exact", "fast"))
    with caplog.at_level("WARNING", logger="vggserve"):
        assert not decodes_on_device(broken, "auto") and not decodes_on_device(broken, "gpu")
    assert asks_device_decoding(broken, "auto") and broken.built == 1  # tried once
    assert [r.getMessage() for r in caplog.records] == [
        "the device JPEG decoder could not be built on Stand-in GPU (RuntimeError: clBuildProgram failed); JPEGs are "
        "decoded on the CPU"]
    assert not decodes_on_device(object(), "gpu")  # no device decoder at all
