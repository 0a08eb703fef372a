"""Decoding past the GIL: a pool of decode processes whose pixels come back through shared memory.

    pool = DecodePool(procs=7, job=DecodeJob(mode="torchvision", on_device=True))
    future = pool.submit("photo.jpg")        # a path (or an upload's bytes)
    pixels, problem = future.result()        # as decode.decode_input answers: (model input, None) or (None, problem)
    ...                                      # pixels is a view of shared memory: copy it (model.submit does)
    pool.release([future])                   # then give its block back
    pool.close()

Each process (worker.py) owns a region of one shared-memory segment (vggserve.ipc.ring), decodes straight into
it where it can (libjpeg-turbo writes a JPEG's pixels there) or copies the model input there, and answers with a
few numbers; only paths and those answers are pickled. A supervisor thread sends every process at most DEPTH
sources at a time (so a slow 12 MP photo holds up no more than its own process), reads the answers and completes
the futures.

A process that dies while decoding (a crash in a decoder, the OOM killer) or takes longer than `timeout_s` on one
image (it is killed) is replaced by a new one on the same region: that image is answered as an error
(DecodeProcessDied / DecodeTimeout) and the images queued behind it go to the new process. A pool whose new
processes die before they are ready (a broken installation) raises DecodePoolError from every pending future.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from pathlib import Path

import numpy as np

from ..errors import VggserveError
from ..ipc.ring import Block, Ring
from ..modelinput import RAW_LIMIT_BYTES, ModelInput
from . import worker
from .stages import StageClock
from .worker import DecodeJob, WorkerStart

log = logging.getLogger("vggserve.decoding")

DEPTH = 3  # sources sent to one process ahead of its answers
DEFAULT_TIMEOUT_S = 60.0  # longest decode of one image before its process is killed
START_TIMEOUT_S = 120.0  # longest start of a process (imports on a loaded machine)
START_FAILURES = 3  # processes in a row dying before they are ready: the pool is broken
TYPICAL_BYTES = 600_000  # a 500x375 image input (562 KB) or a float32 input (602 KB)
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
CHILD_CODE = ("import sys; root = sys.argv[1]; sys.path.insert(0, root) if root not in sys.path else None; "
              "from vggserve.decoding.worker import main; main()")


class DecodePoolError(VggserveError):
    """The decode processes cannot be started."""


def default_procs(local_ranks: int = 1) -> int:
    """Decode processes for one of `local_ranks` processes sharing this machine: its share of the cores (the cores
    it is bound to, when a launcher bound it to fewer than all), less one for itself; at least 1."""
    cpus = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = cpus
    share = allowed if allowed < cpus else cpus // max(1, local_ranks)
    return max(1, share - 1)


def region_bytes(procs: int, in_flight: int) -> int:
    """Shared memory per process: room for 1.5 x its share of `in_flight` typical images, and for two of the
    largest image inputs."""
    return max(2 * RAW_LIMIT_BYTES, -(-3 * in_flight // (2 * procs)) * TYPICAL_BYTES)


class _Process:
    """One decode process seen from the pool: its connection and the sources sent to it, oldest first."""

    def __init__(self, region: int, popen: subprocess.Popen, conn: Connection, started: float):
        self.region = region
        self.popen = popen
        self.conn = conn
        self.started = started
        self.ready = False
        self.sent: collections.deque = collections.deque()  # (future, source)
        self.busy_since: float | None = None  # when it began the oldest source sent to it

    def describe_exit(self) -> str:
        try:
            code = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


class DecodePool:
    """`procs` decode processes running `job`; see the module docstring."""

    def __init__(self, procs: int, job: DecodeJob, timeout_s: float = DEFAULT_TIMEOUT_S, in_flight: int = 64):
        if procs < 1:
            raise ValueError(f"a decode pool needs at least one process, got {procs}")
        self.job = job if job.task else dataclasses.replace(job, task=worker.DEFAULT_TASK)
        self.timeout_s = float(timeout_s)
        self.clock = StageClock()  # the processes' stages, and the link (this side's thread)
        self.restarts = 0  # processes replaced after dying or hanging
        self.inline = 0  # answers whose pixels came pickled (no room in shared memory)
        self.ring = _make_ring(procs, region_bytes(procs, in_flight))
        self._lock = threading.Lock()
        self._waiting: collections.deque = collections.deque()  # (future, source) not yet sent
        self._blocks: dict[Future, Block] = {}
        self._start_failures = 0
        self._broken: BaseException | None = None
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._procs = [self._launch(region) for region in range(procs)]
        self._thread = threading.Thread(target=self._supervise, name="vggserve-decode-pool", daemon=True)
        self._thread.start()

    @property
    def procs(self) -> int:
        return len(self._procs)

    # ---- the consumer's side ----------------------------------------------------------------------------------
    def submit(self, source) -> Future:
        """Decode `source` (a path or bytes) in a process; the future's result is (model input, None) or (None,
        (reason, type name)), or DecodePoolError when no process can run."""
        future: Future = Future()
        with self._lock:
            if self._broken is not None:
                future.set_exception(self._broken)
                return future
            self._waiting.append((future, source))
        self._wake()
        return future

    def release(self, futures) -> None:
        """The model inputs of `futures` have been copied (or dropped): their shared memory may be reused."""
        for future in futures:
            with self._lock:
                block = self._blocks.pop(future, None)
            if block is not None:
                self.ring.free(block)

    def close(self) -> None:
        """Stop the processes; pending futures are cancelled."""
        self._closing = True
        self._wake()
        self._thread.join(timeout=30)
        if self.ring is not None:
            self.ring.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):  # the wake-up socket is full (the thread is awake anyway) or closed
            pass

    # ---- processes ----------------------------------------------------------------------------------------------
    def _launch(self, region: int) -> _Process:
        """Start a process for `region` (a fresh interpreter; nothing of this process is inherited)."""
        ours, theirs = socket.socketpair()
        try:
            popen = subprocess.Popen([sys.executable, "-c", CHILD_CODE, PACKAGE_ROOT, str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise DecodePoolError(f"cannot start a decode process: {exc}") from exc
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        spec = self.ring.writer_spec(region) if self.ring is not None else None
        conn.send(WorkerStart(self.job, spec, os.getpid()))
        return _Process(region, popen, conn, time.monotonic())

    def _supervise(self) -> None:
        cpu = time.thread_time()
        try:
            while not self._closing:
                self._step()
                now = time.thread_time()
                self.clock.add({"link": now - cpu})
                cpu = now
        except BaseException as exc:  # a bug here must not leave the consumer waiting forever
            log.exception("the decode pool's supervisor failed")
            self._fail_all(DecodePoolError(f"the decode pool failed: {exc}"))
        finally:
            self._stop_processes()

    def _step(self) -> None:
        conns = {p.conn: p for p in self._procs}
        for ready in wait([*conns, self._wake_r], timeout=self._next_check()):
            if ready is self._wake_r:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            else:
                self._receive(conns[ready])
        self._check_times()
        self._dispatch()

    def _next_check(self) -> float | None:
        """Seconds until the next process would be overdue (None: no process is busy)."""
        now, due = time.monotonic(), []
        for proc in self._procs:
            if proc.sent:
                if not proc.ready:
                    due.append(proc.started + START_TIMEOUT_S)
                elif proc.busy_since is not None:
                    due.append(proc.busy_since + self.timeout_s)
        return max(0.0, min(due) - now) + 0.01 if due else None

    def _receive(self, proc: _Process) -> None:
        try:
            answer = proc.conn.recv()
        except (EOFError, OSError):
            self._replace(proc, proc.describe_exit(), "DecodeProcessDied", "died")
            return
        if answer[0] == "ready":
            proc.ready, self._start_failures = True, 0
            proc.busy_since = time.monotonic() if proc.sent else None
            return
        future, source = proc.sent.popleft()
        proc.busy_since = time.monotonic() if proc.sent else None
        if future.cancelled():
            if answer[0] == "shared":
                self.ring.take(answer[2], answer[3], answer[4])
                self.ring.free(answer[2])
            return
        self.clock.add(answer[-1])
        future.set_result(self._decoded(future, answer))

    def _decoded(self, future: Future, answer: tuple):
        kind = answer[0]
        if kind == "error":
            return None, answer[2]
        if kind == "inline":
            self.inline += 1
            _, _, pixels, form, _ = answer
        else:
            _, _, block, shape, dtype, form, _ = answer
            pixels = self.ring.take(block, shape, np.dtype(dtype))
            with self._lock:
                self._blocks[future] = block
        return ModelInput(form, pixels), None

    def _check_times(self) -> None:
        now = time.monotonic()
        for proc in list(self._procs):
            if not proc.sent:
                continue
            if not proc.ready and now - proc.started > START_TIMEOUT_S:
                proc.popen.kill()
                self._replace(proc, f"it did not start within {START_TIMEOUT_S:.0f} s", "DecodeProcessDied", "died")
            elif proc.ready and proc.busy_since is not None and now - proc.busy_since > self.timeout_s:
                proc.popen.kill()
                self._replace(proc, f"it took longer than {self.timeout_s:g} s and was killed", "DecodeTimeout",
                              "hung")

    def _replace(self, proc: _Process, why: str, kind: str, verb: str) -> None:
        """`proc` is gone: fail the source it was decoding (if it had started), requeue the others, start another."""
        proc.conn.close()
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait()
        sent = list(proc.sent)
        if proc.ready and sent:
            future, source = sent.pop(0)
            log.error("a decode process %s on %s (%s); a new one takes its place", verb, _name(source), why)
            if not future.cancelled():
                future.set_result((None, (f"the decode process {verb} on {_name(source)} ({why}); the image is "
                                          "skipped and a new process took its place", kind)))
        elif not proc.ready:
            self._start_failures += 1
        with self._lock:
            self._waiting.extendleft(reversed(sent))
        if self._closing:
            return
        if self._start_failures >= START_FAILURES:
            self._fail_all(DecodePoolError(f"decode processes die before they are ready ({why}, "
                                           f"{self._start_failures} in a row); see the messages above"))
            return
        self.restarts += 1
        self._procs[self._procs.index(proc)] = self._launch(proc.region)

    def _dispatch(self) -> None:
        """Send waiting sources to the least busy processes, DEPTH at most each."""
        while True:
            with self._lock:
                if not self._waiting or self._broken is not None:
                    return
                proc = min(self._procs, key=lambda p: (len(p.sent), not p.ready))
                if len(proc.sent) >= DEPTH:
                    return
                future, source = self._waiting.popleft()
            if future.cancelled():
                continue
            try:
                proc.conn.send((id(future), source))
            except OSError:  # it died: its EOF is read next
                with self._lock:
                    self._waiting.appendleft((future, source))
                return
            if proc.ready and not proc.sent:
                proc.busy_since = time.monotonic()
            proc.sent.append((future, source))

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            self._broken = error
            pending = list(self._waiting) + [item for proc in self._procs for item in proc.sent]
            self._waiting.clear()
        for proc in self._procs:
            proc.sent.clear()
        for future, _ in pending:
            if not future.done():
                future.set_exception(error)

    def _stop_processes(self) -> None:
        for proc in self._procs:
            try:
                proc.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            proc.conn.close()
        with self._lock:
            pending = list(self._waiting) + [item for proc in self._procs for item in proc.sent]
            self._waiting.clear()
        for future, _ in pending:
            future.cancel()


def _make_ring(procs: int, nbytes: int) -> Ring | None:
    try:
        return Ring(procs, nbytes)
    except OSError as exc:
        log.warning("no shared memory for decoded images (%s); they are sent through pipes", exc)
        return None


def _name(source) -> str:
    return f"file '{source}'" if isinstance(source, (str, os.PathLike)) else "an upload"
