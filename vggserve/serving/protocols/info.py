"""What is being served (/metadata) and Prometheus metrics (/metrics)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .errors import error_responses
from .schemas import Metadata

router = APIRouter()


@router.get("/metadata", response_model=Metadata, tags=["info"], summary="What is being served",
            responses=error_responses(401))
async def metadata(request: Request):
    """Model, weights source and checksum, input size, number of labels, devices and limits."""
    return await request.app.state.service.describe()


@router.get("/metrics", tags=["info"], summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format."}, **error_responses(401)})
async def metrics(request: Request):
    """Requests by endpoint and status; queue, preprocess, inference and total time; batch sizes; queue length;
    rejected and timed-out counts; readiness."""
    body, content_type = request.app.state.service.metrics.render()
    return Response(body, media_type=content_type)
