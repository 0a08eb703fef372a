"""The two ways of offering load, one level at a time.

Closed loop: `concurrency` clients, each sending its next request as soon as the last one returns, so the
offered load adapts to the server.

Open loop: request i is due at start + i/rate whatever happened before; latency is counted from that due
time, so a server (or a client) that falls behind shows the wait in its latency instead of hiding it by
sending less (no coordinated omission). At most `max_inflight` requests are out at once; a due request that
finds them all busy waits for a free one (overflow "wait", the default, like wrk2) or is not sent at all and
counted `dropped` (overflow "drop", like k6's dropped iterations). A request that goes out more than the lag
threshold after its due time is flagged `late`.

Both loops are bounded by time (warm-up + duration) and by a request cap, stop early when `stop` is set
(Ctrl-C), and wait at most `drain_s` for answers still in flight before cancelling them.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from dataclasses import dataclass, field

from .client import ClientPool, send_one
from .images import Image, ImageSet
from .records import CANCELLED, DROPPED, MEASURE, WARMUP, RequestRecord

STOP_POLL_S = 0.05  # how often a sleeping loop looks at the stop flag


@dataclass
class LevelPlan:
    """What one level asks for; `level` is a concurrency (closed) or a rate in requests/s (open)."""

    mode: str
    level: float
    label: str
    url: str
    warmup_s: float
    duration_s: float
    max_requests: int
    max_inflight: int = 512
    overflow: str = "wait"  # open loop at the in-flight cap: "wait" for a slot (sent late) or "drop" it
    lag_threshold_s: float = 0.010
    drain_s: float = 30.0
    multipart: bool = False
    protocol: str = "classify"


@dataclass
class LevelRun:
    """A level's requests and its measurement window, in run-relative seconds, filled in while it runs."""

    plan: LevelPlan
    clock0: float
    records: list[RequestRecord] = field(default_factory=list)
    start_s: float = 0.0
    window_start_s: float = 0.0
    window_end_s: float = 0.0
    end_s: float = 0.0
    interrupted: bool = False
    inflight: int = 0  # sent, not answered yet
    waiting: int = 0  # open loop, overflow "wait": due, waiting for an in-flight slot

    def now(self) -> float:
        """Seconds since the run's origin."""
        return time.perf_counter() - self.clock0

    def measured(self) -> list[RequestRecord]:
        """The records that count: warm-up excluded."""
        return [r for r in self.records if r.phase == MEASURE]

    @property
    def window_s(self) -> float:
        return max(self.window_end_s - self.window_start_s, 0.0)


async def _sleep_until(run: LevelRun, target_s: float, stop: asyncio.Event) -> bool:
    """Sleep until run-relative time `target_s`; False if `stop` was set first.

    Already past it, it still yields once, so that a schedule running behind lets its requests start.
    """
    await asyncio.sleep(0)
    while not stop.is_set():
        delay = target_s - run.now()
        if delay <= 0:
            return True
        await asyncio.sleep(min(delay, STOP_POLL_S))
    return False


async def _settle(run: LevelRun, tasks: set[asyncio.Task], deadline_s: float, stop: asyncio.Event) -> None:
    """Wait for `tasks` until all finish, `stop` is set or `deadline_s` passes; cancel what is left."""
    pending = {t for t in tasks if not t.done()}
    if pending and not stop.is_set():
        all_done = asyncio.ensure_future(asyncio.wait(pending))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({all_done, stopped}, timeout=max(deadline_s - run.now(), 0.0),
                           return_when=asyncio.FIRST_COMPLETED)
        for helper in (all_done, stopped):
            helper.cancel()  # only the watchers; the requests are dealt with below
    leftover = [t for t in pending if not t.done()]
    for task in leftover:
        task.cancel()
    if leftover:
        await asyncio.gather(*leftover, return_exceptions=True)
    if stop.is_set():
        run.interrupted = True
    for record in run.records:
        if not record.outcome:  # created but never got to run
            record.outcome = CANCELLED


def _new_record(run: LevelRun, image: Image, index: int, phase: str, due_s: float) -> RequestRecord:
    record = RequestRecord(index=index, phase=phase, scheduled_s=due_s, image=image.name, bytes=len(image.data))
    run.records.append(record)
    return record


async def run_closed(pool: ClientPool, images: ImageSet, run: LevelRun, stop: asyncio.Event) -> LevelRun:
    """`plan.level` clients in a loop (client i on slot i of `pool`); requests sent before warm-up ends are
    not counted."""
    plan, clock0 = run.plan, run.clock0
    run.start_s = run.now()
    warm_end = run.start_s + plan.warmup_s
    end = warm_end + plan.duration_s
    counts = {WARMUP: 0, MEASURE: 0}
    next_index = iter(range(10**12))

    async def client_loop(slot: int) -> None:
        client = pool.for_slot(slot)
        while not stop.is_set():
            now = run.now()
            if now >= end:
                return
            phase = WARMUP if now < warm_end else MEASURE
            if counts[phase] >= plan.max_requests:
                if phase == MEASURE:
                    return
                if not await _sleep_until(run, warm_end, stop):
                    return
                continue
            counts[phase] += 1
            index = next(next_index)
            image = images.pick(index)
            record = _new_record(run, image, index, phase, now)
            run.inflight += 1
            try:
                await send_one(client, plan.url, image, record, clock0, plan.multipart, plan.protocol)
            finally:
                run.inflight -= 1

    tasks = {asyncio.create_task(client_loop(slot)) for slot in range(int(plan.level))}
    await _settle(run, tasks, end + plan.drain_s, stop)
    run.end_s = run.now()
    run.window_start_s = warm_end
    run.window_end_s = min(end, run.end_s)
    if counts[MEASURE] >= plan.max_requests:  # the cap, not the clock, ended it: up to the last answer
        run.window_end_s = min(run.window_end_s, max(r.done_s or 0.0 for r in run.measured()))
    return run


def open_loop_counts(plan: LevelPlan) -> tuple[int, int]:
    """(warm-up, measured) request counts of the open-loop schedule, each within the request cap."""
    rate = plan.level
    warm = math.ceil(plan.warmup_s * rate - 1e-9)
    total = math.ceil((plan.warmup_s + plan.duration_s) * rate - 1e-9)
    return min(warm, plan.max_requests), min(total - warm, plan.max_requests)


class Slots:
    """The open loop's `max_inflight` connection slots, handed to waiting requests first come, first served: a slot
    given back goes straight to the request that has waited longest (an asyncio.Queue let a request that fell due
    later take it before the woken waiter ran, so requests went out of their schedule's order)."""

    def __init__(self, count: int):
        self.free = list(range(count - 1, -1, -1))
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    def take(self) -> int | None:
        """A free slot now, or None (none free, or requests waiting for one)."""
        return self.free.pop() if self.free and not self.waiters else None

    async def acquire(self) -> int:
        slot = self.take()
        if slot is not None:
            return slot
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed over as the waiter was cancelled: pass it on
            raise

    def release(self, slot: int) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self.free.append(slot)


async def run_open(pool: ClientPool, images: ImageSet, run: LevelRun, stop: asyncio.Event) -> LevelRun:
    """Request i due at start + i/rate; the first `warm` of them are warm-up. `pool` has max_inflight slots."""
    plan, clock0 = run.plan, run.clock0
    run.start_s = run.now()
    rate = plan.level
    n_warm, n_measure = open_loop_counts(plan)
    tasks: set[asyncio.Task] = set()
    slots = Slots(plan.max_inflight)

    async def send_when_free(record: RequestRecord, image: Image, slot: int | None) -> None:
        if slot is None:  # overflow "wait": queue for the next free slot, in the order the requests fell due
            run.waiting += 1
            try:
                slot = await slots.acquire()
            finally:
                run.waiting -= 1
        try:
            record.late = run.now() - record.scheduled_s > plan.lag_threshold_s
            run.inflight += 1
            await send_one(pool.for_slot(slot), plan.url, image, record, clock0, plan.multipart,
                           plan.protocol)
        finally:
            run.inflight -= 1
            slots.release(slot)

    for index in range(n_warm + n_measure):
        due = run.start_s + index / rate
        if not await _sleep_until(run, due, stop):
            break
        image = images.pick(index)
        record = _new_record(run, image, index, WARMUP if index < n_warm else MEASURE, due)
        slot = None
        if plan.overflow == "drop":
            slot = slots.take()  # taken now, so the next due request sees it gone
            if slot is None:
                record.outcome = DROPPED
                continue
        tasks.add(asyncio.create_task(send_when_free(record, image, slot)))
    schedule_end = run.start_s + (n_warm + n_measure) / rate
    await _sleep_until(run, schedule_end, stop)  # the last interval is part of the window too
    await _settle(run, tasks, max(run.now(), schedule_end) + plan.drain_s, stop)
    run.end_s = run.now()
    run.window_start_s = run.start_s + n_warm / rate
    run.window_end_s = min(schedule_end, run.end_s)
    return run
