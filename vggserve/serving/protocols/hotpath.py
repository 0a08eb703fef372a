"""The hot routes, `POST /classify` and v2 `POST /v2/models/{model}[/versions/{version}]/infer`, answered by a thin
adapter ahead of FastAPI's per-request machinery (its telemetry check, router, dependency solving and validation);
FastAPI keeps the API surface, the OpenAPI schema and /docs, and answers every other request.

    app = create_app(settings)      # hot_routes(app) is called there: the app's class gains the adapter

The adapter runs the route's own function under the same middlewares as any route (the app's user middlewares,
built once from `app.user_middleware`, between Starlette's last-resort 500 and the route): request id, metrics,
CORS, drain, API key, the body's size and pace, the front end's header. It takes a request only when its
parameters are plain (`top_k` alone in the query, as canonical digits in range; `X-Request-Timeout-Ms` at most
once, likewise), and answers an exception with the app's own handler for it, as FastAPI's exception middleware
would: the answers are the same, byte for byte and header for header. A request with anything else in its query
or headers (a bad `top_k`, an unknown parameter) goes to FastAPI, whose validation answers it. FastAPI's own
OpenTelemetry instrumentation, when a provider is configured, sees the other routes only.

When the app's middlewares are those `create_app` adds (no CORS; the front end's header or not), a plain request
meets them fused into one (`web.lane.Lane`, the same answers); the others meet the middlewares themselves.
Under the service's connection (`web.connection`), `direct(scope)` gives the connection that fused answer for
such a request at once, and the app's own dispatch is skipped.
"""

import re

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request

from ..settings import MAX_TIMEOUT_MS, MAX_TOP_K
from ..web.lane import Lane
from . import classify, v2
from .errors import V2_PREFIX, _unexpected_error as _LAST_RESORT

_DIGITS = re.compile(rb"[1-9][0-9]{0,5}")  # canonical: FastAPI reads "05" or "+5" as 5 too; those go to it
_TIMEOUT_HEADER = b"x-request-timeout-ms"
_CALL = "vggserve.hot_call"  # scope key: the route function and its arguments
DEFAULT_TOP_K = 5
_V2_MODELS = V2_PREFIX + "/models/"


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


def _timeout_ms(headers) -> tuple[bool, int | None]:
    """(plain, X-Request-Timeout-Ms): plain is False when the header is there more than once or not plainly."""
    found = None
    for name, value in headers:
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
    parts = path[len(_V2_MODELS):].split("/")
    if len(parts) == 2 and parts[1] == "infer" and parts[0]:
        return parts[0], None
    if len(parts) == 4 and parts[1] == "versions" and parts[3] == "infer" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def hot_call(scope) -> tuple | None:
    """(route function, its arguments after the request) when the adapter takes this request, else None."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    path = scope["path"]
    if path == "/classify":
        top_k = _top_k(scope["query_string"])
        plain, timeout_ms = _timeout_ms(scope["headers"])
        return (classify.classify, top_k, timeout_ms) if top_k is not None and plain else None
    if path.startswith(_V2_MODELS) and path.endswith("/infer"):
        named = _v2_model(path)
        return (v2.infer, *named) if named is not None else None
    return None


def _handler(handlers: dict, exc: Exception):
    """The app's handler for `exc`, as Starlette's exception middleware finds it (Exception's handler is the last
    resort's, outside every middleware, not the route's)."""
    if isinstance(exc, HTTPException) and exc.status_code != 500 and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class HotRoute:
    """The innermost ASGI app of the adapter: the route function named in the scope, its response sent, or the
    app's handler's answer to what it raised."""

    def __init__(self, handlers: dict):
        self.handlers = handlers

    async def __call__(self, scope, receive, send):
        endpoint, *args = scope[_CALL]
        request = Request(scope, receive)
        try:
            response = await endpoint(request, *args)
        except Exception as exc:
            handler = _handler(self.handlers, exc)
            if handler is None:
                raise  # unexpected: the 500 of UnexpectedErrorMiddleware, as from any route
            response = await handler(request, exc)
            exc.__traceback__ = None
        await response(scope, receive, send)


class HotRoutesApp(FastAPI):
    """A FastAPI app whose hot routes skip its per-request machinery (see the module's docstring); fastapi-offline's
    factory makes a FastAPI, which `hot_routes` gives this class. `hot_routes = False` turns the adapter off (the
    tests compare both)."""

    hot_routes = True
    lane = True  # False: every hot request goes through the middlewares themselves (the tests compare both)
    _hot_stack = None
    _lane = None

    async def __call__(self, scope, receive, send):
        call = hot_call(scope) if self.hot_routes and not self.root_path else None
        if call is None:
            return await super().__call__(scope, receive, send)
        plain = self._plain(scope, call)
        if plain is not None:
            await self._lane.answer(scope, receive, send, *plain)
        else:
            await self._hot_stack(scope, receive, send)

    def direct(self, scope):
        """For the connection (web.connection): the ASGI app that answers this request as a call of the app would,
        without the app's dispatch, when it is a plain request to a hot route (the lane's); else None."""
        call = hot_call(scope) if self.hot_routes and not self.root_path else None
        plain = self._plain(scope, call) if call is not None else None
        if plain is None:
            return None
        answer, (length, given) = self._lane.answer, plain
        return lambda scope, receive, send: answer(scope, receive, send, length, given)

    def _plain(self, scope, call) -> tuple | None:
        """The scope made ready for the hot route `call`; what the lane's `takes` says of it (None: the
        middlewares themselves answer it)."""
        scope["app"] = self
        scope[_CALL] = call
        if self._hot_stack is None:
            self._hot_stack = self._build_hot_stack()
        return self._lane.takes(scope) if self._lane is not None and self.lane else None

    def add_middleware(self, *args, **kwargs) -> None:
        super().add_middleware(*args, **kwargs)
        self._hot_stack = None
        self._lane = None

    def _build_hot_stack(self):
        """HotRoute inside the app's user middlewares, inside Starlette's last-resort 500, as FastAPI builds its
        stack around the router."""
        error_handler = self.exception_handlers.get(500) or self.exception_handlers.get(Exception)
        app = route = HotRoute(self.exception_handlers)
        # the middlewares fused into one for plain requests (web.lane), when they are those it knows
        self._lane = Lane.for_middlewares(self.user_middleware, route) if (
            error_handler is _LAST_RESORT and not self.debug) else None
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return ServerErrorMiddleware(app, handler=error_handler, debug=self.debug)


def hot_routes(app: FastAPI) -> FastAPI:
    """`app` (a FastAPI instance, as fastapi-offline's factory makes it), its class now HotRoutesApp."""
    if type(app) is not FastAPI:
        raise TypeError(f"hot_routes takes a FastAPI app, got a {type(app).__name__}")
    app.__class__ = HotRoutesApp
    return app
