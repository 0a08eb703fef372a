"""Service throughput at saturation next to the engine's own, at the same batch size.

    python benchmarks/serve_saturation.py --weights vgg16.safetensors --device gpu --max-batch-size 32
    python benchmarks/serve_saturation.py --weights tiny.safetensors --device cpu --max-batch-size 4 --duration 5

1. Engine: loads VGG16 on each device of --device (a comma list is one server worker per device) and times
   `VGG16.logits` on random (B, 3, 224, 224) batches for --engine-seconds, one batch at a time as `vggserve
   bench` does: images/s at batch B, summed over devices (the issue's reference). Then, for half as long, uint8
   crops streamed through `VGG16.submit` with two batches in flight: the engine's best on the service's own
   input, reported beside it. The models are closed before the server starts.
2. Service: starts `python -m vggserve serve` on 127.0.0.1 with --max-batch-size B (or uses --url), waits for
   /health/ready, then --client-procs processes keep --concurrency requests in flight (POST /classify, raw
   JPEG body; or POST /classify/batch with --files-per-request N) for --warmup + --duration seconds.
   --client raw (the default) sends with vggserve.loadtest.rawhttp, a bare asyncio HTTP/1.1 client (the request
   bytes built once; ~25-65 us of CPU per request against httpx's ~500 us), so the load generator leaves the
   cores to the server's front ends; --client httpx sends with the harness's httpx pools (needed for https).
   A 200 counts only with predictions in it (every file's, for /classify/batch).
   --preprocess-threads, --preprocess-procs, --http-workers and --resize-on are passed to the server (default:
   the server's defaults).
   images/s counts the images classified in requests completed within the --duration window.
   --image-mix photo sends the phone-photo mix instead of one image: of every 8 requests one is a 12 MP JPEG, one
   a 2 MP JPEG and six are 500x375 (vggserve.decoding.corpus's photo-like pictures); --decode is passed to the
   server (exact or fast; gpu or auto, with --decode-group N passed too: the mean batches per device decode in the
   window is printed, from /metrics). CPU per image is measured over the window from /proc: the server's engine
   process, its other processes (HTTP front ends) and the load generator's processes; and the front ends' decode
   time (wall seconds in their threads, from /metrics); and the engine process's busiest threads (one near a full
   core is that process's ceiling: its GIL, or a driver thread spinning while it waits for the device). --gil also
   samples each engine process's GIL holders with py-spy in the window (gil_sampling.py): the share of the time
   its GIL was held, by thread and function; near 1.0 is a process bound by its GIL.
   --precision is passed to the engine timing and to the server where this build's model accepts it.
3. Prints both, their ratios (the target is >= 0.90 of the one-batch-at-a-time figure), the mean batch size the server formed in the window (from
   /metrics) and client latency percentiles, with the client; --json FILE writes the same as JSON. Exit status
   0; with --require R, 1 when the ratio is below R.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import multiprocessing as mp
import sys
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gil_sampling  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default=None, help="weights file (default: vggserve's lookup)")
    p.add_argument("--device", default="gpu", help="device spec or comma list, as for `vggserve serve` (default gpu)")
    p.add_argument("--max-batch-size", type=int, default=32, help="batch size of the engine and the server")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="server's --max-wait-ms (default 5)")
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds of load (default 30)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring (default 5)")
    p.add_argument("--engine-seconds", type=float, default=10.0, help="seconds timing the engine (default 10)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="requests kept in flight (default 4 x batch size x devices)")
    p.add_argument("--client-procs", type=int, default=None, help="load-generating processes (default: cores/2, 1..8)")
    p.add_argument("--preprocess-threads", type=int, default=None, help="server's --preprocess-threads")
    p.add_argument("--preprocess-procs", type=int, default=None,
                   help="server's --preprocess-procs (worker processes decoding images; default: the server's)")
    p.add_argument("--http-workers", default=None, metavar="N",
                   help="server's --http-workers (HTTP front-end processes, or `auto`; default: the server's, 1)")
    p.add_argument("--resize-on", choices=("device", "cpu"), default=None,
                   help="server's --resize-on (default: the server's, device)")
    p.add_argument("--files-per-request", type=int, default=1,
                   help="images per request: 1 posts to /classify, more to /classify/batch (default 1)")
    p.add_argument("--image", default=None, help="image file to send (default: a synthetic 500x375 JPEG)")
    p.add_argument("--image-mix", choices=("single", "photo"), default="single",
                   help="single: --image every time; photo: 1 in 8 a 12 MP JPEG, 1 in 8 a 2 MP one, the rest 500x375")
    p.add_argument("--decode", choices=("exact", "fast", "gpu", "auto"), default=None,
                   help="server's --decode (default: the server's, auto: gpu on a GPU; gpu: the front ends send JPEGs "
                        "compressed, the engine decodes them on its device)")
    p.add_argument("--decode-group", type=int, default=None, metavar="N",
                   help="server's --decode-group (with --decode gpu or auto: batches per device decode at most; "
                        "default: the server's, 4)")
    p.add_argument("--precision", default=None,
                   help="engine precision (fp32, fp16, ...), where this build's model takes a precision option")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="load client: raw (vggserve.loadtest.rawhttp, little CPU per request; http only) or "
                        "httpx (the harness's client) (default raw)")
    p.add_argument("--url", default=None, help="drive this running server instead of starting one")
    p.add_argument("--lanes", type=int, default=None, metavar="N",
                   help="the server's --lanes (forward passes at once per device; default: the server's, 1)")
    p.add_argument("--skip-engine", action="store_true", help="do not time the engine")
    p.add_argument("--gil", action="store_true",
                   help="sample each engine process's GIL holders with py-spy during the measured window "
                        "(gil_sampling.py; py-spy on PATH, allowed to read other processes)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    p.add_argument("--require", type=float, default=None, help="exit 1 if service/engine is below this ratio")
    return p.parse_args(argv)


def synthetic_jpeg(width: int = 500, height: int = 375) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], axis=-1)
    pixels = np.clip(pixels + rng.integers(-20, 20, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def photo_mix() -> list[bytes]:
    """Eight request bodies: a 12 MP JPEG, six 500x375 ones and a 2 MP one (photo-like, quality 90)."""
    from vggserve.decoding.corpus import photo_like

    def jpeg(width, height, seed):
        buffer = io.BytesIO()
        photo_like(width, height, seed=seed).save(buffer, "JPEG", quality=90)
        return buffer.getvalue()

    small = [jpeg(500, 375, seed) for seed in range(6)]
    return [jpeg(4000, 3000, 100), *small[:3], jpeg(1600, 1200, 101), *small[3:]]


def precision_options(precision: str | None) -> dict:
    """{"precision": p} when VGG16.load takes a precision option, else {} (a note on stderr if one was asked)."""
    import inspect

    from vggserve.model.vgg16 import VGG16

    if precision is None:
        return {}
    if "precision" in inspect.signature(VGG16.load).parameters:
        return {"precision": precision}
    print(f"serve_saturation: this build's VGG16.load has no precision option; --precision {precision} is ignored "
          "(FP32)", file=sys.stderr)
    return {}


def cli_takes(command: str, flag: str) -> bool:
    """Whether `vggserve COMMAND --help` lists `flag`."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "vggserve", command, "--help"], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    return flag in done.stdout


def process_tree_cpu(root: int) -> dict[int, float]:
    """{pid: CPU seconds (user + system) so far} of `root` and every process below it, from /proc."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grown = {root}, True
    while grown:
        below = {pid for pid, (parent, _) in stats.items() if parent in tree} - tree
        grown = bool(below)
        tree |= below
    return {pid: stats[pid][1] for pid in tree if pid in stats}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{thread id: (thread name, CPU seconds so far)} of process `pid`, from /proc (empty if it is gone)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            head, rest = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        threads[int(tid)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / tick)
    return threads


def thread_spent(before: dict, after: dict) -> list[tuple[int, str, float]]:
    """(thread id, name, CPU seconds) each thread of one process spent between two thread_cpu readings (a thread
    born meanwhile: all it has)."""
    return [(tid, name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()]


def busiest_threads(before: dict, after: dict, images: float, top: int = 6) -> list[list]:
    """[[thread name, CPU ms per image], ...] of the `top` threads that spent the most between two thread_cpu
    readings: one thread near 1000 / (ms per image) images/s is a process's ceiling (the GIL, or a driver that
    spins while it waits for the device)."""
    spent = sorted(thread_spent(before, after), key=lambda entry: -entry[2])
    return [[name, round(1000 * seconds / images, 3)] for _, name, seconds in spent[:top]]


def threads_by_name(before: dict, after: dict, images: float) -> list[list]:
    """[[thread name, CPU ms per image], ...], busiest first, of several processes' threads ({pid: thread_cpu(pid)}
    before and after), summed by name: the front ends' event loops, link threads and decoding threads."""
    spent: dict[str, float] = {}
    for pid, threads in after.items():
        for _, name, seconds in thread_spent(before.get(pid, {}), threads):
            spent[name] = spent.get(name, 0.0) + seconds
    return [[name, round(1000 * seconds / images, 3)] for name, seconds in sorted(spent.items(), key=lambda e: -e[1])]


def engine_images_per_second(weights: str, device: str, batch: int, seconds: float,
                             precision: str | None = None) -> tuple[float, str, float]:
    """(images/s of VGG16.logits at `batch` on one device, one batch at a time as `vggserve bench` times it, the
    device's name, images/s of uint8 crops streamed through `submit` with two batches in flight: the engine's
    best on the service's own input), each after one untimed batch."""
    from vggserve.model.vgg16 import VGG16

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    crops = rng.integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    with VGG16.load(weights, device=device, max_batch_size=batch, **precision_options(precision)) as model:
        model.logits(x)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds or done == 0:
            model.logits(x)
            done += batch
        one_at_a_time = done / (time.perf_counter() - started)
        model.submit(crops, "probabilities").result()
        done, started, last = 0, time.perf_counter(), None
        while time.perf_counter() - started < seconds / 2 or done == 0:
            last = model.submit(crops, "probabilities")
            done += batch
        last.result()
        return one_at_a_time, model.device_name, done / (time.perf_counter() - started)


def _client_process(url, bodies, files, connections, start_at, warmup, duration, results, client="raw"):
    results.put(asyncio.run(_drive(url, bodies, files, connections, start_at, warmup, duration, client)))


def multipart_body(body: bytes, files: int) -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data upload of `files` copies of `body` in the field `files`."""
    boundary = uuid.uuid4().hex
    parts = [(f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{i}.jpg"\r\n'
              "Content-Type: image/jpeg\r\n\r\n").encode() + body + b"\r\n" for i in range(files)]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def batch_ok(data: bytes) -> bool:
    """Whether a /classify/batch answer has predictions for every file."""
    try:
        return all("predictions" in x for x in json.loads(data)["results"])
    except (ValueError, KeyError, TypeError):
        return False


@contextlib.asynccontextmanager
async def _raw_senders(url, bodies, files, connections, v2=False):
    """One send() per slot, each on its own rawhttp connection: () -> (status, lower-case headers or None). Slot i
    sends bodies[i], bodies[i + 1], ... in turn (/classify/batch: the first body `files` times; v2: each body as
    one image of POST /v2/models/vgg16/infer, frontend_overhead.py's request)."""
    from vggserve.loadtest.rawhttp import RawConnection, RawHTTPError, parse_url

    host, port, base = parse_url(url)
    if v2:
        from frontend_overhead import request_for

        requests = [request_for("v2", body) for body in bodies]
        path, payloads = base + requests[0][1], [(body, headers) for _, _, body, headers in requests]
        answered = lambda data: b'"outputs"' in data  # noqa: E731
    elif files == 1:
        path, payloads = base + "/classify", [(body, {"content-type": "image/jpeg"}) for body in bodies]
        answered = lambda data: b'"predictions"' in data  # noqa: E731
    else:
        payload, content_type = multipart_body(bodies[0], files)
        path, payloads, answered = base + "/classify/batch", [(payload, {"content-type": content_type})], batch_ok

    def sender(conn, slot):
        turn = slot

        async def send():
            nonlocal turn
            (payload, headers), turn = payloads[turn % len(payloads)], turn + 1
            try:
                status, response_headers, data = await conn.request("POST", path, payload, headers)
            except (RawHTTPError, OSError) as exc:
                return type(exc).__name__, None
            if status == 200 and not answered(data):
                status = "item_error" if files > 1 else "no_predictions"
            return status, response_headers
        return send

    conns = [RawConnection(host, port, timeout_s=120) for _ in range(connections)]
    try:
        yield [sender(conn, slot) for slot, conn in enumerate(conns)]
    finally:
        await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)


@contextlib.asynccontextmanager
async def _httpx_senders(url, bodies, files, connections):
    """As _raw_senders, with the harness's httpx pools of a few connections each (one httpx pool of many scales
    badly)."""
    import httpx

    from vggserve.loadtest.client import ClientPool

    def sender(client, slot):
        turn = slot

        async def send():
            nonlocal turn
            body, turn = bodies[turn % len(bodies)], turn + 1
            try:
                if files == 1:
                    r = await client.post(url + "/classify", content=body, headers={"content-type": "image/jpeg"})
                else:
                    r = await client.post(url + "/classify/batch",
                                          files=[("files", (f"{i}.jpg", body, "image/jpeg")) for i in range(files)])
            except httpx.HTTPError as exc:
                return type(exc).__name__, None
            status = r.status_code
            if status == 200 and files > 1:
                status = 200 if batch_ok(r.content) else "item_error"
            return status, r.headers
        return send

    async with ClientPool(connections, timeout_s=120) as pool:
        yield [sender(pool.for_slot(slot), slot) for slot in range(connections)]


async def _drive(url, bodies, files, connections, start_at, warmup, duration, client="raw") -> dict:
    window_start, end = start_at + warmup, start_at + warmup + duration
    ok, statuses, latencies, frontends = 0, {}, [], {}
    cpu = {}  # this load-generating process's CPU seconds at the window's start and end

    async def loop(send):
        nonlocal ok
        while time.time() < end:
            sent = time.time()
            status, headers = await send()
            done = time.time()
            if window_start <= done < end:
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status == 200:
                    ok += files
                    latencies.append(done - sent)
                    pid = headers.get("x-vggserve-frontend", "-")  # which front-end process answered
                    frontends[pid] = frontends.get(pid, 0) + files

    async def clock():
        await asyncio.sleep(max(0.0, window_start - time.time()))
        cpu["start"] = time.process_time()
        await asyncio.sleep(max(0.0, end - time.time()))
        cpu["end"] = time.process_time()

    senders = {"raw": _raw_senders, "httpx": _httpx_senders, "v2": functools.partial(_raw_senders, v2=True)}[client]
    async with senders(url, bodies, files, connections) as sends:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        await asyncio.gather(clock(), *(loop(send) for send in sends))
    return {"ok": ok, "statuses": statuses, "latencies": latencies, "frontends": frontends,
            "cpu_s": cpu.get("end", 0.0) - cpu.get("start", 0.0)}


def batch_stats(url: str) -> tuple[float, ...]:
    """(images, batches, decode seconds, images decoded, batches decoded on the device, device decodes, the batches'
    device seconds, time.monotonic() of the reading) the server has counted so far, from /metrics."""
    import httpx

    from vggserve.loadtest.metrics import Snapshot

    snapshot = Snapshot.parse(httpx.get(url + "/metrics", timeout=10).text)
    return tuple(snapshot.total(name) or 0.0 for name in ("vggserve_batch_size_sum", "vggserve_batch_size_count",
                                                          "vggserve_preprocess_seconds_sum",
                                                          "vggserve_preprocess_seconds_count",
                                                          "vggserve_device_decode_batches_sum",
                                                          "vggserve_device_decode_batches_count",
                                                          "vggserve_inference_seconds_sum")) + (time.monotonic(),)


def server_preprocessing(url: str) -> dict:
    """The running server's preprocess_threads, preprocess_procs and http_workers, from /metadata (None where it
    does not say)."""
    import httpx

    meta = httpx.get(url + "/metadata", timeout=10).json()
    return {k: meta.get(k) for k in ("preprocess_threads", "preprocess_procs", "http_workers")}


def drive(url: str, bodies: list[bytes], concurrency: int, procs: int, warmup: float, duration: float,
          files: int = 1, client: str = "raw", server_pid: int | None = None, gil: bool = False) -> dict:
    bodies = [bodies] if isinstance(bodies, bytes) else bodies
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 3.0  # every process starts together
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    workers = [ctx.Process(target=_client_process,
                           args=(url, bodies, files, n, start_at, warmup, duration, results, client))
               for n in shares if n]
    for w in workers:
        w.start()
    time.sleep(max(0.0, start_at + warmup - time.time()))
    before, cpu0 = batch_stats(url), process_tree_cpu(server_pid) if server_pid else {}
    threads0 = {pid: thread_cpu(pid) for pid in cpu0}  # every server process's threads: the engine's, the front ends'
    # within the window: py-spy's whole seconds, ending before the load does
    sampler = gil_sampling.GilSampler.start(gil_sampling.engine_pids(server_pid, cpu0), int(0.8 * duration)) \
        if gil and server_pid else None
    time.sleep(max(0.0, start_at + warmup + duration - time.time()))
    after, cpu1 = batch_stats(url), process_tree_cpu(server_pid) if server_pid else {}
    threads1 = {pid: thread_cpu(pid) for pid in threads0}
    fronts0, fronts1 = ({pid: t for pid, t in threads.items() if pid != server_pid} for threads in (threads0, threads1))
    (images0, batches0, decode0, decoded0, grouped0, groups0, busy0, read0) = before
    (images1, batches1, decode1, decoded1, grouped1, groups1, busy1, read1) = after
    gil_held = sampler.result() if sampler else None
    parts = [results.get(timeout=warmup + duration + 300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    statuses: dict[str, int] = {}
    frontends: dict[str, int] = {}
    for part in parts:
        for k, v in part["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in part["frontends"].items():
            frontends[k] = frontends.get(k, 0) + v
    latencies = np.array([x for part in parts for x in part["latencies"]]) * 1000
    ok = sum(part["ok"] for part in parts)
    images = max(1.0, images1 - images0)
    cpu_ms = {"load_generator": 1000 * sum(part["cpu_s"] for part in parts) / images,
              "decode_wall": 1000 * (decode1 - decode0) / max(1.0, decoded1 - decoded0)}
    if server_pid:
        spent = {pid: cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1}
        cpu_ms["engine_process"] = 1000 * spent.get(server_pid, 0.0) / images
        cpu_ms["other_server_processes"] = 1000 * sum(v for pid, v in spent.items() if pid != server_pid) / images
    return {"images_per_s": ok / duration, "ok": ok, "statuses": statuses, "cpu_ms_per_image": cpu_ms,
            "engine_threads_cpu_ms_per_image": busiest_threads(threads0.get(server_pid, {}),
                                                               threads1.get(server_pid, {}), images),
            # the other server processes' (front ends') threads, summed by name over the processes
            "frontend_threads_cpu_ms_per_image": threads_by_name(fronts0, fronts1, images),
            "mean_batch": (images1 - images0) / max(1.0, batches1 - batches0),
            # batches per device decode (--decode gpu|auto), None where the engine decoded none on its device
            "mean_decode_group": (grouped1 - grouped0) / (groups1 - groups0) if groups1 > groups0 else None,
            # the network's device time (vggserve_inference_seconds: from a batch's submit, or its lane's previous
            # batch's end, to its results; a device decode, on a queue of its own, is not in it) per second of the
            # window: 1.0 is one device never without a batch of the network
            "device_busy": (busy1 - busy0) / max(1e-9, read1 - read0),
            # --gil: per engine process (the server's first), the share of the window its GIL was held, and where
            "gil": gil_held,
            "images_per_frontend": sorted(frontends.values(), reverse=True),
            "latency_ms": {q: float(np.percentile(latencies, int(q[1:]))) if len(latencies) else None
                           for q in ("p50", "p90", "p99")}}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.url and args.client == "raw":
        from vggserve.loadtest.rawhttp import parse_url

        try:
            parse_url(args.url)
        except ValueError as exc:
            print(f"serve_saturation: {exc}; --client httpx sends to https", file=sys.stderr)
            return 2
    from vggserve.testing.servers import ServerProcess
    from vggserve.serving.settings import parse_devices
    from vggserve.weights import find_weights

    weights = str(find_weights(args.weights)) if not args.url or not args.skip_engine else None
    devices = parse_devices(args.device)
    batch = args.max_batch_size
    concurrency = args.concurrency or max(1, 4 * batch * len(devices) // args.files_per_request)
    procs = args.client_procs or max(1, min(8, (mp.cpu_count() or 2) // 2))
    if args.image_mix == "photo":
        bodies = photo_mix()
    else:
        bodies = [Path(args.image).read_bytes() if args.image else synthetic_jpeg()]
    out = {"device": args.device, "batch_size": batch, "concurrency": concurrency, "client_procs": procs,
           "resize_on": args.resize_on or "device", "image_mix": args.image_mix, "decode": args.decode or "auto",
           "decode_group": args.decode_group, "lanes": args.lanes,
           "precision": args.precision,
           "client": args.client,
           "duration_s": args.duration, "preprocess_threads": args.preprocess_threads,
           "preprocess_procs": args.preprocess_procs, "http_workers": args.http_workers}

    if not args.skip_engine:
        per_device = [engine_images_per_second(weights, d, batch, args.engine_seconds, args.precision)
                      for d in devices]
        out["engine_images_per_s"] = sum(ips for ips, _, _ in per_device)
        out["engine_streamed_images_per_s"] = sum(streamed for _, _, streamed in per_device)
        out["engine_devices"] = [{"spec": d, "name": name, "images_per_s": ips, "streamed_images_per_s": streamed}
                                 for d, (ips, name, streamed) in zip(devices, per_device)]
        print(f"engine  : {out['engine_images_per_s']:9.1f} images/s at batch {batch}, one batch at a time as "
              f"`vggserve bench` ({', '.join(name for _, name, _ in per_device)}); "
              f"{out['engine_streamed_images_per_s']:.1f} streamed (uint8 crops, two batches in flight)", flush=True)

    if args.url:
        out.update(server_preprocessing(args.url.rstrip("/")))
        out["service"] = drive(args.url.rstrip("/"), bodies, concurrency, procs, args.warmup, args.duration,
                               args.files_per_request, args.client)
    else:
        serve_args = ["--weights", weights, "--device", args.device, "--max-batch-size", str(batch),
                      "--max-files", str(max(16, args.files_per_request)),
                      "--max-wait-ms", str(args.max_wait_ms),
                      # the whole server's limit, whichever front end a request reaches: room for every request
                      "--max-queue", str(max(256, 2 * concurrency * args.files_per_request)),
                      "--log-level", "warning"]
        if args.preprocess_threads:
            serve_args += ["--preprocess-threads", str(args.preprocess_threads)]
        if args.preprocess_procs is not None:
            serve_args += ["--preprocess-procs", str(args.preprocess_procs)]
        if args.http_workers is not None:
            serve_args += ["--http-workers", str(args.http_workers)]
        if args.resize_on is not None:
            serve_args += ["--resize-on", args.resize_on]
        if args.decode is not None:
            serve_args += ["--decode", args.decode]
        if args.decode_group is not None:
            serve_args += ["--decode-group", str(args.decode_group)]
        if args.lanes is not None:
            serve_args += ["--lanes", str(args.lanes)]
        if args.precision is not None and cli_takes("serve", "--precision"):
            serve_args += ["--precision", args.precision]
        with ServerProcess.serve_cli(serve_args) as server:
            server.wait_ready(600)
            out.update(server_preprocessing(server.url))
            out["service"] = drive(server.url, bodies, concurrency, procs, args.warmup, args.duration,
                                   args.files_per_request, args.client, server_pid=server.proc.pid,
                                   gil=args.gil)

    service = out["service"]
    lat = service["latency_ms"]
    group = service.get("mean_decode_group")
    print(f"service : {service['images_per_s']:9.1f} images/s, mean batch {service['mean_batch']:.1f}, "
          + (f"mean decode group {group:.2f} batches, " if group is not None else "") +
          f"device busy {service['device_busy']:.2f} s/s, " +
          f"{concurrency} in flight from {procs} {args.client} client processes; "
          f"preprocess threads {out['preprocess_threads']}, "
          f"processes {out['preprocess_procs']}; HTTP front ends {out['http_workers']} (images each "
          f"{service['images_per_frontend']}); "
          f"statuses {service['statuses']}; latency ms "
          + ", ".join(f"{k} {v:.1f}" for k, v in lat.items() if v is not None), flush=True)
    print("cpu     : ms per image: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}"
                                                  for k, v in service["cpu_ms_per_image"].items()), flush=True)
    if service["engine_threads_cpu_ms_per_image"]:
        print("threads : the engine process's busiest, CPU ms per image: " + ", ".join(
            f"{name} {ms:.2f}" for name, ms in service["engine_threads_cpu_ms_per_image"]), flush=True)
    if service["gil"] is not None:
        print("gil     : share of the window each engine process held its GIL: "
              + gil_sampling.summary(service["gil"]), flush=True)
    if "engine_images_per_s" in out:
        out["ratio"] = service["images_per_s"] / out["engine_images_per_s"]
        out["ratio_to_streamed"] = service["images_per_s"] / out["engine_streamed_images_per_s"]
        print(f"ratio   : {out['ratio']:.3f} of the engine one batch at a time (target >= 0.90); "
              f"{out['ratio_to_streamed']:.3f} of the engine streamed")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if args.require is not None and out.get("ratio", 0.0) < args.require:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
