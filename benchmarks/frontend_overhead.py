"""An HTTP front end's own CPU per request, with the decode, the engine and the model out of the picture.

    python benchmarks/frontend_overhead.py                       # every route, 4000 requests each
    python benchmarks/frontend_overhead.py --route classify --requests 10000 --profile /tmp/fe.prof

The server is what a front-end process of `vggserve serve --http-workers N` runs (the app of `create_app` with its
middlewares, the front end's X-Vggserve-Frontend header, prometheus_client's multiprocess metrics, uvicorn with
the service's connection protocol) in a child process, with `vggserve.testing.backends.InstantBackend` in place of
the link to the engine: `prepare` decodes nothing (`--hop`: it still goes through a thread, as a front end's decode
does) and every image is answered at once. A raw-HTTP client in this process keeps `--concurrency` requests in
flight on keep-alive connections; the figure is the child's CPU time (user + system, every thread, from /proc)
over `--requests` requests after a warm-up, divided by their number. Routes:

    health            GET /health/live (the HTTP stack's floor)
    classify          POST /classify, the image as the raw body (Content-Type: image/jpeg)
    classify-form     POST /classify, the image as the multipart field `file`
    v2                POST /v2/models/vgg16/infer, the image as binary tensor data, classification of 5

`--profile FILE` writes the child's cProfile (pstats) over the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SERVER = """
import os, socket, sys, tempfile, signal
from vggserve.serving.metrics import Metrics, multiprocess_metrics
from vggserve.serving.settings import Settings

with multiprocess_metrics(tempfile.mkdtemp(prefix="fe-overhead-")):
    from vggserve.serving.app import create_app
    from vggserve.serving.hosting import uvicorn_config, listening_socket
    from vggserve.serving.processes.frontend import FrontendHeaderMiddleware
    from vggserve.serving.service import Service
    from vggserve.serving.web.drain import DrainingServer
    from vggserve.testing.backends import InstantBackend

    settings = Settings(port=PORT, devices=("cpu",), http_workers=2, max_queue=4096)
    metrics = Metrics(multiprocess=True)
    service = Service(settings, multiprocess=True, backend=InstantBackend(settings, metrics, hop=HOP),
                      metrics=metrics)
    app = create_app(settings, service=service)
    app.add_middleware(FrontendHeaderMiddleware, value=str(os.getpid()))
    server = DrainingServer(uvicorn_config(app, "warning", False), service.drain)
    sock = listening_socket("127.0.0.1", PORT)
    PROFILE_SETUP
    server.run(sockets=[sock])
    PROFILE_DUMP
"""

PROFILE_SETUP = """import cProfile
    profiler = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *a: profiler.enable())
    signal.signal(signal.SIGUSR2, lambda *a: profiler.disable())"""
PROFILE_DUMP = "profiler.dump_stats(PROFILE_FILE)"

ROUTES = ("health", "classify", "classify-form", "v2")


def request_for(route: str, image: bytes) -> tuple[str, str, bytes, dict]:
    """(method, path, body, headers) of one request of `route`."""
    if route == "health":
        return "GET", "/health/live", b"", {}
    if route == "classify":
        return "POST", "/classify", image, {"content-type": "image/jpeg"}
    if route == "classify-form":
        boundary = uuid.uuid4().hex
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n'
                "Content-Type: image/jpeg\r\n\r\n").encode() + image + f"\r\n--{boundary}--\r\n".encode()
        return "POST", "/classify", body, {"content-type": f"multipart/form-data; boundary={boundary}"}
    header = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4 + len(image)}}],
                         "outputs": [{"name": "probabilities", "parameters": {"classification": 5}}]}).encode()
    body = header + len(image).to_bytes(4, "little") + image
    return "POST", "/v2/models/vgg16/infer", body, {"content-type": "application/octet-stream",
                                                     "inference-header-content-length": str(len(header))}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, every thread."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, request: tuple, count: int, concurrency: int) -> dict:
    from vggserve.loadtest.rawhttp import RawConnection, parse_url

    host, port, _ = parse_url(url)
    method, path, body, headers = request
    conns = [RawConnection(host, port, timeout_s=60) for _ in range(concurrency)]
    statuses: dict[int, int] = {}
    left = count

    async def loop(conn):
        nonlocal left
        while left > 0:
            left -= 1
            status, _, _ = await conn.request(method, path, body, headers)
            statuses[status] = statuses.get(status, 0) + 1

    try:
        await asyncio.gather(*(loop(c) for c in conns))
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return statuses


def measure(server, route: str, image: bytes, requests: int, concurrency: int, profile: bool) -> tuple[float, dict]:
    """(the server's CPU ms per request over `requests` requests of `route`, their statuses)."""
    import signal

    request = request_for(route, image)
    asyncio.run(_load(server.url, request, max(200, requests // 10), concurrency))  # warm-up
    if profile:
        server.proc.send_signal(signal.SIGUSR1)
    cpu0, started = process_cpu_s(server.proc.pid), time.perf_counter()
    statuses = asyncio.run(_load(server.url, request, requests, concurrency))
    cpu1, wall = process_cpu_s(server.proc.pid), time.perf_counter() - started
    if profile:
        server.proc.send_signal(signal.SIGUSR2)
    return 1000 * (cpu1 - cpu0) / requests, {"statuses": statuses, "requests_per_s": requests / wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--route", choices=(*ROUTES, "all"), default="all")
    p.add_argument("--requests", type=int, default=4000, help="measured requests per route and round (default 4000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per route; the median is printed (default 3)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    p.add_argument("--hop", action="store_true", help="prepare through a thread, as a front end's decode goes")
    p.add_argument("--image", default=None, help="file to send (default: a 64x48 JPEG; it is never decoded)")
    p.add_argument("--profile", default=None, metavar="FILE", help="the server's cProfile over the last round")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from vggserve.testing.servers import ServerProcess

    sys.path.insert(0, str(HERE))
    import serve_saturation

    image = Path(args.image).read_bytes() if args.image else serve_saturation.synthetic_jpeg(64, 48)
    code = SERVER.replace("HOP", str(args.hop))
    if args.profile:
        code = code.replace("PROFILE_SETUP", PROFILE_SETUP).replace("PROFILE_DUMP", PROFILE_DUMP).replace(
            "PROFILE_FILE", repr(str(Path(args.profile).resolve())))
    else:
        code = code.replace("PROFILE_SETUP", "").replace("PROFILE_DUMP", "")
    results = {}
    with ServerProcess.python_code(code) as server:
        server.wait_ready(60)
        for route in ROUTES if args.route == "all" else (args.route,):
            rounds = [measure(server, route, image, args.requests, args.concurrency,
                              bool(args.profile) and i == args.rounds - 1) for i in range(args.rounds)]
            ms = [r[0] for r in rounds]
            results[route] = {"cpu_ms_per_request": statistics.median(ms), "rounds": ms, **rounds[-1][1]}
            print(f"{route:14s} {statistics.median(ms):.3f} ms CPU per request (rounds "
                  f"{', '.join(f'{x:.3f}' for x in ms)}), {rounds[-1][1]['requests_per_s']:.0f} requests/s, "
                  f"statuses {rounds[-1][1]['statuses']}", flush=True)
        server.signal()
        server.wait(30)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
