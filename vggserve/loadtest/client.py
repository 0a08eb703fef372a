"""Posting one image to /classify with httpx and filling in its RequestRecord."""

from __future__ import annotations

import asyncio
import time

import httpx

from .images import Image
from .records import CANCELLED, CONN_ERROR, HTTP_ERROR, OK, TIMEOUT, RequestRecord


def make_client(connections: int, timeout_s: float, headers: dict | None = None) -> httpx.AsyncClient:
    """An async client with exactly `connections` sockets (no hidden queue in the pool beyond that)."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s), headers=headers, trust_env=False)


def request_kwargs(image: Image, multipart: bool) -> dict:
    """The body of a /classify POST: raw bytes with the image's Content-Type, or the multipart field `file`."""
    if multipart:
        return {"files": {"file": (image.name, image.data, image.content_type)}}
    return {"content": image.data, "headers": {"Content-Type": image.content_type}}


async def send_one(client: httpx.AsyncClient, url: str, image: Image, record: RequestRecord, clock0: float,
                   multipart: bool = False) -> RequestRecord:
    """Send `image`, stamp `record` (sent, done, status, outcome) and return it; never raises for I/O errors.

    `clock0` is the run's time origin on time.perf_counter(). A cancelled request is stamped
    `cancelled` before the cancellation goes on.
    """
    record.sent_s = time.perf_counter() - clock0
    try:
        response = await client.post(url, **request_kwargs(image, multipart))
        await response.aread()
    except httpx.TimeoutException:
        record.outcome = TIMEOUT
    except (httpx.TransportError, httpx.DecodingError, OSError):
        record.outcome = CONN_ERROR
    except asyncio.CancelledError:
        record.outcome = CANCELLED
        record.done_s = None
        raise
    else:
        record.status = response.status_code
        record.outcome = OK if 200 <= response.status_code < 300 else HTTP_ERROR
    record.done_s = time.perf_counter() - clock0
    return record
