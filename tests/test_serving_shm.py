"""Pixels from the front ends through shared memory (vggserve/ipc/shm.py): the arena's FIFO blocks, the
engine's views, and the link using them, with every block freed once the engine has answered."""

import time

import numpy as np
import pytest

from test_http_frontends import crop, engine_and_client, send
from test_http_process import wait_until
from vggserve.modelinput import ModelInput
from vggserve.preprocess import center_crop
from vggserve.serving.scheduling.batcher import Outcome
from vggserve.testing.models import SlowModel
from vggserve.serving.settings import Settings
from vggserve.ipc.shm import ALIGN, Arena, Mapped, Shared


@pytest.fixture
def arena():
    a = Arena(10 * ALIGN)
    yield a
    a.close()


def block(nbytes: int, value: int = 7) -> np.ndarray:
    return np.full(nbytes, value, np.uint8)


def test_blocks_are_handed_out_in_order_until_full_and_come_back_oldest_first(arena):
    blocks = [arena.put(block(3 * ALIGN - 5), form="crop") for _ in range(3)]
    assert [b.offset for b in blocks] == [0, 3 * ALIGN, 6 * ALIGN]
    assert arena.put(block(2 * ALIGN), form="crop") is None  # 9 of 10 taken
    arena.free(blocks[1])  # not the oldest: nothing comes back yet
    assert arena.put(block(2 * ALIGN), form="crop") is None
    arena.free(blocks[0])  # the oldest: both come back, and the next block wraps to the start
    again = arena.put(block(5 * ALIGN), form="crop")
    assert again.offset == 0
    assert arena.put(block(2 * ALIGN), form="crop") is None  # between the wrapped head and the live tail: 1 left
    arena.free(blocks[2])
    arena.free(again)
    assert arena.put(block(10 * ALIGN), form="crop").offset == 0  # empty again: the whole arena
    assert arena.put(block(1), form="crop") is None


def test_freeing_twice_or_unknown_blocks_is_harmless(arena):
    b = arena.put(block(ALIGN), form="image")
    arena.free(b)
    arena.free(b)
    arena.free(Shared(5 * ALIGN, (1,), "crop"))
    assert arena.put(block(10 * ALIGN), form="crop") is not None


def test_the_engine_sees_the_pixels_the_front_end_wrote(arena):
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    shared = arena.put(pixels, form="image")
    mapped = Mapped(arena.name)
    view = mapped.view(shared)
    np.testing.assert_array_equal(view, pixels)
    assert shared.form == "image" and view.shape == (2, 3, 3)
    del view
    mapped.close()


def test_a_stored_input_comes_back_in_the_same_form():
    arena = Arena(1 << 20)
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    crop_pixels = np.arange(224 * 224 * 3, dtype=np.uint64).astype(np.uint8).reshape(224, 224, 3)
    tensor = np.linspace(-2, 2, 3 * 224 * 224, dtype=np.float32).reshape(3, 224, 224)
    mapped = Mapped(arena.name)
    stored = [ModelInput.image(pixels), ModelInput.crop(crop_pixels), ModelInput.tensor(tensor),
              ModelInput.encoded(b"\xff\xd8\xff\xe0 the bytes of a JPEG file")]
    back = [mapped.image(arena.put_image(x)) for x in stored]
    assert [x.form for x in back] == ["image", "crop", "tensor", "encoded"]
    assert back[3].data == stored[3].data
    for x, y in zip(stored, back):
        assert y.array.dtype == x.array.dtype
        np.testing.assert_array_equal(y.array, x.array)
    bare = mapped.image(arena.put_image(crop_pixels))  # a bare uint8 crop, as before the input type
    assert bare.form == "crop"
    del back, bare, y
    mapped.close()
    arena.close()


def test_the_link_carries_crops_and_raw_images_through_shared_memory_and_frees_every_block():
    from PIL import Image

    from vggserve.preprocess import normalize_pixels

    settings = Settings(http_workers=2, max_queue=16, max_files=1, max_batch_size=4, max_wait_ms=50, warmup=False)
    models: list = []
    rng = np.random.default_rng(3)
    photo = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    images = [crop((40 * i, 200 - 30 * i, 90)) for i in range(3)] + [ModelInput.image(photo)]
    with engine_and_client(settings, models, seconds=0.05) as (service, client):
        wait_until(lambda: client.queue.arena is not None, 10, "the engine to map the arena")
        items = [send(client, image) for image in images]
        answers = [item.future.result(timeout=30) for item in items]
        assert all(item.shared is not None for item in items)
        assert client.queue.arena._blocks == {}  # all answered: every block back
    reference = SlowModel(seconds_per_batch=0)
    crops = [*images[:3], np.ascontiguousarray(center_crop(Image.fromarray(photo)))]
    for answer, pixels in zip(answers, crops):
        assert isinstance(answer, Outcome)
        want = reference.probabilities(normalize_pixels(pixels, "torchvision")[None])[0]
        np.testing.assert_array_equal(answer.probabilities, want)


def test_without_room_in_the_arena_pixels_go_inline():
    settings = Settings(http_workers=2, max_queue=8, max_files=1, max_batch_size=2, max_wait_ms=0, warmup=False)
    with engine_and_client(settings, [], seconds=0.05) as (service, client):
        wait_until(lambda: client.queue.arena is not None, 10, "the engine to map the arena")
        small = Arena(ALIGN)  # too small for a crop
        client.queue.arena = small
        try:
            item = send(client, crop((1, 2, 3)))
            assert item.shared is None and isinstance(item.future.result(timeout=30), Outcome)
        finally:
            small.close()


def test_an_arena_the_engine_cannot_map_is_not_used(monkeypatch):
    from vggserve.serving.processes import engine_host

    def refuse(name):
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(engine_host, "Mapped", refuse)
    settings = Settings(http_workers=2, max_queue=8, max_files=1, max_batch_size=2, max_wait_ms=0, warmup=False)
    with engine_and_client(settings, [], seconds=0.05) as (service, client):
        item = send(client, crop((1, 2, 3)))
        assert isinstance(item.future.result(timeout=30), Outcome)  # the link lives on, pixels inline
        assert item.shared is None and client.queue.arena is None


def test_no_room_in_dev_shm_means_no_arena_and_pixels_inline(monkeypatch):
    import errno
    import os

    from vggserve.ipc import shm

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert shm.make_arena() is None  # logged; the front end then sends pixels inline
