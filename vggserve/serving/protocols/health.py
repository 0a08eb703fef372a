"""Liveness and readiness checks (always open, even with an API key)."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .schemas import Health

router = APIRouter()


@router.get("/health/live", response_model=Health, tags=["health"], summary="Liveness",
            responses={503: {"model": Health, "description": "Every device worker has died: restart the process."}})
async def live(request: Request):
    """200 while the process serves HTTP and some device worker is alive or still starting."""
    alive, detail = request.app.state.service.liveness()
    if not alive:
        return JSONResponse({"status": "dead", "detail": detail}, status_code=503)
    return {"status": "ok", "detail": detail}


@router.get("/health/ready", response_model=Health, tags=["health"], summary="Readiness",
            responses={503: {"model": Health, "description": "Loading, warming up, every worker died, or draining."}})
async def ready(request: Request):
    """200 once the weights are loaded and every device worker has run its warm-up batch, then while at least one
    serves; 503 before that, once every worker has died, and while draining for shutdown."""
    ok, code, detail = request.app.state.service.readiness()
    return JSONResponse({"status": code, "detail": detail}, status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": "1"})
