"""The front end's app alone: CPU per POST /classify (raw 64x48 JPEG; or v2 infer) with the ASGI app called in this
process, one request after another, no server, socket, link or decode.

    python benchmarks/app_overhead.py                          # this checkout
    python benchmarks/app_overhead.py --tree /path/to/other    # another checkout's vggserve, for a before/after
    python benchmarks/app_overhead.py --route v2               # POST /v2/models/vgg16/infer, one image

The app is the one a front-end process serves (`create_app` with its middlewares and X-Vggserve-Frontend) over
`vggserve.testing.backends.InstantBackend`; the scope carries what the service's connection puts in it
(web.connection: the body is in; the callback for the client's going, which a checkout without it ignores). With no
socket between client and server and no other process, this is the least noisy figure on a shared machine; it
leaves out what `frontend_overhead.py` (uvicorn, the sockets) and `serve_host_floor.py` (the link, the decode) add.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="requests per round (default 3000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median is printed (default 5)")
    p.add_argument("--tree", default=str(HERE.parent), help="the checkout whose vggserve to import (default: this)")
    p.add_argument("--route", choices=("classify", "v2"), default="classify",
                   help="POST /classify with the raw JPEG (default), or POST /v2/models/vgg16/infer with it as binary "
                        "tensor data (frontend_overhead.py's request)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import uvloop

    rounds, statuses = uvloop.run(measure(args.requests, args.rounds, args.route))
    median = statistics.median(rounds)
    what = "POST /classify raw" if args.route == "classify" else "POST /v2/models/vgg16/infer"
    print(f"app overhead, {what}: {median:.3f} ms CPU per request (rounds "
          f"{', '.join(f'{r:.3f}' for r in rounds)}), statuses {statuses}")
    if args.json:
        Path(args.json).write_text(json.dumps({"route": args.route, "cpu_ms_per_request": median, "rounds": rounds,
                                               "statuses": statuses}, indent=2) + "\n")
    return 0


async def measure(requests: int, rounds: int, route: str = "classify") -> tuple[list[float], dict]:
    from PIL import Image

    from vggserve.serving.app import create_app
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.processes.frontend import FrontendHeaderMiddleware
    from vggserve.serving.service import Service
    from vggserve.serving.settings import Settings
    from vggserve.testing.backends import InstantBackend

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 120, 200)).save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    settings = Settings(devices=("cpu",), http_workers=2, max_queue=4096)
    metrics = Metrics()
    service = Service(settings, backend=InstantBackend(settings, metrics), metrics=metrics)
    app = create_app(settings, service=service)
    app.add_middleware(FrontendHeaderMiddleware, value="1")
    sys.path.insert(0, str(HERE))
    from frontend_overhead import request_for

    _, path, body, wanted = request_for(route, jpeg)
    headers = [(b"host", b"127.0.0.1"), *((k.encode(), v.encode()) for k, v in wanted.items()),
               (b"content-length", b"%d" % len(body))]
    statuses: dict[int, int] = {}
    wishes: list = []

    def when_gone(callback):
        wishes.append(callback)
        return wishes.clear

    async def one() -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": list(headers), "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                 "vggserve.body_ready": lambda: True, "vggserve.client_gone": when_gone}
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            if message["type"] == "http.response.start":
                statuses[message["status"]] = statuses.get(message["status"], 0) + 1

        await app(scope, receive, send)

    async with app.router.lifespan_context(app):
        measured = await cpu_ms_per_call(one, requests, rounds, statuses.clear)
    return measured, statuses


async def cpu_ms_per_call(one, requests: int, rounds: int, after_warm_up) -> list[float]:
    """CPU ms per `await one()` in each of `rounds` rounds of `requests` calls, after a warm-up of a tenth as many
    (at least 100) and then `after_warm_up()`."""
    for _ in range(max(100, requests // 10)):
        await one()
    after_warm_up()
    measured = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(requests):
            await one()
        measured.append(1000 * (time.process_time() - started) / requests)
    return measured


if __name__ == "__main__":
    sys.exit(main())
