"""The service with `--lanes 1` against `--lanes N`, and by `--max-wait-ms`, at light and moderate load (issues 24,
25, 26): `vggserve serve` on one GPU, then `vggserve loadtest` in closed loop at each `--concurrency`, for each lane
count and wait in turn.

    python benchmarks/serve_lanes.py --weights W --precision fp16 --lanes 1,2 --concurrency 2,8,32 --json out.json

The images are 500x375 q90 JPEGs (benchmarks/device_decode.py's photo-like pictures); the service decodes them on
the GPU (`--decode gpu`) so that the host's decode does not hide the engine. Per lane count and load level:
images/s, p50/p95 latency and the mean batch (from the metrics' vggserve_batch_size).
"""

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server, timeout_s: float = 300) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and server.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    if server.poll() is not None:
        raise SystemExit(f"the server exited: {server.stderr.read()[-2000:]}")
    raise SystemExit(f"the server at {url} did not become ready in {timeout_s:.0f} s")


def batch_sums(url: str) -> tuple[float, float]:
    """(images, batches) so far, from the vggserve_batch_size histogram."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("vggserve_batch_size_sum"):
            total += float(line.split()[-1])
        elif line.startswith("vggserve_batch_size_count"):
            count += float(line.split()[-1])
    return total, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--lanes", default="1,2")
    ap.add_argument("--concurrency", default="2,8,32")
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--decode", default="gpu")
    ap.add_argument("--max-wait-ms", default="0", help="the server's --max-wait-ms, comma-separated: each with each "
                    "lane count")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from PIL import Image

    from device_decode import photo_like

    folder = tempfile.mkdtemp(prefix="lanes-images-")
    for i in range(64):
        buf = io.BytesIO()
        Image.fromarray(photo_like(500, 375, i)).save(buf, "JPEG", quality=90)
        with open(os.path.join(folder, f"{i:03d}.jpg"), "wb") as f:
            f.write(buf.getvalue())
    rows = []
    runs = [(int(n), float(w)) for n in args.lanes.split(",") for w in args.max_wait_ms.split(",")]
    for lanes, wait in runs:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "vggserve", "serve", "--weights", args.weights, "--device",
                                   args.device, "--port", str(port), "--precision", args.precision, "--lanes", str(lanes),
                                   "--decode", args.decode, "--max-batch-size", str(args.max_batch_size),
                                   "--max-wait-ms", str(wait)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(url, server)
            for c in (int(v) for v in args.concurrency.split(",")):
                out = tempfile.mkdtemp(prefix="lanes-load-")
                before = batch_sums(url)
                subprocess.run([sys.executable, "-m", "vggserve", "loadtest", "--url", url, "--images", folder,
                                "--mode", "closed", "--concurrency", str(c), "--duration", str(args.duration),
                                "--warmup", "2", "--output", out, "--quiet"], check=True,
                               stdout=subprocess.DEVNULL)
                with open(os.path.join(out, "summary.json")) as f:
                    level = json.load(f)["levels"][0]
                after = batch_sums(url)
                batches = after[1] - before[1]
                row = {"lanes": lanes, "max_wait_ms": wait, "concurrency": c, "images_per_s": level.get("throughput_ips"),
                       "p50_ms": level.get("latency_p50_ms"), "p95_ms": level.get("latency_p95_ms"),
                       "errors": level.get("errors"),
                       "mean_batch": round((after[0] - before[0]) / batches, 2) if batches else None}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"precision": args.precision, "decode": args.decode, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
