"""Dynamic work sharing for the batch job: rank 0 deals chunks of image paths, every rank classifies them.

Only paths travel over MPI; every rank reads and decodes its own images. Every rank, rank 0 included, runs the
same `Worker` loop. Rank 0's main thread also runs the coordinator (coordinator.py), which deals the chunks and
records the results; rank 0's own Worker talks to it in-process instead of over MPI, so `mpirun -n 1` needs no
special case.

Protocol (pickled messages on the job's communicator):

    rank 0 -> worker  TAG_CHUNK    a list of paths, or None ("no more work")
    worker -> rank 0  TAG_REPORT   {"results": [json line, ...], "errors": [json line, ...], "stats": {...}}
                                   for the chunk it just finished; each report asks for one more chunk

Each rank holds TOKENS tokens. A token is a chunk on its way to the rank, a chunk the rank holds (decoding or
classifying), or a report on its way to rank 0. Rank 0 starts by dealing TOKENS rounds, one chunk per rank and
round, rank 0 included, so every rank gets work when there are at least as many chunks as ranks. It answers
each report with a chunk while chunks last, and with None afterwards; a None retires the token. A rank ends
when all its tokens are retired; since its report always reaches rank 0 before its token is retired, rank 0
has every result once all tokens are retired. With five tokens a rank holds a chunk on its device, the next one
staged behind it and three more decoding (or on their way): at the device's pace, its decode processes always have
a chunk to work on while the device computes one. With three, 15 decode processes and a device of 32-image batches
kept the device busy about 0.73 of the time, with five 0.93 (`benchmarks/batch_host_floor.py --replay-ms
--device-ms`, which stands in for both with sleeps; BENCHMARKS.md).

With `--decode gpu` a rank's device decoder decodes several chunks at once (decoding.device.chunks), holding
chunks back while a group gathers and decodes a group at a time, so its ranks hold two groups more
(`rank_tokens(ranks, group)`, the group agreed by every rank: 13 for one rank, 20 for several). More chunks in
flight change nothing in what is recorded: rank 0 writes a chunk's lines when its report comes, a rank ends only
once each of its chunks is reported, and a job that is stopped redoes on its rerun the chunks that were in flight
(a few more of them).

Chunks hold `chunk_size(...)` paths: the batch size, or fewer for a small job, so that it is still spread over
every rank (3 images over 2 ranks are 3 chunks of one image).
"""

from __future__ import annotations

import os
import time
from collections import deque

from .mpi import Outbox, wait_for_message
from .pipeline import ChunkRunner, RankStats

TAG_CHUNK = 41
TAG_REPORT = 42
TOKENS = 5  # per rank: see the module docstring
# per rank when there are several: on two H100s (FP16, batch 64, 2026-11-26) rank 1 with 5 waited 0.24 ms per image for
# its decodes (its chunks came back through rank 0 too late to be decoded ahead) and ran at 0.68 of rank 0; with 12
# both ranks ran alike, 7% more in all; 24 gave nothing more (BENCHMARKS.md)
SHARED_TOKENS = 12


def rank_tokens(ranks: int = 1, group: int = 1) -> int:
    """Tokens per rank in a job of `ranks` ranks whose ranks decode up to `group` chunks at once (agreed_group):
    TOKENS for one rank, SHARED_TOKENS for several (a chunk's round trip through rank 0 takes longer than rank 0's
    own), and two groups more where groups form (group > 1, `--decode gpu`): the rank's device decoder holds up to a
    group's chunks back while they gather, while the group before them is decoded, on top of those it keeps decoded
    ahead (decoding.device.chunks.STARVE_BELOW; one rank: 13, several: 20; with the starve rule at five, one rank ran
    11,350-11,933 images/s on an H200 at FP16 against 9,507-10,853 with 9 tokens and the rule at three, in turn:
    BENCHMARKS.md, thirty-second session). $VGGSERVE_BATCH_TOKENS sets it (2 or more; every rank must see the same
    value, as mpirun passes the environment on)."""
    default = (TOKENS if ranks <= 1 else SHARED_TOKENS) + (2 * group if group > 1 else 0)
    try:
        return max(2, int(os.environ.get("VGGSERVE_BATCH_TOKENS", default)))
    except ValueError:
        return default


def agreed_group(comm, group: int) -> int:
    """The decode group every rank counts its tokens by: the largest of the ranks' own `group`s (an allgather: a
    rank knows only its own decoder, and rank 0 deals every rank the same number of chunks at the start)."""
    return max(comm.allgather(group)) if comm.Get_size() > 1 else group


CHUNKS_PER_RANK = 4  # a job with fewer full chunks per rank than this is cut into smaller chunks


def chunk_size(images: int, ranks: int, batch_size: int) -> int:
    """Paths per chunk: `batch_size`, or fewer (down to 1) so that there are CHUNKS_PER_RANK chunks per rank."""
    return max(1, min(batch_size, -(-images // (ranks * CHUNKS_PER_RANK))))


def chunked(paths: list[str], size: int) -> deque[list[str]]:
    """Consecutive chunks of `size` paths (the last may be shorter)."""
    return deque(paths[start : start + size] for start in range(0, len(paths), size))


class Worker:
    """One rank's side of the protocol, over a link to the coordinator: `chunk_waiting()`, `receive()` (waits
    for the next chunk or None), `report(dict)` and `close()` (waits until the reports are delivered)."""

    def __init__(self, link, runner: ChunkRunner, stats: RankStats, tokens: int | None = None):
        self.link = link
        self.runner = runner
        self.stats = stats
        tokens = rank_tokens() if tokens is None else tokens  # one rank's, unless the job says
        self.requested = tokens  # tokens on their way to us as chunks (rank 0 deals them unasked at the start)
        self.live = tokens  # tokens not yet retired: requested + runner.pending

    @property
    def finished(self) -> bool:
        return self.live == 0

    def ready(self) -> bool:
        """Whether `step` can go ahead without waiting for rank 0."""
        return self.runner.pending > 0 or (self.requested > 0 and self.link.chunk_waiting())

    def step(self) -> None:
        """Take a chunk that has arrived (starting its decoding), waiting for one when nothing is left to
        classify; else classify the oldest chunk and report it (which asks for another)."""
        if self.requested and (self.runner.pending == 0 or self.link.chunk_waiting()):
            starved = time.perf_counter() if self.runner.pending == 0 and self.stats.images else None
            chunk = self.link.receive()
            if starved is not None:
                self.stats.starved_s += time.perf_counter() - starved
            self.requested -= 1
            if chunk is None:
                self.runner.last_chunks()  # rank 0 deals a None only once its chunks are gone: none come after
                self.live -= 1
            else:
                self.runner.submit(chunk)
            return
        outcome = self.runner.run_timed(self.stats)
        self.link.report({"results": outcome.results, "errors": outcome.errors, "stats": self.stats.as_dict()})
        self.requested += 1

    def run(self) -> None:
        """Until every token is retired."""
        while not self.finished:
            self.step()
        self.link.close()


class WorkerLink:
    """A worker rank's side of the MPI messages."""

    def __init__(self, comm):
        self.comm = comm
        self.outbox = Outbox(comm)

    def chunk_waiting(self) -> bool:
        return self.comm.Iprobe(source=0, tag=TAG_CHUNK)

    def receive(self) -> list[str] | None:
        wait_for_message(self.comm, 0, TAG_CHUNK)
        return self.comm.recv(source=0, tag=TAG_CHUNK)

    def report(self, report: dict) -> None:
        self.outbox.send(report, dest=0, tag=TAG_REPORT)

    def progress(self) -> bool:
        """Move the reports sent along; True while some are not yet delivered (ChunkRunner.idle)."""
        return self.outbox.progress()

    def close(self) -> None:
        self.outbox.flush()


class CoordinatorLink:
    """Rank 0's side of the MPI messages: the workers' reports in, chunks out.

    A report is received without blocking (a matched probe, then a non-blocking receive): a large report moves
    only while its worker calls into MPI, and a blocking receive would hold rank 0's main thread, and with it
    every other worker's answer, until that worker does."""

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.outbox = Outbox(comm)
        self._arriving: list = []  # (worker rank, request) of reports matched and not yet complete
        self._arrived: deque = deque()  # (worker rank, report) complete and not yet taken

    def report_waiting(self) -> bool:
        if self.size == 1:  # no worker ranks (and, in a SingleProcess world, no MPI to ask)
            return False
        self._collect()
        return bool(self._arrived)

    def next_report(self) -> tuple[int, dict] | None:
        """(worker rank, report) for a report that has arrived, else None at once."""
        if self.size == 1:
            return None
        if not self._arrived:
            self._collect()
        return self._arrived.popleft() if self._arrived else None

    def _collect(self) -> None:
        """Start receiving every report that has begun to arrive; keep those that have completed."""
        from mpi4py import MPI

        status = MPI.Status()
        while (message := self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REPORT, status=status)) is not None:
            self._arriving.append((status.Get_source(), message.irecv()))
        still = []
        for worker, request in self._arriving:
            done, report = request.test()
            if done:
                self._arrived.append((worker, report))
            else:
                still.append((worker, request))
        self._arriving = still

    def send(self, worker: int, chunk: list[str] | None) -> None:
        self.outbox.send(chunk, dest=worker, tag=TAG_CHUNK)

    def close(self) -> None:
        self.outbox.flush()


def work_for_coordinator(comm, runner: ChunkRunner, stats: RankStats, tokens: int | None = None) -> None:
    """A worker rank (not rank 0): classify the chunks rank 0 sends until all its `tokens` (default: rank_tokens
    for the job's ranks) are retired. While the runner waits for its device or its decodes, its reports keep moving
    (ChunkRunner.idle)."""
    link = WorkerLink(comm)
    runner.idle = link.progress
    Worker(link, runner, stats, rank_tokens(comm.Get_size()) if tokens is None else tokens).run()
