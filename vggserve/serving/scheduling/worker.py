"""A device worker: one thread that owns one model (models are not thread-safe), loads it, runs a warm-up batch,
then computes batches from the shared queue until the queue closes.

Queued images are `ModelInput`s of any form: tensors (decoded in this process, or a v2 request's FP32 input),
crops and images sent by HTTP front-end processes. `prepare` turns a batch into the one argument the model takes
(`modelinput.prepare_batch`): images for a model that resizes on its device, crops for one that normalises on its
device, else float32 tensors. A batch computes logits when one of its images asks for them (the probabilities are
then their softmax, on the CPU), else probabilities (on the device).

A model with the engine's `submit` runs with two batches in flight (`inflight.InflightRunner`, through the public
methods below): the next batch is taken and uploaded while the device computes the current one. Other models (the
stand-ins in `vggserve.testing.models`, the MPI ShardedModel) run one batch at a time here.

A device that fails once is not trusted again: its worker is failed (`vggserve_device_up` 0, one more
`vggserve_device_failures_total`), leaves the queue, and the images of its batches go back to the queue for the other
workers (inference is idempotent); only when no other worker is left are they answered with InferenceFailed."""

import logging
import threading
import time
from typing import Callable

import numpy as np

from ...errors import VggserveError
from ...modelinput import CROP_SHAPE, TENSOR_SHAPE, prepare_batch, uses_device_resize
from ...predictions import softmax
from ...wording import count
from ..metrics import Metrics, observe_all
from .batcher import BatchQueue, Item, answer
from .devicedecode import DeviceDecoding, decodes_on_device
from .devicestats import device_figures
from .errors import InferenceFailed
from ..threadnames import name_this_thread

log = logging.getLogger("vggserve.serving")

LIVE_STATES = ("loading", "warming", "ready")


class DeviceWorker:
    """States: starting -> loading -> warming -> ready -> stopped, or failed (with `error`) from any of them."""

    def __init__(self, device: str, model_factory: Callable, queue: BatchQueue, metrics: Metrics, *,
                 max_batch_size: int, max_wait_s: float, warmup: bool, on_change: Callable[[], None],
                 pixels: bool = False, device_resize: bool = True, decoding: DeviceDecoding | None = None,
                 label: str | None = None):
        self.device = device
        self.label = label or device  # its name in the metrics and the log (settings.device_names)
        self.model_factory = model_factory
        self.queue = queue
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.warmup = warmup
        self.on_change = on_change
        self.pixels = pixels  # images arrive as uint8 crops: warm up the path they will take
        self.device_resize = device_resize  # tell the front ends to send images if the model resizes them
        self.decoding = decoding or DeviceDecoding(metrics)  # encoded uploads: on the device with --decode gpu|auto
        self.state = "starting"
        self.error: str | None = None
        self.info: dict = {}  # device_name, preprocessing, weights_info, max_batch_size, precision once loaded
        self._model_takes_pixels = False
        self.batches = 0
        self._enlisted = False  # counted among the queue's workers (from start until it fails or stops)
        self.metrics.device_up.labels(device=self.label).set(0)
        self.metrics.device_failures.labels(device=self.label)  # exported as 0 from the start, so rate() sees the first
        self._thread = threading.Thread(target=self._run, name=f"vggserve-device-{self.label}", daemon=True)

    @property
    def alive(self) -> bool:
        return self.state in LIVE_STATES and self._thread.is_alive()

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self._thread.is_alive()

    def start(self) -> None:
        self.queue.enlist()
        self._enlisted = True
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def describe(self) -> dict:
        return {"spec": self.device, "label": self.label, "state": self.state, "error": self.error,
                "batches": self.batches, "name": self.info.get("device_name"), "memory": self.info.get("device_memory")}

    def _set(self, state: str, error: str | None = None) -> None:
        self.state, self.error = state, error
        self.metrics.device_up.labels(device=self.label).set(1 if state == "ready" else 0)
        if state == "failed":
            self.metrics.device_failures.labels(device=self.label).inc()
        if state in ("failed", "stopped") and self._enlisted:  # before anyone hears of it: see requeue_or_fail
            self._enlisted = False
            self.queue.leave()
        self.on_change()

    def mark_failed(self, exc: BaseException) -> None:
        """A device that failed once is not trusted again: the worker is failed (before any request hears of it)."""
        self._set("failed", f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        name_this_thread()
        model = None
        try:
            self._set("loading")
            model = self.model_factory(self.device)
            figures = device_figures(model)  # now: before any check runs buffers of its own on the device
            self.info = {"device_name": str(getattr(model, "device_name", self.device)),
                         "preprocessing": getattr(model, "preprocessing", "torchvision"),
                         "precision": str(getattr(model, "precision", "fp32")),
                         "weights_info": dict(getattr(model, "weights_info", None) or {}),
                         "max_batch_size": int(getattr(model, "max_batch_size", self.max_batch_size)),
                         # front ends may then send images, resized and cropped on the device
                         "resizes_on_device": self.device_resizes(model),
                         # front ends may then send JPEGs compressed, decoded on the device (devicedecode)
                         "decodes_on_device": decodes_on_device(model, self.decoding.mode)}
            self._note_device(figures)
            self._model_takes_pixels = hasattr(model, "submit") or hasattr(model, "probabilities_from_pixels")
            if self.warmup:
                self._set("warming")
                started = time.perf_counter()
                self._warm_up(model)
                log.info("device %s warmed up in %.2f s", self.label, time.perf_counter() - started)
            self._set("ready")
            if hasattr(model, "submit"):
                from .inflight import InflightRunner

                InflightRunner(self, model).run()  # returns once the queue is closed and every batch is answered
            else:
                while (batch := self.queue.take_batch(self.max_batch_size, self.max_wait_s)) is not None:
                    self.run_batch(model, batch)
            self._set("stopped")
        except BaseException as exc:  # noqa: BLE001 - a dead worker must be reported, whatever killed it
            if self.state == "failed":  # already reported by run_batch or the in-flight runner
                log.error("device worker %s stopped after a failed batch: %s", self.label, self.error, exc_info=exc)
                return
            if isinstance(exc, VggserveError):  # a known cause with its own message: no traceback
                log.error("device worker %s failed: %s", self.label, exc)
            else:
                log.exception("device worker %s failed", self.label)
            self._set("failed", f"{type(exc).__name__}: {exc}")
        finally:
            if model is not None and hasattr(model, "close"):
                try:
                    model.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing the model on %s failed", self.label)

    def _note_device(self, figures: dict | None) -> None:
        """The device's OpenCL figures on /metrics, and in `info` (for /metadata)."""
        if figures is None:
            return
        self.info["device_memory"] = figures
        self.metrics.device_memory.labels(device=self.label).set(figures["global_memory_bytes"])
        self.metrics.device_engine_bytes.labels(device=self.label).set(figures["engine_bytes"])
        self.metrics.device_compute_units.labels(device=self.label).set(figures["compute_units"])

    def device_resizes(self, model) -> bool:
        """Whether front ends should send this model decoded images: images come from front ends, --resize-on
        device, and the model resizes on its device with this Pillow's results (modelinput.uses_device_resize)."""
        return self.pixels and self.device_resize and uses_device_resize(model)

    # one batch, through the steps the in-flight runner uses too ------------------------------------------------
    def run_batch(self, model, batch: list[Item]) -> None:
        """Compute one batch here, in this thread, and answer it."""
        started = self.note_taken(batch)
        try:
            batch, inputs = self.decoded(model, batch)
            if not batch:
                return
            want = self.wants(batch)
            t0 = time.perf_counter()
            argument = self.prepare(batch, inputs)
            call = want if argument.dtype != np.uint8 else f"{want}_from_pixels"
            rows = np.asarray(getattr(model, call)(argument), dtype=np.float32)
            self.resolve(batch, rows, want, started, time.perf_counter() - t0)
        except BaseException as exc:
            self.mark_failed(exc)
            self.requeue_or_fail(batch, exc)
            raise

    def note_taken(self, batch: list[Item]) -> float:
        """Record a batch just taken from the queue; returns when it was taken (time.monotonic())."""
        started = time.monotonic()
        observe_all(self.metrics.queue_seconds, [started - item.enqueued for item in batch])
        self.metrics.batch_size.observe(len(batch))
        return started

    @staticmethod
    def wants(batch: list[Item]) -> str:
        """What the batch computes: "logits" when one of its images asks for them, else "probabilities"."""
        return "logits" if any(item.want_logits for item in batch) else "probabilities"

    @property
    def _decodes_on_device(self) -> bool:
        """Whether the loaded model decodes JPEGs on its device (its info, once loaded)."""
        return bool(self.info.get("decodes_on_device"))

    @property
    def _preprocessing(self) -> str:
        return self.info.get("preprocessing", "torchvision")

    def decoded(self, model, batch: list[Item]) -> tuple[list[Item], list]:
        """(the items still to compute, their inputs): the batch's encoded uploads decoded (`devicedecode`), each
        the CPU path refuses answered with its ImageError."""
        return self.decoding.decode(model, batch, self._decodes_on_device, self._preprocessing)

    def to_device_decoder(self, batch: list[Item]) -> bool:
        """Whether `batch`'s JPEGs go to this worker's device decoder (`DeviceDecoding.for_device`): the in-flight
        runner then decodes it with a group (`claim_group`) and takes the next batch before a slot is free."""
        return self.decoding.for_device(batch, self._decodes_on_device)

    def claim_group(self, batch: list[Item], max_size: int, busy: Callable[[], bool]) -> list[list[Item]]:
        """The batches to decode on the device together with `batch`, just taken, one that goes to the device decoder
        (`to_device_decoder`): full batches already waiting, claimed (`BatchQueue.take_more`), up to --decode-group
        batches and GROUP_BYTES of files in all."""
        decoding = self.decoding
        if decoding.group < 2:
            return []
        return self.queue.take_more(max_size, decoding.group - 1, busy, decoding.hold_s, decoding.encoded_bytes,
                                    decoding.group_bytes - decoding.encoded_bytes(batch))

    def decoded_group(self, model, batch: list[Item], claimed: list[list[Item]]) -> list[tuple[list[Item], list]]:
        """`decoded` for `batch` (taken) and the `claimed` batches, in one device decode: each batch's (items still
        to compute, their inputs), in order. A claimed image whose file the CPU path refuses is answered with its
        ImageError only while it is still claimed (its request may have been answered meanwhile)."""

        def settle(k: int, items: list[Item]) -> list[Item]:
            return items if k == 0 else self.queue.unclaim(items)

        return self.decoding.decode_group(model, [batch, *claimed], self._decodes_on_device, self._preprocessing,
                                          settle)

    def start_claimed(self, batch: list[Item], inputs: list) -> tuple[list[Item], list]:
        """A claimed batch of a decode group starts: (its items still to compute, their inputs), without those
        withdrawn meanwhile or whose deadline passed (answered 504: `BatchQueue.start_claimed`)."""
        kept = set(map(id, self.queue.start_claimed(batch)))
        pairs = [(item, x) for item, x in zip(batch, inputs) if id(item) in kept]
        return [item for item, _ in pairs], [x for _, x in pairs]

    def prepare(self, batch: list[Item], inputs: list | None = None):
        """The model's argument for the batch (`modelinput.prepare_batch`; `inputs`: the items' inputs as `decoded`
        gave them), counting the images the device resizes."""
        inputs = [item.input for item in batch] if inputs is None else inputs
        argument = prepare_batch(inputs, self._preprocessing,
                                 resizes=bool(self.info.get("resizes_on_device")) or self._decodes_on_device,
                                 takes_pixels=self._model_takes_pixels)
        if isinstance(argument, list):
            self.metrics.device_resized.inc(sum(x.needs_resize for x in argument))
        return argument

    def resolve(self, batch: list[Item], rows: np.ndarray, want: str, started: float, seconds: float) -> None:
        """Answer a computed batch: row i of `rows` (what `want` asked the model for) is batch[i]'s."""
        if rows.ndim != 2 or len(rows) != len(batch):  # else zip would leave images unanswered, waiting forever
            raise RuntimeError(f"the model returned {count(len(rows) if rows.ndim else 0, 'row')} for a batch of "
                               f"{count(len(batch), 'image')} (shape {rows.shape})")
        self.metrics.batch_done(len(batch), seconds)
        self.batches += 1
        if want == "logits":
            answer(batch, softmax(rows), rows, started, seconds, self.device)
        else:
            answer(batch, rows, None, started, seconds, self.device)

    def requeue_or_fail(self, batch: list[Item], exc: BaseException) -> None:
        """The still-unanswered items of a batch this failed worker will not compute: back to the front of the queue
        for the other workers, or, when none is left, answered with InferenceFailed."""
        items = [item for item in batch if not item.future.done()]
        if not items:
            return
        if self.queue.hand_back(items):  # back in the queue, or failed with its close reason (shutting down)
            log.warning("device %s is out (%s): %s of its batch went back to the queue for the other device workers",
                        self.label, self.error or exc, count(len(items), "image"))
            return
        error = InferenceFailed(self.label, exc)
        for item in items:
            item.future.set_exception(error)

    def _warm_up(self, model) -> None:
        if self.pixels and hasattr(model, "probabilities_from_pixels"):
            model.probabilities_from_pixels(np.zeros((self.max_batch_size, *CROP_SHAPE), dtype=np.uint8))
        else:
            model.logits(np.zeros((self.max_batch_size, *TENSOR_SHAPE), dtype=np.float32))
        prepare = getattr(model, "prepare_replays", None)  # the engine's forward passes, every batch size recorded
        if prepare is not None:
            prepare()
