"""Health checks (always open, even with an API key), metadata and Prometheus metrics."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import error_responses
from .schemas import Health, Metadata

router = APIRouter()


@router.get("/health/live", response_model=Health, tags=["health"], summary="Liveness",
            responses={503: {"model": Health, "description": "Every device worker has died: restart the process."}})
async def live(request: Request):
    """200 while the process serves HTTP and some device worker is alive or still starting."""
    service = request.app.state.service
    if service.workers and not any(w.alive or w.state == "starting" for w in service.workers):
        return JSONResponse({"status": "dead", "detail": service.readiness()[2]}, status_code=503)
    return {"status": "ok", "detail": "serving"}


@router.get("/health/ready", response_model=Health, tags=["health"], summary="Readiness",
            responses={503: {"model": Health, "description": "Loading, warming up, a worker died, or draining."}})
async def ready(request: Request):
    """200 once the weights are loaded and every device worker has run its warm-up batch; 503 before that,
    when a worker dies, and while draining for shutdown."""
    ok, code, detail = request.app.state.service.readiness()
    return JSONResponse({"status": code, "detail": detail}, status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": "1"})


@router.get("/metadata", response_model=Metadata, tags=["info"], summary="What is being served",
            responses=error_responses(401))
async def metadata(request: Request):
    """Model, weights source and checksum, input size, number of labels, devices and limits."""
    return request.app.state.service.metadata()


@router.get("/metrics", tags=["info"], summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format."}, **error_responses(401)})
async def metrics(request: Request):
    """Requests by endpoint and status; queue, preprocess, inference and total time; batch sizes; queue length;
    rejected and timed-out counts; readiness."""
    body, content_type = request.app.state.service.metrics.render()
    return Response(body, media_type=content_type)
