"""The batch job's work sharing without MPI: chunk sizes, and rank 0's Coordinator against simulated workers.

`FakeWorkers` stands in for the MPI side (CoordinatorLink): every chunk sent to a worker comes back as a report
`seconds` after the worker is free, one chunk at a time per worker. Rank 0's own Worker runs on a `SleepingRunner`
(ChunkRunner's interface: submit / pending / run_timed / last_chunks) that sleeps per chunk and needs no images.
tests/test_batch_mpi.py runs the real thing under mpiexec.
"""

import json
import os
import threading
import time
from collections import deque

import pytest

from vggserve.decoding.stages import StageClock
from vggserve.distributed.coordinator import Coordinator
from vggserve.distributed.pipeline import ChunkOutcome, RankStats
from vggserve.distributed.workqueue import TOKENS, Worker, chunk_size, chunked


class SleepingRunner:
    def __init__(self, seconds, fail=False):
        self.seconds = seconds
        self.fail = fail
        self.queue = deque()
        self.thread_names = set()
        self.submitted = 0
        self.last_told = []  # chunks submitted when each last_chunks() came

    def last_chunks(self):
        self.last_told.append(self.submitted)

    @property
    def pending(self):
        return len(self.queue)

    def submit(self, paths):
        self.queue.append(list(paths))
        self.submitted += 1

    def run_timed(self, stats):
        self.thread_names.add(threading.current_thread().name)
        started = time.perf_counter()
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("injected failure on rank 0")
        paths = self.queue.popleft()
        outcome = ChunkOutcome([json.dumps({"image": p, "rank": 0}) for p in paths], [])
        stats.record(outcome, started, time.perf_counter())
        return outcome


class FakeWorkers:
    """CoordinatorLink for `size` ranks whose workers (1..size-1) take `seconds` per chunk."""

    def __init__(self, size, seconds):
        self.size = size
        self.seconds = seconds
        self.free_at = {rank: 0.0 for rank in range(1, size)}
        self.in_flight = []  # (due time, worker, report)
        self.nones = {rank: 0 for rank in range(1, size)}
        self.closed = False
        self.lock = threading.Lock()

    def send(self, worker, chunk):
        assert threading.current_thread() is threading.main_thread(), "only the main thread may make MPI calls"
        if chunk is None:
            self.nones[worker] += 1
            return
        due = max(time.monotonic(), self.free_at[worker]) + self.seconds
        self.free_at[worker] = due
        results = [json.dumps({"image": p, "rank": worker}) for p in chunk]
        self.in_flight.append((due, worker, {"results": results, "errors": [], "stats": {"rank": worker}}))

    def _due(self):
        now = time.monotonic()
        due = [entry for entry in self.in_flight if entry[0] <= now]
        return min(due, key=lambda entry: entry[0]) if due else None

    def report_waiting(self):
        assert threading.current_thread() is threading.main_thread()
        return self._due() is not None

    def next_report(self):
        assert threading.current_thread() is threading.main_thread()
        entry = self._due()
        if entry is None:
            return None
        self.in_flight.remove(entry)
        return entry[1], entry[2]

    def close(self):
        self.closed = True


def run_coordinator(size, images, chunk, own_seconds, worker_seconds, threaded, fail=False):
    """The Coordinator over FakeWorkers, every rank holding TOKENS tokens (as these tests count them)."""
    os.environ["VGGSERVE_BATCH_TOKENS"] = str(TOKENS)
    try:
        return _run_coordinator(size, images, chunk, own_seconds, worker_seconds, threaded, fail)
    finally:
        os.environ.pop("VGGSERVE_BATCH_TOKENS", None)


def _run_coordinator(size, images, chunk, own_seconds, worker_seconds, threaded, fail=False):
    paths = [f"img{i:03d}.jpg" for i in range(images)]
    recorded = []
    workers = FakeWorkers(size, worker_seconds)
    runner = SleepingRunner(own_seconds, fail=fail)
    coordinator = Coordinator(workers, runner, RankStats(0, "cpu"), chunked(paths, chunk),
                              lambda outcome: recorded.extend(json.loads(line) for line in outcome.results),
                              threaded=threaded)
    stats = coordinator.run()
    per_rank = {rank: sum(1 for r in recorded if r["rank"] == rank) for rank in range(size)}
    return paths, recorded, per_rank, stats, workers, runner


# ---- chunk size ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("images, ranks, batch, expected", [
    (3, 2, 16, 1),  # a tiny job: one image per chunk, so rank 1 gets work
    (13, 3, 2, 2),  # enough work: the batch size
    (100, 4, 16, 7),  # ceil(100 / 16): about CHUNKS_PER_RANK chunks per rank
    (4096, 4, 32, 32),  # a big job: full batches
    (1, 8, 16, 1),
    (5, 1, 16, 2),
])
def test_chunk_size_is_the_batch_size_unless_the_job_is_too_small_to_spread(images, ranks, batch, expected):
    assert chunk_size(images, ranks, batch) == expected


@pytest.mark.parametrize("images, ranks", [(3, 2), (7, 3), (2, 3), (50, 4), (1000, 8)])
def test_small_jobs_give_every_rank_a_chunk_when_there_are_enough_images(images, ranks):
    chunks = len(chunked(list(range(images)), chunk_size(images, ranks, 16)))
    assert chunks >= min(images, ranks)


# ---- Worker over a fake link -------------------------------------------------------------------------------------
class ScriptedLink:
    """Hands out the given chunks then Nones (one per request, like rank 0), records reports."""

    def __init__(self, chunks):
        self.chunks = deque(chunks)
        self.reports = []
        self.closed = False
        self.receives = 0

    def chunk_waiting(self):
        return self.receives < TOKENS + len(self.reports)

    def receive(self):
        assert self.chunk_waiting(), "the worker waited for a chunk nobody had sent"
        self.receives += 1
        return self.chunks.popleft() if self.chunks else None

    def report(self, report):
        self.reports.append(report)

    def close(self):
        self.closed = True


def test_worker_classifies_every_chunk_once_and_ends_when_its_tokens_are_retired():
    chunks = [[f"{c}-{i}" for i in range(2)] for c in range(7)]
    link = ScriptedLink(chunks)
    runner = SleepingRunner(0.0)
    worker = Worker(link, runner, RankStats(1, "cpu"))
    worker.run()
    assert link.closed and worker.finished and link.receives == len(chunks) + TOKENS
    assert runner.last_told == [len(chunks)] * TOKENS  # told at each None, every chunk in by then
    images = [json.loads(line)["image"] for report in link.reports for line in report["results"]]
    assert images == sum(chunks, [])
    assert link.reports[-1]["stats"]["images"] == 14


# ---- Coordinator -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("size, images, chunk", [(1, 7, 2), (1, 0, 2), (2, 3, 1), (3, 13, 2), (4, 2, 1), (4, 40, 3)])
def test_every_image_is_recorded_exactly_once(size, images, chunk, threaded):
    paths, recorded, _, stats, workers, _ = run_coordinator(size, images, chunk, 0.001, 0.001, threaded)
    assert sorted(r["image"] for r in recorded) == paths
    assert workers.closed and set(workers.nones.values()) <= {TOKENS}
    assert stats[0]["rank"] == 0


@pytest.mark.parametrize("threaded", [True, False])
def test_first_deal_gives_every_rank_a_chunk(threaded):
    """4 chunks, 4 ranks: one each, even though rank 0 could hold TOKENS chunks."""
    _, _, per_rank, _, _, _ = run_coordinator(4, 4, 1, 0.05, 0.05, threaded)
    assert per_rank == {0: 1, 1: 1, 2: 1, 3: 1}


def test_workers_are_answered_while_rank_0_classifies_its_own_slow_chunks():
    """Rank 0 takes 1 s per chunk, the workers 10 ms: the workers get everything but rank 0's first deal."""
    started = time.monotonic()
    _, recorded, per_rank, _, _, runner = run_coordinator(3, 60, 2, 1.0, 0.01, threaded=True)
    assert per_rank[0] == TOKENS * 2  # its first deal only
    assert abs(per_rank[1] - per_rank[2]) <= 4 and per_rank[1] + per_rank[2] == 60 - TOKENS * 2
    assert runner.thread_names == {"vggserve-batch-rank0"}  # the own chunks ran beside the coordinator
    assert time.monotonic() - started < TOKENS * 1.0 + 1.5


def test_without_a_helper_thread_workers_still_get_chunks_between_rank_0s_steps():
    _, _, per_rank, _, _, runner = run_coordinator(3, 30, 2, 0.2, 0.01, threaded=False)
    assert runner.thread_names == {threading.main_thread().name}
    assert per_rank[1] > 0 and per_rank[2] > 0 and sum(per_rank.values()) == 30


def test_rank_0s_failure_on_the_helper_thread_is_raised_by_run():
    with pytest.raises(RuntimeError, match="injected failure on rank 0"):
        run_coordinator(3, 20, 2, 0.01, 0.01, threaded=True, fail=True)


class SlowLink:
    """A worker's link to rank 0 whose chunks arrive `delay` seconds after they are asked for."""

    def __init__(self, chunks, delay):
        self.chunks = deque(chunks)
        self.delay = delay
        self.reports = []

    def chunk_waiting(self):
        return False

    def receive(self):
        time.sleep(self.delay)
        return self.chunks.popleft() if self.chunks else None

    def report(self, report):
        self.reports.append(report)

    def close(self):
        pass


def test_a_worker_reports_how_long_it_waited_with_nothing_to_classify():
    """The summary's "chunks" wait: wall time with an empty runner, waiting for rank 0's next chunk (the first
    chunk's wait, before the rank has classified anything, is start-up and not counted)."""
    chunks = [[f"img{i}.jpg", f"img{i}b.jpg"] for i in range(8)]
    stats = RankStats(1, "cpu", waits=StageClock(time.perf_counter))
    worker = Worker(SlowLink(chunks, 0.02), SleepingRunner(0.0), stats, tokens=1)
    worker.run()
    assert stats.images == 16
    # every chunk after the first was waited for with nothing pending: 7 (and the final None) x 20 ms over 16 images
    assert stats.starved_s >= 7 * 0.02
    assert stats.as_dict()["wait_ms_per_image"]["chunks"] >= 1000 * 7 * 0.02 / 16
    fast = RankStats(1, "cpu")
    Worker(SlowLink(chunks, 0.0), SleepingRunner(0.0), fast, tokens=1).run()
    assert fast.starved_s < 0.02


def test_a_job_of_several_ranks_holds_more_chunks_per_rank(monkeypatch):
    """One rank keeps TOKENS chunks; with several, each keeps SHARED_TOKENS (a chunk's round trip through rank 0 is
    longer); $VGGSERVE_BATCH_TOKENS sets both, at least 2."""
    from vggserve.distributed.workqueue import SHARED_TOKENS, rank_tokens

    monkeypatch.delenv("VGGSERVE_BATCH_TOKENS", raising=False)
    assert rank_tokens(1) == TOKENS and rank_tokens(2) == rank_tokens(16) == SHARED_TOKENS > TOKENS
    monkeypatch.setenv("VGGSERVE_BATCH_TOKENS", "8")
    assert rank_tokens(1) == rank_tokens(4) == 8
    monkeypatch.setenv("VGGSERVE_BATCH_TOKENS", "1")
    assert rank_tokens(4) == 2
    monkeypatch.setenv("VGGSERVE_BATCH_TOKENS", "lots")
    assert rank_tokens(4) == SHARED_TOKENS


def test_the_coordinator_deals_every_rank_its_tokens_before_any_report(monkeypatch):
    """Rank 0 starts by dealing each rank as many chunks as it holds tokens: SHARED_TOKENS in a job of several."""
    from vggserve.distributed.workqueue import SHARED_TOKENS

    monkeypatch.delenv("VGGSERVE_BATCH_TOKENS", raising=False)
    workers = FakeWorkers(3, 10.0)  # reports come back long after the first deal
    coordinator = Coordinator(workers, SleepingRunner(0.0), RankStats(0, "cpu"),
                              chunked([f"i{n}" for n in range(200)], 2), lambda outcome: None)
    for _round in range(coordinator.rounds):
        for rank in coordinator.tokens:
            coordinator._give(rank)
    dealt = {rank: sum(1 for _, worker, _ in workers.in_flight if worker == rank) for rank in (1, 2)}
    assert coordinator.rounds == SHARED_TOKENS and dealt == {1: SHARED_TOKENS, 2: SHARED_TOKENS}


class Arriving:
    """A report on its way: `test()` answers (False, None) until `delivered` is set (its sender called into MPI)."""

    def __init__(self, report):
        self.report = report
        self.delivered = False

    def test(self):
        return (True, self.report) if self.delivered else (False, None)


class MatchedComm:
    """The matched-probe side of an MPI communicator of 3 ranks: `improbe` hands out the queued reports in order."""

    def __init__(self):
        self.queued: deque = deque()  # (source, Arriving)

    def Get_size(self):
        return 3

    def improbe(self, source, tag, status):
        if not self.queued:
            return None
        worker, arriving = self.queued.popleft()
        status.source = worker
        return type("Message", (), {"irecv": lambda self: arriving})()


def test_rank_0_takes_the_reports_that_have_arrived_without_waiting_for_one_still_on_its_way(monkeypatch):
    """A large report moves only while its worker calls into MPI; rank 0 must not block on it meanwhile (a
    blocking receive held every other worker's answer back until that worker called into MPI again)."""
    from mpi4py import MPI

    class Status:
        source = None

        def Get_source(self):
            return self.source

    monkeypatch.setattr(MPI, "Status", Status)
    from vggserve.distributed.workqueue import CoordinatorLink

    comm = MatchedComm()
    link = CoordinatorLink(comm)
    slow, fast = Arriving({"from": 1}), Arriving({"from": 2})
    fast.delivered = True
    comm.queued.extend([(1, slow), (2, fast)])
    assert link.report_waiting()
    assert link.next_report() == (2, {"from": 2})
    assert link.next_report() is None and not link.report_waiting()  # rank 1's is matched, not complete
    slow.delivered = True
    assert link.report_waiting()
    assert link.next_report() == (1, {"from": 1})
    assert link.next_report() is None


def test_the_outbox_says_whether_its_messages_are_still_on_their_way():
    from vggserve.distributed.mpi import Outbox

    class Request:
        def __init__(self):
            self.tests = 0

        def Test(self):
            self.tests += 1
            return self.tests >= 2  # delivered at its second test

    class Comm:
        def isend(self, message, dest, tag):
            return Request()

    outbox = Outbox(Comm())
    assert not outbox.progress()
    outbox.send("report", dest=0, tag=42)
    assert outbox.progress()  # first test: still on its way
    assert not outbox.progress()  # delivered
