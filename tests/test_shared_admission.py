"""--max-queue as the whole server's limit with HTTP front ends (`processes.admission`), in one process: front ends'
queues counting in one shared block, uneven load, every way admitted images leave (answered, failed to decode,
engine gone, a front end's slot cleared), and processes admitting at once. The real processes: test_http_frontends.
"""

import multiprocessing as mp
import time

import numpy as np
import pytest

from test_http_frontends import crop, engine_and_clients
from vggserve.modelinput import ModelInput
from vggserve.serving.metrics import Metrics
from vggserve.serving.processes.admission import AdmissionBlock, SharedCount
from vggserve.serving.processes.engine_link import RemoteQueue
from vggserve.serving.processes.routing import RoutedQueue
from vggserve.serving.scheduling.batcher import Outcome
from vggserve.serving.scheduling.errors import QueueFull, Unavailable, shutting_down
from vggserve.serving.settings import Settings


def queues(block: AdmissionBlock, capacity: int) -> list[RemoteQueue]:
    return [RemoteQueue(capacity, Metrics(), lambda message: None, block.count(i, capacity))
            for i in range(block.front_ends)]


def test_one_front_end_may_take_the_whole_queue_and_the_others_are_refused_past_it():
    block = AdmissionBlock(3)
    busy, idle, other = queues(block, 10)
    busy.admit(9)  # far more than a third of --max-queue
    idle.admit(1)
    for queue, n in ((busy, 1), (idle, 1), (other, 1), (other, 2)):
        with pytest.raises(QueueFull) as full:
            queue.admit(n)
        assert full.value.message == ("the server's queue is full (10 images waiting or being decoded, "
                                      "--max-queue 10); retry after 1 s")
    assert busy.metrics.rejected.labels(reason="queue_full")._value.get() == 1
    assert [block.holding(i) for i in range(3)] == [9, 1, 0] and block.held() == 10
    busy.release(4)  # e.g. four uploads that did not decode
    other.admit(4)
    assert [block.holding(i) for i in range(3)] == [5, 1, 4]
    with pytest.raises(QueueFull):
        other.admit(1)
    for queue in (busy, idle, other):
        queue.release(queue.admitted)
    assert block.held() == 0 and all(q.admitted == 0 for q in (busy, idle, other))


def test_a_refused_request_takes_nothing_and_all_or_none_of_its_images():
    block = AdmissionBlock(2)
    first, second = queues(block, 8)
    first.admit(5)
    with pytest.raises(QueueFull):
        second.admit(4)  # 9 > 8: none of the four
    assert second.admitted == 0 and block.held() == 5
    second.admit(3)
    assert block.held() == 8
    block.count(0, 8).set(6)  # the first front end has published a reservation it will take back (9 > 8)
    second.admit(0)  # a request whose every file was refused before admission: nothing to count, never a 429
    block.count(0, 8).set(5)
    assert block.held() == 8 and second.admitted == 3


def test_answers_engine_loss_and_a_cleared_slot_give_the_room_back():
    block = AdmissionBlock(2)
    sent = []
    first = RemoteQueue(4, Metrics(), sent.append, block.count(0, 4))
    second = RemoteQueue(4, Metrics(), sent.append, block.count(1, 4))
    first.admit(3)
    items = [first.submit(ModelInput.crop(np.zeros((224, 224, 3), np.uint8)), time.monotonic() + 10)
             for _ in range(3)]
    first.resolve(items[0].id, outcome=Outcome(np.zeros(1000, np.float32), 0.0, 0.0, 1, "d"))
    assert block.holding(0) == 2
    first.close(shutting_down("the engine process went away; retry"))  # the two left answered, room given back
    assert block.holding(0) == 0 and all(item.future.done() for item in items)
    assert isinstance(items[2].future.exception(), Unavailable)
    second.admit(4)
    block.clear(1)  # the supervisor reaped front end 1
    assert block.held() == 0
    with pytest.raises(Unavailable):  # a closed queue refuses with its reason, before counting
        first.admit(4)
    assert block.held() == 0 and first.admitted == 0


def test_a_front_end_over_several_engines_counts_in_the_same_block():
    block = AdmissionBlock(2)
    routed = RoutedQueue(6, Metrics(), block.count(0, 6))
    plain = RemoteQueue(6, Metrics(), lambda message: None, block.count(1, 6))
    routed.admit(6)
    with pytest.raises(QueueFull):
        plain.admit(1)
    with pytest.raises(Exception, match="no engine process can take images"):  # no usable engine: given back
        routed.submit(ModelInput.crop(np.zeros((224, 224, 3), np.uint8)), time.monotonic() + 10)
    plain.admit(1)
    assert block.holding(0) == 5 and block.holding(1) == 1


def test_an_engine_link_client_admits_from_the_shared_block_and_ends_at_zero():
    """Two front ends' links to a real engine (sleeping stand-in): the first takes all of --max-queue, the second
    is refused until the first's images are answered, and both slots are back at zero afterwards."""
    settings = Settings(http_workers=2, max_queue=4, max_files=1, max_batch_size=2, max_wait_ms=0, warmup=False)
    block = AdmissionBlock(2)
    models: list = []
    with engine_and_clients(settings, models, 0.3, 2, capacity=4, block=block) as (service, host, clients):
        busy, idle = (client.queue for client in clients)
        busy.admit(4)
        items = [busy.submit(ModelInput.crop(crop((10 * i, 0, 0))), time.monotonic() + 30) for i in range(4)]
        with pytest.raises(QueueFull):
            idle.admit(1)
        outcomes = [item.future.result(timeout=30) for item in items]
        assert all(o.probabilities.shape == (1000,) for o in outcomes)
        idle.admit(1)
        idle.release(1)
    assert block.held() == 0 and [block.holding(i) for i in range(2)] == [0, 0]


def _hammer(memory, index: int, rounds: int, holders, stats) -> None:
    """Admit 2 images of --max-queue 5 and give them back, `rounds` times; `holders` counts the processes holding
    their 2 (inside the admission, so never more than the block lets in), `stats` the admissions, refusals and the
    most holders seen."""
    queue = RemoteQueue(5, Metrics(), lambda message: None, SharedCount(memory, index, 4, 5))
    admitted = refused = most = 0
    for _ in range(rounds):
        try:
            queue.admit(2)
        except QueueFull:
            refused += 1
            continue
        with holders.get_lock():
            holders.value += 1
            most = max(most, holders.value)
        admitted += 1
        for _ in range(100):  # hold them a moment, so that holders overlap
            pass
        with holders.get_lock():
            holders.value -= 1
        queue.release(2)
    with stats.get_lock():
        stats[0] += admitted
        stats[1] += refused
        stats[2] = max(stats[2], most)


def test_processes_admitting_at_once_never_pass_the_limit_and_end_at_zero():
    """Four processes each admitting 2 images at a time against --max-queue 5 in one block: at most two hold theirs
    at once (three would be 6 images), some are refused, and the count ends at zero."""
    block = AdmissionBlock(4)
    context = mp.get_context("fork")
    holders, stats = context.Value("q", 0), context.Array("q", 3)
    procs = [context.Process(target=_hammer, args=(block._memory, i, 5000, holders, stats)) for i in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    admitted, refused, most = stats[:]
    assert admitted + refused == 4 * 5000 and admitted > 0 and most <= 2, stats[:]
    assert block.held() == 0 and holders.value == 0
