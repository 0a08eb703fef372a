"""Front ends hand the engine decoded RGB images (ModelInput images) when its device resizes, and crops otherwise."""

import io

import numpy as np
import pytest
from PIL import Image

from vggserve.modelinput import ModelInput
from vggserve.preprocess import center_crop
from vggserve.serving.scheduling import imaging
from vggserve.serving.scheduling.imaging import decode_for_engine


def jpeg(width, height, mode="RGB") -> bytes:
    rng = np.random.default_rng(width * 7 + height)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def test_a_photo_that_needs_a_resize_goes_to_the_engine_raw():
    data = jpeg(500, 375)
    raw, seconds = decode_for_engine(data, "torchvision", 10**8)
    assert raw.form == "image" and raw.pixels.shape == (375, 500, 3) and seconds >= 0
    np.testing.assert_array_equal(raw.cropped().array, center_crop(Image.open(io.BytesIO(data))))


def test_grayscale_is_sent_as_rgb():
    raw, _ = decode_for_engine(jpeg(300, 400, "L"), "torchvision", 10**8)
    assert raw.form == "image" and raw.pixels.shape == (400, 300, 3)


def test_an_image_that_keeps_its_size_is_cropped_in_the_front_end():
    crop, _ = decode_for_engine(jpeg(256, 300), "torchvision", 10**8)
    assert crop.form == "crop" and crop.array.shape == (224, 224, 3) and crop.array.flags.c_contiguous


def test_a_large_image_is_resized_in_the_front_end(monkeypatch):
    from vggserve import modelinput

    monkeypatch.setattr(modelinput, "RAW_LIMIT_BYTES", 500 * 375 * 3 - 1)
    data = jpeg(500, 375)
    crop, _ = decode_for_engine(data, "torchvision", 10**8)
    np.testing.assert_array_equal(crop.array, center_crop(Image.open(io.BytesIO(data))))


def test_bad_bytes_are_the_same_400_as_for_crops():
    from vggserve.errors import ImageError

    with pytest.raises(Exception) as raw_error:
        decode_for_engine(b"not an image at all", "torchvision", 10**8)
    with pytest.raises(Exception) as crop_error:
        imaging.decode_and_crop(b"not an image at all", "torchvision", 10**8)
    assert type(raw_error.value) is type(crop_error.value)
    assert isinstance(raw_error.value, ImageError) and str(raw_error.value) == str(crop_error.value)


def test_the_worker_hands_a_batch_with_raw_images_to_submit_as_a_list():
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.scheduling.batcher import Item
    from vggserve.serving.scheduling.worker import DeviceWorker

    worker = DeviceWorker("cpu", None, None, Metrics(), max_batch_size=4, max_wait_s=0, warmup=False,
                          on_change=lambda: None)
    worker._model_takes_pixels = True
    worker.info = {"resizes_on_device": True}
    crop = ModelInput.crop(np.zeros((224, 224, 3), np.uint8))
    raw = ModelInput.image(np.zeros((300, 400, 3), np.uint8))
    batch = lambda *inputs: [Item(x, 0.0) for x in inputs]  # noqa: E731
    stacked = worker.prepare(batch(crop, raw, raw))
    assert isinstance(stacked, list) and stacked[1] is raw
    assert worker.prepare(batch(crop, crop)).shape == (2, 224, 224, 3)
    assert worker.metrics.device_resized._value.get() == 2
    worker.info = {"resizes_on_device": False}  # a model that does not resize: cropped here
    cropped = worker.prepare(batch(crop, raw))
    assert cropped.shape == (2, 224, 224, 3) and worker.metrics.device_resized._value.get() == 2


def test_resize_on_is_checked_and_reaches_the_workers():
    from vggserve.serving.service import Service
    from vggserve.serving.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="--resize-on"):
        Settings(resize_on="gpu")
    from vggserve.testing.models import PipelinedModel

    for where, expected in (("device", True), ("cpu", False)):
        service = Service(Settings(http_workers=2, resize_on=where, warmup=False),
                          lambda device: PipelinedModel(device, seconds_per_batch=0.0))
        service.start()
        try:
            assert [w.device_resize for w in service.backend.workers] == [expected]
        finally:
            service.stop()


def test_the_serve_command_takes_resize_on():
    from vggserve.cli import build_parser
    from vggserve.cli import serve

    parser = build_parser()
    assert serve._settings(parser.parse_args(["serve", "--resize-on", "cpu"])).resize_on == "cpu"
    assert serve._settings(parser.parse_args(["serve"])).resize_on == "device"
