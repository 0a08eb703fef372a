"""The FastAPI application: routers, error handlers, middlewares, and the lifespan that starts the device workers.

    app = create_app(Settings(weights="vgg16.safetensors", devices=("gpu:0", "gpu:1")))

Models are loaded in the lifespan (never at import), by one worker thread per device, so the server answers
/health/live at once and /health/ready turns 200 when every worker has loaded and warmed up.
"""

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from .. import __version__
from .web.auth import OPEN_PATHS, ApiKeyMiddleware
from .web.cors import JsonCORSMiddleware
from .web.drain import DrainMiddleware
from .web.head import HeadAsGetMiddleware
from .protocols.errors import UnexpectedErrorMiddleware, install_error_handlers
from .protocols.hotpath import hot_routes
from .web.limits import BodySizeLimitMiddleware, BodyTimeoutMiddleware
from .web.request_id import HEADER as REQUEST_ID_HEADER, RequestIdMiddleware
from .metrics import RequestMetricsMiddleware
from .protocols.classify import router as classify_router
from .protocols.health import router as health_router
from .protocols.info import router as info_router
from .protocols.v2 import router as v2_router
from .service import ModelFactory, Service
from .settings import Settings

DESCRIPTION = """VGG16 ImageNet classification on our own OpenCL kernels, with dynamic batching across devices.

Every error has the body `{"error": {"code": "...", "message": "..."}}`, except under `/v2` (the Open Inference
Protocol, KServe v2), where it is `{"error": "..."}`. Send `X-Request-Timeout-Ms` to set a request's deadline.
When the server has an API key, every endpoint but `/health/*` and `/v2/health/*` needs
`Authorization: Bearer <key>`."""


def create_app(settings: Settings, model_factory: ModelFactory | None = None,
               service: Service | None = None) -> FastAPI:
    """The app for `settings`. `model_factory(device_spec) -> model` replaces loading the weights (for tests);
    `service` replaces the service the app would build (an HTTP front-end process passes its own)."""
    service = service or Service(settings, model_factory)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.stop)

    # /docs and /redoc with their JS and CSS served from the installed fastapi-offline package, not a CDN: they
    # work on an air-gapped host
    app = FastAPIOffline(title="vggserve", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    hot_routes(app)  # POST /classify and v2 infer of plain requests skip FastAPI's per-request machinery
    app.state.service = service
    install_error_handlers(app)
    app.include_router(classify_router)
    app.include_router(health_router)
    app.include_router(info_router)
    app.include_router(v2_router)
    # add_middleware puts each one outside the previous: requests meet metrics, the request id, CORS (preflights
    # answered before the API key is asked for), the 500 for unexpected errors, drain, auth, the body's size limit and
    # its timeout, then HEAD routed as GET
    app.add_middleware(HeadAsGetMiddleware, router=app.router)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.read_timeout_s)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(DrainMiddleware, drain=service.drain)
    app.add_middleware(UnexpectedErrorMiddleware)
    if settings.cors_origins:
        app.add_middleware(JsonCORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "HEAD", "POST"], allow_headers=["*"], max_age=600,
                           expose_headers=[REQUEST_ID_HEADER, "Retry-After", "Inference-Header-Content-Length"])
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(RequestMetricsMiddleware, metrics=service.metrics)
    app.openapi = lambda: _openapi(app, bool(settings.api_key))
    return app


def _openapi(app: FastAPI, needs_key: bool) -> dict:
    """FastAPI's schema, plus the bearer-key requirement on every non-health path when a key is configured."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        if needs_key:
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer", "description": "The server's API key."}
            for path, operations in schema.get("paths", {}).items():
                for operation in operations.values():
                    operation["security"] = [] if path in OPEN_PATHS else [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema
