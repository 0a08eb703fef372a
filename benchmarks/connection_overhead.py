"""The front end's connection and app together, in process: CPU per one-image request fed to the HTTP protocol the
service's uvicorn runs (`web.connection.GuardedProtocol`, as `hosting.uvicorn_config` makes it) over a transport
that keeps what is written, no socket, link or decode (an instant backend).

    python benchmarks/connection_overhead.py                          # this checkout: raw, multipart, v2, health
    python benchmarks/connection_overhead.py --tree /path/to/other    # another checkout, for a before/after

Between `app_overhead.py` (the app alone) and `frontend_overhead.py` (sockets, a client process): what the
connection adds to the app (parsing, the response cycle, the task, the bytes of the answer), without the noise of
a second process on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_overhead import cpu_ms_per_call  # noqa: E402 - the same timing of one call after another

HERE = Path(__file__).resolve().parent
ROUTES = ("raw", "multipart", "v2", "health")


class Transport(asyncio.Transport):
    """A transport that keeps the answers' bytes and wakes a waiter on each write."""

    def __init__(self):
        super().__init__()
        self.written: list[bytes] = []
        self.waiter = None
        self.closing = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data) -> None:
        self.written.append(bytes(data))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def requests_for(jpeg: bytes) -> dict[str, bytes]:
    """The bytes of one keep-alive request of each route."""
    boundary = b"b0undary"
    multipart = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n'
                 b"Content-Type: image/jpeg\r\n\r\n" + jpeg + b"\r\n--" + boundary + b"--\r\n")
    header = (b'{"inputs":[{"name":"image","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":%d}}],'
              b'"outputs":[{"name":"probabilities","parameters":{"classification":5}}]}' % (4 + len(jpeg)))
    bodies = {"raw": (b"/classify", b"image/jpeg", jpeg, b""),
              "multipart": (b"/classify", b"multipart/form-data; boundary=" + boundary, multipart, b""),
              "v2": (b"/v2/models/vgg16/infer", b"application/octet-stream",
                     header + struct.pack("<I", len(jpeg)) + jpeg,
                     b"Inference-Header-Content-Length: %d\r\n" % len(header))}
    return {"health": b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", **{
        name: b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
            path, kind, len(body), extra, body) for name, (path, kind, body, extra) in bodies.items()}}


async def measure(route: str, requests: int, rounds: int) -> tuple[list[float], dict]:
    from PIL import Image
    from uvicorn.server import ServerState

    from vggserve.serving.app import create_app
    from vggserve.serving.hosting import uvicorn_config
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.processes.frontend import FrontendHeaderMiddleware
    from vggserve.serving.service import Service
    from vggserve.serving.settings import Settings
    from vggserve.testing.backends import InstantBackend

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 120, 200)).save(buffer, "JPEG")
    request = requests_for(buffer.getvalue())[route]
    settings = Settings(devices=("cpu",), http_workers=2, max_queue=4096)
    metrics = Metrics()
    service = Service(settings, backend=InstantBackend(settings, metrics), metrics=metrics)
    app = create_app(settings, service=service)
    app.add_middleware(FrontendHeaderMiddleware, value="1")
    config = uvicorn_config(app, "warning", False)
    config.load()
    loop = asyncio.get_running_loop()
    transport = Transport()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    protocol.connection_made(transport)
    statuses: dict[str, int] = {}

    async def one() -> None:
        transport.waiter = loop.create_future()
        protocol.data_received(request)
        await transport.waiter
        status = transport.written[0][9:12].decode()
        statuses[status] = statuses.get(status, 0) + 1
        transport.written.clear()
        await asyncio.sleep(0)  # the request's last steps (its task's end)

    async with app.router.lifespan_context(app):
        measured = await cpu_ms_per_call(one, requests, rounds, statuses.clear)
    protocol.connection_lost(None)
    return measured, statuses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--route", choices=(*ROUTES, "all"), default="all")
    p.add_argument("--requests", type=int, default=3000, help="requests per round (default 3000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median is printed (default 5)")
    p.add_argument("--tree", default=str(HERE.parent), help="the checkout whose vggserve to import (default: this)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import uvloop

    for route in ROUTES if args.route == "all" else (args.route,):
        rounds, statuses = uvloop.run(measure(route, args.requests, args.rounds))
        print(f"connection + app, {route}: {statistics.median(rounds):.3f} ms CPU per request, least "
              f"{min(rounds):.3f} (rounds "
              f"{', '.join(f'{r:.3f}' for r in rounds)}), statuses {statuses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
