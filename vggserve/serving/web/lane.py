"""The app's middlewares fused into one for a plain request to a hot route (POST /classify, v2 infer): what the
request id, metrics, the last-resort 500, drain, API key, body size and body pace middlewares and the front end's
header do to such a request, done in one coroutine with one wrapper of `receive` and one of `send`, instead of ten
nested coroutines each wrapping `send` (their cost was about a tenth of a front end's CPU per request).

    lane = Lane.for_middlewares(app.user_middleware, route)   # None unless they are the known set
    plain = lane.takes(scope) if lane is not None else None    # (Content-Length, X-Request-ID sent) or None
    if plain is not None:
        await lane.answer(scope, receive, send, *plain)
    else:
        await stack(scope, receive, send)                      # the middlewares as they are

A request is plain when none of the middlewares would answer it or change its answer beyond what the lane does: a
Content-Length of plain digits within --max-body-bytes, no Transfer-Encoding, not draining, the API key (when the
server has one) given. Anything else goes through the middlewares themselves, which keep the exact behaviour, and
so does every request while the server has CORS origins (CORS adds `Vary: Origin` to every answer). The lane
answers byte for byte as the middlewares do (tests/test_http_hotpath.py compares the two). Under uvicorn's
httptools protocol it writes an answer's head and body with one write (`connection.send_whole`).
"""

import asyncio
import logging
import time

from ..metrics import TIMED_ENDPOINTS, RequestMetricsMiddleware, endpoint_label
from ..protocols.errors import UnexpectedErrorMiddleware, _unexpected_error_response
from .auth import ApiKeyMiddleware
from .connection import joinable, send_whole
from .drain import DrainMiddleware
from .frontend_header import FrontendHeaderMiddleware
from .head import HeadAsGetMiddleware
from . import limits
from .limits import BODY_READY, BodySizeLimitMiddleware, BodyTimeout, BodyTimeoutMiddleware, BodyTooLarge, _refusal
from .request_id import RequestIdMiddleware, current, log as request_log, new_id, usable_id

_ORDER = (FrontendHeaderMiddleware, RequestMetricsMiddleware, RequestIdMiddleware, UnexpectedErrorMiddleware,
          DrainMiddleware, ApiKeyMiddleware, BodySizeLimitMiddleware, BodyTimeoutMiddleware, HeadAsGetMiddleware)
_OPTIONAL = frozenset({FrontendHeaderMiddleware, ApiKeyMiddleware})
_REQUEST_ID = b"x-request-id"
_CONNECTION = b"connection"
_CLOSE = (b"connection", b"close")


class Lane:
    """The middlewares of `_ORDER` as one around `route` (the hot routes' innermost ASGI app), for the requests
    `takes` accepts."""

    def __init__(self, route, metrics: RequestMetricsMiddleware, drain, max_bytes: int, timeout_s: float,
                 authorised=None, named: tuple | None = None):
        self.route = route
        self.counts = metrics  # its labelled children, looked up once
        self.metrics = metrics.metrics
        self.drain = drain
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.authorised = authorised  # ApiKeyMiddleware._authorised, or None without a key
        self.named = named  # X-Vggserve-Frontend's (name, value), or None

    @classmethod
    def for_middlewares(cls, middlewares, route) -> "Lane | None":
        """The lane for an app's `user_middleware` (outermost first), or None when they are not exactly those the
        lane knows, in their order (CORS, or one the lane has never heard of)."""
        given = [(m.cls, m.args, m.kwargs) for m in middlewares]
        expected = [c for c in _ORDER if c not in _OPTIONAL or any(g[0] is c for g in given)]
        if [g[0] for g in given] != expected:
            return None
        made = {c: c(None, *args, **kwargs) for c, args, kwargs in given}
        key = made.get(ApiKeyMiddleware)
        named = made.get(FrontendHeaderMiddleware)
        return cls(route, made[RequestMetricsMiddleware], made[DrainMiddleware].drain,
                   made[BodySizeLimitMiddleware].max_bytes, made[BodyTimeoutMiddleware].timeout_s,
                   key._authorised if key is not None else None, named.header if named is not None else None)

    def takes(self, scope) -> tuple[int, bytes] | None:
        """(Content-Length, the X-Request-ID sent or b"") when no middleware would answer this request itself or
        change its answer beyond what the lane does, else None."""
        if self.drain.draining or (self.authorised is not None and not self.authorised(scope)):
            return None
        declared = None
        given = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                if declared is None:
                    declared = value.strip()
            elif name == _REQUEST_ID:
                if not given:
                    given = value
            elif name == b"transfer-encoding":
                return None
        if declared is None or not declared.isdigit():
            return None
        length = int(declared)
        return (length, given) if length <= self.max_bytes else None

    async def answer(self, scope, receive, send, length: int, given: bytes) -> None:
        """The request's answer (`length`, `given`: what `takes` returned for it)."""
        rid = (usable_id(given.decode("latin-1")) if given else None) or new_id()
        scope.setdefault("state", {})["request_id"] = rid
        token = current.set(rid)
        named = (_REQUEST_ID, rid.encode()), *((self.named,) if self.named is not None else ())
        start = time.perf_counter()
        status = 500
        started = False
        complete = length == 0  # no body to wait for
        received = 0
        ready = scope.get(BODY_READY)
        max_bytes, timeout_s = self.max_bytes, self.timeout_s

        async def lane_receive():  # the body's pace (BodyTimeoutMiddleware), then its size (BodySizeLimitMiddleware)
            nonlocal complete, received
            if complete:
                message = await receive()
            else:
                if ready is not None and ready():
                    message = await receive()
                else:
                    try:
                        message = await limits._within(receive(), timeout_s)
                    except asyncio.TimeoutError:
                        raise BodyTimeout(timeout_s) from None
                complete = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(max_bytes)
            return message

        cycle = joinable(send)
        held = None  # the answer's start, held to be written with its body (one write to the socket)

        async def outer_send(message):  # what every middleware outside the body's pace does to the answer
            nonlocal status, started, held
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [*(h for h in message.get("headers", ()) if h[0].lower() != _REQUEST_ID),
                                      *named]
                if cycle is not None:
                    held = message
                    return
            elif held is not None:
                start, held = held, None
                if not message.get("more_body", False):
                    return await send_whole(cycle, start, message)
                await send(start)
            await send(message)

        async def lane_send(message):  # BodyTimeoutMiddleware's: an answer before the whole body closes
            if message["type"] == "http.response.start" and not complete:
                message["headers"] = [*(h for h in message.get("headers", ()) if h[0].lower() != _CONNECTION),
                                      _CLOSE]
            await outer_send(message)

        drain = self.drain
        try:
            try:
                drain.in_flight += 1
                try:
                    await self.route(scope, lane_receive, lane_send)
                except (BodyTimeout, BodyTooLarge) as exc:  # the limits' own answers, for code outside the handlers
                    if started:
                        raise
                    await _refusal(exc, scope)(scope, receive, outer_send)
                finally:
                    drain.in_flight -= 1
            except Exception:  # noqa: BLE001 - UnexpectedErrorMiddleware's 500
                if started:
                    if held is not None:  # what was sent goes out before the server ends the connection
                        start, held = held, None
                        await send(start)
                    raise
                await _unexpected_error_response(scope.get("method", ""), scope.get("path", ""))(
                    scope, receive, outer_send)
            finally:
                if request_log.isEnabledFor(logging.DEBUG):
                    request_log.debug("%s %s -> %s in %.1f ms", scope.get("method"), scope.get("path"), status,
                                      (time.perf_counter() - start) * 1000)
                current.reset(token)
                endpoint = endpoint_label(scope.get("path", ""))
                self.counts._count(endpoint, status).inc()
                if endpoint in TIMED_ENDPOINTS:
                    seconds = time.perf_counter() - start
                    self.metrics.request_seconds.observe(seconds)
                    self.counts._outcome(status == 200).observe(seconds)
        except Exception:  # Starlette's last resort (ServerErrorMiddleware): the app's 500 handler logs it
            if held is not None:
                start, held = held, None
                await send(start)
            response = _unexpected_error_response(scope.get("method", ""), scope.get("path", ""))
            if not started:
                await response(scope, receive, send)
            raise


