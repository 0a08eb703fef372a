"""The bounded queue between the HTTP handlers and the device workers, and the batches workers take from it.

Admission is counted in images: `admit(n)` reserves room before an image is decoded, so a full queue refuses
(QueueFull) at once and decoding work is bounded too; `submit` turns reserved room into waiting items. A worker's
`take_batch` waits at most `max_wait` after the oldest waiting image arrived for a batch to fill, drops images
whose deadline has passed (DeadlineExceeded, never computed), and hands back up to `max_size` images (a worker
that failed while it waited `put_back`s them for the others). Handlers `withdraw` images whose deadline passed or
whose client went away while they still wait, so those are never computed either.
"""

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ...modelinput import ModelInput
from ..metrics import Metrics
from .errors import ClientGone, DeadlineExceeded, QueueFull, SchedulingError


@dataclass(eq=False)
class Item:
    """One image waiting for a device; its future gets an Outcome or a SchedulingError."""

    input: ModelInput
    deadline: float  # time.monotonic() after which it is dropped
    want_logits: bool = False  # its Outcome carries the logits too (the batch then computes logits)
    enqueued: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)

    def expire(self, now: float) -> None:
        self.future.set_exception(DeadlineExceeded(now - self.enqueued))


@dataclass(frozen=True)
class Outcome:
    """What a device worker hands back for one image."""

    probabilities: np.ndarray  # (1000,) float32
    queue_s: float  # from submit to the start of its batch
    inference_s: float  # device time of its whole batch
    batch_size: int
    device: str
    logits: np.ndarray | None = None  # (1000,) float32, when the item asked for them


class Admission:
    """Room counted in images, shared by the queues: `admit(n)` reserves all or none (QueueFull when it is
    taken; the close reason once closed), `release(n)` gives room back. `guard`: the subclass's lock."""

    def __init__(self, capacity: int, metrics: Metrics, guard):
        self.capacity = capacity
        self.metrics = metrics
        self._guard = guard
        self._admitted = 0  # images reserved, waiting or (front ends) on their way
        self._closed: SchedulingError | None = None

    @property
    def admitted(self) -> int:
        return self._admitted

    def admit(self, n: int) -> None:
        """Reserve room for n images, all or none; QueueFull if there is not enough."""
        with self._guard:
            if self._closed is not None:
                raise self._closed
            if self._admitted + n > self.capacity:
                self.metrics.rejected.labels(reason="queue_full").inc()
                raise self.full()
            self._admitted += n

    def full(self) -> QueueFull:
        """The refusal of an image beyond the room."""
        return QueueFull(self.capacity)

    def release(self, n: int) -> None:
        """Give back reserved room that will not be submitted (the image failed to decode, say)."""
        with self._guard:
            self._admitted -= n


class BatchQueue(Admission):
    """Thread-safe bounded FIFO of Items shared by all device workers."""

    def __init__(self, capacity: int, metrics: Metrics):
        self._cond = threading.Condition()
        super().__init__(capacity, metrics, self._cond)
        self._items: deque[Item] = deque()
        self._filling: list[int] = []  # the batch sizes that workers waiting for a batch to fill want

    def __len__(self) -> int:
        return len(self._items)

    def submit(self, image: ModelInput, deadline: float, want_logits: bool = False) -> Item:
        """Queue one admitted image for the next batch."""
        item = Item(image, deadline, want_logits)
        with self._cond:
            if self._closed is not None:
                self._admitted -= 1
                raise self._closed
            self._items.append(item)
            self._note_length()
            # wake the workers only when one can act: a first image, or enough for a batch (not 31 times a batch)
            if len(self._items) == 1 or len(self._items) >= min(self._filling, default=1):
                self._cond.notify_all()
        return item

    def withdraw(self, item: Item, error: SchedulingError) -> bool:
        """Take a still-waiting image out of the queue and fail it with `error`; False if a worker has it."""
        with self._cond:
            try:
                self._items.remove(item)
            except ValueError:
                return False
            self._admitted -= 1
            self._note_length()
        item.future.set_exception(error)
        if isinstance(error, DeadlineExceeded):
            self.metrics.timeouts.inc()
        elif isinstance(error, ClientGone):
            self.metrics.abandoned.inc()
        return True

    def put_back(self, batch: list[Item]) -> None:
        """Return a batch that a worker took but cannot compute (it failed while waiting for it) to the front of
        the queue, for the other workers; once the queue is closed, fail it with the close reason instead."""
        with self._cond:
            error = self._closed
            if error is None:
                self._items.extendleft(reversed(batch))
                self._admitted += len(batch)
                self._note_length()
                self._cond.notify_all()
        if error is not None:
            for item in batch:
                item.future.set_exception(error)

    def take_batch(self, max_size: int, max_wait_s: float) -> list[Item] | None:
        """Block until a batch is ready and return it; None once the queue is closed and empty."""
        while True:
            expired: list[Item] = []
            with self._cond:
                while not self._items and self._closed is None:
                    self._cond.wait()
                if not self._items:
                    return None
                fill_by = self._items[0].enqueued + max_wait_s
                self._filling.append(max_size)
                try:
                    while 0 < len(self._items) < max_size and self._closed is None:
                        remaining = fill_by - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                finally:
                    self._filling.remove(max_size)
                batch: list[Item] = []
                now = time.monotonic()
                while self._items and len(batch) < max_size:
                    item = self._items.popleft()
                    self._admitted -= 1
                    (expired if item.deadline <= now else batch).append(item)
                self._note_length()
            for item in expired:
                item.expire(now)
                self.metrics.timeouts.inc()
            if batch:
                return batch

    def _note_length(self) -> None:
        """Multiprocess metrics cannot ask the queue at scrape time: set the gauge as the length changes."""
        if self.metrics.multiprocess:
            self.metrics.queue_length.set(len(self._items))

    def close(self, error: SchedulingError) -> None:
        """Refuse further images with `error`, fail the waiting ones with it, and wake every worker."""
        with self._cond:
            self._closed = error
            left = list(self._items)
            self._items.clear()
            self._admitted -= len(left)
            self._note_length()
            self._cond.notify_all()
        for item in left:
            item.future.set_exception(error)
