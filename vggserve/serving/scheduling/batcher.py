"""The bounded queue between the HTTP handlers and the device workers, and the batches workers take from it.

Admission is counted in images: `admit(n)` reserves room before an image is decoded, so a full queue refuses
(QueueFull) at once and decoding work is bounded too; `submit` turns reserved room into waiting items. A worker's
`take_batch` waits at most `max_wait` after the oldest waiting image arrived for a batch to fill, drops images
whose deadline has passed (DeadlineExceeded, never computed), and hands back up to `max_size` images. Handlers
`withdraw` images whose deadline passed or whose client went away while they still wait, so those are never
computed either.

Batches are formed as Triton's dynamic batcher forms them, only for a device that can run them: the workers waiting
in `take_batch` queue up, and one at a time (the first whose device is idle, else the first) fills its batch while
the others wait behind it. A worker whose device is still busy with an earlier batch (the in-flight runner taking
its next batch early, `busy()` true) takes only a full batch; once its device is idle (`nudge`), a partial one
after `max_wait`, as a lone worker does. So under load every batch is full, and several devices never split the
queue into small batches between them.

Workers `enlist` when they start and `leave` when they fail or stop: a batch that a worker took but cannot compute
(its device failed) goes back to the front of the queue (`hand_back`) while another worker is enlisted.

A worker that decodes its batches' JPEGs on its device (--decode gpu) decodes several batches at once (its decode
group, --decode-group): right after `take_batch` it `take_more`s up to group - 1 more full batches, only from images
already waiting (never waiting for more, but for `hold_s` while its device is busy: none by default), leaving a full
batch for each other worker waiting in take_batch. Those batches are claimed, not taken: out of the queue (its
length and room), their images still waiting as far as their requests go, so until the worker starts a batch
(`start_claimed`) a client that goes away or a deadline that passes withdraws its image as from the queue, and
`start_claimed` drops the images whose deadline passed meanwhile (504, never computed). `unclaim` hands claimed
images to the worker for good (to answer a decoding error, or to hand back a batch it will not compute).
"""

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Protocol

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
    # not a field: who answers this item with its batch-mates of the same group at once (`answer`), None for an
    # item answered on its own; an engine link's items name their front end (processes.engine_host)
    group = None

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


class Group(Protocol):
    """Answers several items of a batch at once (`Item.group`)."""

    def answer_rows(self, items: list[Item], probabilities: np.ndarray, logits: np.ndarray | None,
                    queue_s: list[float], inference_s: float, batch_size: int, device: str) -> None:
        """What each Outcome would say: row i of `probabilities` (and of `logits`, the model's, when the batch
        computed them; only the items that asked get them) and queue_s[i] are items[i]'s."""


def answer(batch: list[Item], probabilities: np.ndarray, logits: np.ndarray | None, started: float, seconds: float,
           device: str) -> None:
    """Answer a computed batch: row i of `probabilities` (and of `logits` when the batch computed them) is
    batch[i]'s. Each item of a group is answered with its group's other items in one `answer_rows` call, each
    other item with its Outcome."""
    groups: dict = {}
    size = len(batch)
    for i, item in enumerate(batch):
        if item.group is not None:
            groups.setdefault(item.group, []).append(i)
            continue
        logit = logits[i] if item.want_logits and logits is not None else None
        item.future.set_result(Outcome(probabilities[i], started - item.enqueued, seconds, size, device, logit))
    for group, rows in groups.items():
        items = [batch[i] for i in rows]
        if len(rows) < size:
            probs, logs = probabilities[rows], None if logits is None else logits[rows]
        else:  # the whole batch: no copy
            probs, logs = probabilities, logits
        group.answer_rows(items, probs, logs, [started - item.enqueued for item in items], seconds, size, device)


class Admission:
    """Room counted in images, shared by the queues: `admit(n)` reserves all or none (QueueFull when it is
    taken; the close reason once closed), `release(n)` gives room back. `guard`: the subclass's lock.

    `shared` (an HTTP front end's `processes.admission.SharedCount`): the room is the whole server's, counted with
    the other front ends' images in shared memory; this process's count is published there at every change."""

    def __init__(self, capacity: int, metrics: Metrics, guard, shared=None):
        self.capacity = capacity
        self.metrics = metrics
        self._guard = guard
        self._admitted = 0  # images reserved, waiting or (front ends) on their way
        self._closed: SchedulingError | None = None
        self._shared = shared

    @property
    def admitted(self) -> int:
        return self._admitted

    def admit(self, n: int) -> None:
        """Reserve room for n images, all or none; QueueFull if there is not enough."""
        with self._guard:
            if self._closed is not None:
                raise self._closed
            if self._shared is None:
                fits = self._admitted + n <= self.capacity
            else:
                fits = self._shared.admit(self._admitted + n, n)  # publishes the count, or takes it back
            if not fits:
                self.metrics.rejected.labels(reason="queue_full").inc()
                raise self.full()
            self._admitted += n

    def full(self) -> QueueFull:
        """The refusal of an image beyond the room."""
        return QueueFull(self.capacity)

    def release(self, n: int) -> None:
        """Give back reserved room that will not be submitted (the image failed to decode, say)."""
        if n:
            with self._guard:
                self.count_held(-n)

    def count_held(self, n: int) -> None:
        """Add n (negative: give back) to the room taken, with the guard already held (a queue counting in another
        queue's room under that room's lock: processes.routing)."""
        self._admitted += n
        if self._shared is not None:
            self._shared.set(self._admitted)


class BatchQueue(Admission):
    """Thread-safe bounded FIFO of Items shared by all device workers."""

    def __init__(self, capacity: int, metrics: Metrics):
        self._cond = threading.Condition()
        super().__init__(capacity, metrics, self._cond)
        self._items: deque[Item] = deque()
        self._filling: list[int] = []  # the batch sizes that workers waiting for a batch to fill want
        self._takers: list[_Taker] = []  # workers waiting in take_batch, in arrival order
        self._workers = 0  # workers enlisted and neither failed nor stopped
        self._claimed: set[Item] = set()  # images of claimed batches (take_more) not started yet

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

    def submit_many(self, items: list[Item]) -> list[tuple[Item, SchedulingError]]:
        """Queue admitted-on-arrival items (an engine link's submits) under one hold of the lock: each is admitted
        as `admit(1)` would, in order, and queued; the refused ones come back with their error (QueueFull once the
        room is taken, the close reason once closed), unanswered."""
        refused: list[tuple[Item, SchedulingError]] = []
        with self._cond:
            before = len(self._items)
            for item in items:
                if self._closed is not None:
                    refused.append((item, self._closed))
                elif self._admitted >= self.capacity:
                    refused.append((item, self.full()))
                else:
                    self._admitted += 1
                    self._items.append(item)
            if len(self._items) != before:
                self._note_length()
                if before == 0 or len(self._items) >= min(self._filling, default=1):  # as `submit` wakes them
                    self._cond.notify_all()
        full = sum(isinstance(error, QueueFull) for _, error in refused)
        if full:
            self.metrics.rejected.labels(reason="queue_full").inc(full)
        return refused

    def withdraw(self, item: Item, error: SchedulingError) -> bool:
        """Take a still-waiting image (in the queue, or of a batch claimed and not started) out and fail it with
        `error`; False if a worker has it."""
        with self._cond:
            try:
                self._items.remove(item)
            except ValueError:
                if item not in self._claimed:
                    return False
                self._claimed.discard(item)  # its room was given back when it was claimed
            else:
                self._admitted -= 1
                self._note_length()
        item.future.set_exception(error)
        if isinstance(error, DeadlineExceeded):
            self.metrics.timeouts.inc()
        elif isinstance(error, ClientGone):
            self.metrics.abandoned.inc()
        return True

    def enlist(self) -> None:
        """A device worker starts taking batches from this queue."""
        with self._cond:
            self._workers += 1

    def leave(self) -> None:
        """A device worker failed or stopped: it takes no more batches."""
        with self._cond:
            self._workers -= 1

    def hand_back(self, batch: list[Item]) -> bool:
        """Return a batch that a worker took but will not compute (its device failed) to the front of the queue, for
        the other workers; False (the batch untouched) when no other worker is enlisted to compute it. Once the queue
        is closed (and other workers are), the batch is failed with the close reason instead."""
        with self._cond:
            if self._workers <= 0:
                return False
            error = self._closed
            if error is None:
                self._items.extendleft(reversed(batch))
                self._admitted += len(batch)
                self._note_length()
                self._cond.notify_all()
        if error is not None:
            for item in batch:
                item.future.set_exception(error)
        return True

    def nudge(self) -> None:
        """A waiting worker's device became idle (or its worker failed): let the takers look again."""
        with self._cond:
            self._cond.notify_all()

    def take_batch(self, max_size: int, max_wait_s: float, busy: Callable[[], bool] | None = None,
                   quit: Callable[[], bool] | None = None) -> list[Item] | None:
        """Block until a batch is ready and return it; None once the queue is closed and empty, or once `quit()`.
        `busy()`: the taker's device still computes an earlier batch (only a full batch is taken then)."""
        me = _Taker(max_size, busy or _never, quit or _never)
        with self._cond:
            self._takers.append(me)
            self._filling.append(max_size)
        try:
            while True:
                expired: list[Item] = []
                with self._cond:
                    if not self._wait_for_turn(me, max_wait_s):
                        return None
                    batch = self._pop_up_to(max_size, expired)
                    self._note_length()
                now = time.monotonic()
                for item in expired:
                    item.expire(now)
                    self.metrics.timeouts.inc()
                if batch:
                    return batch
        finally:
            with self._cond:
                self._takers.remove(me)
                self._filling.remove(max_size)
                if self._takers:
                    self._cond.notify_all()  # the next taker's turn

    def take_more(self, max_size: int, batches: int, busy: Callable[[], bool] | None = None, hold_s: float = 0.0,
                  weigh: Callable[[list[Item]], int] | None = None, room: int | None = None) -> list[list[Item]]:
        """Up to `batches` more full batches of `max_size` waiting images, oldest first, claimed (see the module's
        docstring), for the decode group of the batch the caller just took. Only images already waiting: with too
        few for a full batch it returns at once, or, with `hold_s` > 0, waits up to that long while `busy()` (its
        device still computes, so the batch just taken could not start anyway) for more to arrive. A full batch
        is left for each other worker waiting in take_batch. `weigh(batch)` (its encoded bytes, say): the batches
        taken weigh `room` at most together. Images whose deadline passed are dropped as take_batch drops them."""
        claimed: list[list[Item]] = []
        expired: list[Item] = []
        end = time.monotonic() + hold_s
        busy = busy or _never
        with self._cond:
            holding = False
            try:
                while len(claimed) < batches and self._closed is None:
                    others = sum(1 for t in self._takers if not t.quit())
                    if len(self._items) >= (others + 1) * max_size:
                        batch = self._pop_full(max_size, expired)
                        if batch is None:  # expired images left too few: look again
                            continue
                        if len(self._items) < others * max_size:  # expired images ate the others' batches
                            self._put_back(batch)
                            continue
                        weight = weigh(batch) if weigh is not None else 0
                        if room is not None and weight > room:
                            self._put_back(batch)
                            break
                        if room is not None:
                            room -= weight
                        self._claimed.update(batch)
                        claimed.append(batch)
                        continue
                    remaining = end - time.monotonic()
                    if remaining <= 0 or not busy():
                        break
                    if not holding:  # submit wakes this thread once a batch is there, not per image
                        holding = True
                        self._filling.append(max_size)
                    self._cond.wait(remaining)
            finally:
                if holding:
                    self._filling.remove(max_size)
                self._note_length()
        now = time.monotonic()
        for item in expired:
            item.expire(now)
            self.metrics.timeouts.inc()
        return claimed

    def _pop_full(self, max_size: int, expired: list[Item]) -> list[Item] | None:
        """(Holding the lock) the next `max_size` waiting images whose deadline has not passed, those that have
        into `expired`; None (the others back in front) when too few are left."""
        batch = self._pop_up_to(max_size, expired)
        if len(batch) < max_size:
            self._put_back(batch)
            return None
        return batch

    def _pop_up_to(self, max_size: int, expired: list[Item]) -> list[Item]:
        """(Holding the lock) up to `max_size` waiting images whose deadline has not passed, oldest first; those
        whose deadline has passed, met on the way, go into `expired`."""
        batch: list[Item] = []
        now = time.monotonic()
        while self._items and len(batch) < max_size:
            item = self._items.popleft()
            self._admitted -= 1
            (expired if item.deadline <= now else batch).append(item)
        return batch

    def _put_back(self, batch: list[Item]) -> None:
        """(Holding the lock) images just popped back to the front of the queue, in order."""
        self._items.extendleft(reversed(batch))
        self._admitted += len(batch)

    def unclaim(self, items: list[Item]) -> list[Item]:
        """The images of `items` still claimed (neither withdrawn nor started), the caller's from now on: it answers
        or computes them, or hands them back."""
        with self._cond:
            kept = [item for item in items if item in self._claimed]
            self._claimed.difference_update(kept)
        return kept

    def start_claimed(self, batch: list[Item]) -> list[Item]:
        """A claimed batch starts on its worker's device: its images still claimed, but those whose deadline has
        passed meanwhile, which are answered DeadlineExceeded (never computed) as take_batch answers them."""
        now = time.monotonic()
        kept, expired = [], []
        for item in self.unclaim(batch):
            (expired if item.deadline <= now else kept).append(item)
        for item in expired:
            item.expire(now)
            self.metrics.timeouts.inc()
        return kept

    def _wait_for_turn(self, me: "_Taker", max_wait_s: float) -> bool:
        """Wait (holding the lock) until `me` may take a batch: True then, False once it should stop."""
        while True:
            if me.quit() or (self._closed is not None and not self._items):
                return False
            if self._items and self._turn() is me:
                if len(self._items) >= me.max_size or self._closed is not None:
                    return True
                if not me.busy():
                    remaining = self._items[0].enqueued + max_wait_s - time.monotonic()
                    if remaining <= 0:
                        return True
                    self._cond.wait(remaining)
                    continue
            self._cond.wait()

    def _turn(self) -> "_Taker":
        """The taker that fills the next batch: the first whose device is idle, else the first."""
        return next((t for t in self._takers if not t.busy() and not t.quit()), self._takers[0])

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


def _never() -> bool:
    return False


@dataclass(eq=False)
class _Taker:
    """A worker waiting in take_batch: the batch size it takes, whether its device is busy, whether it stops."""

    max_size: int
    busy: Callable[[], bool]
    quit: Callable[[], bool]
