"""Graceful drain on SIGTERM (and the first Ctrl+C): readiness turns 503 at once, new requests are refused with
503 `draining`, requests already in flight finish within `drain_timeout_s`, then uvicorn shuts down and the
process exits 0. A second SIGINT during the drain exits at once."""

import asyncio
import logging
import signal
import time

import uvicorn

from ..protocols.errors import error_response
from ..metrics import Metrics

log = logging.getLogger("vggserve.serving")

# still answered while draining, so load balancers and monitoring can watch the drain
ALWAYS_OPEN = frozenset({"/health/live", "/health/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})


class Drain:
    """Draining state and the count of HTTP requests in flight."""

    def __init__(self, timeout_s: float, metrics: Metrics):
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.draining = False
        self.started_at: float | None = None
        self.in_flight = 0

    def begin(self, announce: bool = True) -> None:
        if not self.draining:
            self.draining = True
            self.started_at = time.monotonic()
            if announce:
                log.info("draining: refusing new requests, waiting for %d in flight (at most %.0f s)",
                         self.in_flight, self.timeout_s)

    async def wait_idle(self, poll_s: float = 0.05) -> bool:
        """Wait until no request is in flight or the drain time is over; True if all finished."""
        end = (self.started_at or time.monotonic()) + self.timeout_s
        while self.in_flight > 0 and time.monotonic() < end:
            await asyncio.sleep(poll_s)
        if self.in_flight:
            log.warning("drain time over with %d requests still in flight", self.in_flight)
        return self.in_flight == 0


class DrainMiddleware:
    """Pure ASGI middleware: counts requests in flight; while draining, refuses new ones with 503."""

    def __init__(self, app, drain: Drain):
        self.app = app
        self.drain = drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.drain.draining and scope.get("path") not in ALWAYS_OPEN:
            self.drain.metrics.rejected.labels(reason="draining").inc()
            return await error_response(503, "draining", "the server is shutting down and takes no new requests; "
                                        "retry on another instance", {"Connection": "close", "Retry-After": "1"},
                                        scope.get("path", ""))(
                scope, receive, send)
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains before exiting (exit status 0)."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        self.failure: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def fail(self, reason: str) -> None:
        """Stop serving because the service cannot work any more (called from any thread)."""
        self.failure = reason
        self.should_exit = True

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        # not recorded in _captured_signals on purpose: uvicorn would re-raise it after shutdown (exit -15)
        if self.drain.draining or self._loop is None:
            if sig == signal.SIGINT or self._loop is None:
                self.should_exit = True
                self.force_exit = self.drain.draining
            return
        self.drain.begin()
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._finish_drain()))

    async def _finish_drain(self) -> None:
        await self.drain.wait_idle()
        self.should_exit = True
