"""The HTTP servers' own floor: CPU per request of a trivial app that reads the body and answers a fixed JSON, under
uvicorn (httptools + uvloop, as `vggserve serve` runs its front ends) and, where granian is installed, under
granian's ASGI and RSGI interfaces. Does another server make a front end's HTTP layer cheaper?

    python3 benchmarks/server_floor.py                        # 3 rounds of 20,000 requests, 8 connections
    python3 benchmarks/server_floor.py --servers uvicorn      # granian not installed: uvicorn alone

Each server runs in a child process with one worker (granian: one worker, one runtime thread); a raw asyncio client
in this process keeps --connections keep-alive connections busy, one request in flight each (a 2,000-byte POST to
/classify). The figure is the server's CPU time (user + system, every thread of the process and its children, from
/proc) over the measured requests, after a warm-up, divided by their number. On a machine of few cores the client
competes with the server; compare servers within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from serve_saturation import process_tree_cpu  # noqa: E402
from vggserve.testing.servers import free_port  # noqa: E402

BODY = b'{"predictions":[{"index":1,"label":"goldfish","probability":0.5}]}'

APPS = '''
BODY = %r
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


class RSGI:
    async def __rsgi__(self, scope, protocol):
        await protocol()
        protocol.response_bytes(200, [("content-type", "application/json")], BODY)


rsgi = RSGI()
''' % BODY

SERVERS = {
    "uvicorn": lambda port: [sys.executable, "-m", "uvicorn", "floor_apps:asgi", "--port", str(port), "--http",
                             "httptools", "--loop", "uvloop", "--log-level", "warning", "--no-access-log"],
    "granian-asgi": lambda port: [sys.executable, "-m", "granian", "--interface", "asgi", "--port", str(port),
                                  "--workers", "1", "--runtime-threads", "1", "--no-ws", "--log-level", "warning",
                                  "floor_apps:asgi"],
    "granian-rsgi": lambda port: [sys.executable, "-m", "granian", "--interface", "rsgi", "--port", str(port),
                                  "--workers", "1", "--runtime-threads", "1", "--no-ws", "--log-level", "warning",
                                  "floor_apps:rsgi"],
}


async def _connection(port: int, count: int, payload: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (b"POST /classify HTTP/1.1\r\nHost: floor\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n"
               % len(payload)) + payload
    for _ in range(count):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the server answered {head[:40]!r}")
        await reader.readexactly(len(BODY))
    writer.close()


def drive(port: int, requests: int, connections: int) -> None:
    payload = os.urandom(2000)
    per = max(1, requests // connections)

    async def run() -> None:
        await asyncio.wait_for(asyncio.gather(*(_connection(port, per, payload) for _ in range(connections))), 600)

    asyncio.run(run())


def measure(name: str, folder: Path, requests: int, connections: int, rounds: int) -> list[tuple[float, float]]:
    """[(CPU ms per request, requests/s)] per round of server `name`."""
    port = free_port()
    proc = subprocess.Popen(SERVERS[name](port), cwd=folder, env={**os.environ, "PYTHONPATH": str(folder)})
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        drive(port, max(500, requests // 10), connections)  # warm-up
        out = []
        for _ in range(rounds):
            cpu0, t0 = sum(process_tree_cpu(proc.pid).values()), time.perf_counter()
            drive(port, requests, connections)
            cpu1, wall = sum(process_tree_cpu(proc.pid).values()), time.perf_counter() - t0
            out.append((1000 * (cpu1 - cpu0) / requests, requests / wall))
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> int:
    import importlib.util

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default="uvicorn,granian-asgi,granian-rsgi")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    names = [s for s in args.servers.split(",") if s]
    unknown = [s for s in names if s not in SERVERS]
    if unknown:
        raise SystemExit(f"server_floor: unknown server {', '.join(unknown)} (known: {', '.join(SERVERS)})")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "floor_apps.py").write_text(APPS)
        for name in names:
            if name.startswith("granian") and importlib.util.find_spec("granian") is None:
                print(f"{name:13s} skipped: granian is not installed (pip install granian)")
                continue
            rounds = measure(name, folder, args.requests, args.connections, args.rounds)
            ms = [r[0] for r in rounds]
            print(f"{name:13s} {statistics.median(ms):.3f} ms CPU per request (rounds "
                  f"{', '.join(f'{x:.3f}' for x in ms)}), {statistics.median(r[1] for r in rounds):,.0f} requests/s",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
