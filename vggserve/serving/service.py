"""The service: settings, metrics, the drain, what is served (the model card) and a backend that computes. Started
and stopped by the app's lifespan; the protocols' routes talk only to it.

The backend is local (`scheduling.local.LocalBackend`: this process's queue, device workers and decoding pools) or
remote (`processes.remote.RemoteBackend`: an HTTP front-end process's link to the engine process). Both offer the
same: start/stop, `queue` (admit, submit, withdraw), `prepare(bytes)`, readiness, liveness, `admit`, model info.
"""

import logging
from typing import Callable

from .. import __version__
from .metrics import Metrics
from .modelcard import VGG16_CARD, ModelCard
from .scheduling.errors import Unavailable
from .scheduling.local import LocalBackend, ModelFactory
from .settings import Settings
from .web.drain import Drain

log = logging.getLogger("vggserve.serving")

__all__ = ["Service", "ModelFactory"]


class Service:
    """Owns everything the routes need; one per app."""

    def __init__(self, settings: Settings, model_factory: ModelFactory | None = None, multiprocess: bool = False,
                 backend=None, metrics: Metrics | None = None, card: ModelCard = VGG16_CARD):
        """`backend` (with the `metrics` it counts into) replaces the local one of `model_factory`'s models."""
        self.settings = settings
        self.card = card
        self.metrics = metrics or Metrics(multiprocess)
        self.drain = Drain(settings.drain_timeout_s, self.metrics)
        self.backend = backend or LocalBackend(settings, self.metrics, model_factory)
        self.backend.on_change = self.state_changed
        self.backend.on_all_dead = lambda reasons: self.on_all_workers_dead and self.on_all_workers_dead(reasons)
        self._users = 0  # lifespans currently using the service
        self.on_all_workers_dead: Callable[[str], None] | None = None  # set by run_server: exit, so it restarts
        self.on_state_change: Callable[[], None] | None = None  # set by the engine host: tell the front ends
        self._on_ready: list[Callable[[], None]] = []  # called once, the first time the service is ready
        if not multiprocess:  # computed at scrape time; in multiprocess mode state_changed sets them
            self.metrics.ready.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
            self.metrics.queue_length.set_function(lambda: len(self.backend.queue))
            self.metrics.admitted.set_function(lambda: self.backend.queue.admitted)
            self.metrics.workers_ready.set_function(lambda: sum(d["state"] == "ready" for d in self.backend.devices()))

    # lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the backend; returns at once (models load on). A stopped service can be started again; starts while
        it runs (overlapping lifespans of one app) share it, and the last matching stop stops it."""
        self._users += 1
        if self._users == 1:
            self.backend.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._users = max(0, self._users - 1)
        if not self._users:
            self.backend.stop(timeout_s)

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, the first time the service is ready (at once if it is)."""
        self._on_ready.append(callback)
        self.state_changed()

    def state_changed(self) -> None:
        """Readiness may have changed (a worker, the drain): update the gauges that are not computed at scrape
        time and tell whoever listens."""
        if self._on_ready and self.readiness()[0]:
            callbacks, self._on_ready = self._on_ready, []
            for callback in callbacks:
                callback()
        if self.metrics.multiprocess:
            self.metrics.ready.set(1.0 if self.readiness()[0] else 0.0)
            self.metrics.workers_ready.set(sum(d["state"] == "ready" for d in self.backend.devices()))
        if self.on_state_change is not None:
            self.on_state_change()

    # state the routes ask for --------------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str, str]:
        """(ready, code, message): never while draining, else what the backend says."""
        if self.drain.draining:
            return False, "draining", "the server is draining for shutdown"
        return self.backend.readiness()

    def liveness(self) -> tuple[bool, str]:
        return self.backend.liveness()

    def ensure_accepting(self) -> None:
        """Raise Unavailable while draining, else whatever the backend's `admit` raises."""
        if self.drain.draining:
            raise Unavailable("draining", "the server is draining for shutdown; retry on another instance")
        self.backend.admit()

    def model_info(self) -> dict:
        """What the model reported once loaded: device_name, preprocessing, weights_info, precision, ..."""
        return self.backend.model_info()

    @property
    def preprocessing(self) -> str:
        return self.model_info().get("preprocessing", "torchvision")

    @property
    def precision(self) -> str:
        return self.model_info().get("precision") or self.settings.precision

    async def describe(self) -> dict:
        """What /metadata answers (in a front end: the engine's, and which front end answered)."""
        return await self.backend.describe(self.metadata)

    def metadata(self) -> dict:
        info = self.model_info()
        weights = info.get("weights_info") or {}
        sha256 = weights.get("sha256")
        if not isinstance(sha256, str):
            sha256 = self.backend.weights_sha256()
        tensor = self.card.input("input")
        return {
            "model": self.card.name,
            "version": __version__,
            "weights": {"path": str(weights.get("path") or self.settings.weights or "") or None,
                        "format": weights.get("format"), "sha256": sha256 if isinstance(sha256, str) else None},
            "preprocessing": info.get("preprocessing"),
            "precision": self.precision,
            "input": {"shape": list(tensor.shape[1:]), "dtype": "float32"},
            "labels": self.card.classes,
            "devices": self.backend.devices(),
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
            "engine_processes": self.settings.engine_count,  # an engine's own: 1 (its front ends' router counts them)
            # uploads decoded by the front ends, resized and cropped on the device
            "resize_on_device": self.settings.http_workers > 1 and bool(info.get("resizes_on_device")),
            # --decode gpu|auto: JPEGs sent to the engine compressed and decoded on its device
            "decode": self.settings.decode,
            "decode_group": self.settings.decode_group,
            "lanes": self.settings.lanes,
            "decodes_on_device": bool(info.get("decodes_on_device")),
        }
