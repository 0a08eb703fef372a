"""The service's state: settings, metrics, the queue, the device workers, the preprocessing pool, the drain.
Started and stopped by the app's lifespan; the routes ask it whether it is ready and what it serves."""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .. import __version__
from ..weights.spec import INPUT_SIZE, NUM_CLASSES
from .scheduling.batcher import BatchQueue
from .web.drain import Drain
from .protocols.errors import shutting_down, unavailable
from .metrics import Metrics
from .scheduling.imaging import decode_and_crop
from .scheduling.procpool import ProcessPool
from .settings import Settings, SettingsError
from .scheduling.worker import DeviceWorker

log = logging.getLogger("vggserve.serving")

ModelFactory = Callable[[str], object]  # device spec -> a model with logits/probabilities/close


def default_model_factory(settings: Settings) -> ModelFactory:
    """Each device worker loads the weights file itself with the real engine, in its own thread."""
    if not settings.weights:
        raise SettingsError("no weights file configured: pass --weights PATH (or give create_app a model_factory)")

    def load(device: str):
        from ..model.vgg16 import VGG16

        return VGG16.load(settings.weights, device=device, max_batch_size=settings.max_batch_size)

    return load


class Service:
    """Owns everything the routes need; one per app."""

    sends_pixels = False  # True in an HTTP front-end process: images leave it as uint8 crops, not model inputs

    def __init__(self, settings: Settings, model_factory: ModelFactory | None = None, multiprocess: bool = False):
        self.settings = settings
        self.model_factory = model_factory
        self.metrics = Metrics(multiprocess)
        self.drain = Drain(settings.drain_timeout_s, self.metrics)
        self.queue = BatchQueue(settings.max_queue, self.metrics)
        self.workers: list[DeviceWorker] = []
        self.pool: ThreadPoolExecutor | None = None
        self.procs: ProcessPool | None = None  # decoding processes when settings.preprocess_procs > 0
        self._procs_started = None  # Future of the processes' warm-up, run in the thread pool
        self.preprocess_task = decode_and_crop  # what the processes run (module-level; tests swap in fakes')
        self._sha256 = None  # Future of the weights file's checksum, computed once in the pool
        self.stopping = False
        self._users = 0  # lifespans currently using the service
        self.on_all_workers_dead: Callable[[str], None] | None = None  # set by run_server: exit, so it restarts
        self.on_state_change: Callable[[], None] | None = None  # set by the engine host: tell the front ends
        if not multiprocess:  # computed at scrape time; in multiprocess mode state_changed sets them
            self.metrics.ready.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
            self.metrics.queue_length.set_function(lambda: len(self.queue))
            self.metrics.workers_ready.set_function(lambda: sum(w.ready for w in self.workers))

    # lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the preprocessing pool and one worker thread per device; returns at once (loading runs on).
        A stopped service can be started again (each lifespan of the app gets fresh workers and queue); starts
        while it runs (overlapping lifespans of one app) share it, and the last matching stop stops it."""
        self._users += 1
        if self._users > 1:
            return
        factory = self.model_factory or default_model_factory(self.settings)
        self.stopping = False
        self.queue = BatchQueue(self.settings.max_queue, self.metrics)
        self.workers = []
        self.pool = ThreadPoolExecutor(self.settings.preprocess_threads, thread_name_prefix="vggserve-preprocess")
        self.procs, self._procs_started = None, None
        if self.settings.preprocess_procs:
            self.procs = ProcessPool(self.settings.preprocess_procs, task=self.preprocess_task)
            self.procs.start()
            self._procs_started = self.pool.submit(self.procs.warm_up)  # readiness waits for it
        if self.settings.weights:
            from ..weights import sha256_file

            self._sha256 = self.pool.submit(sha256_file, self.settings.weights)
        self.workers = [DeviceWorker(device, factory, self.queue, self.metrics,
                                     max_batch_size=self.settings.max_batch_size, max_wait_s=self.settings.max_wait_s,
                                     warmup=self.settings.warmup, on_change=self._worker_changed,
                                     pixels=self.settings.http_workers > 1,
                                     device_resize=self.settings.resize_on == "device")
                        for device in self.settings.devices]
        for worker in self.workers:  # all listed before any starts: "none alive" must see every worker
            worker.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fail what still waits, let workers finish their batch and close their models, stop the pool."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
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
        if self.workers and not self.stopping and not any(w.alive or w.state == "starting" for w in self.workers):
            reasons = "; ".join(f"{w.device}: {w.error or w.state}" for w in self.workers)
            log.error("no device worker is alive (%s)", reasons)
            self.queue.close(unavailable("no_workers", f"no device worker is alive ({reasons})"))
            if self.on_all_workers_dead is not None:
                self.on_all_workers_dead(reasons)
        self.state_changed()

    def state_changed(self) -> None:
        """Readiness may have changed (a worker, the drain): update the gauges that are not computed at scrape
        time and tell whoever listens."""
        if self.metrics.multiprocess:
            self.metrics.ready.set(1.0 if self.readiness()[0] else 0.0)
            self.metrics.workers_ready.set(sum(w.ready for w in self.workers))
        if self.on_state_change is not None:
            self.on_state_change()

    # state the routes ask for --------------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str, str]:
        """(ready, code, message): never while draining, else what `serving_readiness` says."""
        if self.drain.draining:
            return False, "draining", "the server is draining for shutdown"
        return self.serving_readiness()

    def serving_readiness(self) -> tuple[bool, str, str]:
        """Readiness when not draining: ready once every worker has loaded and warmed up, and none has died."""
        if not self.workers:
            return False, "not_ready", "the service has not started"
        dead = [w for w in self.workers if not w.alive and w.state != "starting"]
        if dead:
            return False, "worker_failed", "; ".join(f"device worker {w.device} is {w.state}"
                                                     + (f": {w.error}" if w.error else "") for w in dead)
        waiting = [f"{w.device} ({w.state})" for w in self.workers if not w.ready]
        if self._procs_started is not None and not self._procs_started.done():
            waiting.append(f"{self.settings.preprocess_procs} preprocessing processes (starting)")
        if waiting:
            return False, "not_ready", "waiting for " + ", ".join(waiting)
        return True, "ready", f"{len(self.workers)} device worker(s) ready"

    def liveness(self) -> tuple[bool, str]:
        """(alive, detail): alive while some device worker is alive or still starting."""
        if self.workers and not any(w.alive or w.state == "starting" for w in self.workers):
            return False, self.readiness()[2]
        return True, "serving"

    def ensure_accepting(self) -> None:
        """Raise 503 while draining, else whatever `admit` raises."""
        if self.drain.draining:
            raise unavailable("draining", "the server is draining for shutdown; retry on another instance")
        self.admit()

    def admit(self) -> None:
        """When not draining: raise 503 unless some device worker can take images (one dead worker of several is
        not fatal)."""
        if any(w.ready for w in self.workers):
            return
        if any(w.alive or w.state == "starting" for w in self.workers):
            raise unavailable("not_ready", "the model is still loading or warming up; retry in a moment "
                              "(GET /health/ready answers 200 when it is ready)")
        raise unavailable("no_workers", "no device worker is alive; " + self.readiness()[2])

    def model_info(self) -> dict:
        """What the first ready worker reported about its model ({} before any is ready)."""
        for worker in self.workers:
            if worker.info:
                return worker.info
        return {}

    @property
    def preprocessing(self) -> str:
        return self.model_info().get("preprocessing", "torchvision")

    async def describe(self) -> dict:
        """What /metadata answers."""
        return self.metadata()

    def metadata(self) -> dict:
        info = self.model_info()
        weights = info.get("weights_info") or {}
        sha256 = weights.get("sha256")
        if not isinstance(sha256, str) and self._sha256 is not None and self._sha256.done() \
                and self._sha256.exception() is None:
            sha256 = self._sha256.result()
        return {
            "model": "vgg16",
            "version": __version__,
            "weights": {"path": str(weights.get("path") or self.settings.weights or "") or None,
                        "format": weights.get("format"), "sha256": sha256 if isinstance(sha256, str) else None},
            "preprocessing": info.get("preprocessing"),
            "input": {"shape": [3, INPUT_SIZE, INPUT_SIZE], "dtype": "float32"},
            "labels": NUM_CLASSES,
            "devices": [w.describe() for w in self.workers],
            "max_batch_size": self.settings.max_batch_size,
            "max_wait_ms": self.settings.max_wait_ms,
            "max_queue": self.settings.max_queue,
            "request_timeout_ms": self.settings.request_timeout_ms,
            "max_body_bytes": self.settings.max_body_bytes,
            "max_pixels": self.settings.max_pixels,
            "max_files": self.settings.max_files,
            "preprocess_threads": self.settings.preprocess_threads,
            "preprocess_procs": self.settings.preprocess_procs,
            "mpi": self.settings.mpi,
            "http_workers": self.settings.http_workers,
            # uploads decoded by the front ends, resized and cropped on the device
            "resize_on_device": self.settings.http_workers > 1 and bool(info.get("resizes_on_device")),
        }
