"""The local backend: this process's queue, its device workers, and the pool (threads, and processes with
--preprocess-procs) that decodes uploads. Used by the one-process server, by the engine process behind HTTP front
ends, and by rank 0 under mpirun (one worker whose model is the ShardedModel)."""

from functools import partial
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ...modelinput import ModelInput
from ..metrics import Metrics
from ..settings import Settings, SettingsError
from .batcher import BatchQueue
from ...wording import count
from .errors import Unavailable, shutting_down
from .devicedecode import (DEVICE_MODES, ON_DEVICE, DeviceDecoding, encoded_here, encoded_or_decoded, note_cpu,
                           route)
from .imaging import decode_and_crop, decode_for_engine, normalize, prepare_image
from .procpool import ProcessPool
from .worker import DeviceWorker

log = logging.getLogger("vggserve.serving")

ModelFactory = Callable[[str], object]  # device spec -> a model with logits/probabilities/close


def default_model_factory(settings: Settings) -> ModelFactory:
    """Each device worker loads the weights file itself with the real engine, in its own thread."""
    if not settings.weights:
        raise SettingsError("no weights file configured: pass --weights PATH (or give create_app a model_factory)")

    def load(device: str):
        from ...model.vgg16 import VGG16

        return VGG16.load(settings.weights, device=device, max_batch_size=settings.max_batch_size,
                          precision=settings.precision, lanes=settings.lanes)

    return load


class LocalBackend:
    """Queue, device workers and decoding pools of this process. `on_change()` is called whenever a worker's state
    changes; `on_all_dead(reasons)` once every worker has died."""

    def __init__(self, settings: Settings, metrics: Metrics, model_factory: ModelFactory | None = None):
        self.settings = settings
        self.metrics = metrics
        self.model_factory = model_factory
        self.queue = BatchQueue(settings.max_queue, metrics)
        self.workers: list[DeviceWorker] = []
        self.pool: ThreadPoolExecutor | None = None
        self.procs: ProcessPool | None = None  # decoding processes when settings.preprocess_procs > 0
        self._procs_started = None  # Future of the processes' warm-up, run in the thread pool
        self.preprocess_task = decode_and_crop  # what the processes run (module-level; tests swap in their own)
        self.sha256 = None  # Future of the weights file's checksum, computed once in the pool
        self.stopping = False
        self.on_change: Callable[[], None] = lambda: None
        self.on_all_dead: Callable[[str], None] = lambda reasons: None

    def start(self) -> None:
        """Start the decoding pools and one worker thread per device; returns at once (loading runs on). Each start
        gets a fresh queue and fresh workers."""
        factory = self.model_factory or default_model_factory(self.settings)
        self.stopping = False
        self.queue = BatchQueue(self.settings.max_queue, self.metrics)
        self.pool = ThreadPoolExecutor(self.settings.preprocess_threads, thread_name_prefix="vggserve-preprocess")
        self.procs, self._procs_started = None, None
        if self.settings.preprocess_procs:
            self.procs = ProcessPool(self.settings.preprocess_procs,
                                     task=partial(self.preprocess_task, decode=self.settings.cpu_decode))
            self.procs.start()
            self._procs_started = self.pool.submit(self.procs.warm_up)  # readiness waits for it
        if self.settings.weights:
            from ...weights import sha256_file

            self.sha256 = self.pool.submit(sha256_file, self.settings.weights)
        self.workers = [DeviceWorker(device, factory, self.queue, self.metrics,
                                     max_batch_size=self.settings.max_batch_size, max_wait_s=self.settings.max_wait_s,
                                     warmup=self.settings.warmup, on_change=self._worker_changed,
                                     pixels=self.settings.http_workers > 1,
                                     device_resize=self.settings.resize_on == "device",
                                     decoding=DeviceDecoding(self.metrics, self.settings.decode,
                                                             self.settings.max_pixels,
                                                             group=self.settings.decode_group),
                                     label=label)
                        for device, label in zip(self.settings.devices, self.settings.labels)]
        for worker in self.workers:  # all listed before any starts: "none alive" must see every worker
            worker.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fail what still waits, let workers finish their batch and close their models, stop the pools."""
        self.stopping = True
        self.queue.close(shutting_down())
        end = time.monotonic() + timeout_s
        for worker in self.workers:
            worker.join(max(0.0, end - time.monotonic()))
        if self.procs is not None:
            self.procs.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _worker_changed(self) -> None:
        if self.workers and not self.stopping and not self._any_alive():
            reasons = "; ".join(f"{w.label}: {w.error or w.state}" for w in self.workers)
            log.error("no device worker is alive (%s)", reasons)
            self.queue.close(Unavailable("no_workers", f"no device worker is alive ({reasons})"))
            self.on_all_dead(reasons)
        self.on_change()

    def _any_alive(self) -> bool:
        return any(w.alive or w.state == "starting" for w in self.workers)

    # what the service asks ------------------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str, str]:
        """Ready once every worker has loaded and warmed up (and the decoding processes started), and while at least
        one of them serves: a device that failed leaves the others serving, and the detail names it."""
        if not self.workers:
            return False, "not_ready", "the service has not started"
        dead = [w for w in self.workers if not w.alive and w.state != "starting"]
        out = "; ".join(f"device worker {w.label} is {w.state}" + (f": {w.error}" if w.error else "") for w in dead)
        live = [w for w in self.workers if w not in dead]
        if not live:
            return False, "worker_failed", out
        waiting = [f"{w.label} ({w.state})" for w in live if not w.ready]
        if self._procs_started is not None and not self._procs_started.done():
            waiting.append(f"{self.settings.preprocess_procs} preprocessing processes (starting)")
        if waiting:
            return False, "not_ready", "waiting for " + ", ".join(waiting)
        return True, "ready", f"{count(len(live), 'device worker')} ready" + (f"; {out}" if dead else "")

    def liveness(self) -> tuple[bool, str]:
        """(alive, detail): alive while some device worker is alive or still starting."""
        if self.workers and not self._any_alive():
            return False, self.readiness()[2]
        return True, "serving"

    def admit(self) -> None:
        """Raise Unavailable unless some device worker can take images (one dead worker of several is not fatal)."""
        if any(w.ready for w in self.workers):
            return
        if self._any_alive():
            raise Unavailable("not_ready", "the model is still loading or warming up; retry in a moment (the "
                              "readiness check answers 200 when it is ready)")
        raise Unavailable("no_workers", "no device worker is alive; " + self.readiness()[2])

    def model_info(self) -> dict:
        """What the first ready worker reported about its model ({} before any is ready)."""
        return next((w.info for w in self.workers if w.info), {})

    def devices(self) -> list[dict]:
        return [w.describe() for w in self.workers]

    def weights_sha256(self) -> str | None:
        done = self.sha256 is not None and self.sha256.done() and self.sha256.exception() is None
        return self.sha256.result() if done else None

    async def describe(self, metadata: Callable[[], dict]) -> dict:
        return metadata()

    async def prepare(self, data: bytes) -> tuple[ModelInput, float]:
        """(the tensor, seconds): decoded in a thread, or decoded in a worker process and normalised here; with
        --decode gpu|auto and a worker that decodes on its device, `_for_device_decoding`."""
        import asyncio

        info = self.model_info()
        mode = info.get("preprocessing", "torchvision")
        if self.settings.decode in DEVICE_MODES:
            if info.get("decodes_on_device"):
                return await self._for_device_decoding(data, mode)
            note_cpu(self.metrics)("no_device")
        if self.procs is None:
            return await asyncio.get_running_loop().run_in_executor(
                self.pool, partial(prepare_image, decode=self.settings.cpu_decode), data, mode,
                self.settings.max_pixels)
        return await self.procs.run(data, mode, self.settings.max_pixels, then=normalize)

    async def _for_device_decoding(self, data: bytes, mode: str) -> tuple[ModelInput, float]:
        """A JPEG the device decoder takes as it is, compressed (`devicedecode`); any other file as the engine's
        submit takes it: an image (which it resizes on the device) or a crop, decoded in a thread or a process."""
        import asyncio

        loop, note = asyncio.get_running_loop(), note_cpu(self.metrics)
        taken = encoded_here(data, mode, self.settings.max_pixels)
        if isinstance(taken, tuple):  # the JPEGs the device takes need no decoding thread
            return taken
        if self.procs is None:
            task = partial(encoded_or_decoded, task=decode_for_engine, decode=self.settings.cpu_decode, note=note,
                           why=taken)
            return await loop.run_in_executor(self.pool, task, data, mode, self.settings.max_pixels)
        started = time.perf_counter()
        why = taken or await loop.run_in_executor(self.pool, route, data, self.settings.max_pixels)
        if why == ON_DEVICE:
            return ModelInput.encoded(data), time.perf_counter() - started
        note(why)
        return await self.procs.run(data, mode, self.settings.max_pixels)  # a crop
