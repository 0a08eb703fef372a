"""Stand-in models with the engine's interface, for tests and demos of the service without OpenCL.

`ReferenceModel` computes real VGG16 scores with the float32 numpy reference (slow but exact); `SlowModel`
returns fixed scores after sleeping, to make queues fill and deadlines pass on purpose; `SlowModels` makes them for
engine processes (a picklable factory; devices that fail on demand); `PipelinedModel` is a SlowModel with the
engine's `submit` (batches in flight, gated results, failures); `InstantModel` a device that takes no time, for
benchmarks of the host side (`InstantModels`: their factory for engine processes). `crash_on_marker` is a
preprocessing-process task whose worker dies on a marker upload (`service.preprocess_task = crash_on_marker`).
"""

import os
import threading
import time
from collections import defaultdict, deque

import numpy as np

from ..predictions import softmax
from ..runtime.hostcopy import copy_many
from ..weights.spec import NUM_CLASSES


class ReferenceModel:
    """VGG16 on numpy (float32) from torchvision-named tensors."""

    preprocessing = "torchvision"

    def __init__(self, tensors: dict, device: str = "cpu", max_batch_size: int = 16):
        self.tensors = tensors
        self.device_name = f"numpy reference ({device})"
        self.max_batch_size = max_batch_size
        self.weights_info = {"path": None, "format": "memory", "sha256": None}
        self.batch_sizes: list[int] = []

    def logits(self, x: np.ndarray) -> np.ndarray:
        from ..model.reference import reference_logits

        self.batch_sizes.append(len(x))
        return reference_logits(self.tensors, x, dtype=np.float32).astype(np.float32)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return softmax(self.logits(x))

    def close(self) -> None:
        pass


class SlowModel:
    """Sleeps `seconds_per_batch` per batch and scores class (sum of the image's pixels) mod 1000 highest;
    `fail_after` batches, raises RuntimeError (a dying device). With `hold_file`, a batch also waits on the device
    for as long as that file exists: a test holds the device busy for exactly as long as it needs, however slow
    the machine."""

    preprocessing = "torchvision"

    def __init__(self, device: str = "cpu", seconds_per_batch: float = 0.2, max_batch_size: int = 16,
                 load_seconds: float = 0.0, fail_after: int | None = None, hold_file: str | None = None):
        time.sleep(load_seconds)
        self.hold_file = hold_file
        self.device_name = f"sleeping stand-in ({device})"
        self.seconds_per_batch = seconds_per_batch
        self.max_batch_size = max_batch_size
        self.fail_after = fail_after
        self.weights_info = {"path": None, "format": "memory", "sha256": None}
        self.batch_sizes: list[int] = []

    def logits(self, x: np.ndarray) -> np.ndarray:
        if self.fail_after is not None and len(self.batch_sizes) >= self.fail_after:
            raise RuntimeError("simulated device failure")
        self.batch_sizes.append(len(x))
        time.sleep(self.seconds_per_batch)
        while self.hold_file is not None and os.path.exists(self.hold_file):
            time.sleep(0.01)
        return slow_model_logits(x)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return softmax(self.logits(x))

    def close(self) -> None:
        pass


class SlowModels:
    """A model factory of SlowModels that an engine process can be given (it pickles by reference, unlike a
    closure): `fail_files` maps a device to a file whose existence makes that device fail at its next batch (a
    test kills one device mid-load, when it chooses)."""

    def __init__(self, seconds_per_batch: float = 0.05, max_batch_size: int = 4,
                 fail_files: dict[str, str] | None = None):
        self.seconds_per_batch = seconds_per_batch
        self.max_batch_size = max_batch_size
        self.fail_files = dict(fail_files or {})

    def __call__(self, device: str) -> "SlowModel":
        model = SlowModel(device, self.seconds_per_batch, self.max_batch_size)
        fail_file = self.fail_files.get(device)
        if fail_file is not None:
            logits = model.logits

            def failing(x: np.ndarray) -> np.ndarray:
                if os.path.exists(fail_file):
                    raise RuntimeError(f"simulated failure of device {device}")
                return logits(x)

            model.logits = failing
        return model


def slow_model_logits(x: np.ndarray) -> np.ndarray:
    """SlowModel's scores: 10 for class (sum of |pixels|) mod 1000 of each image, 0 elsewhere."""
    out = np.zeros((len(x), NUM_CLASSES), dtype=np.float32)
    winners = np.abs(np.asarray(x, dtype=np.float64)).reshape(len(x), -1).sum(axis=1).astype(np.int64) % NUM_CLASSES
    out[np.arange(len(x)), winners] = 10.0
    return out


class PipelinedModel(SlowModel):
    """A SlowModel with the engine's `submit`: batch k's probabilities (SlowModel's, for float32 inputs or uint8
    crops as they are) can be collected `seconds_per_batch` after its submit, and, with `gated`, only once
    `release(k)` was called. Records each batch's input in submission order (`submitted`), the most batches in
    flight at once (`max_in_flight`: submitted, result not yet collected), and `log`: ("submit", k), ("result", k)
    and ("close",) in the order they happened. `fail_at=(k, "submit")` or `(k, "result")` makes batch k (0-based)
    raise RuntimeError there. `lanes`: the engine's `lane_count` it reports (its batches run at once anyway)."""

    def __init__(self, device: str = "cpu", seconds_per_batch: float = 0.02, max_batch_size: int = 16, *,
                 gated: bool = False, fail_at: tuple[int, str] | None = None, lanes: int = 1):
        super().__init__(device, seconds_per_batch, max_batch_size)
        self.lane_count = lanes
        self.device_name = f"pipelined stand-in ({device})"
        self.gated, self.fail_at = gated, fail_at
        self.submitted: list[np.ndarray] = []
        self.in_flight = self.max_in_flight = 0
        self.log: list[tuple] = []
        self._lock = threading.Lock()
        self._gates: defaultdict[int, threading.Event] = defaultdict(threading.Event)

    def release(self, *batches: int) -> None:
        """Let these batches' results be collected (with `gated`)."""
        with self._lock:
            for k in batches:
                self._gates[k].set()

    def submit(self, x: np.ndarray, want: str = "logits", pinned: bool = True) -> "FakePending":
        if not 1 <= len(x) <= self.max_batch_size:
            raise ValueError(f"submit takes 1 to max_batch_size={self.max_batch_size} images, got {len(x)}")
        with self._lock:
            k = len(self.submitted)
            if self.fail_at == (k, "submit"):
                self.fail_at = None
                raise RuntimeError(f"simulated device failure at submit of batch {k}")
            self.submitted.append(np.array(x))
            self.batch_sizes.append(len(x))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.log.append(("submit", k))
            gate = self._gates[k] if self.gated else None
        scores = slow_model_logits(x)
        rows = softmax(scores) if want == "probabilities" else scores
        return FakePending(self, k, rows, time.monotonic() + self.seconds_per_batch, gate,
                           self.fail_at == (k, "result"))

    def _collected(self, k: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.log.append(("result", k))

    def close(self) -> None:
        with self._lock:
            self.log.append(("close",))


class FakePending:
    """PipelinedModel's batch in flight; `result()` is thread-safe and gives the same rows (or error) each time."""

    def __init__(self, model: PipelinedModel, k: int, rows: np.ndarray, ready_at: float, gate, fail: bool):
        self._model, self._k, self._rows, self._ready_at, self._gate, self._fail = model, k, rows, ready_at, gate, fail
        self._collected = False
        self._lock = threading.Lock()

    def result(self) -> np.ndarray:
        with self._lock:
            if not self._collected:
                time.sleep(max(0.0, self._ready_at - time.monotonic()))
                if self._gate is not None:
                    self._gate.wait()
                self._collected = True
                self._model._collected(self._k)
        if self._fail:
            raise RuntimeError(f"simulated device failure in batch {self._k}")
        return self._rows

    def done(self) -> bool:
        """Whether `result()` would answer without waiting (as the engine's Pending.done)."""
        return self._collected or (time.monotonic() >= self._ready_at and (self._gate is None or self._gate.is_set()))


CRASH_MARKER = b"vggserve: crash this worker"


def crash_on_marker(data: bytes, mode: str, max_pixels: int, formats, decode: str = "exact"):
    """`imaging.decode_and_crop`, except that the worker process dies at once (as a crashing decoder would) when
    the upload starts with CRASH_MARKER."""
    from ..serving.scheduling.imaging import decode_and_crop

    if bytes(data[:len(CRASH_MARKER)]) == CRASH_MARKER:
        os._exit(70)
    return decode_and_crop(data, mode, max_pixels, formats, decode)


class InstantModel:
    """A device that takes no time (or `seconds_per_batch`), with the engine's interface: it resizes on its 'device'
    (takes image inputs as well as crops and tensors), `submit` copies every input into a staging array as the engine
    copies into its pinned staging, and the batch is done then (or once the device has had its time). Its
    probabilities are softmax rows of random logits (no ties), so
    top-k costs what it costs on real scores. For benchmarks of the host side: the batch job's rank
    (benchmarks/batch_host_floor.py) and the service's processes (benchmarks/serve_host_floor.py).

    Like the engine it has `slots` staging slots (the engine's two): a submit first waits until the batch that used
    its slot `slots` submits ago is done, so at most `slots` batches are on the 'device' at once. `log` (a list, when
    given) records ("submit", k) once batch k is on the device and ("result", k) when its rows are first taken."""

    resizes_on_device = True
    preprocessing = "torchvision"
    precision = "fp32"

    def __init__(self, device: str = "cpu", max_batch_size: int = 32, seconds_per_batch: float = 0.0, *,
                 slots: int = 2, log: list | None = None):
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.device_name = f"instant stand-in ({device})"
        self.max_batch_size = max_batch_size
        self.seconds_per_batch = seconds_per_batch  # a device that takes this long per batch, one after the other
        self.weights_info = {"path": None, "format": "memory", "sha256": None}
        self.staging = np.empty(max_batch_size * (4 << 20), np.uint8)
        self.batches = 0
        self.log = log
        self._free_at = 0.0  # when the 'device' has finished the batches submitted so far
        self._slots: deque[float] = deque(maxlen=slots)  # when each of the last `slots` batches is done

    def resize_matches_pillow(self) -> bool:
        return True

    def submit(self, inputs, want: str = "probabilities", pinned: bool = True) -> "Instant":
        if len(self._slots) == self._slots.maxlen:  # the engine collects the batch that used this slot first
            time.sleep(max(0.0, self._slots[0] - time.monotonic()))
        copies, offset = [], 0
        for x in inputs:
            array = np.ascontiguousarray(getattr(x, "array", x)).reshape(-1).view(np.uint8)
            copies.append((self.staging[offset:offset + array.nbytes], array))
            offset += array.nbytes
        copy_many(copies)
        self.batches += 1
        rows = instant_scores(len(inputs), self.batches)
        self._free_at = max(time.monotonic(), self._free_at) + self.seconds_per_batch
        self._slots.append(self._free_at)
        if self.log is not None:
            self.log.append(("submit", self.batches - 1))
        return Instant(np.log(rows) if want == "logits" else rows, self._free_at, self.log, self.batches - 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.submit(x, "logits").result()

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return self.submit(x).result()

    def close(self) -> None:
        pass


class InstantModels:
    """A picklable factory of InstantModel (engine processes rebuild their models from it): `factory(device)`."""

    def __init__(self, max_batch_size: int = 32, seconds_per_batch: float = 0.0):
        self.max_batch_size, self.seconds_per_batch = max_batch_size, seconds_per_batch

    def __call__(self, device: str) -> InstantModel:
        return InstantModel(device, self.max_batch_size, self.seconds_per_batch)


class Instant:
    """InstantModel's batch `k`: done at `ready_at` (time.monotonic()); its first result() is logged in `log`."""

    def __init__(self, rows: np.ndarray, ready_at: float = 0.0, log: list | None = None, k: int = 0):
        self.rows = rows
        self.ready_at = ready_at
        self._log, self._k = log, k

    def result(self) -> np.ndarray:
        time.sleep(max(0.0, self.ready_at - time.monotonic()))
        if self._log is not None:
            self._log.append(("result", self._k))
            self._log = None
        return self.rows

    def done(self) -> bool:
        return time.monotonic() >= self.ready_at


_SCORES: list = []


def instant_scores(n: int, batch: int) -> np.ndarray:
    """n softmax rows of random logits (a table of 256 made once), starting at a place that moves with `batch`."""
    if not _SCORES:
        logits = np.random.default_rng(1).normal(0, 3, (256, NUM_CLASSES))
        _SCORES.append(softmax(logits))
    table = _SCORES[0]
    start = (batch * 37) % max(1, len(table) - n)
    return table[start:start + n].copy() if n <= len(table) else np.resize(table, (n, NUM_CLASSES))
