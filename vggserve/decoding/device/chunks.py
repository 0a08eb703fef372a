"""The batch job's decoder for `--decode gpu`: the decoder interface of `decoding.threads.ThreadDecoder` (start,
release, close, clock), with each chunk's JPEGs decoded on the rank's model's device and left there
(`decode_inputs`): the rank reads the files' bytes, parses their headers and launches the kernels; other files and
the device's fallbacks are decoded in this process, on its thread, as the exact mode does. Two threads: one reads,
parses and launches while the other waits for its device decode, which queues behind the network's kernels on the
same GPU (with one, each chunk's host work waited for the chunk before it to come back).

Chunks that are waiting for a thread when one comes free are decoded together, as one group: one sequence of
launches, by `decoding.groups`' rule (up to GROUP chunks, GROUP_BYTES of files at most; the first chunk always
goes). Each chunk still gets its own answers, handed to the network batch by batch as before; the group's images
share one pooled output buffer, which goes back to the pool when the last of them is dropped. A group forms only from chunks already started: none is held back
waiting for another, so a lone chunk (the job's last, or a slow coordinator) is decoded at once.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from ..groups import GROUP, GROUP_BYTES, check, source_bytes, take
from ..stages import StageClock
from ..threads import ThreadDecoding

THREADS = 2


class DeviceChunkDecoder:
    procs = 0
    restarts = 0
    inline = 0

    def __init__(self, model, job, group: int = GROUP, group_bytes: int = GROUP_BYTES):
        check(group, group_bytes)
        self.model, self.job = model, job
        self.threads, self.group, self.group_bytes = THREADS, group, group_bytes
        self.clock = StageClock()
        self.groups: list[int] = []  # chunks per device decode, in the order they ran (benchmarks, tests)
        self._waiting: deque = deque()  # (sources, future, bytes) of chunks started and not yet taken by a thread
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="device-decode")

    def start(self, sources) -> ThreadDecoding:
        """Decode a chunk: `result()` answers [(input, None) or (None, (reason, type name))] as ThreadDecoder's."""
        sources = list(sources)
        whole: Future = Future()
        size = sum(map(source_bytes, sources))  # once, outside the lock that both decode threads take
        with self._lock:
            self._waiting.append((sources, whole, size))
        self._pool.submit(self._decode_waiting)
        return ThreadDecoding([_Item(whole, i) for i in range(len(sources))])

    def _take(self) -> list:
        """The chunks of the next group, oldest first (none where another thread took them all)."""
        with self._lock:
            return [(sources, whole) for sources, whole, _ in take(self._waiting, self.group, self.group_bytes)]

    def _decode_waiting(self) -> None:
        taken = self._take()
        if not taken:
            return
        for _, whole in taken:
            whole.set_running_or_notify_cancel()
        try:
            from . import decode_inputs

            sources = [s for chunk, _ in taken for s in chunk]
            with self.clock("decode"):
                answers = decode_inputs(sources, self.model, self.job.mode, self.job.on_device, **self.job.limits)
            self.groups.append(len(taken))
        except BaseException as exc:  # each chunk of the group raises it from result(), as a chunk of its own did
            for _, whole in taken:
                whole.set_exception(exc)
            return
        at = 0
        for chunk, whole in taken:
            whole.set_result(answers[at:at + len(chunk)])
            at += len(chunk)

    def release(self, decoding) -> None:
        """Nothing to give back: device images are freed with their last reference."""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            while self._waiting:
                self._waiting.popleft()[1].cancel()


class _Item:
    """One source's share of its chunk's future, as ThreadDecoding expects of a future."""

    def __init__(self, whole, index: int):
        self.whole, self.index = whole, index

    def result(self, timeout=None):
        return self.whole.result(timeout)[self.index]

    def done(self) -> bool:
        return self.whole.done()
