"""`VGG16.submit` with a list of images: uint8 crops and `ModelInput` images, the raw ones resized and cropped on the
device (ops/resize.py). The probabilities must be exactly those of the CPU's `center_crop` of the same images."""

import numpy as np
import pytest
from PIL import Image

from vggserve.modelinput import ModelInput, raw_rgb
from vggserve.preprocess import center_crop

RawImage = ModelInput.image

SIZES = [(500, 375), (375, 500), (224, 224), (256, 300), (300, 256), (1024, 768), (231, 97), (257, 257), (40, 30)]


@pytest.fixture(scope="module")
def model(tiny_weights_path, test_device):
    from vggserve.model.vgg16 import VGG16

    with VGG16.load(tiny_weights_path, device=test_device, max_batch_size=len(SIZES) + 1) as m:
        yield m


def pictures(seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


@pytest.mark.parametrize("split_bytes", [1, 1 << 40], ids=["copied over threads", "copied on one thread"])
def test_raw_images_and_crops_give_the_probabilities_of_the_cpu_crops(model, split_bytes, monkeypatch):
    from vggserve.runtime import hostcopy

    monkeypatch.setattr(hostcopy, "MIN_SPLIT", split_bytes)  # the staging copies dealt over threads, or not
    monkeypatch.setattr(hostcopy, "MIN_PAIR", split_bytes)
    images = pictures()
    batch = [raw_rgb(img) for img in images]
    batch.insert(3, np.ascontiguousarray(center_crop(images[0])))  # a crop among the raw images
    want = model.probabilities_from_pixels(np.stack([np.ascontiguousarray(center_crop(img)) for img in images]))
    want = np.insert(want, 3, want[0], axis=0)
    got = model.submit(batch, "probabilities").result()
    np.testing.assert_array_equal(got, want)


def test_two_batches_in_flight_keep_their_own_raw_images(model):
    first, second = pictures(1), pictures(2)
    pending = [model.submit([raw_rgb(img) for img in batch], "probabilities") for batch in (first, second)]
    for batch, p in zip((first, second), pending):
        want = model.probabilities_from_pixels(np.stack([np.ascontiguousarray(center_crop(img)) for img in batch]))
        np.testing.assert_array_equal(p.result(), want)


def test_a_raw_image_that_keeps_its_size_is_cropped_on_the_host(model):
    img = pictures()[3]  # 256 x 300: Resize(256) keeps it
    assert not raw_rgb(img).needs_resize
    want = model.probabilities_from_pixels(np.ascontiguousarray(center_crop(img))[None])
    np.testing.assert_array_equal(model.submit([raw_rgb(img)], "probabilities").result(), want)


@pytest.mark.parametrize("bad", [np.zeros((224, 224, 3), np.float32), np.zeros((100, 100, 3), np.uint8),
                                 np.zeros((224, 224), np.uint8)])
def test_a_batch_item_that_is_neither_crop_nor_raw_image_is_refused(model, bad):
    with pytest.raises(ValueError, match="image 1 of the batch"):
        model.submit([RawImage(np.zeros((300, 400, 3), np.uint8)), bad])


def test_raw_image_checks_its_shape_and_pickles():
    import pickle

    with pytest.raises(ValueError, match=r"\(h, w, 3\)"):
        RawImage(np.zeros((10, 10), np.uint8))
    raw = RawImage(np.arange(60, dtype=np.uint8).reshape(4, 5, 3))
    back = pickle.loads(pickle.dumps(raw))
    np.testing.assert_array_equal(back.pixels, raw.pixels)


def test_the_device_resize_is_checked_against_the_installed_pillow(model, monkeypatch):
    from vggserve.ops import resize

    assert model.resize_matches_pillow()
    # as if Pillow's pass order had changed: 300 x 1000 shrinks its height enough for the order to matter
    monkeypatch.setattr(resize, "VERTICAL_FIRST_RULE", not resize.VERTICAL_FIRST_RULE)
    resize.crop_tables.cache_clear()
    try:
        assert not model.resize_matches_pillow()
    finally:
        monkeypatch.undo()
        resize.crop_tables.cache_clear()
    assert model.resize_matches_pillow()


def test_a_worker_falls_back_to_front_end_crops_when_the_check_fails(model, monkeypatch):
    from vggserve.serving.scheduling.worker import DeviceWorker

    worker = object.__new__(DeviceWorker)
    worker.device, worker.pixels, worker.device_resize = "test", True, True
    assert worker.device_resizes(model)
    monkeypatch.setattr(type(model), "resize_matches_pillow", lambda self: False)
    assert not worker.device_resizes(model)
    worker.pixels = False  # one process: no front ends, nothing to decide
    monkeypatch.undo()
    assert not worker.device_resizes(model)


def test_the_batch_pipeline_resizes_on_the_device_with_the_cpu_paths_results(model, tmp_path):
    from vggserve.distributed.pipeline import ChunkRunner

    paths = []
    for i, img in enumerate(pictures(4)):
        paths.append(str(tmp_path / f"{i}.png"))
        img.save(paths[-1])
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    paths.insert(2, str(tmp_path / "broken.jpg"))
    runner = ChunkRunner(model, top_k=5, decode_threads=2)
    host_runner = ChunkRunner(model, top_k=5, on_device=False)  # float32: decoded, resized, normalised on the host
    try:
        assert runner.on_device
        runner.submit(paths)
        on_device = runner.run_next()
        host_runner.submit(paths)
        on_host = host_runner.run_next()
    finally:
        runner.close()
        host_runner.close()
    assert len(on_device.results) == len(SIZES) and len(on_device.errors) == 1
    assert on_device.results == on_host.results and on_device.errors == on_host.errors


def test_more_device_inputs_than_a_batch_go_in_batches(model):
    from vggserve.distributed.pipeline import probabilities_of

    images = pictures(5) * 2  # 18 images, max_batch_size 10
    want = model.probabilities_from_pixels(np.stack([np.ascontiguousarray(center_crop(img)) for img in images]))
    got = probabilities_of(model, [raw_rgb(img) for img in images])
    np.testing.assert_array_equal(got, want)


def test_the_batch_pipeline_keeps_the_next_chunk_on_the_device_and_answers_in_order(model, tmp_path):
    from vggserve.distributed.pipeline import ChunkRunner

    images = pictures(6)
    paths = []
    for i, img in enumerate(images):
        paths.append(str(tmp_path / f"{i}.png"))
        img.save(paths[-1])
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    chunks = [paths[:4], [str(tmp_path / "broken.jpg")], paths[4:], paths[1:3]]
    runner = ChunkRunner(model, top_k=3, decode_threads=2)
    submits = []
    real_submit = model.submit
    model.submit = lambda *a, **k: submits.append(len(a[0])) or real_submit(*a, **k)
    try:
        for chunk in chunks:
            runner.submit(chunk)
        outcomes = [runner.run_next() for _ in chunks]
        assert runner.pending == 0
    finally:
        del model.submit
        runner.close()
    assert submits == [4, 5, 2]  # the broken-only chunk puts nothing on the device
    runner_host = ChunkRunner(model, top_k=3, on_device=False)
    try:
        for chunk in chunks:
            runner_host.submit(chunk)
        want = [runner_host.run_next() for _ in chunks]
    finally:
        runner_host.close()
    assert [o.results for o in outcomes] == [w.results for w in want]
    assert [o.errors for o in outcomes] == [w.errors for w in want] and len(outcomes[1].errors) == 1
