"""A front end's CPU beside the decode (issue 24): small uploads decoded on the event loop, large ones in the
decoding threads; the link written by the sending thread (a turn of the event loop's submits as one list), what the
socket cannot take at once left to the writer thread in order; the engine's answers set on the loop once per
message. Each keeps the behaviour of the thread-hop path it replaces."""

import asyncio
import io
import pickle
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import Pipe

import numpy as np
import pytest
from PIL import Image

from vggserve.errors import ImageError
from vggserve.modelinput import ModelInput
from vggserve.serving.metrics import Metrics
from vggserve.serving.processes import inline
from vggserve.serving.processes.engine_link import DirectLink, EngineClient, RemoteQueue
from vggserve.serving.processes.remote import RemoteBackend
from vggserve.serving.scheduling.errors import DeadlineExceeded
from vggserve.serving.scheduling.imaging import decode_and_crop
from vggserve.serving.settings import Settings


def encoded(size: tuple[int, int], fmt: str = "JPEG", noise: bool = False) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), np.uint8) if noise else None
    image = Image.fromarray(pixels) if noise else Image.new("RGB", size, (90, 140, 200))
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF"])
def test_the_pixel_size_is_read_from_the_header(fmt):
    assert inline.pixels_of(encoded((123, 45), fmt)) == (123, 45)


def test_only_small_files_of_few_pixels_are_decoded_on_the_event_loop():
    assert inline.decodes_inline(encoded((64, 48)))
    assert inline.decodes_inline(encoded((256, 256)))
    assert not inline.decodes_inline(encoded((257, 256)))  # few bytes, too many pixels
    big = encoded((250, 250), "PNG", noise=True)
    assert len(big) > inline.INLINE_MAX_BYTES and not inline.decodes_inline(big)  # few pixels, too many bytes
    assert not inline.decodes_inline(encoded((64, 48), "BMP"))  # a format not sized from its header
    assert not inline.decodes_inline(b"\xff\xd8\xff\xe0\x00")  # a header cut short
    assert not inline.decodes_inline(b"not an image")


class CountingPool(ThreadPoolExecutor):
    def __init__(self):
        super().__init__(1)
        self.calls = 0

    def submit(self, *args, **kwargs):
        self.calls += 1
        return super().submit(*args, **kwargs)


def backend_with_counting_pool() -> RemoteBackend:
    backend = RemoteBackend(Settings(http_workers=2), Metrics(), "unused", b"key", 0)
    backend.pool = CountingPool()
    return backend


def test_a_small_upload_is_decoded_without_the_thread_hop_and_a_large_one_in_a_thread():
    backend = backend_with_counting_pool()
    small, seconds = asyncio.run(backend.prepare(encoded((64, 48))))
    assert backend.pool.calls == 0 and small.array.shape == (224, 224, 3) and seconds > 0
    large, _ = asyncio.run(backend.prepare(encoded((500, 375))))
    assert backend.pool.calls == 1 and large.array.shape == (224, 224, 3)
    backend.pool.shutdown()


def test_a_bad_small_upload_decoded_on_the_loop_is_the_same_image_error():
    cut = encoded((64, 48))[:300]  # its header sized, its data cut short
    assert inline.decodes_inline(cut)
    with pytest.raises(ImageError) as in_a_thread:
        decode_and_crop(cut, "torchvision", 10**8)
    backend = backend_with_counting_pool()
    with pytest.raises(ImageError) as on_the_loop:
        asyncio.run(backend.prepare(cut))
    assert backend.pool.calls == 0
    assert (type(on_the_loop.value), str(on_the_loop.value)) == (type(in_a_thread.value), str(in_a_thread.value))
    backend.pool.shutdown()


def probabilities(n: int) -> bytes:
    return np.arange(n * 4, dtype=np.float32).tobytes()


def test_answers_of_one_message_wake_the_event_loop_once_and_resolve_each_image():
    sent: list = []
    queue = RemoteQueue(8, Metrics(), sent.append)

    async def main():
        loop = asyncio.get_running_loop()
        wakes = []
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: wakes.append(a) or original(*a)
        queue.admit(3)
        items = [queue.submit(ModelInput.crop(np.zeros((224, 224, 3), np.uint8)), time.monotonic() + 10)
                 for _ in range(3)]
        assert all(isinstance(item.future, asyncio.Future) for item in items)
        reader = threading.Thread(target=queue.resolve_rows, args=(
            [items[0].id, items[2].id], probabilities(2), None, [], [0.1, 0.2], 0.5, 2, "gpu0"))
        reader.start()
        reader.join()
        await asyncio.wait([items[0].future, items[2].future])
        assert len(wakes) == 1 and not items[1].future.done()
        threading.Thread(target=queue.resolve, args=(items[1].id,),
                         kwargs={"error": DeadlineExceeded(1.0)}).start()
        await asyncio.wait([items[1].future])
        return items

    items = asyncio.run(main())
    first, third = items[0].future.result(), items[2].future.result()
    assert first.probabilities.tolist() == [0, 1, 2, 3] and third.probabilities.tolist() == [4, 5, 6, 7]
    assert (first.queue_s, third.queue_s, first.batch_size, first.device) == (0.1, 0.2, 2, "gpu0")
    assert isinstance(items[1].future.exception(), DeadlineExceeded)
    assert queue.admitted == 0 and len(queue) == 0


def test_an_image_submitted_off_an_event_loop_gets_a_thread_safe_future():
    queue = RemoteQueue(8, Metrics(), lambda message: None)
    queue.admit(1)
    item = queue.submit(ModelInput.crop(np.zeros((224, 224, 3), np.uint8)), time.monotonic() + 10)
    assert isinstance(item.future, Future)
    queue.resolve_rows([item.id], probabilities(1), None, [], [0.0], 0.1, 1, "cpu")
    assert item.future.result(timeout=1).probabilities.tolist() == [0, 1, 2, 3]


class RecordingLink:
    def __init__(self):
        self.lists = []

    def send(self, message):
        self.lists.append([message])

    def send_many(self, messages):
        self.lists.append(messages)


def test_the_submits_and_withdrawals_of_one_turn_of_the_event_loop_go_to_the_engine_as_one_list():
    client = EngineClient("unused", b"key", 8, Metrics(), 0)
    client.link = RecordingLink()

    async def main():
        client.queue.admit(3)
        items = [client.queue.submit(ModelInput.image(np.zeros((2, 2, 3), np.uint8)), time.monotonic() + 10)
                 for _ in range(3)]
        client.queue.withdraw(items[1], DeadlineExceeded(0.0))
        assert client.link.lists == []  # not before the turn ends
        await asyncio.sleep(0)
        client.queue.withdraw(items[2], DeadlineExceeded(0.0))
        await asyncio.sleep(0)
        return items

    items = asyncio.run(main())
    assert [[m[:2] for m in sent] for sent in client.link.lists] == [
        [("submit", items[0].id), ("submit", items[1].id), ("submit", items[2].id), ("withdraw", items[1].id)],
        [("withdraw", items[2].id)]]
    client.queue.close(DeadlineExceeded(0.0))


def test_a_direct_link_writes_at_once_and_leaves_what_the_socket_cannot_take_to_its_writer_in_order():
    ours, theirs = Pipe()
    link = DirectLink(ours, lambda messages: None, lambda: None, "test-link")
    link.start()
    try:
        link.send(("small", 1))
        assert theirs.poll(5) and pickle.loads(theirs.recv_bytes()) == [("small", 1)]
        payloads = [bytes([i]) * 300_000 for i in range(20)]  # far past a socket's buffer: the writer takes over
        for i, payload in enumerate(payloads):
            link.send_many([("big", i, payload), ("after", i)])
        assert link._backlog  # nobody reads yet
        received = [pickle.loads(theirs.recv_bytes()) for _ in payloads]
        assert received == [[("big", i, p), ("after", i)] for i, p in enumerate(payloads)]
        end = time.monotonic() + 5  # the writer drops a message from its backlog once written: a moment after the read
        while link._backlog and time.monotonic() < end:
            time.sleep(0.001)
        assert not link._backlog
        link.close()
        link._writer.join(5)
        assert not link._writer.is_alive() and theirs.poll(5) and not link._sock.fileno() >= 0
        with pytest.raises(EOFError):
            theirs.recv_bytes()  # the engine sees the link closed
        link.send(("after close", 0))  # dropped, no error
    finally:
        link.close()
        theirs.close()
