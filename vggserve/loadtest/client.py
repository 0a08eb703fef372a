"""Posting one image to /classify with httpx and filling in its RequestRecord."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import ssl
import struct
import time

import certifi
import httpx

from .images import Image
from .records import CANCELLED, CONN_ERROR, HTTP_ERROR, OK, TIMEOUT, RequestRecord


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One certificate store for every client (httpx would load it anew per client: ~25 ms each)."""
    return ssl.create_default_context(cafile=certifi.where())


def make_client(connections: int, timeout_s: float, headers: dict | None = None) -> httpx.AsyncClient:
    """An async client with exactly `connections` sockets (no hidden queue in the pool beyond that)."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s), headers=headers, trust_env=False,
                             verify=_tls_context())


# httpx's pool looks at every connection it holds for each request, so one pool of hundreds of connections
# spends its time scanning (measured on loopback: 8 connections ~950 req/s, 32 ~400, 128 ~130). Pools of at
# most this many connections, one per group of slots, keep the cost per request flat.
CONNECTIONS_PER_POOL = 8


class ClientPool:
    """`slots` connections split over httpx clients of CONNECTIONS_PER_POOL each.

    Slot s always uses client s % len(clients), and each client has exactly as many connections as slots map
    to it, so a request holding a slot never waits inside httpx for a connection.
    """

    def __init__(self, slots: int, timeout_s: float, headers: dict | None = None):
        count = max(1, math.ceil(slots / CONNECTIONS_PER_POOL))
        self.sizes = [len(range(i, slots, count)) for i in range(count)]  # connections of each client
        self.clients = [make_client(size, timeout_s, headers) for size in self.sizes]

    def for_slot(self, slot: int) -> httpx.AsyncClient:
        """The client that slot `slot` sends with."""
        return self.clients[slot % len(self.clients)]

    async def __aenter__(self) -> "ClientPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients), return_exceptions=True)


V2_OUTPUTS = [{"name": "probabilities", "parameters": {"classification": 5}}]


def v2_request(data: bytes) -> tuple[bytes, dict]:
    """(body, headers) of a v2 inference request for one image file: the BYTES input `image` as binary tensor data,
    the top 5 classes asked for (the classification extension), as tritonclient would send it."""
    head = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 4 + len(data)}}],
                       "outputs": V2_OUTPUTS}).encode()
    return head + struct.pack("<I", len(data)) + data, {"Inference-Header-Content-Length": str(len(head)),
                                                         "Content-Type": "application/octet-stream"}


def request_kwargs(image: Image, multipart: bool, protocol: str = "classify") -> dict:
    """The body of a /classify POST: raw bytes with the image's Content-Type, or the multipart field `file`; with
    protocol v2, a v2 inference request."""
    if protocol == "v2":
        body, headers = v2_request(image.data)
        return {"content": body, "headers": headers}
    if multipart:
        return {"files": {"file": (image.name, image.data, image.content_type)}}
    return {"content": image.data, "headers": {"Content-Type": image.content_type}}


async def send_one(client: httpx.AsyncClient, url: str, image: Image, record: RequestRecord, clock0: float,
                   multipart: bool = False, protocol: str = "classify") -> RequestRecord:
    """Send `image`, stamp `record` (sent, done, status, outcome) and return it; never raises for I/O errors.

    `clock0` is the run's time origin on time.perf_counter(). A cancelled request is stamped
    `cancelled` before the cancellation goes on.
    """
    record.sent_s = time.perf_counter() - clock0
    try:
        response = await client.post(url, **request_kwargs(image, multipart, protocol))
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
