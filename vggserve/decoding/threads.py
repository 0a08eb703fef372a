"""Decoding on threads of this process: the same interface as `DecodePool` (start, release, close, clock), for
`--decode-procs 0` and for callers that decode a few images only. Pillow and libjpeg-turbo release the GIL while
they decode, but the rest of each image's work holds it: threads of one process keep up with a slow device only."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from .decode import decode_input
from .stages import StageClock
from .worker import DecodeJob


class ThreadDecoder:
    """`threads` threads running `job` (DecodeJob.task is not used: threads run `decode_input`)."""

    procs = 0
    restarts = 0
    inline = 0

    def __init__(self, threads: int, job: DecodeJob):
        self.job = job
        self.threads = max(1, threads)
        self.clock = StageClock()
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="decode")
        self._limits = job.limits

    def start(self, sources) -> "ThreadDecoding":
        """Decode `sources` on the threads; `result()` answers as `DecodePool.start`'s."""
        return ThreadDecoding([self._pool.submit(decode_input, source, self.job.mode, on_device=self.job.on_device,
                                                 decode=self.job.decode, clock=self.clock, **self._limits)
                               for source in sources])

    def release(self, decoding) -> None:
        """Nothing to give back: the inputs are ordinary arrays."""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ThreadDecoding:
    """A chunk decoding on threads: one future per source."""

    def __init__(self, futures: list[Future]):
        self.futures = futures

    def result(self, timeout: float | None = None) -> list:
        """[(model input, None) or (None, (reason, type name))], one per source, in order."""
        return [future.result(timeout) for future in self.futures]

    def done(self) -> bool:
        return all(future.done() for future in self.futures)
