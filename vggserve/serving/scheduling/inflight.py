"""A device worker's batches, two in flight, for a model with the engine's `submit` (`VGG16.submit`).

The feeder (the worker's own thread) takes a batch from the queue, starts it with `model.submit` and hands it to
a completer thread, which waits for the results in submission order and answers the batch's requests. A
semaphore of DEPTH slots, taken by the feeder before it takes a batch and given back by the completer once the
batch's results are in (or it failed), keeps at most DEPTH batches in flight: while the device computes one batch,
the next is already taken, its compressed JPEGs decoded on the device (`worker.decoded`, --decode gpu), stacked
and uploaded, and the previous one's answers go out.

The feeder takes its batch as a busy taker (`BatchQueue.take_batch`'s `busy`) while a batch of its own is still on
the device: a full batch then, a partial one only once the device is idle, so that an early take never splits the
queue into small batches; the completer nudges the queue when the device has no batch left.

With --decode gpu a batch's JPEGs are decoded together with those of up to --decode-group - 1 more full batches
already waiting (`DeviceWorker.claim_group`, one device decode: `devicedecode`): the feeder keeps the group's
other batches, decoded and claimed, and starts them one by one, each as a batch of its own with its own slot,
before it takes the next batch. A claimed batch's images stay withdrawable until it starts
(`BatchQueue.start_claimed`), and its queue time and size are recorded then. After a batch or group that went to
the device decoder (any --decode-group) the feeder takes the next batch as soon as the last one is submitted, before
a slot is free (two batches in flight; as a busy taker, so a full batch), and takes the slot once the new batch or
group is decoded: the decode's launches and its wait for the device then overlap the network's last two batches
instead of one, which left the device idle whenever the host took longer than one batch of the network (FP16 on an
H200: 4.3 ms a batch of 64, against 1.8 ms of launches and 0.9 ms of waiting per decode). Without device decoding
the order is as it was: a slot, then the next batch.

A failure (from `submit` or from `result()`) marks the worker failed and stops the feeder; its batch, every batch
still in flight and one the feeder took meanwhile go back to the queue for the other device workers, or, when none
is left, are failed with InferenceFailed (`DeviceWorker.requeue_or_fail`), and so do the claimed batches of its
decode group. `run` then raises the failure. When the queue closes, `run` returns once the batches in flight (and
the group's claimed ones) are answered, so the model is closed only after them.
"""

import queue
import threading
import time
from collections import deque

import numpy as np
from ..threadnames import name_this_thread

DEPTH = 2  # batches in flight at once per lane; VGG16 has two staging slots per lane (engine.py)


class InflightRunner:
    def __init__(self, worker, model):
        self.worker = worker
        self.model = model
        # submit takes at most the model's max_batch_size images (the serial path's calls would split a batch)
        self.max_size = min(worker.max_batch_size, int(worker.info.get("max_batch_size", worker.max_batch_size)))
        # with lanes (engine.py: forward passes at once on queues of their own), DEPTH batches in flight per lane, and
        # the device counts as busy only once every lane has a batch
        self.lanes = max(1, int(getattr(model, "lane_count", 1)))
        self._slots = threading.Semaphore(DEPTH * self.lanes)
        self._handoff: queue.SimpleQueue = queue.SimpleQueue()  # (batch, pending, want, taken, submitted); None: end
        self._lock = threading.Lock()
        self.failure: BaseException | None = None  # the first failure; nothing is computed after it
        self._on_device = 0  # batches submitted whose results are not in yet
        # per lane, when its previous batch's results were in: a lane (one in-order queue) starts a batch no earlier,
        # so a batch's device time runs from then or from its submit, whichever is later, not from its submit alone.
        # The engine gives batches to its lanes in turn, so batch k shares a lane with batch k - lanes.
        self._last_done = [float("-inf")] * self.lanes
        self._completed = 0  # batches the completer has taken, in submission order
        self._completer = threading.Thread(target=self._complete, name=f"vggserve-inflight-{worker.label}",
                                           daemon=True)

    def run(self) -> None:
        """Feed batches until the queue closes or one fails; return once every batch taken is answered and the
        completer has ended; raise the failure, if any."""
        self._completer.start()
        try:
            self._feed()
        finally:
            self._handoff.put(None)
            self._completer.join()
        if self.failure is not None:
            raise self.failure

    def _feed(self) -> None:
        worker = self.worker
        group: deque = deque()  # the claimed batches of the decode group not started yet: [batch, its inputs]
        early = False  # the last batch went to the device decoder: the next is taken before a slot is free
        try:
            while True:
                batch: list = []  # the batch this round computes, once it is this worker's alone
                try:
                    if group:
                        if not self._slot():
                            return  # failed: `finally` hands the group back
                        batch, inputs = worker.start_claimed(*group.popleft())
                        taken = worker.note_taken(batch) if batch else 0.0
                    else:
                        late_slot = early
                        if not late_slot and not self._slot():
                            return
                        taken_batch = worker.queue.take_batch(self.max_size, worker.max_wait_s, busy=self._busy,
                                                              quit=self._failed)
                        if taken_batch is None:  # closed (the completer finishes what is in flight), or failed
                            return
                        batch = taken_batch
                        taken = worker.note_taken(batch)
                        ahead = worker.to_device_decoder(batch)
                        claimed = worker.claim_group(batch, self.max_size, self._busy) if ahead else []
                        group.extend([more, None] for more in claimed)  # given back, undecoded, if the decode fails
                        decoded = worker.decoded_group(self.model, batch, claimed)  # on the device, encoded uploads
                        (batch, inputs), rest = decoded[0], decoded[1:]
                        for entry, (more, more_inputs) in zip(group, rest):
                            entry[:] = more, more_inputs
                        early = ahead
                        if late_slot and not self._slot():  # failed while this group was decoded
                            worker.requeue_or_fail(batch + self._given_up(group), self.failure)
                            return
                    if not batch:  # every image of it answered with its decoding error (or withdrawn, expired)
                        self._slots.release()
                        continue
                    if self.failure is None:
                        submitted, want = time.perf_counter(), worker.wants(batch)
                        pending = self.model.submit(worker.prepare(batch, inputs), want)
                        with self._lock:
                            self._on_device += 1
                        self._handoff.put((batch, pending, want, taken, submitted))
                        continue
                except BaseException as exc:  # noqa: BLE001 - the batch must be answered, whatever went wrong
                    self._fail(exc)
                worker.requeue_or_fail(batch + self._given_up(group), self.failure)  # never computed
                return
        finally:
            if group:  # failed meanwhile (or an error the loop did not catch)
                worker.requeue_or_fail(self._given_up(group), self.failure or RuntimeError("the feeder stopped"))

    def _slot(self) -> bool:
        """Wait for one of the DEPTH slots (given back by the completer); False once the worker has failed."""
        self._slots.acquire()
        return self.failure is None

    def _given_up(self, group: deque) -> list:
        """The still-claimed images of the group's batches not started, in order, this worker's now (emptied)."""
        items = [item for batch, _ in group for item in self.worker.queue.unclaim(batch)]
        group.clear()
        return items

    def _complete(self) -> None:
        name_this_thread()
        worker = self.worker
        while (entry := self._handoff.get()) is not None:
            batch, pending, want, taken, submitted = entry
            probs, seconds = None, 0.0
            lane, self._completed = self._completed % self.lanes, self._completed + 1
            try:
                if self.failure is None:
                    probs = np.asarray(pending.result(), dtype=np.float32)
                    done = time.perf_counter()
                    seconds, self._last_done[lane] = done - max(submitted, self._last_done[lane]), done
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
            finally:
                self._left_device()
                self._slots.release()
            try:
                if self.failure is None:
                    worker.resolve(batch, probs, want, taken, seconds)
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
            if self.failure is not None:
                worker.requeue_or_fail(batch, self.failure)  # those not answered yet

    def _busy(self) -> bool:
        """Every lane has a batch of this worker's on the device (read under the queue's lock: no lock of its own)."""
        return self._on_device >= self.lanes

    def _failed(self) -> bool:
        return self.failure is not None

    def _left_device(self) -> None:
        """A batch's results are in (or it failed): the device may be idle now, which the queue's takers weigh."""
        with self._lock:
            self._on_device -= 1
        self.worker.queue.nudge()

    def _fail(self, exc: BaseException) -> None:
        """Record the first failure; the worker is marked failed (and has left the queue) before any other thread
        sees `failure`, so before any request hears of it and before any of its batches goes back to the queue."""
        with self._lock:
            if self.failure is not None:
                return
            self.worker.mark_failed(exc)
            self.failure = exc
        self.worker.queue.nudge()  # a feeder waiting for a batch stops
