"""The error shape of each protocol for every failure, and the handlers that make FastAPI's own errors (validation,
404, 405, ...) and the middlewares' refusals use it too: `{"error": {"code": ..., "message": ...}}` on vggserve's own
endpoints, v2's `{"error": "..."}` under /v2 (the Open Inference Protocol's shape, which its clients read)."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ...errors import ImageError
from ..scheduling.errors import (ClientGone, DeadlineExceeded, InferenceFailed, InternalError, PreprocessFailed,
                                 QueueFull, SchedulingError, Unavailable)

log = logging.getLogger("vggserve.serving")

# codes for HTTP errors that Starlette/FastAPI raise themselves
_STATUS_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
                 406: "not_acceptable", 408: "request_timeout", 413: "payload_too_large",
                 415: "unsupported_media_type", 422: "invalid_request", 429: "queue_full", 500: "internal_error",
                 503: "unavailable"}


class ApiError(Exception):
    """An error answered to the client as `status` with `{"error": {"code", "message"}}` (and optional headers)."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def __reduce__(self):  # pickles whole, subclasses too (Exception's default rebuilds from the message alone)
        return _rebuild_api_error, (type(self), self.status, self.code, self.message, self.headers)


def _rebuild_api_error(cls, status: int, code: str, message: str, headers: dict) -> ApiError:
    """An unpickled ApiError of class `cls`, whatever arguments that subclass's constructor takes."""
    error = cls.__new__(cls)
    ApiError.__init__(error, status, code, message, headers)
    return error


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable error code, e.g. `invalid_image`, `queue_full`.")
    message: str = Field(description="What was wrong and, where there is one, how to fix it.")


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


# the HTTP status of each of the scheduler's errors (the same in both protocols)
SCHEDULING_STATUS = {QueueFull: 429, DeadlineExceeded: 504, ClientGone: 499, Unavailable: 503, InferenceFailed: 500,
                     PreprocessFailed: 500, InternalError: 500}


def scheduling_status(exc: SchedulingError) -> int:
    return next((s for cls, s in SCHEDULING_STATUS.items() if isinstance(exc, cls)), 500)


def as_api_error(exc: BaseException) -> ApiError:
    """The HTTP error for an image's failure: a scheduler error, an ImageError, or an ApiError as it is; anything
    else is raised again (a bug, answered 500 by the generic handler)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SchedulingError):
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        return ApiError(scheduling_status(exc), exc.code, exc.message, headers)
    if isinstance(exc, ImageError):
        return ApiError(*image_error_parts(exc))
    raise exc


V2_PREFIX = "/v2"


def is_v2(path: str) -> bool:
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


def error_body(code: str, message: str, path: str = "") -> dict:
    """The error body for a request to `path`: v2's shape under /v2, else ours."""
    if is_v2(path):
        return {"error": message}
    return {"error": {"code": code, "message": message}}


def error_response(status: int, code: str, message: str, headers: dict | None = None,
                   path: str = "") -> JSONResponse:
    return JSONResponse(error_body(code, message, path), status_code=status, headers=headers)


def image_error_parts(exc: ImageError) -> tuple[int, str, str]:
    """(status, code, message) of an ImageError from vggserve.images."""
    return int(getattr(exc, "http_status", 400)), str(getattr(exc, "code", "invalid_image")), str(exc)


def _validation_message(exc: RequestValidationError) -> str:
    """One line per problem: where it is (e.g. `query parameter top_k`) and what pydantic said."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ())]
        where = f"{loc[0]} parameter {'.'.join(loc[1:])}" if len(loc) > 1 else ".".join(loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "the request is invalid"


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.headers, request.url.path)


async def _image_or_scheduling_error(request: Request, exc: Exception) -> JSONResponse:
    return await _api_error(request, as_api_error(exc))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    status = 400 if is_v2(request.url.path) else 422  # v2: every malformed request is a 400
    return error_response(status, "invalid_request", _validation_message(exc), path=request.url.path)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        message = f"no endpoint at {request.url.path}; see /docs for the API"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; see /docs for the API"
    return error_response(exc.status_code, code, message, getattr(exc, "headers", None), request.url.path)


async def _client_disconnect(request: Request, exc: ClientDisconnect) -> Response:
    """The client went away while its body was being read: nobody will read an answer; count it as 499."""
    return Response(status_code=499)


def _unexpected_error_response(method: str, path: str) -> JSONResponse:
    """Log the exception being handled and answer it with a 500 in the path's shape."""
    log.exception("unexpected error on %s %s", method, path)
    return error_response(500, "internal_error", "an unexpected error occurred on the server; it was logged",
                          path=path)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return _unexpected_error_response(request.method, request.url.path)


class UnexpectedErrorMiddleware:
    """Pure ASGI middleware inside the request-id one: an exception that no handler took becomes the 500 in our shape
    here. Starlette answers it only in its outermost layer, outside every middleware of ours: that 500 had no
    X-Request-ID (nor the front end's header), and its log line no request id."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def note_start(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, note_start)
        except Exception:  # noqa: BLE001 - a bug: answered and logged like the handler of last resort does
            if started:
                raise
            await _unexpected_error_response(scope.get("method", ""), scope.get("path", ""))(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI and our code raise to the one JSON shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ImageError, _image_or_scheduling_error)
    app.add_exception_handler(SchedulingError, _image_or_scheduling_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(Exception, _unexpected_error)


def error_responses(*statuses: int) -> dict:
    """OpenAPI `responses=` entries for the given error statuses, each with the ErrorBody schema."""
    return {s: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


ERROR_DESCRIPTIONS = {
    400: "Bad request: not an image, empty body, truncated file, missing `file` field, malformed multipart, a "
         "compressed body that does not inflate (codes `invalid_image`, `empty_body`, `missing_file`, "
         "`invalid_multipart`, `bad_request`).",
    401: "Missing or wrong `Authorization: Bearer <key>` when the server has an API key (code `unauthorized`).",
    408: "The body stopped arriving for the server's --read-timeout; the connection is closed (code "
         "`request_timeout`).",
    413: "Body larger than the server's limit, inflated when it came compressed (code `payload_too_large`), or an "
         "image with more pixels than allowed, decided from its header (code `image_too_large`).",
    415: "Content type or Content-Encoding not accepted (gzip and deflate are), or an image format outside the "
         "allowlist such as SVG or PDF (codes `unsupported_media_type`, `unsupported_image_format`).",
    422: "A query parameter or header out of range, e.g. `top_k` above 1000 (code `invalid_request`).",
    429: "The queue is full; retry after the `Retry-After` header's seconds (code `queue_full`).",
    500: "Inference failed on a device (code `inference_failed`), a preprocessing worker process died (code "
         "`preprocess_failed`) or an unexpected error (code `internal_error`).",
    503: "Not ready yet, draining for shutdown, or no device worker alive (codes `not_ready`, `draining`, "
         "`no_workers`); `Retry-After` says when to try again.",
    504: "The request's deadline passed before it reached a device (code `deadline_exceeded`).",
}
