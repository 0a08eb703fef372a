"""One rank's work on chunks of image paths: decode ahead on threads, classify in order on the rank's model.

    runner = ChunkRunner(model, top_k=5, decode_threads=2)
    runner.submit(paths)              # starts decoding this chunk on the thread pool
    outcome = runner.run_next()       # oldest submitted chunk: waits for its pixels, runs the model

An image that cannot be opened or decoded becomes an error line and never reaches the model; an exception
from the model itself propagates (the job aborts: that is a device or engine failure, not a bad image).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..predictions import top_k as top_k_predictions
from .store import error_line, result_line


@dataclass
class ChunkOutcome:
    """What a chunk produced: JSON lines for the results and the errors file."""

    results: list[str]
    errors: list[str]

    @property
    def images(self) -> int:
        return len(self.results) + len(self.errors)


@dataclass
class RankStats:
    """Work done by one rank in this run; `active_seconds` spans its first chunk's start to its last's end."""

    rank: int
    device: str
    images: int = 0
    errors: int = 0
    active_seconds: float = 0.0
    _started: float | None = field(default=None, repr=False)

    def record(self, outcome: ChunkOutcome, started: float, ended: float) -> None:
        if self._started is None:
            self._started = started
        self.images += outcome.images
        self.errors += len(outcome.errors)
        self.active_seconds = ended - self._started

    @property
    def images_per_second(self) -> float:
        return self.images / self.active_seconds if self.active_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "rank": self.rank,
            "device": self.device,
            "images": self.images,
            "errors": self.errors,
            "active_seconds": round(self.active_seconds, 3),
            "images_per_second": round(self.images_per_second, 3),
        }


def decode(path: str, mode: str, catch: type[BaseException] | tuple = Exception, on_device: bool = False):
    """(pixels, None) for a readable image, else (None, (reason, exception type)). pixels: a `ModelInput`, the
    float32 (3, 224, 224) tensor; with on_device (a model that resizes on its device), `modelinput.device_input`:
    an image or a crop.

    `catch`: the failures recorded that way; any other exception propagates. The batch job records an unreadable
    image of any kind (never fatal); `vggserve classify` only `ImageError`s.
    """
    from ..images import open_image
    from ..modelinput import ModelInput, device_input
    from ..preprocess import check_mode, load_and_preprocess

    try:
        if on_device:
            check_mode(mode)
            return device_input(open_image(path)), None
        return ModelInput.tensor(load_and_preprocess(path, mode)), None
    except catch as exc:
        reason = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
        return None, (reason or str(exc) or type(exc).__name__, type(exc).__name__)


def probabilities_of(model, inputs: list) -> np.ndarray:
    """(N, 1000) probabilities of decoded `ModelInput`s: tensors in one call, or device inputs (images and crops)
    through `submit`, max_batch_size at a time with two batches in flight."""
    if inputs[0].form == "tensor":
        return model.probabilities(np.stack([x.array for x in inputs]))
    return _rows(_submit_in_batches(model, inputs))


def _submit_in_batches(model, inputs: list) -> list:
    """The model's Pendings for device inputs, max_batch_size at a time (none for no inputs)."""
    step = model.max_batch_size
    return [model.submit(inputs[i:i + step], "probabilities") for i in range(0, len(inputs), step)]


def _rows(pending: list) -> np.ndarray:
    return np.concatenate([p.result() for p in pending])


def split_decoded(paths: list[str], decoded) -> tuple[list[str], list, list]:
    """(readable paths, their pixels, [(path, (reason, exception type))]) from `decode`'s answer for each path."""
    good_paths, pixels, failed = [], [], []
    for path, (array, problem) in zip(paths, decoded, strict=True):
        if problem is None:
            good_paths.append(path)
            pixels.append(array)
        else:
            failed.append((path, problem))
    return good_paths, pixels, failed


def classify_decoded(model, paths: list[str], decoded, k: int):
    """([(path, top-k predictions)], [(path, (reason, exception type))]): `decoded` is `decode`'s answer for each
    of `paths`, in order (any iterable; taken one at a time). The readable images go to the model in one batch."""
    good_paths, pixels, failed = split_decoded(paths, decoded)
    if not pixels:
        return [], failed
    predictions = top_k_predictions(probabilities_of(model, pixels), k)
    return list(zip(good_paths, predictions, strict=True)), failed


class ChunkRunner:
    """Decode-ahead classification of chunks on one model (which only this runner's thread may call).

    With a model that resizes on its device, two chunks are on the device at once: `run_next` puts the next
    submitted chunk on the device (once its decoding is done) before it reads the current chunk's results, so the
    device computes one while the host formats the other.
    """

    def __init__(self, model, top_k: int = 5, decode_threads: int = 2):
        from ..modelinput import uses_device_resize

        self.model = model
        self.top_k = top_k
        self.on_device = uses_device_resize(model)  # decode to image inputs: the device resizes and crops
        self._pool = ThreadPoolExecutor(max_workers=max(1, decode_threads), thread_name_prefix="decode")
        self._queue: deque[tuple[list[str], list[Future]]] = deque()
        self._ahead: tuple | None = None  # _start's answer for _queue[0], put on the device early by run_next

    @property
    def pending(self) -> int:
        """Chunks submitted and not yet run."""
        return len(self._queue)

    def submit(self, paths: list[str]) -> None:
        mode = self.model.preprocessing
        self._queue.append((list(paths), [self._pool.submit(decode, path, mode, on_device=self.on_device)
                                          for path in paths]))

    def run_next(self) -> ChunkOutcome:
        """Classify the oldest submitted chunk: result lines in the chunk's order, error lines for the rest."""
        entry = self._queue.popleft()
        if not self.on_device:
            paths, futures = entry
            classified, failed = classify_decoded(self.model, paths, (f.result() for f in futures), self.top_k)
        else:
            started, self._ahead = self._ahead or self._start(entry), None
            good_paths, failed, pending = started
            if self._queue:  # the next chunk goes on the device before this one's results are read
                self._ahead = self._start(self._queue[0])
            predictions = top_k_predictions(_rows(pending), self.top_k) if pending else []
            classified = list(zip(good_paths, predictions, strict=True))
        return ChunkOutcome([result_line(path, preds) for path, preds in classified],
                            [error_line(path, *problem) for path, problem in failed])

    def _start(self, entry) -> tuple[list[str], list, list]:
        """Wait for a chunk's decoding and start its readable images on the device: (their paths, the failures,
        the model's Pendings: one per max_batch_size images, none when nothing is readable)."""
        paths, futures = entry
        good_paths, pixels, failed = split_decoded(paths, (f.result() for f in futures))
        return good_paths, failed, _submit_in_batches(self.model, pixels)

    def run_timed(self, stats: RankStats) -> ChunkOutcome:
        """run_next, recorded in `stats`."""
        started = time.perf_counter()
        outcome = self.run_next()
        stats.record(outcome, started, time.perf_counter())
        return outcome

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

