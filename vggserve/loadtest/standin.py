"""A stand-in for the classification service, to try and test the harness without a model.

It speaks the service's HTTP contract (POST /classify with a raw or multipart image, /metrics with the agreed
vggserve_* names, /health/ready), and imitates a batching device: requests wait in a bounded queue, a worker
takes up to `max_batch` of them at a time and "runs" the batch for `delay_s + per_image_s * size` seconds.
A full queue answers 429 with Retry-After; a request past its deadline 504; a body over `max_bytes` 413.
Setting `reject = True` on the live config makes every /classify answer 429.

    python -m vggserve.loadtest.standin --port 8001 --delay-ms 20 --max-batch 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..serving.metrics import Metrics


@dataclass
class StandinConfig:
    """How the stand-in behaves; fields may be changed while it runs (e.g. `reject`)."""

    delay_s: float = 0.01
    per_image_s: float = 0.0
    max_batch: int = 8
    queue_limit: int = 256
    deadline_s: float = 30.0
    max_bytes: int = 10 * 1024 * 1024
    reject: bool = False


def _error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


class Standin:
    """The app, its batch worker and what it has seen (`received` counts every /classify request)."""

    def __init__(self, config: StandinConfig | None = None):
        self.config = config or StandinConfig()
        self.metrics = Metrics()  # the service's own metric names, so the two cannot drift apart
        self.received = 0
        self.queue: asyncio.Queue | None = None
        self.app = self._build_app()

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app):
            self.queue = asyncio.Queue()
            worker = asyncio.create_task(self._batch_worker())
            self.metrics.ready.set(1)
            yield
            self.metrics.ready.set(0)
            worker.cancel()

        app = FastAPI(title="vggserve stand-in", lifespan=lifespan)
        app.post("/classify")(self.classify)
        app.get("/metrics")(self.metrics_text)
        app.get("/health/ready")(self.ready)
        return app

    async def ready(self):
        return {"ready": True}

    async def metrics_text(self):
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def classify(self, request: Request):
        """Admit, queue, wait for the batch; every answer is counted in vggserve_requests_total."""
        self.received += 1
        response = await self._classify(request)
        self.metrics.requests.labels("/classify", str(response.status_code)).inc()
        return response

    async def _classify(self, request: Request):
        start = time.perf_counter()
        body = await self._body(request)
        config = self.config
        if len(body) > config.max_bytes:
            return _error(413, "too_large", f"image is {len(body)} bytes, limit {config.max_bytes}")
        if not body:
            return _error(400, "invalid_image", "empty body")
        if config.reject or self.queue.qsize() >= config.queue_limit:
            reason = "forced" if config.reject else "queue_full"
            self.metrics.rejected.labels(reason).inc()
            return _error(429, "overloaded", "queue is full", {"Retry-After": "1"})
        self.metrics.preprocess_seconds.observe(time.perf_counter() - start)
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((time.perf_counter(), future))
        self.metrics.queue_length.set(self.queue.qsize())
        try:
            timing = await asyncio.wait_for(asyncio.shield(future), config.deadline_s)
        except asyncio.TimeoutError:
            self.metrics.timeouts.inc()
            return _error(504, "deadline_exceeded", f"no result within {config.deadline_s} s")
        total = time.perf_counter() - start
        self.metrics.request_seconds.observe(total)
        return JSONResponse({"request_id": uuid.uuid4().hex, "model": "standin",
                             "predictions": [{"index": 0, "label": "stand-in", "score": 1.0}],
                             "timing_ms": {**timing, "total": total * 1000.0}})

    @staticmethod
    async def _body(request: Request) -> bytes:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            upload = form.get("file")
            return await upload.read() if hasattr(upload, "read") else b""
        return await request.body()

    async def _batch_worker(self) -> None:
        """Take what is waiting (up to max_batch), sleep for the batch's 'device time', answer all of it."""
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.config.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            self.metrics.queue_length.set(self.queue.qsize())
            started = time.perf_counter()
            for admitted, _ in batch:
                self.metrics.queue_seconds.observe(started - admitted)
            self.metrics.batch_size.observe(len(batch))
            await asyncio.sleep(self.config.delay_s + self.config.per_image_s * len(batch))
            device = time.perf_counter() - started
            self.metrics.inference_seconds.observe(device)
            for admitted, future in batch:
                if not future.done():
                    future.set_result({"queue": (started - admitted) * 1000.0, "preprocess": 0.0,
                                       "inference": device * 1000.0})


class StandinServer:
    """Runs a Standin with uvicorn on 127.0.0.1 (a free port) in a background thread; a context manager."""

    def __init__(self, config: StandinConfig | None = None):
        import uvicorn

        self.standin = Standin(config)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.standin.app, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> StandinConfig:
        return self.standin.config

    def __enter__(self) -> "StandinServer":
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("stand-in server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        self._socket.close()


def main(argv=None) -> None:
    """Serve the stand-in in the foreground (for trying the harness by hand)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="default 8001; 0 takes a free port")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="device time per batch (ms)")
    parser.add_argument("--per-image-ms", type=float, default=0.0, help="extra device time per image (ms)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--queue-limit", type=int, default=256, help="429 beyond this many waiting")
    parser.add_argument("--reject", action="store_true", help="answer every /classify with 429")
    args = parser.parse_args(argv)
    config = StandinConfig(delay_s=args.delay_ms / 1000.0, per_image_s=args.per_image_ms / 1000.0,
                           max_batch=args.max_batch, queue_limit=args.queue_limit, reject=args.reject)
    sock = listening_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"vggserve stand-in: listening on http://{host}:{port} (Ctrl+C to stop)", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(Standin(config).app, log_level="warning"))
    server.run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: a free one), or SystemExit with a one-line reason and fix.
    Connections that come before uvicorn serves wait in its backlog, so the address can be announced at once."""
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    backlog=2048)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise SystemExit(f"vggserve stand-in: cannot listen on {host}:{port}: {reason}: "
                         "choose another --port (0 takes a free one) or --host") from None
    return sock


if __name__ == "__main__":
    main()
