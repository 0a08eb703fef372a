"""The batch job's decoder for `--decode gpu`: the decoder interface of `decoding.threads.ThreadDecoder` (start,
release, close, clock), with each chunk's JPEGs decoded on the rank's model's device and left there
(`decode_inputs`): the rank reads the files' bytes, parses their headers and launches the kernels; other files and
the device's fallbacks are decoded in this process, on its thread, as the exact mode does. Two threads: one reads,
parses and launches while the other waits for its device decode, which queues behind the network's kernels on the
same GPU (with one, each chunk's host work waited for the chunk before it to come back).

Chunks are decoded in groups, one sequence of launches each, by `decoding.groups`' rule (up to GROUP chunks,
GROUP_BYTES of files at most; the first chunk always goes): the device decoder's synchronisation rounds are bound
by latency, so four chunks in one decode cost the device much less than four decodes. Each chunk still gets its own
answers, handed to the network batch by batch as before; the group's images share one pooled output buffer, which
goes back to the pool when the last of them is dropped.

A rank's chunks come one at a time (each report to rank 0 brings the next), so a thread that took whatever was
waiting as soon as it was free would decode them one by one. A group is taken when it is *due* (`due`):

- full: GROUP chunks or GROUP_BYTES are waiting (the group cannot grow);
- end: no more chunks are coming (`finish`, from the runner once rank 0 has none left for this rank);
- starve: fewer than STARVE_BELOW chunks are decoded and not yet computed, those being decoded included (`ahead`,
  from the runner as the device takes them): the network never waits for a group that is being held;
- timeout: the oldest waiting chunk has waited HOLD_S (a slow coordinator, a runner that reports nothing).

So a lone chunk (the job's first or last, or any chunk of a decoder nobody tells `ahead`) is decoded at once, by
the starve or end rule. `groups` and `due_counts` record each decode's chunks and why it was due (the summary's
`decode_groups`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from concurrent.futures import Future

from ..groups import GROUP, GROUP_BYTES, check, source_bytes, take
from ..stages import StageClock
from ..threads import ThreadDecoding

THREADS = 2
# Decoded chunks (not yet computed, those being decoded included) below which the waiting ones are decoded at once:
# the device computes one chunk and has the next staged, and a group's decode (its host work on one thread, 256 files
# read, parsed and laid out, then its kernels among the network's) takes longer than three chunks of the network at
# FP16 on an H200, so with three the device waited for decodes. With five (and the tokens that hold them,
# workqueue.rank_tokens), one rank ran 11,350-11,933 images/s against 9,507-10,853 with three, in turn
# (BENCHMARKS.md, thirty-second session).
STARVE_BELOW = 5
# The longest a chunk waits for others to form a group: a few batches' device time at FP16 on an H100 (64 images
# of VGG16 take about 20 ms), a small share of what a batch job of any size takes.
HOLD_S = 0.1
REASONS = ("full", "end", "starve", "timeout")


class DeviceChunkDecoder:
    """`decode`: the group's decode, called with the sources of every chunk of the group in order and answering one
    item per source (default: decode_inputs on `model`, as `job` says; tests pass their own); `clock`: seconds, for
    the timeout rule (tests pass their own)."""

    procs = 0
    restarts = 0
    inline = 0

    def __init__(self, model, job, group: int = GROUP, group_bytes: int = GROUP_BYTES, *, decode=None,
                 clock=time.monotonic):
        check(group, group_bytes)
        self.model, self.job = model, job
        self.threads, self.group, self.group_bytes = THREADS, group, group_bytes
        self.clock = StageClock()
        self.groups: list[int] = []  # chunks per device decode, in the order they were taken (benchmarks, tests)
        self.due_counts: Counter = Counter()  # decodes by the rule that made them due (REASONS)
        self._decode = decode or self._decode_inputs
        self._now = clock
        self._waiting: deque = deque()  # (sources, future, arrived, bytes) of chunks started and not yet taken
        self._ahead = 0  # decoded chunks queued ahead of the device: the runner's count, plus those decoded since
        self._decoding = 0  # chunks of the groups being decoded now
        self._finished = False  # no more chunks are coming
        self._closed = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    def start(self, sources) -> ThreadDecoding:
        """Decode a chunk: `result()` answers [(input, None) or (None, (reason, type name))] as ThreadDecoder's."""
        sources = list(sources)
        whole: Future = Future()
        size = sum(map(source_bytes, sources))  # once, outside the lock that both decode threads take
        with self._cond:
            if self._closed:
                whole.cancel()
            else:
                self._waiting.append((sources, whole, self._now(), size))
                self._start_threads()
                self._cond.notify_all()
        return ThreadDecoding([_Item(whole, i) for i in range(len(sources))])

    # ---- the runner's seam ----------------------------------------------------------------------------------------

    def ahead(self, chunks: int) -> None:
        """The runner's count of decoded chunks queued ahead of its device (on it or waiting to go on)."""
        with self._cond:
            self._ahead = chunks
            self._cond.notify_all()

    def finish(self) -> None:
        """No more chunks are coming: every waiting chunk, and any started after, is due (the end rule)."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def wake(self) -> None:
        """Decide again whether a group is due (after a change the decoder cannot see, such as its clock's)."""
        with self._cond:
            self._cond.notify_all()

    def due(self) -> str | None:
        """The rule that makes a group due now (one of REASONS), or None while none does."""
        with self._cond:
            return self._due()

    def group_stats(self) -> dict:
        """{"decodes", "chunks_per_decode" (mean), "due": {reason: decodes}}: the summary's decode_groups."""
        with self._cond:
            decodes, chunks = len(self.groups), sum(self.groups)
            return {"decodes": decodes, "chunks_per_decode": round(chunks / decodes, 3) if decodes else 0.0,
                    "due": {reason: self.due_counts[reason] for reason in REASONS}}

    # ---- the decode threads ---------------------------------------------------------------------------------------

    def _due(self) -> str | None:
        if not self._waiting:
            return None
        if len(self._waiting) >= self.group or sum(item[-1] for item in self._waiting) >= self.group_bytes:
            return "full"
        if self._finished:
            return "end"
        if self._ahead + self._decoding < STARVE_BELOW:
            return "starve"
        if self._now() - self._waiting[0][2] >= HOLD_S:
            return "timeout"
        return None

    def _start_threads(self) -> None:
        """The decode threads, on the first chunk (a decoder never used starts none). Holds the lock."""
        while len(self._threads) < self.threads:
            thread = threading.Thread(target=self._run, name=f"device-decode-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self) -> None:
        while True:
            taken = self._next_group()
            if taken is None:
                return
            self._decode_group(taken)

    def _next_group(self) -> list | None:
        """Wait until a group is due and take it, oldest first: [(sources, future)]; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                reason = self._due()
                if reason is not None:
                    break
                # a chunk waiting: until its timeout (the clock may be another than wait's: look again soon after)
                self._cond.wait(max(0.001, self._waiting[0][2] + HOLD_S - self._now()) if self._waiting else None)
            taken = [(sources, whole) for sources, whole, _, _ in take(self._waiting, self.group, self.group_bytes)]
            self._decoding += len(taken)
            self.groups.append(len(taken))
            self.due_counts[reason] += 1
            return taken

    def _decode_group(self, taken: list) -> None:
        for _, whole in taken:
            whole.set_running_or_notify_cancel()
        answers, failure = None, None
        try:
            with self.clock("decode"):
                answers = self._decode([s for chunk, _ in taken for s in chunk])
        except BaseException as exc:  # each chunk of the group raises it from result(), as a chunk of its own did
            failure = exc
        # counted as decoded before any of them is done: a count the runner takes once it sees them done includes
        # them, and one it took before can only be lower (a group due early by the starve rule, never one held)
        with self._cond:
            self._decoding -= len(taken)
            self._ahead += len(taken)
            self._cond.notify_all()
        at = 0
        for chunk, whole in taken:
            if failure is not None:
                whole.set_exception(failure)
            else:
                whole.set_result(answers[at:at + len(chunk)])
            at += len(chunk)

    def _decode_inputs(self, sources: list) -> list:
        from . import decode_inputs

        return decode_inputs(sources, self.model, self.job.mode, self.job.on_device, **self.job.limits)

    def release(self, decoding) -> None:
        """Nothing to give back: device images are freed with their last reference."""

    def close(self) -> None:
        """Stop the threads (a group being decoded is finished) and cancel the chunks still waiting."""
        with self._cond:
            self._closed = True
            while self._waiting:
                self._waiting.popleft()[1].cancel()
            self._cond.notify_all()


class _Item:
    """One source's share of its chunk's future, as ThreadDecoding expects of a future."""

    def __init__(self, whole, index: int):
        self.whole, self.index = whole, index

    def result(self, timeout=None):
        return self.whole.result(timeout)[self.index]

    def done(self) -> bool:
        return self.whole.done()
