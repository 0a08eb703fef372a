"""The Open Inference Protocol (KServe v2) over HTTP, an adapter over the same `Service` as /classify: the same
queue, batching, limits, API key, deadlines, drain and metrics, in every server layout.

    GET  /v2                                         server metadata (name, version, extensions)
    GET  /v2/health/live, /v2/health/ready           200 or 503
    GET  /v2/models/vgg16[/versions/1]               model metadata: inputs and outputs from the model card
    GET  /v2/models/vgg16[/versions/1]/ready         200 or 503
    GET  /v2/models/vgg16[/versions/1]/config        the model configuration Triton's clients ask for
    GET  /v2/models/stats, /v2/models/vgg16[/versions/1]/stats   statistics (Triton's extension, v2_stats)
    POST /v2/models/vgg16[/versions/1]/infer         inference (JSON and binary tensor data, classification)

Errors are v2's `{"error": "..."}`: a malformed request, a wrong input name, datatype, shape or size, or an image
that cannot be decoded is 400; an unknown model or version 404; a Content-Encoding other than gzip or deflate 415;
a full queue 429; a passed deadline 504; a server that is loading or draining 503. The request's
`parameters.timeout` (microseconds, as Triton's clients send it) or the `X-Request-Timeout-Ms` header sets its
deadline.
"""

import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ... import __version__
from ...errors import ImageError
from ...modelinput import ModelInput
from ..modelcard import ModelCard
from ..scheduling.pipeline import deadline_for, run_inputs
from ..settings import MAX_TIMEOUT_MS
from .classify import client_gone
from .encodings import inflated_body
from .errors import ApiError, as_api_error
from .v2_stats import model_statistics
from .v2_codec import HEADER_LENGTH, V2RequestError, classifications, encode_response, parse_request, split_body

router = APIRouter(prefix="/v2", tags=["v2 (Open Inference Protocol)"])

EXTENSIONS = ["classification", "binary_tensor_data", "model_configuration", "statistics"]


class V2Error(BaseModel):
    error: str = Field(description="What was wrong and, where there is one, how to fix it.")


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 is the batch.")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict = Field(description="`precision` of the engine's arithmetic and the weights' `preprocessing`.")


_DESCRIPTIONS = {400: "A malformed request, a wrong input name, datatype, shape or size, or an undecodable image.",
                 401: "Missing or wrong `Authorization: Bearer <key>` when the server has an API key.",
                 404: "No such model or version.",
                 408: "The body stopped arriving for the server's --read-timeout; the connection is closed.",
                 413: "The body is larger than the server's --max-body-bytes (inflated, when it came compressed).",
                 415: "A Content-Encoding other than gzip or deflate.",
                 429: "The queue is full; retry after `Retry-After` seconds.",
                 499: "The client went away.",
                 500: "Inference failed on a device, or an unexpected error.",
                 503: "Not ready yet, draining for shutdown, or no device worker alive.",
                 504: "The request's deadline passed before it reached a device."}


def _errors(*statuses: int) -> dict:
    return {s: {"model": V2Error, "description": _DESCRIPTIONS[s]} for s in statuses}


def _card(request: Request) -> ModelCard:
    return request.app.state.service.card


def _check_model(card: ModelCard, model: str, version: str | None) -> None:
    if model != card.name:
        raise ApiError(404, "not_found", f"unknown model {model!r}; this server serves {card.name!r}")
    if version is not None and version != card.version:
        raise ApiError(404, "not_found", f"unknown version {version!r} of {card.name!r}; it has version "
                       f"{card.version!r}")


def _both(path: str):
    """The decorators for a model route with and without `/versions/{version}`."""
    return path.replace("{model}", "{model}/versions/{version}")


# server -----------------------------------------------------------------------------------------------------
@router.get("", response_model=ServerMetadata, summary="Server metadata", responses=_errors(401))
async def server_metadata():
    return {"name": "vggserve", "version": __version__, "extensions": EXTENSIONS}


@router.get("/health/live", response_model=Live, summary="Server liveness", responses={503: {"model": Live}})
async def live(request: Request):
    alive, _ = request.app.state.service.liveness()
    return JSONResponse({"live": alive}, status_code=200 if alive else 503)


@router.get("/health/ready", response_model=Ready, summary="Server readiness", responses={503: {"model": Ready}})
async def ready(request: Request):
    ok = request.app.state.service.readiness()[0]
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503, headers=None if ok else {"Retry-After": "1"})


# model ------------------------------------------------------------------------------------------------------
async def model_metadata(request: Request, model: str, version: str | None = None):
    service = request.app.state.service
    card = service.card
    _check_model(card, model, version)
    return {"name": card.name, "versions": [card.version], "platform": card.platform,
            "inputs": [t.as_v2() for t in card.inputs], "outputs": [t.as_v2() for t in card.outputs],
            "parameters": {"precision": service.precision, "preprocessing": service.preprocessing}}


async def model_ready(request: Request, model: str, version: str | None = None):
    _check_model(_card(request), model, version)
    ok = request.app.state.service.readiness()[0]
    return JSONResponse({"name": model, "ready": ok}, status_code=200 if ok else 503)


async def model_config(request: Request, model: str, version: str | None = None):
    """Triton's model configuration, as far as it applies: batching, the tensors, the queue policy."""
    service = request.app.state.service
    card, settings = service.card, service.settings
    _check_model(card, model, version)

    def tensor(t, role: str) -> dict:
        entry = {"name": t.name, "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                 "dims": list(t.shape[1:]) or [1]}
        if role == "input":
            entry["format"] = "FORMAT_NCHW" if len(t.shape) == 4 else "FORMAT_NONE"
            if len(t.shape) == 1:
                entry["reshape"] = {"shape": []}
        return entry

    return {"name": card.name, "platform": card.platform, "backend": "vggserve", "max_batch_size":
            settings.max_files, "version_policy": {"specific": {"versions": [int(card.version)]}},
            "input": [tensor(t, "input") for t in card.inputs], "output": [tensor(t, "output") for t in card.outputs],
            "dynamic_batching": {"preferred_batch_size": [settings.max_batch_size],
                                 "max_queue_delay_microseconds": int(settings.max_wait_ms * 1000),
                                 "default_queue_policy": {"timeout_action": "REJECT", "max_queue_size":
                                                          settings.max_queue, "default_timeout_microseconds":
                                                          settings.request_timeout_ms * 1000}},
            "parameters": {"precision": {"string_value": service.precision},
                           "preprocessing": {"string_value": service.preprocessing}}}


async def all_model_stats(request: Request):
    """Triton's statistics extension, for every model served (the one)."""
    service = request.app.state.service
    return {"model_stats": [model_statistics(service.metrics.samples(), service.card)]}


async def model_stats(request: Request, model: str, version: str | None = None):
    _check_model(_card(request), model, version)
    return await all_model_stats(request)


# inference --------------------------------------------------------------------------------------------------
def _v2_error(exc: BaseException) -> ApiError:
    """v2's status for one image's failure: an image that cannot be used is a bad request (400), whatever kind."""
    error = as_api_error(exc)
    if isinstance(exc, ImageError):
        return ApiError(400, error.code, error.message)
    return error


_HEADER_LENGTH_KEY, _TIMEOUT_KEY = HEADER_LENGTH.lower().encode(), b"x-request-timeout-ms"


def _headers(scope) -> tuple[str | None, str | None]:
    """(Inference-Header-Content-Length, X-Request-Timeout-Ms), the first of each as Starlette's `headers.get`
    gives it, from one pass over the request's headers."""
    length = timeout = None
    for name, value in scope["headers"]:
        if name == _HEADER_LENGTH_KEY and length is None:
            length = value.decode("latin-1")
        elif name == _TIMEOUT_KEY and timeout is None:
            timeout = value.decode("latin-1")
    return length, timeout


def _timeout_ms(header: str | None, timeout_us: int | None) -> float | None:
    """The request's own deadline in milliseconds: `parameters.timeout`, else X-Request-Timeout-Ms (`header`), else
    None."""
    if timeout_us is not None:
        ms = timeout_us / 1000.0
    elif header is None:
        return None
    else:
        try:
            ms = float(int(header))
        except ValueError:
            raise ApiError(400, "invalid_request", f"X-Request-Timeout-Ms must be an integer, got {header!r}") from None
    if not 0 < ms <= MAX_TIMEOUT_MS:
        raise ApiError(400, "invalid_request", f"the timeout must be above 0 and at most {MAX_TIMEOUT_MS} ms "
                       f"({MAX_TIMEOUT_MS * 1000} microseconds in `parameters.timeout`)")
    return ms


def _stacked(rows: list[np.ndarray]) -> np.ndarray:
    return rows[0][None] if len(rows) == 1 else np.stack(rows)


_INFER_BODY = {"requestBody": {"required": True, "description": (
    "The inference request (JSON), optionally followed by binary tensor data whose JSON length is in the "
    "`Inference-Header-Content-Length` header. One input: `image` (BYTES [N], image files; base64 strings in JSON) "
    "or `input` (FP32 [N, 3, 224, 224], normalised). Outputs `logits` and `probabilities` (FP32 [N, 1000]), each "
    "optionally with the parameters `binary_data` and `classification`."),
    "content": {"application/json": {"schema": {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"}, "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": {"type": "object", "required": ["name", "shape", "datatype"],
                                               "properties": {"name": {"type": "string"},
                                                              "shape": {"type": "array", "items": {"type": "integer"}},
                                                              "datatype": {"type": "string"},
                                                              "parameters": {"type": "object"}, "data": {}}}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "parameters": {"type": "object"}}}}}}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
_INFER_OK = {200: {"description": "The inference response (JSON, then binary outputs if any were asked for).",
                   "content": {"application/json": {}, "application/octet-stream": {}}}}


async def infer(request: Request, model: str, version: str | None = None):
    started = time.monotonic()
    service = request.app.state.service
    card = service.card
    _check_model(card, model, version)
    service.ensure_accepting()
    body = await inflated_body(request, service.settings.max_body_bytes)
    header_length, timeout_header = _headers(request.scope)
    try:
        parsed = parse_request(*split_body(body, header_length), card, service.settings.max_files)
    except V2RequestError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    timeout_ms = _timeout_ms(timeout_header, parsed.timeout_us)
    deadline = deadline_for(service, started, None) if timeout_ms is None else started + timeout_ms / 1000.0
    sources = parsed.images or [ModelInput.tensor(row) for row in parsed.tensor]
    want_logits = any(o.name == "logits" for o in parsed.outputs)
    results = await run_inputs(service, sources, started, deadline, client_gone=client_gone(request),
                               want_logits=want_logits, all_or_nothing=True)
    failed = [(i, r.error) for i, r in enumerate(results) if r.error is not None]
    if failed:
        index, exc = failed[0]
        error = _v2_error(exc)
        where = f"{parsed.input_name} {index} of the batch: " if parsed.batch > 1 else ""
        raise ApiError(error.status, error.code, where + error.message, error.headers)
    tensors = []
    for o in parsed.outputs:
        rows = [r.outcome.logits if o.name == "logits" else r.outcome.probabilities for r in results]
        tensors.append((o, classifications(rows, o.classes) if o.classes else _stacked(rows)))
    payload, header_length = encode_response(card.name, card.version, parsed.id, tensors)
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)})


_STATS = dict(summary="Statistics (Triton's statistics extension)", responses=_errors(401, 404))
router.add_api_route("/models/stats", all_model_stats, methods=["GET"], **_STATS)  # before /models/{model} takes it
for _path, _endpoint, _kwargs in (
        ("/models/{model}", model_metadata, dict(response_model=ModelMetadata, summary="Model metadata",
                                                 responses=_errors(401, 404))),
        ("/models/{model}/ready", model_ready, dict(response_model=ModelReady, summary="Model readiness",
                                                    responses={**_errors(401, 404), 503: {"model": ModelReady}})),
        ("/models/{model}/config", model_config, dict(summary="Model configuration (Triton's)",
                                                      responses=_errors(401, 404))),
        ("/models/{model}/stats", model_stats, _STATS)):
    for _route_path in (_path, _both(_path)):
        router.add_api_route(_route_path, _endpoint, methods=["GET"], **_kwargs)
for _route_path in ("/models/{model}/infer", _both("/models/{model}/infer")):
    router.add_api_route(_route_path, infer, methods=["POST"], summary="Inference", openapi_extra=_INFER_BODY,
                         responses={**_INFER_OK, **_errors(400, 401, 404, 408, 413, 415, 429, 500, 503, 504)})
