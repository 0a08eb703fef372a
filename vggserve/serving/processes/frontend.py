"""An HTTP front-end process (`vggserve serve --http-workers N`, N > 1): the same FastAPI app under uvicorn, on the
listening socket the engine process bound and handed down, but with no device workers of its own. It parses
requests, enforces the limits, decodes and centre-crops images in its threads, and sends the uint8 crops to the
engine process, which batches them with the other front ends' images (vggserve.serving.processes.engine_link).

Started by the engine process (vggserve.serving.processes.frontends) as
`python -m vggserve.serving.processes.frontend`, with a pickled FrontendSpec on its standard input.
"""

import logging
import os
import pickle
import socket
import sys
from dataclasses import dataclass

from ..app import create_app
from ..hosting import configure_logging, uvicorn_config
from ..web.drain import DrainingServer
from ..web.frontend_header import FrontendHeaderMiddleware
from .admission import SharedCount
from .remote import RemoteBackend
from ..metrics import Metrics
from ..service import Service
from ..settings import Settings

log = logging.getLogger("vggserve.serving")


@dataclass(frozen=True)
class FrontendSpec:
    """What a front-end process is told at start."""

    settings: Settings
    fd: int  # the inherited listening socket
    address: str | tuple[str, ...]  # the engine's Unix socket, or each engine process's (one per device)
    authkey: bytes
    index: int
    log_level: str = "info"
    access_log: bool = False
    admission_fd: int | None = None  # the inherited shared admission block (`admission.AdmissionBlock`)


def frontend_service(settings: Settings, address: str | tuple[str, ...], authkey: bytes, index: int,
                     shared: SharedCount | None = None) -> Service:
    """The service of a front-end process: readiness and results come from the engine process, admission from the
    count every front end shares (`shared`)."""
    metrics = Metrics(multiprocess=True)
    backend = RemoteBackend(settings, metrics, address, authkey, index, shared)
    return Service(settings, multiprocess=True, backend=backend, metrics=metrics)


def serve(spec: FrontendSpec) -> int:
    """Serve on the inherited socket until drained (0) or the engine goes away (1; with several engine processes,
    every one of them)."""
    configure_logging(spec.log_level)
    sock = socket.socket(fileno=spec.fd)
    shared = None
    if spec.admission_fd is not None:
        shared = SharedCount.attach(spec.admission_fd, spec.index, spec.settings.http_workers,
                                    spec.settings.max_queue)
    service = frontend_service(spec.settings, spec.address, spec.authkey, spec.index, shared)
    app = create_app(spec.settings, service=service)
    app.add_middleware(FrontendHeaderMiddleware, value=str(os.getpid()))
    server = DrainingServer(uvicorn_config(app, spec.log_level, spec.access_log), service.drain)
    service.backend.engine.on_lost = server.fail
    server.run(sockets=[sock])
    if server.failure:
        log.error("front end %d stops: %s", spec.index, server.failure)
        return 1
    return 0 if server.started else 1


def main() -> int:
    spec = pickle.load(sys.stdin.buffer)
    sys.stdin.close()
    return serve(spec)


if __name__ == "__main__":
    sys.exit(main())
