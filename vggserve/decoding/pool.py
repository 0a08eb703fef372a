"""Decoding past the GIL: a pool of decode processes whose pixels come back through shared memory.

    pool = DecodePool(procs=7, job=DecodeJob(mode="torchvision", on_device=True))
    decoding = pool.start(["a.jpg", "b.jpg"])   # a chunk of paths (or uploads' bytes)
    answers = decoding.result()                 # one per source, in order: (model input, None) or (None, problem)
    ...                                         # the inputs are views of shared memory: copy them (model.submit does)
    pool.release(decoding)                      # then give their blocks back
    pool.close()

Each process (worker.py) owns a region of one shared-memory segment (vggserve.ipc.ring), decodes straight into
it where it can (libjpeg-turbo writes a JPEG's pixels there) or copies the model input there, and answers with a
few numbers per image; only paths and those answers are pickled. A supervisor thread deals the waiting sources to
the processes in parcels of up to PARCEL sources (one message each way per parcel), at most DEPTH ahead of each
process's answers (so a slow 12 MP photo holds up no more than its own process); it reads every answer waiting on
a process's socket at once (vggserve.ipc.frames), and wakes the consumer once per chunk, when the chunk's last
answer is in. So the consumer's process spends a few microseconds per image on the link, and wakes up about once
per parcel rather than once per image.

A process that dies while decoding (a crash in a decoder, the OOM killer) or takes longer than `timeout_s` on one
image (it is killed) is replaced by a new one on the same region: the image it was on (the ring's header says which
of its parcel: `Ring.progress`) is answered as an error (DecodeProcessDied / DecodeTimeout), and the others sent to
it and not answered go to the new process. Without shared memory, parcels are of one source, so the image is the
oldest one not answered. A pool whose new processes die before they are ready (a broken installation) raises
DecodePoolError from every waiting chunk.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import selectors
import socket
import subprocess
import threading
import time

from ..children import child_command
from ..errors import VggserveError
from ..ipc.frames import FrameReader, frame
from ..ipc.ring import Block, Ring
from ..modelinput import RAW_LIMIT_BYTES, ModelInput
from . import worker
from .stages import StageClock
from .worker import DecodeJob, WorkerStart

log = logging.getLogger("vggserve.decoding")

DEPTH = 12  # sources sent to one process ahead of its answers: two parcels
# sources sent to a process in one message, answered in one message: each message costs the rank's process about
# 0.1 ms of CPU on this supervisor's thread, so 6 rather than 3 halves that (BENCHMARKS.md, twelfth session)
PARCEL = 6
DEFAULT_TIMEOUT_S = 60.0  # longest decode of one image before its process is killed
START_TIMEOUT_S = 120.0  # longest start of a process (imports on a loaded machine)
START_FAILURES = 3  # processes in a row dying before they are ready: the pool is broken
CHECK_EVERY_S = 0.25  # how often the supervisor looks for processes that hang (at most a quarter of the timeout)
TYPICAL_BYTES = 600_000  # a 500x375 image input (562 KB) or a float32 input (602 KB)


class DecodePoolError(VggserveError):
    """The decode processes cannot be started."""


def default_procs(cores: float | None = None) -> int:
    """Decode processes for a process that may count `cores` cores as its own (an MPI rank: its share,
    vggserve.distributed.cores; None: every core this process may run on), less one for itself; at least 1."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
    return max(1, int(round(cores, 6)) - 1)  # round: a sum of 1/n shares may fall just short of a whole core


def region_bytes(procs: int, in_flight: int) -> int:
    """Shared memory per process: room for 1.5 x its share of `in_flight` typical images, and for two of the
    largest image inputs."""
    return max(2 * RAW_LIMIT_BYTES, -(-3 * in_flight // (2 * procs)) * TYPICAL_BYTES)


class Decoding:
    """A chunk of sources on its way through the pool. `result()` waits for every answer and returns them in the
    sources' order; `blocks`: the shared memory its inputs lie in (`DecodePool.release` gives it back)."""

    def __init__(self, count: int):
        self.answers: list = [None] * count
        self.blocks: list[Block] = []
        self._left = count  # answers still to come (the supervisor's thread only)
        self._done = threading.Event()
        self._error: BaseException | None = None
        if count == 0:
            self._done.set()

    def result(self, timeout: float | None = None) -> list:
        """[(model input, None) or (None, (reason, type name))], one per source; raises DecodePoolError when the
        pool broke or closed first, TimeoutError after `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the decoding was not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        return self.answers

    def done(self) -> bool:
        return self._done.is_set()

    def _answer(self, index: int, answer: tuple) -> None:
        if self._error is None:
            self.answers[index] = answer
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()


class _Process:
    """One decode process seen from the pool: its socket and the sources sent to it, oldest first."""

    def __init__(self, region: int, popen: subprocess.Popen, sock: socket.socket, started: float):
        self.region = region
        self.popen = popen
        self.sock = sock
        self.frames = FrameReader(sock)
        self.started = started
        self.ready = False
        self.sent: collections.deque = collections.deque()  # (decoding, index, source) not answered yet
        self.answered = 0  # answers received from it (its ring header counts the images it has begun)
        self.busy_since: float | None = None  # when its oldest source not answered began, at the latest

    def send(self, message) -> None:
        self.sock.sendall(frame(message))

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
        # without the ring's header a process cannot say which source of a parcel it is on: parcels of one
        self._parcel, self._depth = (PARCEL, DEPTH) if self.ring is not None else (1, DEPTH // PARCEL)
        self._lock = threading.Lock()
        self._waiting: collections.deque = collections.deque()  # (decoding, index, source) not yet sent
        self._stages: dict[str, float] = {}  # the processes' stage seconds, added to `clock` once per wake-up
        self._start_failures = 0  # processes in a row that died before they were ready
        self._idle_deaths = 0  # ready processes in a row that died with images sent to them, before beginning one
        self._broken: BaseException | None = None
        self._closing = False
        self._check_every = min(CHECK_EVERY_S, self.timeout_s / 4)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._procs: list[_Process] = []
        self._launched = threading.Event()
        self._launch_error: BaseException | None = None
        self._thread = threading.Thread(target=self._supervise, args=(procs,), name="vggserve-decode-pool",
                                        daemon=True)
        self._thread.start()
        self._launched.wait()
        if self._launch_error is not None:
            self.close()  # stops the processes started, unlinks the shared memory
            raise self._launch_error

    @property
    def procs(self) -> int:
        return len(self._procs)

    # ---- the consumer's side ----------------------------------------------------------------------------------
    def start(self, sources) -> Decoding:
        """Decode `sources` (paths or bytes) in the processes; see Decoding."""
        sources = list(sources)
        decoding = Decoding(len(sources))
        with self._lock:
            if self._broken is not None:
                decoding._fail(self._broken)
                return decoding
            self._waiting.extend((decoding, index, source) for index, source in enumerate(sources))
        if sources:
            self._wake()
        return decoding

    def release(self, decoding: Decoding) -> None:
        """The model inputs of `decoding` have been copied (or dropped): their shared memory may be reused."""
        blocks, decoding.blocks = decoding.blocks, []
        if blocks:
            self.ring.free_many(blocks)

    def close(self) -> None:
        """Stop the processes; chunks still waiting raise DecodePoolError."""
        self._closing = True
        self._wake()
        self._thread.join(timeout=30)
        if self.ring is not None:
            self.ring.close()
        self._selector.close()
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
        shared = (self.ring.fd,) if self.ring is not None else ()  # the ring has no name: it goes by descriptor
        try:
            popen = subprocess.Popen(child_command("vggserve.decoding.worker", str(theirs.fileno())),
                                     pass_fds=(theirs.fileno(), *shared), stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise DecodePoolError(f"cannot start a decode process: {exc}") from exc
        finally:
            theirs.close()
        proc = _Process(region, popen, ours, time.monotonic())
        spec = self.ring.writer_spec(region) if self.ring is not None else None
        try:
            proc.send(WorkerStart(self.job, spec, os.getpid()))
        except OSError:  # it died at once: its end of file is read next
            pass
        self._selector.register(ours, selectors.EVENT_READ, proc)
        return proc

    def _supervise(self, procs: int) -> None:
        # the processes are started here, on the thread that lives as long as the pool: a decode process is killed
        # when the thread that started it ends (PR_SET_PDEATHSIG), and the caller's thread may end first
        try:
            for region in range(procs):
                self._procs.append(self._launch(region))
        except BaseException as exc:
            self._launch_error, self._closing = exc, True
        finally:
            self._launched.set()
        cpu = time.thread_time()
        next_check = time.monotonic() + self._check_every
        try:
            while not self._closing:
                for key, _ in self._selector.select(self._check_every):
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._receive(key.data)
                now = time.monotonic()
                if now >= next_check:
                    self._check_times(now)
                    next_check = now + self._check_every
                self._dispatch()
                spent = time.thread_time()
                self._stages["link"] = self._stages.get("link", 0.0) + spent - cpu
                cpu = spent
                self.clock.add(self._stages)
                self._stages = {}
        except BaseException as exc:  # a bug here must not leave the consumer waiting forever
            log.exception("the decode pool's supervisor failed")
            self._fail_all(DecodePoolError(f"the decode pool failed: {exc}"))
        finally:
            self._stop_processes()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _receive(self, proc: _Process) -> None:
        """Every answer `proc` has sent; its replacement if it has gone."""
        if proc not in self._procs:  # replaced earlier in this wake-up
            return
        answers, closed = proc.frames.read()
        for answer in answers:
            self._answered(proc, answer)
        if closed:
            self._replace(proc, proc.describe_exit(), "DecodeProcessDied", "died")

    def _answered(self, proc: _Process, message) -> None:
        if isinstance(message, tuple):  # ("ready", pid)
            proc.ready, self._start_failures = True, 0
            proc.busy_since = time.monotonic() if proc.sent else None
            return
        for answer in message:
            self._answer(proc, proc.sent.popleft(), answer)
        proc.answered += len(message)
        self._idle_deaths = 0
        proc.busy_since = time.monotonic() if proc.sent else None

    def _answer(self, proc: _Process, item: tuple, answer: tuple) -> None:
        decoding, index, _ = item
        kind = answer[0]
        stages = self._stages
        for stage, seconds in answer[-1].items():
            stages[stage] = stages.get(stage, 0.0) + seconds
        if kind == "shared":
            _, start, end, shape, dtype, form, _ = answer
            block = Block(proc.region, start, end)
            pixels = self.ring.take(block, shape, dtype)
            if decoding.done():  # the pool broke or closed: nobody will release it
                self.ring.free(block)
                return
            decoding.blocks.append(block)
            decoding._answer(index, (ModelInput.checked(form, pixels), None))  # checked in its decode process
        elif kind == "inline":
            self.inline += 1
            decoding._answer(index, (ModelInput(answer[2], answer[1]), None))
        else:
            decoding._answer(index, (None, answer[1]))

    def _current(self, proc: _Process) -> tuple[int, float | None]:
        """(index in proc.sent of the source it is decoding, when it began it): from the ring's header, or without
        a ring the oldest (parcels are of one source then). The index is out of range between sources."""
        if self.ring is None:
            return 0, proc.busy_since
        begun, began_at = self.ring.progress(proc.region)
        return begun - proc.answered - 1, began_at

    def _check_times(self, now: float) -> None:
        for proc in list(self._procs):
            if not proc.sent:
                continue
            if not proc.ready and now - proc.started > START_TIMEOUT_S:
                proc.popen.kill()
                self._replace(proc, f"it did not start within {START_TIMEOUT_S:.0f} s", "DecodeProcessDied", "died")
                continue
            index, since = self._current(proc)
            if proc.ready and 0 <= index < len(proc.sent) and since is not None and now - since > self.timeout_s:
                proc.popen.kill()
                self._replace(proc, f"it took longer than {self.timeout_s:g} s and was killed", "DecodeTimeout",
                              "hung")

    def _replace(self, proc: _Process, why: str, kind: str, verb: str) -> None:
        """`proc` is gone: fail the source it was decoding (if it had started), requeue the others, start another."""
        self._selector.unregister(proc.sock)
        proc.sock.close()
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait()
        sent = list(proc.sent)
        proc.sent.clear()
        at = self._current(proc)[0] if proc.ready and sent else -1
        if 0 <= at < len(sent):
            decoding, index, source = sent.pop(at)
            log.error("a decode process %s on %s (%s); a new one takes its place", verb, _name(source), why)
            decoding._answer(index, (None, (f"the decode process {verb} on {_name(source)} ({why}); the image is "
                                            "skipped and a new process took its place", kind)))
        elif sent:  # before it began any of the images sent to it: none is to blame
            self._idle_deaths += 1
            log.error("a decode process died before it began its images (%s); a new one takes its place", why)
        if not proc.ready:
            self._start_failures += 1
        with self._lock:
            self._waiting.extendleft(reversed(sent))
        if self._closing:
            return
        if self._start_failures >= START_FAILURES:
            self._fail_all(DecodePoolError(f"decode processes die before they are ready ({why}, "
                                           f"{self._start_failures} in a row); see the messages above"))
            return
        if self._idle_deaths >= START_FAILURES:
            self._fail_all(DecodePoolError(f"decode processes die before they begin an image ({why}, "
                                           f"{self._idle_deaths} in a row); see the messages above"))
            return
        self.restarts += 1
        self._procs[self._procs.index(proc)] = self._launch(proc.region)

    def _dispatch(self) -> None:
        """Deal waiting sources to the processes with room, a parcel each at most, one source per process and round
        (ready processes before starting ones), so that a chunk is spread over every process."""
        given: dict[_Process, list] = {}
        with self._lock:
            if not self._waiting or self._broken is not None:
                return
            room = [(proc, space) for proc in sorted(self._procs, key=lambda p: not p.ready)
                    if (space := min(self._parcel, self._depth - len(proc.sent))) > 0]
            for level in range(self._parcel):
                for proc, space in room:
                    if space <= level:
                        continue
                    while self._waiting and self._waiting[0][0].done():  # failed: nobody waits for it
                        self._waiting.popleft()
                    if not self._waiting:
                        break
                    item = self._waiting.popleft()
                    if proc.ready and not proc.sent:
                        proc.busy_since = time.monotonic()
                    proc.sent.append(item)
                    given.setdefault(proc, []).append(item)
        for proc, items in given.items():
            try:
                proc.send([source for _, _, source in items])
            except OSError:  # it died: its end of file is read next; these go to the next process
                for _ in items:
                    proc.sent.pop()
                with self._lock:
                    self._waiting.extendleft(reversed(items))

    def _fail_all(self, error: BaseException) -> None:
        self._fail_pending(error, replace_broken=True)

    def _fail_pending(self, error: BaseException, replace_broken: bool) -> None:
        """Fail every chunk with a source waiting or sent and not answered; the pool is broken by `error` from now
        on (or by the error it already had, unless `replace_broken`)."""
        with self._lock:
            if replace_broken or self._broken is None:
                self._broken = error
            pending = list(self._waiting) + [item for proc in self._procs for item in proc.sent]
            self._waiting.clear()
        for proc in self._procs:
            proc.sent.clear()
        for decoding, _, _ in pending:
            decoding._fail(error)

    def _stop_processes(self) -> None:
        for proc in self._procs:
            try:
                proc.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            proc.sock.close()
        self._fail_pending(DecodePoolError("the decode pool was closed before this decoding finished"),
                           replace_broken=False)


def _make_ring(procs: int, nbytes: int) -> Ring | None:
    try:
        return Ring(procs, nbytes)
    except OSError as exc:
        log.warning("no shared memory for decoded images (%s); they are sent through pipes", exc)
        return None


def _name(source) -> str:
    return f"file '{source}'" if isinstance(source, (str, os.PathLike)) else "an upload"
