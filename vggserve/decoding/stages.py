"""Host CPU time per image, by stage: where the CPU goes between a file (or an upload) and its result line.

    clock = StageClock()
    with clock("decode"):
        ...
    clock.seconds            # {"decode": CPU seconds of this thread inside the block, ...}

The stages the batch job reports (`vggserve batch` prints them per image in its summary):

    read     reading the file's bytes
    decode   header checks, decoding, EXIF turn, RGB conversion and the geometry done on the host
    copy     copying the model input into shared memory (none when it was decoded there)
    link     moving the work between the rank and its decode processes (sending paths, receiving answers)
    stage    the model's submit: copying into its pinned staging memory and enqueuing the batch
    result   top-k and the JSON lines

Times are CPU time of the thread that ran the stage (`time.thread_time`), not wall time: a stage waiting for the
GIL or for a device costs nothing here. `StageClock(time.perf_counter)` sums wall time instead: the batch job's
rank reports so how long it waited for its device and for its decodes (pipeline.ChunkRunner.waits).
"""

from __future__ import annotations

import contextlib
import threading
import time

STAGES = ("read", "decode", "copy", "link", "stage", "result")


class StageClock:
    """CPU seconds of the calling thread (or what `timer` counts), summed by stage name. Adding from several threads
    is safe."""

    def __init__(self, timer=time.thread_time):
        self.seconds: dict[str, float] = {}
        self._timer = timer
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, stage: str):
        started = self._timer()
        try:
            yield
        finally:
            self.add({stage: self._timer() - started})

    def add(self, seconds: dict[str, float]) -> None:
        with self._lock:
            for stage, value in seconds.items():
                self.seconds[stage] = self.seconds.get(stage, 0.0) + value

    def per_image_ms(self, images: int) -> dict[str, float]:
        """{stage: CPU milliseconds per image}, in STAGES order (stages never timed are left out)."""
        if images <= 0:
            return {}
        order = [s for s in STAGES if s in self.seconds] + sorted(set(self.seconds) - set(STAGES))
        return {stage: round(1000.0 * self.seconds[stage] / images, 3) for stage in order}


class NoClock:
    """A StageClock that measures nothing (the default of the decode functions)."""

    seconds: dict = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        yield

    def add(self, seconds: dict) -> None:
        pass


NO_CLOCK = NoClock()
