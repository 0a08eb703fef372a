"""POST /classify (one image) and POST /classify/batch (several, one result or error each)."""

import time

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse

from ..scheduling.pipeline import Result, deadline_for, run_inputs
from ..web.connection import CLIENT_GONE
from ..web.request_id import request_id
from .answers import predictions
from .errors import as_api_error, error_responses
from .schemas import BatchResponse, ClassifyResponse
from ..settings import MAX_TIMEOUT_MS, MAX_TOP_K
from .uploads import BATCH_FIELD, SINGLE_FIELD, read_batch, read_single

router = APIRouter(tags=["classify"])

_BINARY = {"type": "string", "format": "binary"}
SINGLE_BODY = {"requestBody": {"required": True, "description": (
    f"The image, either as the multipart field `{SINGLE_FIELD}` or as the raw body with an image/* Content-Type "
    "or application/octet-stream (the format is sniffed from the bytes). "
    "JPEG, PNG, WebP, GIF (first frame), BMP and TIFF are accepted. The body may come compressed "
    "(`Content-Encoding: gzip` or `deflate`)."), "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": [SINGLE_FIELD],
                                       "properties": {SINGLE_FIELD: _BINARY}}},
    "image/*": {"schema": _BINARY}, "application/octet-stream": {"schema": _BINARY}}}}
BATCH_BODY = {"requestBody": {"required": True, "description": (
    f"One or more images, each in a multipart field named `{BATCH_FIELD}`."), "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": [BATCH_FIELD], "properties": {
        BATCH_FIELD: {"type": "array", "items": _BINARY}}}}}}}

TopK = Query(5, ge=1, le=MAX_TOP_K, description="How many classes to return per image, most probable first.")
TimeoutHeader = Header(None, ge=1, le=MAX_TIMEOUT_MS, description=(
    "This request's deadline in milliseconds, counted from its arrival and including time in the queue; "
    "an image still waiting for a device when it passes is dropped and answered 504. Default: the server's "
    "--request-timeout-ms."))


def _timing(result: Result, started: float) -> dict:
    o = result.outcome
    return {"queue": round(o.queue_s * 1000, 3), "preprocess": round(result.preprocess_s * 1000, 3),
            "inference": round(o.inference_s * 1000, 3), "total": round((time.monotonic() - started) * 1000, 3)}


def _predictions(result: Result, k: int) -> list[dict]:
    return predictions(result.outcome.probabilities, k)


def client_gone(request: Request):
    """A coroutine function that returns once the request's client has disconnected (the pipeline then withdraws
    its images still waiting). Under our connection (web.connection.CLIENT_GONE) it has `when_gone(callback)` too,
    which the pipeline uses instead of a task waiting on it."""

    async def gone() -> None:
        while True:
            try:
                message = await request.receive()
            except Exception:  # noqa: BLE001 - the server has nothing more to say about this connection
                return
            if message["type"] == "http.disconnect":
                return

    gone.when_gone = request.scope.get(CLIENT_GONE)
    return gone


async def _classify(request: Request, service, uploads: list, started: float, deadline: float) -> list[Result]:
    sources = [u if isinstance(u, Exception) else u.data for u in uploads]
    return await run_inputs(service, sources, started, deadline, client_gone=client_gone(request))


@router.post("/classify", response_model=ClassifyResponse, openapi_extra=SINGLE_BODY,
             summary="Classify one image",
             responses=error_responses(400, 401, 408, 413, 415, 422, 429, 500, 503, 504))
async def classify(request: Request, top_k: int = TopK, x_request_timeout_ms: int = TimeoutHeader):
    """Classify one image with VGG16; requests arriving together are batched on the devices."""
    started = time.monotonic()
    service = request.app.state.service
    service.ensure_accepting()
    deadline = deadline_for(service, started, x_request_timeout_ms)
    upload = await read_single(request, service.settings.max_body_bytes)
    (result,) = await _classify(request, service, [upload], started, deadline)
    if result.error is not None:
        raise as_api_error(result.error)
    body = {"request_id": request_id(request.scope), "model": service.card.name,
            "predictions": _predictions(result, top_k), "timing_ms": _timing(result, started)}
    return JSONResponse(body)


@router.post("/classify/batch", response_model=BatchResponse, openapi_extra=BATCH_BODY,
             summary="Classify several images",
             responses=error_responses(400, 401, 408, 413, 415, 422, 429, 503))
async def classify_batch(request: Request, top_k: int = TopK, x_request_timeout_ms: int = TimeoutHeader):
    """Classify several images sent in one multipart request. The answer is 200 with one entry per file, in order:
    predictions, or an error (same codes as /classify) for a file that failed."""
    started = time.monotonic()
    service = request.app.state.service
    service.ensure_accepting()
    deadline = deadline_for(service, started, x_request_timeout_ms)
    uploads = await read_batch(request, service.settings.max_files, service.settings.max_body_bytes)
    results = await _classify(request, service, uploads, started, deadline)
    entries = []
    for upload, result in zip(uploads, results):
        entry = {"filename": getattr(upload, "filename", None)}
        if result.error is not None:
            error = as_api_error(result.error)
            entry["error"] = {"code": error.code, "message": error.message}
        else:
            entry["predictions"] = _predictions(result, top_k)
            entry["timing_ms"] = _timing(result, started)
        entries.append(entry)
    body = {"request_id": request_id(request.scope), "model": service.card.name, "results": entries}
    return JSONResponse(body)
