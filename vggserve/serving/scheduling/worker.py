"""A device worker: one thread that owns one model (models are not thread-safe), loads it, runs a warm-up batch,
then computes batches from the shared queue until the queue closes.

Queued images are float32 (3, 224, 224) model inputs, or uint8 (224, 224, 3) centre crops sent by HTTP front-end
processes; a batch of crops goes to the model's `probabilities_from_pixels` when it has one (the preprocessing
arithmetic then runs on the device), else each crop is normalised here exactly as `preprocess` would.

A model with the engine's `submit` runs with two batches in flight (`inflight.InflightRunner`): the next batch is
taken and uploaded while the device computes the current one. Other models (the stand-ins in `fakes`) run one
batch at a time here."""

import logging
import threading
import time
from typing import Callable

import numpy as np

from ...errors import VggserveError
from ...preprocess import RawImage, uses_device_resize
from .batcher import BatchQueue, Item, Outcome
from ..protocols.errors import ApiError
from ..metrics import Metrics

log = logging.getLogger("vggserve.serving")

INPUT_SHAPE = (3, 224, 224)
PIXELS_SHAPE = (224, 224, 3)
LIVE_STATES = ("loading", "warming", "ready")


class InferenceFailed(ApiError):
    def __init__(self, device: str, exc: BaseException):
        super().__init__(500, "inference_failed", f"inference failed on device {device}: {exc}")


class DeviceWorker:
    """States: starting -> loading -> warming -> ready -> stopped, or failed (with `error`) from any of them."""

    def __init__(self, device: str, model_factory: Callable, queue: BatchQueue, metrics: Metrics, *,
                 max_batch_size: int, max_wait_s: float, warmup: bool, on_change: Callable[[], None],
                 pixels: bool = False, device_resize: bool = True):
        self.device = device
        self.model_factory = model_factory
        self.queue = queue
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.warmup = warmup
        self.on_change = on_change
        self.pixels = pixels  # images arrive as uint8 crops: warm up the path they will take
        self.device_resize = device_resize  # tell the front ends to send RawImages if the model resizes them
        self.state = "starting"
        self.error: str | None = None
        self.info: dict = {}  # device_name, preprocessing, weights_info, max_batch_size once loaded
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name=f"vggserve-device-{device}", daemon=True)

    @property
    def alive(self) -> bool:
        return self.state in LIVE_STATES and self._thread.is_alive()

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def describe(self) -> dict:
        return {"spec": self.device, "state": self.state, "error": self.error, "batches": self.batches,
                "name": self.info.get("device_name")}

    def _set(self, state: str, error: str | None = None) -> None:
        self.state, self.error = state, error
        self.on_change()

    def _run(self) -> None:
        model = None
        try:
            self._set("loading")
            model = self.model_factory(self.device)
            self.info = {"device_name": str(getattr(model, "device_name", self.device)),
                         "preprocessing": getattr(model, "preprocessing", "torchvision"),
                         "weights_info": dict(getattr(model, "weights_info", None) or {}),
                         "max_batch_size": int(getattr(model, "max_batch_size", self.max_batch_size)),
                         # front ends may then send RawImages, resized and cropped on the device
                         "resizes_on_device": self._device_resizes(model)}
            if self.warmup:
                self._set("warming")
                started = time.perf_counter()
                self._warm_up(model)
                log.info("device %s warmed up in %.2f s", self.device, time.perf_counter() - started)
            self._set("ready")
            if hasattr(model, "submit"):
                from .inflight import InflightRunner

                InflightRunner(self, model).run()  # returns once the queue is closed and every batch is answered
            else:
                while (batch := self.queue.take_batch(self.max_batch_size, self.max_wait_s)) is not None:
                    self._run_batch(model, batch)
            self._set("stopped")
        except BaseException as exc:  # noqa: BLE001 - a dead worker must be reported, whatever killed it
            if self.state == "failed":  # already reported by _run_batch or the in-flight runner
                log.error("device worker %s stopped after a failed batch: %s", self.device, self.error, exc_info=exc)
                return
            if isinstance(exc, VggserveError):  # a known cause with its own message: no traceback
                log.error("device worker %s failed: %s", self.device, exc)
            else:
                log.exception("device worker %s failed", self.device)
            self._set("failed", f"{type(exc).__name__}: {exc}")
        finally:
            if model is not None and hasattr(model, "close"):
                try:
                    model.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing the model on %s failed", self.device)

    def _device_resizes(self, model) -> bool:
        """Whether front ends should send this model decoded images: images come from front ends, --resize-on
        device, and the model resizes on its device with this Pillow's results (preprocess.uses_device_resize)."""
        return self.pixels and self.device_resize and uses_device_resize(model)

    def _run_batch(self, model, batch: list[Item]) -> None:
        started = self._taken(batch)
        try:
            t0 = time.perf_counter()
            probs = np.asarray(self._probabilities(model, [item.tensor for item in batch]), dtype=np.float32)
            seconds = time.perf_counter() - t0
        except BaseException as exc:
            # a device that failed once is not trusted again: the worker dies, and says so before anyone hears
            self._set("failed", f"{type(exc).__name__}: {exc}")
            self._fail_items(batch, exc)
            raise
        self._resolve(batch, probs, started, seconds)

    def _taken(self, batch: list[Item]) -> float:
        """Record a batch just taken from the queue; returns when it was taken (time.monotonic())."""
        started = time.monotonic()
        for item in batch:
            self.metrics.queue_seconds.observe(started - item.enqueued)
        self.metrics.batch_size.observe(len(batch))
        return started

    def _resolve(self, batch: list[Item], probs: np.ndarray, started: float, seconds: float) -> None:
        """Answer a computed batch: row i of probs is batch[i]'s."""
        self.metrics.inference_seconds.observe(seconds)
        self.batches += 1
        for item, row in zip(batch, probs):
            item.future.set_result(Outcome(row, started - item.enqueued, seconds, len(batch), self.device))

    def _fail_items(self, batch: list[Item], exc: BaseException) -> None:
        """Answer every still-unanswered item of the batch with 500 inference_failed."""
        error = InferenceFailed(self.device, exc)
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)

    def _warm_up(self, model) -> None:
        if self.pixels and hasattr(model, "probabilities_from_pixels"):
            model.probabilities_from_pixels(np.zeros((self.max_batch_size, *PIXELS_SHAPE), dtype=np.uint8))
        else:
            model.logits(np.zeros((self.max_batch_size, *INPUT_SHAPE), dtype=np.float32))

    def _probabilities(self, model, inputs: list[np.ndarray]) -> np.ndarray:
        """(N, 1000) probabilities for a batch of float32 model inputs and/or uint8 crops."""
        batch = self._stacked(inputs, pixels=hasattr(model, "probabilities_from_pixels"))
        if batch.dtype == np.uint8:
            return model.probabilities_from_pixels(batch)
        return model.probabilities(batch)

    def _stack(self, inputs: list[np.ndarray]) -> np.ndarray:
        """What `submit` takes for a batch: a list when it holds RawImages (crops and raw images, resized on the
        device), the uint8 crops stacked when all are crops, else float32 inputs."""
        raw = sum(isinstance(x, RawImage) for x in inputs)
        if raw and self.info.get("resizes_on_device"):
            self.metrics.device_resized.inc(raw)
            return list(inputs)
        return self._stacked(inputs)

    def _stacked(self, inputs: list, pixels: bool = True) -> np.ndarray:
        """The batch as one array, any RawImage cropped here on the CPU first: the uint8 crops stacked when all are
        crops and `pixels` (the model takes them), else float32 model inputs (crops normalised here)."""
        inputs = [x.center_crop() if isinstance(x, RawImage) else x for x in inputs]
        if pixels and all(x.dtype == np.uint8 for x in inputs):
            return np.stack(inputs)
        return np.stack([self._as_input(x) for x in inputs])

    def _as_input(self, x: np.ndarray) -> np.ndarray:
        if x.dtype != np.uint8:
            return x
        from ...preprocess import normalize_pixels

        return normalize_pixels(x, self.info.get("preprocessing", "torchvision"))
