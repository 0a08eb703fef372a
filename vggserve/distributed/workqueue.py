"""Dynamic work sharing for the batch job: rank 0 hands out chunks of image paths, ranks ask for more.

Only paths travel over MPI; every rank reads and decodes its own images. Rank 0 classifies too: between its
own chunks it answers the requests waiting for it (non-blocking probes), so `mpirun -n 1` needs no special
case and no rank sits idle while another still has a long queue.

Protocol (pickled messages on the job's communicator):

    rank 0 -> worker  TAG_CHUNK    a list of paths, or None ("no more work")
    worker -> rank 0  TAG_REPORT   {"results": [json line, ...], "errors": [json line, ...], "stats": {...}}
                                   for the chunk it just finished; each report asks for one more chunk

Each worker holds TOKENS tokens. A token is a chunk on its way to the worker, a chunk the worker holds
(decoding or classifying), or a report on its way to rank 0. Rank 0 starts by dealing every worker TOKENS
chunks (round-robin, keeping OWN_DEPTH for itself in the first rounds); it answers each report with a chunk
while chunks last, and with None afterwards; a None retires the token. A worker ends when all its tokens
are retired; since a worker's report always reaches rank 0 before its token is retired, rank 0 has every
result once all tokens are retired. With three tokens a worker holds a chunk being classified and the next
one being decoded while its request for another travels.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .mpi import wait, wait_for_message
from .pipeline import ChunkOutcome, ChunkRunner, RankStats

TAG_CHUNK = 41
TAG_REPORT = 42
TOKENS = 3  # per worker: see the module docstring
OWN_DEPTH = 2  # chunks rank 0 keeps submitted to its own runner: one classified, one decoded ahead


class Outbox:
    """Non-blocking sends: a large message (a report with many top-k lines) must not stall its sender until
    the receiver gets round to it."""

    def __init__(self, comm):
        self.comm = comm
        self._requests: list = []

    def send(self, message, dest: int, tag: int) -> None:
        self._requests = [request for request in self._requests if not request.Test()]
        self._requests.append(self.comm.isend(message, dest=dest, tag=tag))

    def flush(self) -> None:
        """Wait until every message has been delivered."""
        for request in self._requests:
            wait(request)
        self._requests.clear()


def chunked(paths: list[str], size: int) -> deque[list[str]]:
    """Consecutive chunks of `size` paths (the last may be shorter)."""
    return deque(paths[start : start + size] for start in range(0, len(paths), size))


class Coordinator:
    """Rank 0: deals chunks, classifies its own share, and records every outcome through `record`."""

    def __init__(
        self,
        comm,
        runner: ChunkRunner,
        stats: RankStats,
        chunks: deque[list[str]],
        record: Callable[[ChunkOutcome], None],
    ):
        self.comm = comm
        self.runner = runner
        self.stats = stats
        self.chunks = chunks
        self.record = record
        self.tokens = {worker: TOKENS for worker in range(1, comm.Get_size())}
        self.worker_stats: dict[int, dict] = {}
        self.outbox = Outbox(comm)

    def run(self) -> dict[int, dict]:
        """Until every image is recorded; returns the stats (RankStats.as_dict) of every rank that did work."""
        from mpi4py import MPI

        for round_ in range(TOKENS):  # deal round-robin, rank 0 included
            if round_ < OWN_DEPTH and self.chunks:
                self.runner.submit(self.chunks.popleft())
            for worker in self.tokens:
                self._give(worker)
        while True:
            self._answer_reports()
            while self.runner.pending < OWN_DEPTH and self.chunks:
                self.runner.submit(self.chunks.popleft())
            if self.runner.pending:
                self.record(self.runner.run_timed(self.stats))
            elif any(self.tokens.values()):
                wait_for_message(self.comm, MPI.ANY_SOURCE, TAG_REPORT)
            else:
                break
        self.outbox.flush()
        return {0: self.stats.as_dict(), **self.worker_stats}

    def _give(self, worker: int) -> None:
        """Send `worker` the next chunk, or None (retiring one of its tokens) when none is left."""
        chunk = self.chunks.popleft() if self.chunks else None
        if chunk is None:
            self.tokens[worker] -= 1
        self.outbox.send(chunk, dest=worker, tag=TAG_CHUNK)

    def _answer_reports(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REPORT, status=status):
            worker = status.Get_source()
            report = self.comm.recv(source=worker, tag=TAG_REPORT)
            self.worker_stats[worker] = report["stats"]
            self.record(ChunkOutcome(report["results"], report["errors"]))
            self._give(worker)


def work_for_coordinator(comm, runner: ChunkRunner, stats: RankStats) -> None:
    """A worker rank: classify the chunks rank 0 sends until all TOKENS tokens are retired."""
    requested = TOKENS  # tokens on their way to us as chunks (rank 0 deals them unasked at the start)
    live = TOKENS  # tokens not yet retired: requested + runner.pending
    outbox = Outbox(comm)
    while live:
        if requested and (runner.pending == 0 or comm.Iprobe(source=0, tag=TAG_CHUNK)):
            wait_for_message(comm, 0, TAG_CHUNK)
            chunk = comm.recv(source=0, tag=TAG_CHUNK)
            requested -= 1
            if chunk is None:
                live -= 1
            else:
                runner.submit(chunk)
            continue
        outcome = runner.run_timed(stats)
        report = {"results": outcome.results, "errors": outcome.errors, "stats": stats.as_dict()}
        outbox.send(report, dest=0, tag=TAG_REPORT)
        requested += 1
    outbox.flush()
