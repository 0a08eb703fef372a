"""The path of one request's images, whatever the protocol: admit (QueueFull when full) -> decode in the pool (or
take the model input the request carries) -> queue -> wait for the device, dropping images whose deadline passes
(DeadlineExceeded) or whose client goes away (ClientGone) before they are computed.

    results = await run_inputs(service, [b"<jpeg>", ModelInput.tensor(x), ApiError(...)], started, deadline,
                               client_gone=wait_for_disconnect, want_logits=False)

Each source is an encoded image file (bytes), a ModelInput ready for the model, or an exception that stands in its
place (a bad file of a batch request); each gets one Result, in order. Nothing here knows HTTP: the protocol
passes `client_gone`, a coroutine function that returns when the client has gone (with, where the server can call
back, `client_gone.when_gone(callback) -> take_back`), and maps the errors."""

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Awaitable, Callable

from ...modelinput import ModelInput
from .batcher import Item, Outcome
from .errors import ClientGone, DeadlineExceeded, SchedulingError


@dataclass(frozen=True)
class Result:
    """One image's outcome with its preprocessing time, or the error that replaced it."""

    outcome: Outcome | None
    preprocess_s: float
    error: BaseException | None = None


async def _watch(client_gone: Callable[[], Awaitable[None]], queue, items: list[Item]) -> None:
    """Withdraw the request's waiting images as soon as its client has gone."""
    await client_gone()
    _gone(queue, items)


def _gone(queue, items: list[Item]) -> None:
    for item in items:
        queue.withdraw(item, ClientGone())


def _overdue(queue, items: list[Item], futures: list) -> None:
    now = time.monotonic()
    for item, future in zip(items, futures):
        if not future.done():  # still queued: withdrawn; on a device already: it will finish
            queue.withdraw(item, DeadlineExceeded(now - item.enqueued))


def _count_down(waiter, left: list, _future) -> None:
    left[0] -= 1
    if not left[0] and not waiter.done():
        waiter.set_result(None)


async def _await_items(service, items: list[Item], deadline: float, client_gone) -> None:
    """Until every image of `items` has its outcome: a timer withdraws those still queued when the deadline passes,
    and, where `client_gone` has `when_gone(callback)`, the connection's callback withdraws them when the client
    goes (else a task waiting on `client_gone` does). A waiter of this task's own, which a cancellation of the task
    does not pass on to the images' futures; no asyncio.wait, its sets and its callbacks (a request of one image,
    the common case, costs the least)."""
    queue = service.backend.queue
    loop = asyncio.get_running_loop()
    futures = [asyncio.wrap_future(item.future) for item in items]  # the future itself when it is the loop's
    waiter = loop.create_future()
    count_down = partial(_count_down, waiter, [len(futures)])
    for future in futures:
        future.add_done_callback(count_down)
    timer = loop.call_later(max(0.0, deadline - time.monotonic()), _overdue, queue, items, futures)
    watcher = take_back = None
    if client_gone is not None:
        when_gone = getattr(client_gone, "when_gone", None)  # the connection calls back: no task to wait on it
        if when_gone is not None:
            take_back = when_gone(partial(_gone, queue, items))
        else:
            watcher = asyncio.ensure_future(_watch(client_gone, queue, items))
    try:
        await waiter
    finally:
        timer.cancel()
        if take_back is not None:
            take_back()
        if watcher is not None:
            watcher.cancel()
        for future in futures:
            future.remove_done_callback(count_down)
            if future.done() and not future.cancelled():  # results are read from the items; mark them seen
                future.exception()


async def _prepared(service, source) -> tuple[ModelInput, float]:
    if isinstance(source, ModelInput):
        return source, 0.0
    return await service.backend.prepare(source)


async def _prepare_all(service, sources: list) -> list:
    """Each source's (ModelInput, seconds), or the exception that replaced it, in order. One source (a request of
    one image, the common case) is prepared in the request's own task: no task to gather."""
    if len(sources) == 1:
        try:
            return [await _prepared(service, sources[0])]
        except Exception as exc:  # noqa: BLE001 - as gather's return_exceptions: the caller sorts them out
            return [exc]
    return await asyncio.gather(*(_prepared(service, s) for s in sources), return_exceptions=True)


async def run_inputs(service, sources: list, started: float, deadline: float,
                     client_gone: Callable[[], Awaitable[None]] | None = None,
                     want_logits: bool = False, all_or_nothing: bool = False) -> list[Result]:
    """Classify every source (see the module's docstring); one Result each, in order. With `all_or_nothing`, one
    source that fails to decode keeps the others off the devices (their Results then have neither an outcome nor
    an error): for protocols that answer a batch as a whole."""
    queue = service.backend.queue
    results: list[Result | None] = [Result(None, 0.0, s) if isinstance(s, BaseException) else None for s in sources]
    positions = [i for i, r in enumerate(results) if r is None]
    queue.admit(len(positions))  # QueueFull for the whole request when the queue cannot take all its images
    reserved = len(positions)  # admitted room not yet handed to the queue; given back whatever happens
    waiting: list[tuple[int, Item, float]] = []
    try:
        prepared = await _prepare_all(service, [sources[i] for i in positions])
        if all_or_nothing and any(isinstance(p, BaseException) for p in prepared):
            for i, p in zip(positions, prepared):
                results[i] = Result(None, 0.0, p) if isinstance(p, BaseException) else Result(None, p[1])
            return results
        now = time.monotonic()
        for i, outcome in zip(positions, prepared):
            if isinstance(outcome, BaseException):
                results[i] = Result(None, 0.0, outcome)
                continue
            image, seconds = outcome
            if seconds:
                service.metrics.preprocess_seconds.observe(seconds)
            if now >= deadline:  # dropped before it reaches the queue
                service.metrics.timeouts.inc()
                results[i] = Result(None, seconds, DeadlineExceeded(now - started))
                continue
            reserved -= 1  # submit takes over the slot, or gives it back itself when the queue is closed
            try:
                waiting.append((i, queue.submit(image, deadline, want_logits), seconds))
            except SchedulingError as exc:
                results[i] = Result(None, seconds, exc)
    finally:
        queue.release(reserved)
    if waiting:
        await _await_items(service, [item for _, item, _ in waiting], deadline, client_gone)
    for i, item, seconds in waiting:
        exc = item.future.exception()
        results[i] = Result(None, seconds, exc) if exc else Result(item.future.result(), seconds)
    return results


def deadline_for(service, started: float, timeout_ms: int | None) -> float:
    """Monotonic deadline: the request's own timeout if given (bounded by the protocol), else the server's."""
    ms = service.settings.request_timeout_ms if timeout_ms is None else timeout_ms
    return started + ms / 1000.0
