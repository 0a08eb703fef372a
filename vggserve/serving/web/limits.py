"""Limits on request bodies. Their size, enforced twice before the whole body is read: from Content-Length when the
request arrives, and again while the body streams in (chunked uploads, or a Content-Length that lies). Their pace:
while the app waits for more of a body, no more than --read-timeout may pass between two pieces of it (as nginx's
client_body_timeout), else 408 and the connection is closed; a request answered before its body was read in full
closes its connection too, so a client that never sends the rest holds nothing. (The deadline on the headers is
the connection's, web.connection.)"""

import asyncio
import sys

from ..protocols.errors import ApiError, error_response


class BodyTooLarge(ApiError):
    def __init__(self, limit: int, seen: int | None = None):
        size = f"{seen} bytes" if seen is not None else f"more than {limit} bytes"
        super().__init__(413, "payload_too_large",
                         f"request body is {size}; this server accepts at most {limit} bytes "
                         "(send a smaller image, or raise the server's --max-body-bytes)")


if sys.version_info >= (3, 11):
    async def _within(awaitable, seconds: float):
        async with asyncio.timeout(seconds):  # no task per call, unlike wait_for
            return await awaitable
else:
    _within = asyncio.wait_for


class BodyTimeout(ApiError):
    def __init__(self, timeout_s: float):
        super().__init__(408, "request_timeout",
                         f"the request body stopped arriving: nothing came for the server's {timeout_s:g} s "
                         "(--read-timeout) before it was complete; send the whole body, as its Content-Length says",
                         {"Connection": "close"})


def _refusal(exc: ApiError, scope):
    """The answer to a request refused before its body was read in full: the connection is not reused."""
    return error_response(exc.status, exc.code, exc.message, {**exc.headers, "Connection": "close"},
                          scope.get("path", ""))


def _header(scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return value.decode("latin-1")
    return None


def _content_length(scope) -> str | None:
    return _header(scope, b"content-length")


def has_body(scope) -> bool:
    """Whether the request says a body follows its headers (a Content-Length above 0, or chunks)."""
    declared = (_content_length(scope) or "").strip()
    return (declared.isdigit() and int(declared) > 0) or "chunked" in (_header(scope, b"transfer-encoding") or "")


class BodySizeLimitMiddleware:
    """Pure ASGI middleware answering 413 for bodies over `max_bytes`, without buffering them."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None:
            if not declared.strip().isdigit():
                return await _refusal(ApiError(400, "bad_request", f"Content-Length {declared!r} is not a number"),
                                      scope)(scope, receive, send)
            if int(declared) > self.max_bytes:
                return await _refusal(BodyTooLarge(self.max_bytes, int(declared)), scope)(scope, receive, send)

        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def note_start(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, note_start)
        except BodyTooLarge as exc:  # normally answered by the app's handler; this covers code outside it
            if started:
                raise
            await _refusal(exc, scope)(scope, receive, send)


# scope key: a callable, set by the connection (web.connection), that is true when the server's receive() has a
# message ready and so returns without waiting: no deadline is needed for it (a small upload arrives whole with
# its headers). Absent (another server, the test client), every read of the body has its deadline.
BODY_READY = "vggserve.body_ready"


class BodyTimeoutMiddleware:
    """Pure ASGI middleware: each wait of the app for more of the request body is bounded by `timeout_s` (408 with
    `Connection: close` when it passes); an answer sent before the body was read in full closes the connection."""

    def __init__(self, app, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        complete = not has_body(scope)
        started = False
        ready = scope.get(BODY_READY)

        async def timed_receive():
            nonlocal complete
            if complete:  # the body is in: waits from here on are for the client going away
                return await receive()
            if ready is not None and ready():
                message = await receive()  # returns at once: nothing to time
            else:
                try:
                    message = await _within(receive(), self.timeout_s)
                except asyncio.TimeoutError:
                    raise BodyTimeout(self.timeout_s) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def closing_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not complete:
                    message["headers"] = [*[h for h in message.get("headers", ()) if h[0].lower() != b"connection"],
                                          (b"connection", b"close")]
            await send(message)

        try:
            await self.app(scope, timed_receive, closing_send)
        except BodyTimeout as exc:  # normally answered by the app's handler; this covers code outside it
            if started:
                raise
            await _refusal(exc, scope)(scope, receive, send)
