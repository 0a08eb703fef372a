"""BatchQueue: admission bounds, batch formation, deadlines and withdrawal, without HTTP."""

import threading
import time

import numpy as np
import pytest

from vggserve.modelinput import ModelInput
from vggserve.serving.scheduling.batcher import BatchQueue
from vggserve.serving.scheduling.errors import ClientGone, DeadlineExceeded, QueueFull
from vggserve.serving.metrics import Metrics

X = ModelInput.tensor(np.zeros((3, 224, 224), dtype=np.float32))


def far() -> float:
    return time.monotonic() + 60


def submit(queue: BatchQueue, n: int, deadline=None):
    queue.admit(n)
    return [queue.submit(X, deadline or far()) for _ in range(n)]


def test_admission_refuses_beyond_capacity_all_or_nothing():
    metrics = Metrics()
    queue = BatchQueue(3, metrics)
    queue.admit(2)
    with pytest.raises(QueueFull) as info:
        queue.admit(2)
    assert info.value.code == "queue_full" and info.value.retry_after_s == 1
    assert queue.admitted == 2  # the refused request reserved nothing
    queue.admit(1)
    queue.release(3)
    assert queue.admitted == 0
    assert metrics.rejected.labels(reason="queue_full")._value.get() == 1


def test_take_batch_returns_up_to_max_size_in_arrival_order():
    queue = BatchQueue(100, Metrics())
    items = submit(queue, 5)
    first = queue.take_batch(max_size=3, max_wait_s=0)
    second = queue.take_batch(max_size=3, max_wait_s=0)
    assert first == items[:3] and second == items[3:]
    assert queue.admitted == 0 and len(queue) == 0


def test_take_batch_waits_at_most_max_wait_for_a_batch_to_fill():
    queue = BatchQueue(100, Metrics())
    submit(queue, 1)
    started = time.monotonic()
    batch = queue.take_batch(max_size=8, max_wait_s=0.15)
    waited = time.monotonic() - started
    assert len(batch) == 1
    assert 0.1 <= waited < 1.0


def test_take_batch_collects_images_arriving_during_the_wait():
    queue = BatchQueue(100, Metrics())
    submit(queue, 1)
    late = threading.Timer(0.05, lambda: submit(queue, 2))
    late.start()
    batch = queue.take_batch(max_size=3, max_wait_s=2.0)
    late.join()
    assert len(batch) == 3  # returned as soon as full, long before max_wait


def test_expired_images_are_dropped_before_a_batch_and_answered_504():
    metrics = Metrics()
    queue = BatchQueue(100, metrics)
    (stale,) = submit(queue, 1, deadline=time.monotonic() - 0.001)
    (fresh,) = submit(queue, 1)
    batch = queue.take_batch(max_size=8, max_wait_s=0)
    assert batch == [fresh]
    with pytest.raises(DeadlineExceeded) as info:
        stale.future.result(timeout=1)
    assert info.value.code == "deadline_exceeded" and "not computed" in info.value.message
    assert metrics.timeouts._value.get() == 1


def test_withdraw_removes_a_waiting_image_but_not_one_on_a_device():
    metrics = Metrics()
    queue = BatchQueue(100, metrics)
    a, b = submit(queue, 2)
    assert queue.withdraw(a, ClientGone())
    assert queue.admitted == 1 and metrics.abandoned._value.get() == 1
    assert queue.take_batch(max_size=8, max_wait_s=0) == [b]
    assert not queue.withdraw(b, ClientGone())  # a worker has it now
    assert not b.future.done()


def test_close_fails_waiting_images_and_releases_workers():
    queue = BatchQueue(100, Metrics())
    (item,) = submit(queue, 1)
    error = DeadlineExceeded(0.0)
    got = []
    worker = threading.Thread(target=lambda: got.append(queue.take_batch(8, 0)))
    queue.close(error)
    worker.start()
    worker.join(timeout=2)
    assert got == [None]
    assert item.future.exception(timeout=1) is error
    with pytest.raises(DeadlineExceeded):
        queue.admit(1)


def test_a_worker_filling_a_batch_is_woken_by_the_first_image_and_the_full_batch_only():
    """Not once per image: 32 submits wake a waiting worker twice, and it takes all 32 at once, long before
    max_wait."""
    queue = BatchQueue(64, Metrics())
    wakes = []
    notify_all = queue._cond.notify_all
    queue._cond.notify_all = lambda: (wakes.append(len(queue)), notify_all())
    got = []
    taker = threading.Thread(target=lambda: got.append(queue.take_batch(32, max_wait_s=30)))
    taker.start()
    submit(queue, 1)
    deadline = time.monotonic() + 10
    while not queue._filling and time.monotonic() < deadline:  # the worker waits for the batch to fill
        time.sleep(0.001)
    for _ in range(31):
        submit(queue, 1)
    taker.join(10)
    assert not taker.is_alive() and len(got[0]) == 32
    assert wakes == [1, 32]
