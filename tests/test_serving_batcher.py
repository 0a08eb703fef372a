"""BatchQueue: admission bounds, batch formation, deadlines and withdrawal, without HTTP."""

import contextlib
import threading
import time

import numpy as np
import pytest

from vggserve.modelinput import ModelInput
from vggserve.serving.scheduling.batcher import BatchQueue, Item, Outcome, answer
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


def test_submit_many_admits_each_image_in_turn_and_returns_the_refused_with_their_error():
    metrics = Metrics()
    queue = BatchQueue(3, metrics)
    queue.admit(1)  # a request of this process holds one place
    items = [Item(X, far()) for _ in range(4)]
    refused = queue.submit_many(items)
    assert [item for item, _ in refused] == items[2:] and all(isinstance(e, QueueFull) for _, e in refused)
    assert queue.admitted == 3 and len(queue) == 2 and not any(item.future.done() for item in items)
    assert metrics.rejected.labels(reason="queue_full")._value.get() == 2  # one per image, as admit(1) counts
    assert queue.take_batch(8, 0) == items[:2]
    queue.close(ClientGone())
    assert [(item, error) for item, error in queue.submit_many(items[2:3])] == [(items[2], queue._closed)]


def test_submit_many_wakes_a_waiting_worker_once_for_a_whole_batch():
    queue = BatchQueue(64, Metrics())
    wakes = []
    notify_all = queue._cond.notify_all
    queue._cond.notify_all = lambda: (wakes.append(len(queue)), notify_all())
    got = []
    taker = threading.Thread(target=lambda: got.append(queue.take_batch(8, max_wait_s=30)))
    taker.start()
    deadline = time.monotonic() + 10
    while not queue._filling and time.monotonic() < deadline:
        time.sleep(0.001)
    queue.submit_many([Item(X, far()) for _ in range(3)])  # the first images: the taker starts its wait
    queue.submit_many([Item(X, far()) for _ in range(5)])  # the batch is full
    taker.join(10)
    assert not taker.is_alive() and len(got[0]) == 8 and wakes == [3, 8]


class Recorder:
    """A Group that records each answer_rows call."""

    def __init__(self):
        self.calls = []

    def answer_rows(self, items, probabilities, logits, queue_s, inference_s, batch_size, device):
        self.calls.append((items, probabilities, logits, queue_s, inference_s, batch_size, device))


def test_answer_gives_each_group_its_rows_in_one_call_and_the_other_items_their_outcomes():
    one, two = Recorder(), Recorder()
    batch = [Item(X, far(), want_logits=i == 2, enqueued=10.0 + i) for i in range(5)]
    batch[0].group = batch[2].group = one
    batch[3].group = two
    probabilities = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    logits = -probabilities
    answer(batch, probabilities, logits, started=20.0, seconds=0.5, device="gpu1")
    (items, probs, logs, queue_s, *rest), = one.calls
    assert items == [batch[0], batch[2]] and rest == [0.5, 5, "gpu1"] and queue_s == [10.0, 8.0]
    np.testing.assert_array_equal(probs, probabilities[[0, 2]])
    np.testing.assert_array_equal(logs, logits[[0, 2]])
    (items, probs, *_), = two.calls
    assert items == [batch[3]] and np.array_equal(probs, probabilities[[3]])
    for i in (1, 4):  # no group: an Outcome each, as before
        outcome = batch[i].future.result(timeout=0)
        assert isinstance(outcome, Outcome) and outcome.batch_size == 5 and outcome.queue_s == 20.0 - (10.0 + i)
        assert np.array_equal(outcome.probabilities, probabilities[i]) and outcome.logits is None
    assert not any(batch[i].future.done() for i in (0, 2, 3))


@pytest.mark.parametrize("multiprocess", [False, True], ids=["one process", "multiprocess files"])
def test_observe_all_counts_as_one_observe_per_amount(multiprocess, tmp_path):
    from vggserve.serving.metrics import multiprocess_metrics, observe_all

    amounts = [0.0, 0.001, 0.0010001, 0.02, 0.02, 7.5, 61.0, 1e9, float("nan")]
    with multiprocess_metrics(str(tmp_path)) if multiprocess else contextlib.nullcontext():
        one, many = Metrics(), Metrics()
        for amount in amounts:
            one.queue_seconds.observe(amount)
        observe_all(many.queue_seconds, amounts)
        observe_all(many.queue_seconds, [])
        want, got = ([(s.name, s.labels, s.value) for s in m.queue_seconds.collect()[0].samples
                      if not s.name.endswith("_created")] for m in (one, many))
    assert [s[:2] for s in got] == [s[:2] for s in want]
    for (_, _, w), (name, labels, g) in zip(want, got):
        assert g == w or (np.isnan(w) and np.isnan(g)), (name, labels)


# the pipeline's wait for a request of one image (scheduling.pipeline._await_one), over a BatchQueue ---------------

class OneImageService:
    """What run_inputs needs of a service: a backend with a BatchQueue and a `prepare` that passes the input."""

    def __init__(self):
        from types import SimpleNamespace

        self.metrics = Metrics()
        self.backend = SimpleNamespace(queue=BatchQueue(4, self.metrics), prepare=None)


def run_one(service, deadline, client_gone=None):
    from vggserve.serving.scheduling.pipeline import run_inputs

    return run_inputs(service, [X], time.monotonic(), deadline, client_gone=client_gone)


def test_one_image_whose_deadline_passes_in_the_queue_is_withdrawn_as_504():
    import asyncio

    service = OneImageService()
    (result,) = asyncio.run(run_one(service, time.monotonic() + 0.05))
    assert isinstance(result.error, DeadlineExceeded) and len(service.backend.queue) == 0
    assert service.metrics.timeouts._value.get() == 1


def test_one_image_of_a_client_that_goes_away_is_withdrawn_by_the_servers_callback_without_a_task():
    import asyncio

    service = OneImageService()
    wishes, taken_back = [], []

    async def never() -> None:  # a task waiting on this would never end: the callback must be what withdraws
        await asyncio.Event().wait()

    def when_gone(callback):
        wishes.append(callback)
        asyncio.get_running_loop().call_later(0.02, callback)
        return lambda: taken_back.append(True)

    never.when_gone = when_gone

    async def run():
        tasks = len(asyncio.all_tasks())
        running = asyncio.ensure_future(run_one(service, time.monotonic() + 60, never))
        await asyncio.sleep(0.01)
        assert len(asyncio.all_tasks()) == tasks + 1  # the request's own task, no watcher
        return await running

    (result,) = asyncio.run(run())
    assert isinstance(result.error, ClientGone) and len(wishes) == 1 and taken_back == [True]
    assert service.metrics.abandoned._value.get() == 1


def test_cancelling_a_request_of_one_image_leaves_the_images_future_to_the_queue():
    import asyncio

    service = OneImageService()

    async def run():
        running = asyncio.ensure_future(run_one(service, time.monotonic() + 60))
        await asyncio.sleep(0.01)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(run())
    (item,) = service.backend.queue.take_batch(4, 0)
    assert not item.future.cancelled() and not item.future.done()  # a worker may still answer it


# decode groups: more full batches claimed at once (take_more), still withdrawable until they start ----------------

def test_take_more_claims_only_full_batches_already_waiting_and_leaves_the_rest_queued():
    queue = BatchQueue(100, Metrics())
    items = submit(queue, 4 * 3 + 2)
    first = queue.take_batch(max_size=4, max_wait_s=0)
    started = time.monotonic()
    more = queue.take_more(max_size=4, batches=3, busy=lambda: True)
    assert time.monotonic() - started < 0.5  # no hold: nothing waited for
    assert first == items[:4] and more == [items[4:8], items[8:12]]  # oldest first, full batches only
    assert len(queue) == 2 and queue.admitted == 2  # the claimed images left the queue and its room
    assert queue.take_more(max_size=4, batches=3) == []  # 2 waiting: no full batch
    assert queue.take_batch(max_size=4, max_wait_s=0) == items[12:]


def test_take_more_never_delays_a_lone_request_beyond_the_hold():
    queue = BatchQueue(100, Metrics())
    (lone,) = submit(queue, 1)
    assert queue.take_batch(max_size=4, max_wait_s=0) == [lone]
    for busy, hold, most in ((True, 0.0, 0.05), (False, 5.0, 0.05), (True, 0.2, 1.0)):
        started = time.monotonic()
        assert queue.take_more(max_size=4, batches=3, busy=lambda: busy, hold_s=hold) == []
        waited = time.monotonic() - started
        assert waited < most, (busy, hold, waited)  # an idle device never waits; a busy one the hold at most
    assert waited >= 0.15


def test_take_more_holding_while_busy_claims_a_batch_that_fills_meanwhile_and_stops_when_the_device_is_idle():
    queue = BatchQueue(100, Metrics())
    submit(queue, 4)
    queue.take_batch(max_size=4, max_wait_s=0)
    late = threading.Timer(0.05, lambda: submit(queue, 4))
    late.start()
    started = time.monotonic()
    more = queue.take_more(max_size=4, batches=1, busy=lambda: True, hold_s=5.0)
    late.join()
    assert len(more) == 1 and len(more[0]) == 4 and time.monotonic() - started < 2.0  # not the whole hold
    idle = threading.Event()
    threading.Timer(0.05, lambda: (idle.set(), queue.nudge())).start()  # the device finished its batch
    started = time.monotonic()
    assert queue.take_more(max_size=4, batches=1, busy=lambda: not idle.is_set(), hold_s=5.0) == []
    assert time.monotonic() - started < 2.0


def test_take_more_leaves_a_full_batch_for_each_other_worker_waiting_and_keeps_to_its_room():
    queue = BatchQueue(100, Metrics())
    got = []
    other = threading.Thread(target=lambda: got.append(queue.take_batch(4, max_wait_s=30, busy=lambda: True)))
    other.start()
    deadline = time.monotonic() + 10
    while not queue._takers and time.monotonic() < deadline:
        time.sleep(0.001)
    items = [Item(X, far()) for _ in range(12)]
    with queue._cond:  # (re-entrant) the other worker cannot take a batch before take_more has looked
        queue.submit_many(items)
        more = queue.take_more(max_size=4, batches=3)
    assert more == [items[:4], items[4:8]]  # items[8:] are the other worker's
    queue.nudge()
    other.join(10)
    assert got == [items[8:]]
    rest = submit(queue, 8)
    weights = {id(item): 10 for item in rest}
    more = queue.take_more(max_size=4, batches=3, weigh=lambda batch: sum(weights[id(i)] for i in batch), room=50)
    assert more == [rest[:4]] and len(queue) == 4  # the second would weigh 80 > 50


def test_a_claimed_image_is_withdrawn_as_a_waiting_one_until_its_batch_starts():
    metrics = Metrics()
    queue = BatchQueue(100, metrics)
    submit(queue, 8)
    queue.take_batch(max_size=4, max_wait_s=0)
    (batch,) = queue.take_more(max_size=4, batches=1)
    assert queue.withdraw(batch[1], ClientGone())  # its client went away: answered, never computed
    assert isinstance(batch[1].future.exception(timeout=0), ClientGone) and metrics.abandoned._value.get() == 1
    assert queue.unclaim([batch[1], batch[2]]) == [batch[2]]  # the worker answers batch[2] itself now
    assert not queue.withdraw(batch[2], ClientGone())
    assert queue.start_claimed(batch) == [batch[0], batch[3]]
    assert not queue.withdraw(batch[0], ClientGone()) and not batch[0].future.done()  # on the device now
    assert queue.admitted == 0 and len(queue) == 0


def test_a_claimed_image_whose_deadline_passes_before_its_batch_starts_is_answered_504_not_computed():
    metrics = Metrics()
    queue = BatchQueue(100, metrics)
    soon = time.monotonic() + 0.1
    submit(queue, 4)
    queue.admit(4)
    late = [queue.submit(X, far() if i % 2 else soon) for i in range(4)]
    queue.take_batch(max_size=4, max_wait_s=0)
    assert queue.take_more(max_size=4, batches=1) == [late]
    time.sleep(0.15)
    assert queue.start_claimed(late) == [late[1], late[3]]
    for item in (late[0], late[2]):
        with pytest.raises(DeadlineExceeded):
            item.future.result(timeout=0)
    assert metrics.timeouts._value.get() == 2


def test_take_more_drops_expired_images_as_take_batch_does():
    metrics = Metrics()
    queue = BatchQueue(100, metrics)
    submit(queue, 4)
    stale = submit(queue, 2, deadline=time.monotonic() - 0.001)
    fresh = submit(queue, 4)
    queue.take_batch(max_size=4, max_wait_s=0)
    assert queue.take_more(max_size=4, batches=2) == [fresh]
    assert all(isinstance(item.future.exception(timeout=0), DeadlineExceeded) for item in stale)
    assert metrics.timeouts._value.get() == 2 and len(queue) == 0 and queue.admitted == 0
