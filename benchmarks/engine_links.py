"""The engine process's work per image on the front-end links (`--http-workers N`), without HTTP: images/s and the
engine process's CPU milliseconds per image, with N simulated front ends and a stand-in device.

    python benchmarks/engine_links.py
    python benchmarks/engine_links.py --fronts 8 --devices 2 --inflight 128 --seconds 10
    python benchmarks/engine_links.py --batch-ms 8          # a device that sleeps 8 ms per batch

This process is the engine process as `vggserve serve --http-workers N` runs it (metrics in multiprocess mode, one
BatchQueue, one device worker per --devices with the in-flight runner, an EngineHost), with
vggserve.testing.models.InstantModel on each device (it copies each input into a staging array and answers at
once, or after --batch-ms). --fronts client processes each connect an EngineClient, as a front end does, and keep
--inflight images in flight on it from an event loop, as a front end's requests do: an answered image is submitted
again at once (a 224x224 uint8 crop, through the front end's shared-memory arena). No HTTP, no decoding: what is
measured is the link, the queue, the device workers' host work and the answers.

Printed: images/s over the --seconds window (after --warmup), the engine process's CPU ms per image (from
os.times()) and its busiest threads' (from /proc). The engine process runs its threads under one GIL, so
1000 / (its CPU ms per image) bounds the images/s of the whole service however many devices it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from serve_saturation import thread_cpu, thread_spent  # noqa: E402

ROLES = (("-reader", "link readers"), ("-writer", "link writers"), ("vggserve-inflight-", "completers"),
         ("vggserve-device-", "feeders"), ("", "other"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fronts", type=int, default=4, help="simulated front-end processes (default 4)")
    p.add_argument("--devices", type=int, default=1, help="stand-in devices (default 1)")
    p.add_argument("--inflight", type=int, default=128, help="images in flight per front end (default 128)")
    p.add_argument("--max-batch-size", type=int, default=64, help="the server's --max-batch-size (default 64)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's --max-wait-ms (default 5)")
    p.add_argument("--batch-ms", type=float, default=0.0, help="device time per batch, sleeping (default 0)")
    p.add_argument("--logits", action="store_true", help="every image asks for its logits too")
    p.add_argument("--inline", action="store_true", help="pixels inline in the link, not through shared memory")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring (default 2)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds (default 5)")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = p.parse_args(argv)
    if min(args.fronts, args.devices, args.inflight, args.max_batch_size) < 1 or args.seconds <= 0:
        p.error("--fronts, --devices, --inflight, --max-batch-size and --seconds must be positive")
    return args


def front_end(address: str, authkey: bytes, index: int, inflight: int, logits: bool, inline: bool, answered,
              stop) -> None:
    """A simulated front end: keeps `inflight` crops in flight on its link; counts answers in `answered` (-1 until
    it is connected and sending)."""
    import numpy as np

    from vggserve.modelinput import ModelInput
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.processes.engine_link import EngineClient

    client = EngineClient(address, authkey, 4 * inflight, Metrics(), index)
    client.connect(wait_state_s=60)
    deadline = time.monotonic() + 60
    while not (client.state and client.state["ready"][0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if inline:
        client.queue.arena = None
    else:
        while client.queue.arena is None and time.monotonic() < deadline:
            time.sleep(0.01)
    crop = ModelInput.crop(np.random.default_rng(index).integers(0, 256, (224, 224, 3), dtype=np.uint8))

    async def keep_one_in_flight() -> None:
        while True:
            client.queue.admit(1)
            await client.queue.submit(crop, time.monotonic() + 60, logits).future
            answered.value += 1

    async def run() -> None:  # on an event loop, as a front end submits: those of one turn as one message list
        loop = asyncio.get_running_loop()
        senders = [asyncio.ensure_future(keep_one_in_flight()) for _ in range(inflight)]
        answered.value = 0
        await loop.run_in_executor(None, stop.wait)
        for sender in senders:
            sender.cancel()
        await asyncio.gather(*senders, return_exceptions=True)

    asyncio.run(run())
    client.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    from vggserve.serving.metrics import multiprocess_metrics

    with tempfile.TemporaryDirectory(prefix="vggserve-links-") as workdir:
        os.mkdir(os.path.join(workdir, "metrics"))
        with multiprocess_metrics(os.path.join(workdir, "metrics")):
            result = measure(args, workdir)
    print(f"engine links: {result['images_per_s']:.0f} images/s, {args.fronts} front ends x {args.inflight} in "
          f"flight, {args.devices} stand-in device(s) ({args.batch_ms:g} ms a batch), batch {args.max_batch_size}, "
          f"{'inline' if args.inline else 'shared memory'}{', logits' if args.logits else ''}")
    print(f"engine process CPU ms per image: {result['engine_cpu_ms_per_image']:.3f} "
          f"(a GIL-bound ceiling of {result['engine_ceiling_images_per_s']:.0f} images/s)")
    print("its threads by role, CPU ms per image: " + ", ".join(f"{name} {ms:.3f}" for name, ms in result["threads"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def measure(args: argparse.Namespace, workdir: str) -> dict:
    from vggserve.serving.processes.engine_host import EngineHost
    from vggserve.serving.service import Service
    from vggserve.serving.settings import Settings
    from vggserve.testing.models import InstantModel

    settings = Settings(devices=tuple(f"stand-in{i}" for i in range(args.devices)), http_workers=args.fronts,
                        max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, warmup=False,
                        max_queue=4 * args.inflight * args.fronts)
    service = Service(settings, lambda device: InstantModel(device, args.max_batch_size, args.batch_ms / 1000),
                      multiprocess=True)
    host = EngineHost(service, os.path.join(workdir, "engine.sock"), os.urandom(32))
    host.start()
    service.start()
    context = mp.get_context("spawn")
    stop = context.Event()
    counters = [context.RawValue("q", -1) for _ in range(args.fronts)]
    procs = [context.Process(target=front_end, args=(host.address, host.authkey, i, args.inflight, args.logits,
                                                     args.inline, counters[i], stop), daemon=True)
             for i in range(args.fronts)]
    try:
        for proc in procs:
            proc.start()
        started = time.monotonic()
        while min(c.value for c in counters) < 0:
            if time.monotonic() > started + 120 or not all(proc.is_alive() for proc in procs):
                raise SystemExit("engine links: the simulated front ends did not start sending within 120 s")
            time.sleep(0.1)
        time.sleep(args.warmup)
        answered = lambda: sum(c.value for c in counters)  # noqa: E731
        t0, n0, cpu0, threads0 = time.monotonic(), answered(), sum(os.times()[:2]), thread_cpu(os.getpid())
        time.sleep(args.seconds)
        t1, n1, cpu1, threads1 = time.monotonic(), answered(), sum(os.times()[:2]), thread_cpu(os.getpid())
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
    finally:
        stop.set()
        for proc in procs:
            proc.join(10)
        host.close()
        service.stop()
    images = max(1, n1 - n0)
    cpu_ms = 1000 * (cpu1 - cpu0) / images
    return {"images_per_s": images / (t1 - t0), "engine_cpu_ms_per_image": cpu_ms,
            "engine_ceiling_images_per_s": 1000 / cpu_ms if cpu_ms else float("inf"),
            "threads": by_role(threads0, threads1, names, images), "fronts": args.fronts,
            "devices": args.devices, "inflight": args.inflight, "max_batch_size": args.max_batch_size,
            "batch_ms": args.batch_ms, "logits": args.logits, "inline": args.inline}


def by_role(before: dict, after: dict, names: dict, images: int) -> list[list]:
    """[[role, CPU ms per image], ...] of this process's threads between two thread_cpu readings, by the role their
    Python name ({native id: name}) tells (ROLES)."""
    spent = dict.fromkeys((role for _, role in ROLES), 0.0)
    for tid, name, seconds in thread_spent(before, after):
        name = names.get(tid, name)
        spent[next(role for part, role in ROLES if part in name)] += seconds
    return [[role, round(1000 * seconds / images, 3)] for role, seconds in spent.items()]


if __name__ == "__main__":
    sys.exit(main())
