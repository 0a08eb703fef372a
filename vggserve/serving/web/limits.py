"""Request body size limit, enforced twice before the whole body is read: from Content-Length when the request
arrives, and again while the body streams in (chunked uploads, or a Content-Length that lies)."""

from ..protocols.errors import ApiError, error_response


class BodyTooLarge(ApiError):
    def __init__(self, limit: int, seen: int | None = None):
        size = f"{seen} bytes" if seen is not None else f"more than {limit} bytes"
        super().__init__(413, "payload_too_large",
                         f"request body is {size}; this server accepts at most {limit} bytes "
                         "(send a smaller image, or raise the server's --max-body-bytes)")


def _refusal(exc: ApiError, scope):
    """The answer to a request refused before its body was read in full: the connection is not reused."""
    return error_response(exc.status, exc.code, exc.message, {**exc.headers, "Connection": "close"},
                          scope.get("path", ""))


def _content_length(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.decode("latin-1")
    return None


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
