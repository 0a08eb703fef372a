"""The path of one request's images: admit (429 when full) -> decode and preprocess in the pool -> queue -> wait for
the device, dropping images whose deadline passes (504) or whose client goes away, before they are computed."""

import asyncio
import time
from dataclasses import dataclass

from fastapi import Request

from ...errors import ImageError
from .batcher import ClientGone, DeadlineExceeded, Item, Outcome
from ..protocols.errors import ApiError, image_error_parts
from .imaging import decode_and_crop, decode_for_engine, normalize, prepare_image
from ..service import Service
from ..protocols.uploads import Upload


@dataclass(frozen=True)
class Result:
    """One image's outcome with its preprocessing time, or the error that replaced it."""

    outcome: Outcome | None
    preprocess_s: float
    error: ApiError | None = None


def as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ImageError):
        return ApiError(*image_error_parts(exc))
    raise exc


def deadline_for(service: Service, started: float, header_ms: int | None) -> float:
    """Monotonic deadline: the request's X-Request-Timeout-Ms if given (the route bounds it to MAX_TIMEOUT_MS),
    else the server's default."""
    ms = service.settings.request_timeout_ms if header_ms is None else header_ms
    return started + ms / 1000.0


async def _prepare(service: Service, upload: Upload) -> tuple:
    """(float32 model input, seconds): decoded in a thread, or decoded in a worker process and normalised here;
    in an HTTP front-end process, (uint8 centre crop or preprocess.RawImage, seconds): the engine process
    normalises it (and resizes a RawImage on its device)."""
    loop = asyncio.get_running_loop()
    mode = service.preprocessing
    if service.sends_pixels:  # the engine resizes on its device when it can (RawImages), else it gets crops
        task = decode_for_engine if service.model_info().get("resizes_on_device") else decode_and_crop
        return await loop.run_in_executor(service.pool, task, upload.data, mode, service.settings.max_pixels)
    if service.procs is None:
        return await loop.run_in_executor(service.pool, prepare_image, upload.data, mode, service.settings.max_pixels)
    return await service.procs.run(upload.data, mode, service.settings.max_pixels, then=normalize)


async def _watch_disconnect(request: Request, service: Service, items: list[Item]) -> None:
    """Withdraw the request's waiting images as soon as its client disconnects."""
    while True:
        try:
            message = await request.receive()
        except Exception:  # noqa: BLE001 - the server has nothing more to say about this connection
            return
        if message["type"] == "http.disconnect":
            for item in items:
                service.queue.withdraw(item, ClientGone())
            return


async def _await_items(request: Request, service: Service, items: list[Item], deadline: float) -> None:
    futures = [asyncio.wrap_future(item.future) for item in items]
    watcher = asyncio.ensure_future(_watch_disconnect(request, service, items))
    try:
        _, pending = await asyncio.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        if pending:
            now = time.monotonic()
            for item, fut in zip(items, futures):
                if fut in pending:
                    service.queue.withdraw(item, DeadlineExceeded(now - item.enqueued))
            await asyncio.wait(futures)  # the rest are on a device already and will finish
    finally:
        watcher.cancel()
        for fut in futures:  # results are read from the items; mark the wrappers' exceptions as seen
            if fut.done() and not fut.cancelled():
                fut.exception()


async def run_images(request: Request, service: Service, uploads: list, started: float,
                     deadline: float) -> list[Result]:
    """Classify every Upload in `uploads` (ApiErrors in it are passed through in place); one Result each, in order."""
    results: list[Result | None] = [Result(None, 0.0, u) if isinstance(u, ApiError) else None for u in uploads]
    positions = [i for i, r in enumerate(results) if r is None]
    service.queue.admit(len(positions))  # 429 for the whole request when the queue cannot take all its images
    reserved = len(positions)  # admitted room not yet handed to the queue; given back whatever happens
    try:
        prepared = await asyncio.gather(*(_prepare(service, uploads[i]) for i in positions), return_exceptions=True)
        waiting: list[tuple[int, Item, float]] = []
        now = time.monotonic()
        for i, outcome in zip(positions, prepared):
            if isinstance(outcome, BaseException):
                results[i] = Result(None, 0.0, as_api_error(outcome))
                continue
            tensor, seconds = outcome
            service.metrics.preprocess_seconds.observe(seconds)
            if now >= deadline:  # dropped before it reaches the queue
                service.metrics.timeouts.inc()
                results[i] = Result(None, seconds, DeadlineExceeded(now - started))
                continue
            reserved -= 1  # submit takes over the slot, or gives it back itself when the queue is closed
            try:
                waiting.append((i, service.queue.submit(tensor, deadline), seconds))
            except ApiError as exc:
                results[i] = Result(None, seconds, exc)
    finally:
        service.queue.release(reserved)
    if waiting:
        await _await_items(request, service, [item for _, item, _ in waiting], deadline)
    for i, item, seconds in waiting:
        exc = item.future.exception()
        results[i] = Result(None, seconds, as_api_error(exc)) if exc else Result(item.future.result(), seconds)
    return results
