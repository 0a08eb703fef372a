"""The batch job's decoder for `--decode gpu`: the decoder interface of `decoding.threads.ThreadDecoder` (start,
release, close, clock), with each chunk's JPEGs decoded on the rank's model's device and left there
(`decode_inputs`): the rank reads the files' bytes, parses their headers and launches the kernels; other files and
the device's fallbacks are decoded in this process, on its thread, as the exact mode does. Two threads: one reads,
parses and launches a chunk while the other waits for its chunk's device decode, which queues behind the network's
kernels on the same GPU (with one, each chunk's host work waited for the chunk before it to come back)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..stages import StageClock
from ..threads import ThreadDecoding


THREADS = 2


class DeviceChunkDecoder:
    procs = 0
    restarts = 0
    inline = 0

    def __init__(self, model, job):
        self.model, self.job = model, job
        self.threads = THREADS
        self.clock = StageClock()
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="device-decode")

    def start(self, sources) -> ThreadDecoding:
        """Decode a chunk: `result()` answers [(input, None) or (None, (reason, type name))] as ThreadDecoder's."""
        sources = list(sources)
        whole = self._pool.submit(self._decode, sources)
        return ThreadDecoding([_Item(whole, i) for i in range(len(sources))])

    def _decode(self, sources) -> list:
        from . import decode_inputs

        with self.clock("decode"):
            return decode_inputs(sources, self.model, self.job.mode, self.job.on_device, **self.job.limits)

    def release(self, decoding) -> None:
        """Nothing to give back: device images are freed with their last reference."""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Item:
    """One source's share of its chunk's future, as ThreadDecoding expects of a future."""

    def __init__(self, whole, index: int):
        self.whole, self.index = whole, index

    def result(self, timeout=None):
        return self.whole.result(timeout)[self.index]

    def done(self) -> bool:
        return self.whole.done()
