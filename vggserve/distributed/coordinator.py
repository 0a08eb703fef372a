"""Rank 0 of the batch job: deal the chunks to every rank, itself included, and record every outcome.

    coordinator = Coordinator(CoordinatorLink(comm), runner, stats, chunks, record, threaded=helper_threads_allowed())
    stats_by_rank = coordinator.run()

The protocol is workqueue.py's. Rank 0's main thread makes every MPI call: it answers the workers' reports and
records the results. Rank 0's own chunks are classified by a `Worker` on a helper thread that makes no MPI calls
and talks to the coordinator through a `LocalLink` (two in-process queues). So a worker's report is answered
within a few milliseconds (mpi.sleep_until's longest sleep), also while rank 0's device is in a long chunk or
its decode threads are behind; rank 0's own reports wake the main thread at once (an Event), so a one-rank job
waits for no poll; and the own Worker is fed the same way as any other rank.

That needs MPI_THREAD_FUNNELED or above (mpi.helper_threads_allowed), which the decode threads assume already.
Below it (`threaded=False`), the main thread steps its own Worker itself and answers every waiting report
after each step (taking a chunk, which starts its decoding, or classifying one): workers then wait for at
most one of rank 0's chunks.

An exception (a full disk while recording, rank 0's model failing on the helper thread) is raised by `run` on
the main thread; the helper thread stops after its current chunk.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Callable

from .mpi import sleep_until
from .pipeline import ChunkOutcome, ChunkRunner, RankStats
from .workqueue import CoordinatorLink, Worker, rank_tokens


class Stopped(Exception):
    """Raised in rank 0's own Worker when the coordinator has given up."""


class LocalLink:
    """The line between the coordinator and rank 0's own Worker (the Worker's side is the link protocol)."""

    def __init__(self):
        self.chunks: queue.SimpleQueue = queue.SimpleQueue()
        self.reports: queue.SimpleQueue = queue.SimpleQueue()
        self.arrived = threading.Event()  # a report was put: wakes the coordinator at once
        self.stopped = False

    # the Worker's side
    def chunk_waiting(self) -> bool:
        return self.stopped or not self.chunks.empty()

    def receive(self) -> list[str] | None:
        chunk = self.chunks.get()
        if self.stopped:
            raise Stopped
        return chunk

    def report(self, report: dict) -> None:
        if self.stopped:
            raise Stopped
        self.reports.put(report)
        self.arrived.set()

    def close(self) -> None:
        pass

    # the coordinator's side
    def next_report(self) -> tuple[int, dict] | None:
        try:
            return 0, self.reports.get_nowait()
        except queue.Empty:
            return None

    def stop(self) -> None:
        self.stopped = True
        self.chunks.put(None)  # wakes a Worker waiting in receive


class Coordinator:
    """Deals `chunks` to every rank, runs rank 0's own Worker, and passes every outcome to `record`. `group`: the
    decode group the ranks agreed on (workqueue.agreed_group), which sets how many chunks each rank holds."""

    def __init__(
        self,
        link: CoordinatorLink,
        runner: ChunkRunner,
        stats: RankStats,
        chunks: deque[list[str]],
        record: Callable[[ChunkOutcome], None],
        threaded: bool = True,
        group: int = 1,
    ):
        self.remote = link
        self.local = LocalLink()
        # rank 0's own Worker holds one rank's tokens: the rest of its deal waits in the LocalLink, a round trip of
        # no time at all
        self.own = Worker(self.local, runner, stats, rank_tokens(1, group))
        self.chunks = chunks
        self.record = record
        self.threaded = threaded
        self.rounds = rank_tokens(link.size, group)
        self.tokens = {rank: self.rounds for rank in range(link.size)}
        self.worker_stats: dict[int, dict] = {}
        self.own_error: BaseException | None = None

    def run(self) -> dict[int, dict]:
        """Until every image is recorded; returns the stats (RankStats.as_dict) of every rank that did work."""
        for _round in range(self.rounds):
            for rank in self.tokens:
                self._give(rank)
        helper = None
        if self.threaded:
            helper = threading.Thread(target=self._run_own, name="vggserve-batch-rank0", daemon=True)
            helper.start()
        try:
            while any(self.tokens.values()):
                if self.own_error is not None:
                    raise self.own_error
                if self._answer_one():
                    continue
                if not self.threaded and self.own.ready():
                    self.own.step()
                    continue
                sleep_until(self._something_to_answer, wake=self.local.arrived)
        except BaseException:
            self.local.stop()  # the caller aborts every rank, or closes the model (which waits for the chunk)
            raise
        if helper is not None:
            helper.join()
        self.remote.close()
        return {0: self.own.stats.as_dict(), **self.worker_stats}

    def _run_own(self) -> None:
        try:
            self.own.run()
        except Stopped:
            pass
        except BaseException as exc:  # raised again on the main thread
            self.own_error = exc

    def _something_to_answer(self) -> bool:
        """A report is waiting (probing leaves it queued) or the helper thread failed."""
        return not self.local.reports.empty() or self.own_error is not None or self.remote.report_waiting()

    def _answer_one(self) -> bool:
        """Record one waiting report (rank 0's own first) and answer it; False when none is waiting."""
        found = self.local.next_report() or self.remote.next_report()
        if found is None:
            return False
        rank, report = found
        if rank != 0:
            self.worker_stats[rank] = report["stats"]
        self.record(ChunkOutcome(report["results"], report["errors"]))
        self._give(rank)
        return True

    def _give(self, rank: int) -> None:
        """Send `rank` the next chunk, or None (retiring one of its tokens) when none is left."""
        chunk = self.chunks.popleft() if self.chunks else None
        if chunk is None:
            self.tokens[rank] -= 1
        if rank == 0:
            self.local.chunks.put(chunk)
        else:
            self.remote.send(rank, chunk)
