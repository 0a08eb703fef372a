"""The hot routes, `POST /classify` and v2 `POST /v2/models/{model}[/versions/{version}]/infer`, answered by a pure
ASGI adapter ahead of FastAPI's per-request machinery (its router, dependency solving and exception middleware);
FastAPI keeps the API surface, the OpenAPI schema and /docs, and the same routes answer every request the adapter
passes on.

The adapter sits inside every middleware of ours (request id, metrics, CORS, drain, auth, the body's limits), so
those apply to it as to any route. It takes a request only when its parameters are plain (`top_k` alone in the
query, as canonical digits in range; `X-Request-Timeout-Ms` once, likewise), calls the route's own function on it,
and answers an exception with the app's own handler for it, as FastAPI would: the answers are the same, byte for
byte and header for header. A request with anything else in its query or headers (a bad `top_k`, an unknown
parameter) goes to FastAPI, whose validation answers it.
"""

import re

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..settings import MAX_TIMEOUT_MS, MAX_TOP_K
from . import classify, v2
from .errors import V2_PREFIX

_DIGITS = re.compile(rb"[1-9][0-9]{0,5}")  # canonical: FastAPI reads "05" or "+5" as 5 too; those go to it
_TIMEOUT_HEADER = b"x-request-timeout-ms"
DEFAULT_TOP_K = 5


def _number(raw: bytes, highest: int) -> int | None:
    """`raw` as an integer from 1 to `highest` when it is written plainly, else None."""
    if _DIGITS.fullmatch(raw) is None:
        return None
    value = int(raw)
    return value if value <= highest else None


def _top_k(query: bytes) -> int | None:
    """`top_k` from a query string that holds only it (or nothing: the default), else None."""
    if not query:
        return DEFAULT_TOP_K
    name, sep, value = query.partition(b"=")
    return _number(value, MAX_TOP_K) if name == b"top_k" and sep else None


def _timeout_ms(scope) -> tuple[bool, int | None]:
    """(plain, X-Request-Timeout-Ms): plain is False when the header is there more than once or not plainly."""
    found = None
    for name, value in scope["headers"]:
        if name == _TIMEOUT_HEADER:
            if found is not None:
                return False, None
            found = value
    if found is None:
        return True, None
    value = _number(found.strip(), MAX_TIMEOUT_MS)
    return value is not None, value


def _v2_model(path: str) -> tuple[str, str | None] | None:
    """(model, version) of a v2 infer path, else None (as the routes' `{model}` and `{version}` match)."""
    parts = path[len(V2_PREFIX):].split("/")
    if len(parts) == 4 and parts[:2] == ["", "models"] and parts[3] == "infer" and parts[2]:
        return parts[2], None
    if (len(parts) == 6 and parts[:2] == ["", "models"] and parts[3] == "versions" and parts[5] == "infer"
            and parts[2] and parts[4]):
        return parts[2], parts[4]
    return None


class HotPathMiddleware:
    """Pure ASGI middleware, innermost: see the module's docstring. `handlers` is the app's exception_handlers."""

    def __init__(self, app, handlers: dict):
        self.app = app
        self.handlers = handlers

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/classify":
                top_k = _top_k(scope["query_string"])
                plain, timeout_ms = _timeout_ms(scope)
                if top_k is not None and plain:
                    request = Request(scope, receive)
                    return await self._answer(request, send, classify.classify(request, top_k, timeout_ms))
            elif path.startswith(V2_PREFIX + "/models/") and path.endswith("/infer"):
                named = _v2_model(path)
                if named is not None:
                    request = Request(scope, receive)
                    return await self._answer(request, send, v2.infer(request, *named))
        await self.app(scope, receive, send)

    async def _answer(self, request: Request, send, endpoint) -> None:
        """Send what the route's coroutine returns, or what the app's handler answers for what it raises."""
        try:
            response = await endpoint
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # unexpected: the 500 of UnexpectedErrorMiddleware, as from any route
            response = await handler(request, exc)
            exc.__traceback__ = None
        await response(request.scope, request.receive, send)

    def _handler(self, exc: Exception):
        """The app's handler for `exc`, as Starlette's exception middleware finds it (Exception's is the last
        resort's, not the route's)."""
        if isinstance(exc, HTTPException) and exc.status_code in self.handlers:
            return self.handlers[exc.status_code]
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self.handlers:
                return self.handlers[cls]
        return None
