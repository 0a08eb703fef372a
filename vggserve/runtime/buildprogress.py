"""Progress of program compiles that take long, on the "vggserve.runtime.build" logger.

A first start on new weights or on a new device compiles its OpenCL programs; later starts load them from the
program cache. Most compiles take a fraction of a second, but a pruned network's generated programs (the weights
compiled into the code) can take minutes together on a CPU, and a start that says nothing for two minutes looks
hung. A `ProgramCache` therefore tells its `BuildProgress` when each compile begins and ends, and the model tells
it when its start-up is over (`finish`). Once the compiles of a start have run for `NOTICE_S`, it logs:

    INFO   compiling OpenCL programs for <device>: the first start on these weights or on this device compiles
           them, later starts load them from the cache (<folder>)
    DEBUG  compiling OpenCL programs: 3 done, 12 s, now kernels/conv_sparse_codegen.cl       (every TICK_S)
    INFO   compiled 13 OpenCL programs in 128.3 s

The times are compile times, summed over the start's compiles. Starts whose compiles are quicker log nothing; a
cache whose owner never calls `finish` logs no summary. Each record carries `build_stage` ("notice", "tick",
"done") for handlers that draw it differently (`vggserve.cli.buildlog` rewrites the tick line in place on a
terminal).
"""

from __future__ import annotations

import logging
import threading
import time

from ..wording import count

log = logging.getLogger("vggserve.runtime.build")

NOTICE_S = 1.0  # compiles that take longer than this, together, are reported
TICK_S = 1.0  # a tick record this often while a compile goes on
IDLE_S = 10.0  # the watcher thread stops after this long with no compile (the next compile starts it again)


class BuildProgress:
    """The compiles of one start (a run, until `finish`), timed and reported as the module says. Times are
    compile times: the work between compiles (weights re-laid out, generated code written) is not counted.

    thread=False: no watcher thread; `tick()` is then called by the owner (tests drive it with a fake `clock`)."""

    def __init__(self, device: str, folder, clock=time.perf_counter, thread: bool = True):
        self.device, self.folder, self.clock, self.thread = device, folder, clock, thread
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self.running = False  # a run is open: a compile has begun since the last `finish`
        self.done = 0  # compiles finished in this run
        self.seconds = 0.0  # their compile time
        self.current: str | None = None  # the compile going on (kernel file name), if any
        self.current_start = 0.0
        self.last_end = 0.0
        self.noticed = False  # the notice was logged for this run

    def compiling(self, name: str) -> None:
        """A compile of kernels/`name` begins."""
        with self._lock:
            if not self.running:
                self.running, self.done, self.seconds, self.noticed = True, 0, 0.0, False
            self.current, self.current_start = name, self.clock()
            if self.thread and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="vggserve-build-progress", daemon=True)
                self._watcher.start()

    def compiled(self) -> None:
        """The compile begun last is over (built or failed)."""
        with self._lock:
            self.last_end = self.clock()
            self.done += 1
            self.seconds += self.last_end - self.current_start
            self.current = None

    def finish(self) -> None:
        """The start is over: the run ends, with its summary if it was reported."""
        with self._lock:
            if self.running and self.noticed:
                self._log(logging.INFO, "done", f"compiled {count(self.done, 'OpenCL program')} in "
                          f"{self.seconds:.1f} s")
            self.running, self.current = False, None

    def tick(self) -> None:
        """While a compile goes on: the notice once the run's compiles have taken NOTICE_S, then a tick."""
        with self._lock:
            if self.current is None:
                return
            busy = self.seconds + self.clock() - self.current_start
            if self.noticed:
                self._log(logging.DEBUG, "tick", f"compiling OpenCL programs: {self.done} done, {busy:.0f} s, "
                          f"now kernels/{self.current}")
            elif busy >= NOTICE_S:
                self.noticed = True
                self._log(logging.INFO, "notice", f"compiling OpenCL programs for {self.device}: the first start "
                          "on these weights or on this device compiles them, later starts load them from the "
                          f"cache ({self.folder})")

    def _log(self, level: int, stage: str, message: str) -> None:
        log.log(level, message, extra={"build_stage": stage})

    def _watch(self) -> None:
        while True:
            time.sleep(TICK_S)
            self.tick()
            with self._lock:
                if self.current is None and self.clock() - self.last_end >= IDLE_S:
                    self._watcher = None
                    return
