"""Decoding in worker processes (`--preprocess-procs N`): Pillow decode, resize and crop hold the GIL for most of
their time, so threads of one process cannot keep a fast device busy. Each worker process takes an upload's bytes
and the limits and sends back the uint8 224x224x3 centre crop (a `ModelInput`, 150 KB, a quarter of the float32
input); the main process normalises it with exactly `preprocess`'s arithmetic, in the executor's own result thread
(a done callback: no extra hop through a thread pool, nothing on the event loop).

Workers are started by a fork server (or spawned), never forked from this process: it has threads and may have an
OpenCL context. A worker that dies (BrokenProcessPool) fails the images it had in flight with a 500
`preprocess_failed` and the pool is replaced by a fresh one; the server keeps running.
"""

import asyncio
import logging
import multiprocessing
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ...images import ALLOWED_FORMATS
from .errors import PreprocessFailed, shutting_down
from .imaging import decode_and_crop

log = logging.getLogger("vggserve.serving")

START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
# imported once by the fork server, so each worker starts with them loaded
PRELOAD = ["vggserve.serving.scheduling.imaging"]
WARMUP_TASK_S = 0.2  # each warm-up task keeps its worker busy this long, so every worker gets started


def _init_worker() -> None:
    """The service drains on SIGTERM / the first Ctrl+C and shuts the pool down itself afterwards; a signal sent to
    the whole process group (Ctrl+C in a terminal, systemd's KillMode=control-group) must not kill the workers
    under the requests still in flight."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _warm(seconds: float) -> None:
    time.sleep(seconds)


def _chained(future: Future, then, mode: str) -> Future:
    """A future of `then(pixels, mode)` on `future`'s (pixels, seconds), computed in the thread completing `future`."""
    out: Future = Future()

    def finish(done: Future) -> None:
        if done.cancelled():  # cancelled by close(): the server is stopping
            out.set_exception(shutting_down())
            return
        try:
            pixels, seconds = done.result()
            value, more = then(pixels, mode)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request as is
            out.set_exception(exc)
        else:
            out.set_result((value, seconds + more))

    future.add_done_callback(finish)
    return out


class ProcessPool:
    """A ProcessPoolExecutor of `procs` workers running `task` (default `decode_and_crop`), replaced when broken."""

    def __init__(self, procs: int, task=decode_and_crop, start_method: str = START_METHOD):
        if procs < 1:
            raise ValueError(f"a process pool needs at least one process, got {procs}")
        self.procs = procs
        self.task = task  # a module-level function (workers import it by name)
        self.start_method = start_method
        self.restarts = 0  # pools replaced after a worker died
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False

    def _new_executor(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            context.set_forkserver_preload(PRELOAD)  # used when the fork server starts (once per process)
        return ProcessPoolExecutor(self.procs, mp_context=context, initializer=_init_worker)

    def start(self) -> None:
        with self._lock:
            self._closed = False
            if self._executor is None:
                self._executor = self._new_executor()

    def warm_up(self) -> None:
        """Start every worker process now and wait for them (blocking: call it from a thread), so the first requests
        do not pay for starting the fork server and the workers."""
        executor = self._executor
        if executor is None:
            return
        for future in [executor.submit(_warm, WARMUP_TASK_S) for _ in range(self.procs)]:
            future.result()

    def _replace(self, broken: ProcessPoolExecutor, why: BaseException) -> None:
        with self._lock:
            if self._closed or self._executor is not broken:
                return  # closing, or another request has replaced it already
            log.error("a preprocessing worker process died (%s); starting a new pool of %d", why, self.procs)
            self._executor = self._new_executor()
            self.restarts += 1
        # a broken pool stops its surviving workers with SIGTERM, which ours ignore (_init_worker): kill them, or
        # they live on and the interpreter's exit waits for them forever
        workers = list((getattr(broken, "_processes", None) or {}).values())
        broken.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            if worker.is_alive():
                worker.kill()

    async def run(self, data: bytes, mode: str, max_pixels: int, formats=ALLOWED_FORMATS, then=None):
        """`task(data, mode, max_pixels, formats)` in a worker: its result, or the exception it raised (an ImageError:
        same class and message as in a thread). A dead worker: PreprocessFailed.
        With `then(pixels, mode) -> (value, seconds)`, the task's (pixels, seconds) become (value, total seconds),
        `then` running in this process as soon as the worker's answer arrives."""
        for _attempt in range(2):
            executor = self._executor
            if executor is None or self._closed:
                raise shutting_down()
            try:
                future = executor.submit(self.task, data, mode, max_pixels, tuple(formats))
            except BrokenProcessPool as exc:  # broken by an earlier image; this one has not run: try a fresh pool
                self._replace(executor, exc)
                continue
            except RuntimeError as exc:  # shut down under us
                raise shutting_down() from exc
            try:
                return await asyncio.wrap_future(future if then is None else _chained(future, then, mode))
            except BrokenProcessPool as exc:
                self._replace(executor, exc)
                raise PreprocessFailed("the worker process decoding this image died (a crash in "
                               "the decoder, or it was killed); the pool of preprocessing processes was restarted, "
                               "retry the request") from exc
        raise PreprocessFailed("the preprocessing worker processes cannot be started; see the "
                       "server log")

    def close(self) -> None:
        """Stop the workers (after the drain: nothing is waiting for them any more)."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
