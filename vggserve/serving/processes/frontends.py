"""`vggserve serve --http-workers N` (N > 1): this process becomes the engine process. It binds the listening socket,
loads the models with the usual device workers and BatchQueue, and starts N HTTP front-end processes
(vggserve.serving.processes.frontend) that share the socket, decode images past this process's GIL and send their crops
here over Unix-socket links (vggserve.serving.processes.engine_host), so every device batch can mix all front
ends' images.

--max-queue bounds the images admitted by every front end together: the front ends count them in a block of shared
memory this process makes before it starts them (`admission`); the slot of a front end that dies is cleared before
its replacement starts, so what it held is given back.

A front end that dies is restarted; RESTART_LIMIT deaths within RESTART_WINDOW_S stop the server (exit status
FRONTENDS_FAILED_EXIT). SIGTERM or the first SIGINT drains: the front ends are told to drain (readiness 503, new
requests refused, in-flight ones finish within --drain-timeout) and exit, then the device workers stop and this
process exits 0; a second SIGINT kills the front ends at once. Every device worker dead: exit status 3, as with one
process. Metrics of every process go to one directory (prometheus_client's multiprocess mode) so any front end's
/metrics shows the whole server.

With several devices and `--engine-processes per-device` (or auto), each device has an engine process of its own:
this process hosts engine 0 and supervises, engines 1.. are child processes (`engines.EngineGroup`), and each front
end links to every engine (`routing.EngineRouter`). An engine whose device is lost stops getting images; the server
exits with status 3 only once every engine is out. The engines stop after the front ends have drained.
"""

import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable

from ...children import child_command
from .admission import AdmissionBlock
from .engine_host import EngineHost
from .engine_link import AUTHKEY_BYTES
from .engine_process import portable
from .engines import EngineGroup
from .frontend import FrontendSpec
from ..metrics import forget_process, multiprocess_metrics
from ..hosting import (CANNOT_LISTEN_EXIT, CLOSE_CONNECTIONS_S, FRONTENDS_FAILED_EXIT, NO_WORKERS_EXIT, CannotListen,
                       announce_when_ready, announcement, listening_socket)
from ..service import ModelFactory, Service
from ..settings import Settings, SettingsError

log = logging.getLogger("vggserve.serving")

RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
SUPERVISE_EVERY_S = 0.1
STOP_GRACE_S = 5.0  # beyond --drain-timeout and uvicorn's connection closing, before front ends are killed


class FrontEnds:
    """The front-end processes: `launch(index)` starts one; dead ones are restarted, within a budget.
    `on_exit(index)`: called for each front end seen to have exited, before any replacement starts."""

    def __init__(self, count: int, launch: Callable[[int], subprocess.Popen],
                 on_exit: Callable[[int], None] = lambda index: None):
        self.launch = launch
        self.on_exit = on_exit
        self.procs: list[subprocess.Popen | None] = [None] * count
        self._deaths: deque[float] = deque()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def start(self) -> None:
        for index in range(len(self.procs)):
            self.procs[index] = self.launch(index)

    def check(self) -> str | None:
        """Restart the front ends that have exited; the reason to give up when they die too often."""
        for index, proc in enumerate(self.procs):
            if proc is None or proc.poll() is None:
                continue
            forget_process(proc.pid)
            self.on_exit(index)
            now = time.monotonic()
            self._deaths.append(now)
            while self._deaths and self._deaths[0] < now - RESTART_WINDOW_S:
                self._deaths.popleft()
            if len(self._deaths) >= RESTART_LIMIT:
                return (f"HTTP front-end processes keep dying ({len(self._deaths)} exits within "
                        f"{RESTART_WINDOW_S:.0f} s, the last front end {index} with status {proc.returncode}); "
                        "see the log above")
            log.error("front end %d (pid %d) exited with status %s; starting a new one", index, proc.pid,
                      proc.returncode)
            self.procs[index] = self.launch(index)
        return None

    def signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)

    def exited(self) -> bool:
        return all(p is None or p.poll() is not None for p in self.procs)

    def wait(self, timeout_s: float, give_up: Callable[[], bool]) -> bool:
        """Wait until every front end has exited (True), the time is over or `give_up()` (False)."""
        end = time.monotonic() + timeout_s
        while not self.exited() and time.monotonic() < end and not give_up():
            time.sleep(0.05)
        return self.exited()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        for proc in self.procs:
            if proc is not None:
                proc.wait()


class Stop:
    """Why and how the engine process stops: a signal (exit 0) or a failure (its exit status and reason)."""

    def __init__(self):
        self.event = threading.Event()
        self.code = 0
        self.reason: str | None = None
        self.forced = False  # a second SIGINT: kill the front ends, do not wait for the drain

    def fail(self, code: int, reason: str) -> None:
        if not self.event.is_set():
            self.code, self.reason = code, reason
            self.event.set()

    def on_signal(self, sig: int, frame) -> None:
        if self.event.is_set():
            self.forced = self.forced or sig == signal.SIGINT
            return
        log.info("%s: draining the front ends", signal.Signals(sig).name)
        self.event.set()


@contextmanager
def _handling_signals(stop: Stop):
    previous = {sig: signal.signal(sig, stop.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def bind(settings: Settings, count: int) -> list[socket.socket]:
    """The listening TCP sockets of `count` front ends, all on settings.port (0: the system picks one).

    Where the system has SO_REUSEPORT (Linux), each front end gets its own socket in one reuse-port group, and the
    kernel spreads new connections evenly over them. One socket accepted from by every process instead lets the
    first idle process take most connections: on an H100 host, 8 front ends then answered from 2083 to 5532
    images each, and the busiest one set the pace. Elsewhere every front end shares one socket."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return [listening_socket(settings.host, settings.port, False)] * count
    first = listening_socket(settings.host, settings.port, True)
    socks = [first]
    try:
        for _ in range(count - 1):
            socks.append(listening_socket(settings.host, first.getsockname()[1], True))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def launcher(spec_for: Callable[[int], FrontendSpec]) -> Callable[[int], subprocess.Popen]:
    """A function starting front end `index` as a fresh interpreter (no OpenCL state, no threads inherited),
    handing it its listening socket (the spec's `fd`)."""

    def launch(index: int) -> subprocess.Popen:
        spec = spec_for(index)
        fds = (spec.fd,) if spec.admission_fd is None else (spec.fd, spec.admission_fd)
        proc = subprocess.Popen(child_command("vggserve.serving.processes.frontend"), stdin=subprocess.PIPE,
                                pass_fds=fds, env=dict(os.environ))
        try:
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.close()
        except OSError:  # it died at once: the supervisor sees it exit
            pass
        return proc

    return launch


def run_with_frontends(settings: Settings, model_factory: ModelFactory | None = None, log_level: str = "info",
                       access_log: bool = False, banner: str = "") -> int:
    """Serve with settings.http_workers front-end processes until SIGTERM/SIGINT; the exit status."""
    workdir = tempfile.mkdtemp(prefix="vggserve-engine-")
    try:
        os.mkdir(os.path.join(workdir, "metrics"))
        with multiprocess_metrics(os.path.join(workdir, "metrics")):
            return _serve(settings, model_factory, log_level, access_log, workdir, banner)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def engine_factory(settings: Settings, model_factory) -> tuple[Settings, bytes | None]:
    """The settings to serve with, and the model factory pickled for engine processes 1.. (None: they load
    settings.weights). A factory that cannot travel to another process is an error with --engine-processes
    per-device, and one engine process for every device with auto (a warning says so)."""
    if settings.engine_count == 1 or model_factory is None:
        return settings, None
    try:
        return settings, portable(model_factory)
    except ValueError as exc:
        if settings.engine_processes == "per-device":
            raise SettingsError(f"--engine-processes per-device: {exc}; define it in a module, or pass "
                                "--engine-processes 1") from None
        log.warning("%s; one engine process serves every device", exc)
        return replace(settings, engine_processes="1"), None


def _serve(settings: Settings, model_factory, log_level: str, access_log: bool, workdir: str, banner: str) -> int:
    settings, factory = engine_factory(settings, model_factory)
    try:
        socks = bind(settings, settings.http_workers)
    except CannotListen as exc:
        print(f"vggserve: error: {exc.strerror}", file=sys.stderr)
        return CANNOT_LISTEN_EXIT
    engines = settings.engine_count
    addresses = [os.path.join(workdir, f"engine{i}.sock" if engines > 1 else "engine.sock") for i in range(engines)]
    service = Service(settings.for_engine(0), model_factory, multiprocess=True)
    host = EngineHost(service, addresses[0], os.urandom(AUTHKEY_BYTES))
    stop = Stop()
    group = None
    if engines == 1:
        announce_when_ready(service, socks[0], settings.host, banner)
        service.on_all_workers_dead = lambda reasons: stop.fail(NO_WORKERS_EXIT,
                                                                f"no device worker is alive ({reasons})")
    else:
        group = EngineGroup(settings, addresses, host.authkey, factory, log_level, service.metrics)
        group.on_ready.append(announcement(socks[0], settings.host, banner))
        group.on_all_out = lambda reasons: stop.fail(NO_WORKERS_EXIT, f"no device worker is alive ({reasons})")
    address = addresses[0] if engines == 1 else tuple(addresses)
    admission = AdmissionBlock(settings.http_workers)

    def spec_for(index: int) -> FrontendSpec:  # a restarted front end gets the socket of the one it replaces
        return FrontendSpec(settings, socks[index].fileno(), address, host.authkey, index, log_level, access_log,
                            admission.fd)

    frontends = FrontEnds(settings.http_workers, launcher(spec_for), on_exit=admission.clear)
    with _handling_signals(stop):
        try:
            host.start()
            service.start()
            if group is not None:
                group.start()
            frontends.start()
            log.info("listening on http://%s:%d with %d HTTP front-end processes (pids %s)%s", settings.host,
                     socks[0].getsockname()[1], settings.http_workers, ", ".join(map(str, frontends.pids)),
                     f" and {engines} engine processes (this one and pids "
                     f"{', '.join(map(str, group.pids))})" if group else "")
            _supervise(frontends, group, stop, lambda: service.metrics.admitted.set(admission.held()))
        finally:
            _shut_down(settings, service, host, frontends, stop, socks, group)
            admission.close()
    if stop.code:
        print(f"vggserve: error: {stop.reason}", file=sys.stderr)
    return stop.code


def _supervise(frontends: FrontEnds, group: EngineGroup | None, stop: Stop,
               sample: Callable[[], None] = lambda: None) -> None:
    """Restart front ends that die, note engine processes that exit, `sample()` the admission gauge, until a signal
    or a failure stops the server."""
    while not stop.event.wait(SUPERVISE_EVERY_S):
        sample()
        reason = frontends.check()
        if reason:
            stop.fail(FRONTENDS_FAILED_EXIT, reason)
        if group is not None:
            group.check()


def _shut_down(settings: Settings, service: Service, host: EngineHost, frontends: FrontEnds, stop: Stop,
               socks: list, group: EngineGroup | None = None) -> None:
    """Drain the front ends and wait for them to exit (killed if they take too long), then stop the workers."""
    service.drain.begin(announce=False)  # readiness "draining", pushed to the front ends
    service.state_changed()
    frontends.signal(signal.SIGTERM)
    # nothing is restarted from here on: the front ends hold the only copies of their sockets, so the socket of one
    # that has exited leaves the reuse-port group, and new connections go to those still draining (a 503) or are
    # refused, instead of waiting in a socket nobody accepts from until this process exits
    for sock in set(socks):
        sock.close()
    if not frontends.wait(settings.drain_timeout_s + CLOSE_CONNECTIONS_S + STOP_GRACE_S, lambda: stop.forced):
        if not stop.forced:
            log.warning("front ends still running after the drain time; killing them")
        frontends.kill()
    for pid in frontends.pids:
        forget_process(pid)
    if group is not None:
        group.stop(settings.drain_timeout_s)
    host.close()
    service.stop()
