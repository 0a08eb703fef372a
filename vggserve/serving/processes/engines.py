"""The engine processes of `--engine-processes per-device`, seen from the supervising process: engine 0 is the
supervisor's own service, engines 1..G-1 are child processes (`engine_process`), and each is watched through a link
of its own (the "state" messages every front end gets too).

An engine is out once its device worker is no longer alive (its state says so) or its process has gone: that is
logged once, naming the device, and `vggserve_device_up` says 0 for it. Engines that are out are not restarted (a
device that failed once is not trusted again, as with one engine); the front ends send their images to the others.
When every engine is out, `on_all_out(reasons)` is called (the server then exits with NO_WORKERS_EXIT).

Stopping (after the front ends have exited): each child's standard input is closed, which stops it; one that does
not exit in time is killed.
"""

import logging
import os
import subprocess
import threading
import time
from typing import Callable

from ...children import child_command
from ..metrics import Metrics, forget_process
from ..settings import Settings
from .engine_link import EngineClient
from .engine_process import EngineSpec, framed

log = logging.getLogger("vggserve.serving")

CONNECT_WITHIN_S = 60.0  # a fresh engine process listens within this time (it imports, then listens)
STOP_WITHIN_S = 10.0  # beyond --drain-timeout, before an engine process that does not stop is killed


class Watch(EngineClient):
    """The supervisor's link to one engine: states only, no images, no log of its own when the link ends."""

    def _closed(self) -> None:
        if not self._stopping and self.on_lost is not None:
            self.on_lost("its process went away")


class EngineGroup:
    """Starts engines 1..G-1, watches every engine, and stops the children."""

    def __init__(self, settings: Settings, addresses: list[str], authkey: bytes, factory: bytes | None,
                 log_level: str, metrics: Metrics):
        self.settings = settings
        self.addresses = addresses
        self.authkey = authkey
        self.factory = factory
        self.log_level = log_level
        self.metrics = metrics
        self.procs: list[subprocess.Popen | None] = [None] * len(addresses)  # engine 0: this process
        self.watches: list[Watch | None] = [None] * len(addresses)
        self.out: dict[int, str] = {}  # engine -> why it is out
        self.ready: set[int] = set()
        self.on_all_out: Callable[[str], None] = lambda reasons: None
        self.on_ready: list[Callable[[], None]] = []  # called once every engine is ready or out, one ready at least
        self._lock = threading.Lock()
        self._closing = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def device(self, index: int) -> str:
        return self.settings.labels[index]

    def start(self) -> None:
        """Start engines 1.. and link to every engine (engine 0 listens already); returns once each listens, or
        has been found out."""
        for index in range(1, len(self.addresses)):
            self.procs[index] = self._launch(index)
        for index in range(len(self.addresses)):
            self._watch(index)

    def _launch(self, index: int) -> subprocess.Popen:
        spec = EngineSpec(self.settings.for_engine(index), self.addresses[index], self.authkey, index, self.factory,
                          self.log_level)
        proc = subprocess.Popen(child_command("vggserve.serving.processes.engine_process"), stdin=subprocess.PIPE,
                                env=dict(os.environ))
        try:
            proc.stdin.write(framed(spec))
            proc.stdin.flush()  # and left open: its end stops the engine
        except OSError:  # it died at once: `check` sees it exit
            pass
        return proc

    def _watch(self, index: int) -> None:
        watch = Watch(self.addresses[index], self.authkey, 1, self.metrics, -1)
        watch.on_state = lambda: self._state(index)
        watch.on_lost = lambda why: self._out(index, why)
        end = time.monotonic() + CONNECT_WITHIN_S
        proc = self.procs[index]
        while True:
            try:
                watch.connect(arena=False)
                break
            except OSError as exc:
                if proc is not None and proc.poll() is not None:
                    self._out(index, f"its process exited with status {proc.returncode} before it listened")
                    return
                if time.monotonic() > end:
                    self._out(index, f"it does not listen on {self.addresses[index]} ({exc})")
                    return
                time.sleep(0.05)
        self.watches[index] = watch
        self._state(index)

    def _state(self, index: int) -> None:
        state = self.watches[index].state if self.watches[index] is not None else None
        if state is None:
            return
        if not state["live"][0]:
            self._out(index, state["live"][1])
        elif state["ready"][0]:
            with self._lock:
                self.ready.add(index)
            self._maybe_ready()

    def _maybe_ready(self) -> None:
        with self._lock:
            if not self.on_ready or len(self.ready | set(self.out)) < len(self.addresses) or not self.ready:
                return
            callbacks, self.on_ready = self.on_ready, []
        for callback in callbacks:
            callback()

    def _out(self, index: int, why: str) -> None:
        """Engine `index` serves no more: said once, in the log and the metrics; all out: `on_all_out`."""
        with self._lock:
            if self._closing or index in self.out:
                return
            self.out[index] = why
            self.ready.discard(index)
            left = len(self.addresses) - len(self.out)
        self.metrics.device_up.labels(device=self.device(index)).set(0)
        log.error("engine %d (device %s) is out: %s; %d of %d engine processes serve on", index, self.device(index),
                  why, left, len(self.addresses))
        if not left:
            self.on_all_out("; ".join(f"{self.device(i)}: {w}" for i, w in sorted(self.out.items())))
        else:
            self._maybe_ready()

    def check(self) -> None:
        """Note engine processes that have exited (their live gauges dropped)."""
        for index, proc in enumerate(self.procs):
            if proc is None or proc.poll() is None:
                continue
            forget_process(proc.pid)
            self.procs[index] = None
            self._out(index, f"its process exited with status {proc.returncode}")

    def stop(self, timeout_s: float) -> None:
        """Stop every engine process (closing its standard input) and wait for it; kill those that take longer."""
        with self._lock:
            self._closing = True
        for watch in self.watches:
            if watch is not None:
                watch.close()
        live = [p for p in self.procs if p is not None]
        for proc in live:
            try:
                proc.stdin.close()
            except OSError:
                pass
        end = time.monotonic() + timeout_s + STOP_WITHIN_S
        for proc in live:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("engine process %d did not stop in time; killing it", proc.pid)
                proc.kill()
                proc.wait()
            forget_process(proc.pid)
