"""An HTTP front-end process (`vggserve serve --http-workers N`, N > 1): the same FastAPI app under uvicorn, on the
listening socket the engine process bound and handed down, but with no device workers of its own. It parses
requests, enforces the limits, decodes and centre-crops images in its threads, and sends the uint8 crops to the
engine process, which batches them with the other front ends' images (vggserve.serving.processes.engine_link).

Started by the engine process (vggserve.serving.processes.frontends) as `python -m vggserve.serving.processes.frontend`, with a
pickled FrontendSpec on its standard input.
"""

import logging
import os
import pickle
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..app import create_app
from ..hosting import configure_logging, uvicorn_config
from ..web.drain import DrainingServer
from .engine_link import EngineClient
from ..protocols.errors import ApiError, unavailable
from ..service import Service
from ..settings import Settings

log = logging.getLogger("vggserve.serving")

HEADER = "X-Vggserve-Frontend"  # on every response: the pid of the front-end process that answered


@dataclass(frozen=True)
class FrontendSpec:
    """What a front-end process is told at start."""

    settings: Settings
    fd: int  # the inherited listening socket
    address: str  # the engine's Unix socket
    authkey: bytes
    index: int
    log_level: str = "info"
    access_log: bool = False


class FrontendService(Service):
    """The service of a front-end process: readiness, admission and results come from the engine process."""

    sends_pixels = True

    def __init__(self, settings: Settings, address: str, authkey: bytes, index: int):
        super().__init__(settings, multiprocess=True)
        self.index = index
        self.engine = EngineClient(address, authkey, settings.frontend_queue_share, self.metrics, index)
        self.queue = self.engine.queue

    def start(self) -> None:
        """Start the decoding threads and connect to the engine."""
        self.stopping = False
        self.pool = ThreadPoolExecutor(self.settings.preprocess_threads, thread_name_prefix="vggserve-preprocess")
        self.engine.connect()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopping = True
        self.engine.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def serving_readiness(self) -> tuple[bool, str, str]:
        state = self.engine.state
        if state is None:
            return False, "not_ready", "waiting for the engine process"
        return tuple(state["ready"])

    def liveness(self) -> tuple[bool, str]:
        state = self.engine.state
        return (True, "serving") if state is None else tuple(state["live"])

    def admit(self) -> None:
        state = self.engine.state
        if state is None:
            raise unavailable("not_ready", "the engine process has not answered yet; retry in a moment")
        refusal = state["refusal"]
        if refusal is not None:
            raise ApiError(refusal.status, refusal.code, refusal.message, refusal.headers)

    def model_info(self) -> dict:
        state = self.engine.state
        return (state or {}).get("info") or {}

    async def describe(self) -> dict:
        """The engine's metadata, and which front end answered."""
        metadata = await self.engine.call("metadata")
        metadata["frontend"] = {"index": self.index, "pid": os.getpid()}
        return metadata


class FrontendHeaderMiddleware:
    """Pure ASGI middleware: names the answering process on every response (for debugging load spreading)."""

    def __init__(self, app, value: str):
        self.app = app
        self.header = (HEADER.lower().encode(), value.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, send_named)


def serve(spec: FrontendSpec) -> int:
    """Serve on the inherited socket until drained (0) or the engine goes away (1)."""
    configure_logging(spec.log_level)
    sock = socket.socket(fileno=spec.fd)
    service = FrontendService(spec.settings, spec.address, spec.authkey, spec.index)
    app = create_app(spec.settings, service=service)
    app.add_middleware(FrontendHeaderMiddleware, value=str(os.getpid()))
    server = DrainingServer(uvicorn_config(app, spec.log_level, spec.access_log), service.drain)
    service.engine.on_lost = server.fail
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
