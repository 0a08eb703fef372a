"""Device decodes' launches handed from the batch job's decode threads to its rank's thread, which enqueues each
one just before its next network batch.

A decode's synchronisation rounds are bound by latency and run beside the network's kernels when a network batch is
enqueued right after them; enqueued at any other moment they mostly run between the network's batches, and their
device time adds to the network's (`benchmarks/device_decode.py`'s ahead and serial orders: BENCHMARKS.md,
twenty-eighth and thirty-third sessions). So a decode thread lays its group out (`JpegDecoder.stage`) and hands the
launch over (`launches(launch)`, as `onmodel.start_decode`'s launcher); the rank's thread runs what was handed over
before each submit (`run_waiting`) and while it waits for a decoded chunk (`wait`).

    launches = Launches()
    run = launches(lambda: decoder.launch(staged, out))   # a decode thread: waits until the launch has run
    launches.run_waiting()                                 # the rank's thread, before model.submit

A launch nobody takes within `handoff_s` (a rank thread busy elsewhere, or gone) is run by its own thread, so no
decode waits for longer than that.
"""

from __future__ import annotations

import threading
from collections import deque

# How long a decode thread waits for the rank's thread to take its launch: several network batches at FP16 on an
# H200 (about 4.5 ms each), so that in a steady job the rank's thread takes every launch.
HANDOFF_S = 0.02
# The longest the rank's thread sleeps in `wait` between looks at what it waits for (a decode thread's wake-up ends
# it sooner).
WAKE_S = 0.05


class _Handed:
    __slots__ = ("launch", "done", "value", "error")

    def __init__(self, launch):
        self.launch, self.done, self.value, self.error = launch, threading.Event(), None, None

    def run(self) -> None:
        try:
            self.value = self.launch()
        except BaseException as exc:  # raised again on the thread that handed it over
            self.error = exc
        finally:
            self.done.set()

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


class Launches:
    """Launches handed over, oldest first; `taken` counts those the rank's thread ran, `own` those run by the thread
    that handed them over after `handoff_s`."""

    def __init__(self, handoff_s: float = HANDOFF_S):
        self.handoff_s = handoff_s
        self.taken = self.own = 0
        self._waiting: deque[_Handed] = deque()
        self._cond = threading.Condition()

    def __call__(self, launch):
        """On a decode thread: `launch()`'s value (or its exception), run by the rank's thread, or by this one if
        the rank's thread has not taken it within handoff_s."""
        item = _Handed(launch)
        with self._cond:
            self._waiting.append(item)
            self._cond.notify_all()
        if not item.done.wait(self.handoff_s):
            with self._cond:
                mine = item in self._waiting
                if mine:
                    self._waiting.remove(item)
                    self.own += 1
            if mine:
                item.run()
            item.done.wait()
        return item.result()

    def run_waiting(self) -> int:
        """On the rank's thread: run every launch handed over, in order; how many."""
        ran = 0
        while True:
            with self._cond:
                if not self._waiting:
                    return ran
                item = self._waiting.popleft()
                self.taken += 1
            item.run()
            ran += 1

    def wait(self, done) -> None:
        """On the rank's thread: run the launches handed over until `done()` is true (a decoded chunk it waits
        for). Whoever makes it true calls `wake()`."""
        while True:
            self.run_waiting()
            with self._cond:
                if done():
                    return
                if not self._waiting:
                    self._cond.wait(WAKE_S)

    def wake(self) -> None:
        """Something a `wait` may wait for has happened."""
        with self._cond:
            self._cond.notify_all()
