"""Images/s and mean batch of the engine process's queue and device workers with 1 and 2 stand-in devices.

    python benchmarks/devices_scaling.py
    python benchmarks/devices_scaling.py --devices 1,2,4 --max-batch-size 64 --batch-ms 2 --image-ms 0.1 --seconds 5

What the engine process runs, without HTTP and without a GPU: one `BatchQueue`, one `DeviceWorker` per stand-in
device, each with the in-flight runner (two batches in flight, as VGG16). A stand-in device computes one batch at
a time in --batch-ms + --image-ms per image (by default 2 + 0.1 x 64 = 8.4 ms for 64 images: an H100's FP16
VGG16 streams about 7,500 images/s at batch 64), sleeping, so it costs no CPU. Clients form a closed loop, as the
load test's: --concurrency images are in the system at once (default 4 x batch x devices, as
serve_saturation.py); an answered image comes back into the queue after a random delay of 0 to --return-ms (its
way through a front end and the link), spending --host-us of Python CPU under the engine's GIL on arrival (a link
thread's work per image) and --submit-host-ms per batch in the device's submit (the engine's kernel launches).

Prints, per device count: images/s over the --seconds window (after --warmup), the mean batch, the share of full
batches, each device's share of the batches and the median queue time; --json FILE writes the same.
"""

from __future__ import annotations

import argparse
import heapq
import json
import queue as queues
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vggserve.modelinput import CROP_SHAPE, ModelInput  # noqa: E402
from vggserve.serving.metrics import Metrics  # noqa: E402
from vggserve.serving.scheduling.batcher import BatchQueue  # noqa: E402
from vggserve.serving.scheduling.errors import shutting_down  # noqa: E402
from vggserve.serving.scheduling.worker import DeviceWorker  # noqa: E402
from vggserve.testing.models import InstantModel  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="1,2", help="device counts to compare, a comma list (default 1,2)")
    p.add_argument("--max-batch-size", type=int, default=64, help="the server's --max-batch-size (default 64)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's --max-wait-ms (default 5)")
    p.add_argument("--batch-ms", type=float, default=2.0, help="device time per batch (default 2)")
    p.add_argument("--image-ms", type=float, default=0.1, help="device time per image of a batch (default 0.1)")
    p.add_argument("--concurrency", type=int, default=0, help="images in the system (default 4 x batch x devices)")
    p.add_argument("--return-ms", type=float, default=4.0,
                   help="an answered image re-enters the queue after 0 to this many ms (default 4)")
    p.add_argument("--host-us", type=float, default=0.0, help="Python CPU per arriving image (default 0)")
    p.add_argument("--submit-host-ms", type=float, default=0.0,
                   help="Python CPU per batch in submit, under the GIL (kernel launches; default 0)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring (default 1)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds (default 5)")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = p.parse_args(argv)
    try:
        args.device_counts = [int(n) for n in args.devices.split(",")]
    except ValueError:
        p.error(f"--devices takes a comma list of counts such as 1,2, got {args.devices!r}")
    if min(args.device_counts) < 1 or args.max_batch_size < 1 or args.seconds <= 0:
        p.error("--devices, --max-batch-size and --seconds must be positive")
    return args


class TimedDevice(InstantModel):
    """InstantModel (two staging slots, one batch at a time on its 'device') whose batch takes batch_s + image_s
    per image."""

    def __init__(self, device: str, max_batch_size: int, batch_s: float, image_s: float, host_s: float = 0.0):
        super().__init__(device, max_batch_size)
        self.batch_s, self.image_s, self.host_s = batch_s, image_s, host_s

    def submit(self, inputs, want: str = "probabilities", pinned: bool = True):
        burn(self.host_s)
        self.seconds_per_batch = self.batch_s + self.image_s * len(inputs)
        return super().submit(inputs, want, pinned)


def burn(seconds: float) -> None:
    """Hold the GIL for about `seconds` of CPU (a link thread's Python work on one image)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(devices: int, args) -> dict:
    """One closed-loop run; the figures of its measured window."""
    batch = args.max_batch_size
    concurrency = args.concurrency or 4 * batch * devices
    metrics = Metrics()
    queue = BatchQueue(concurrency, metrics)
    workers = [DeviceWorker(f"stand-in:{i}", lambda d: TimedDevice(d, batch, args.batch_ms / 1e3, args.image_ms / 1e3,
                                                                   args.submit_host_ms / 1e3),
                            queue, metrics, max_batch_size=batch, max_wait_s=args.max_wait_ms / 1e3, warmup=False,
                            on_change=lambda: None)
               for i in range(devices)]
    for worker in workers:
        worker.start()
    while not all(w.ready for w in workers):
        time.sleep(0.01)
    crop = ModelInput.crop(np.zeros(CROP_SHAPE, np.uint8))
    answered: queues.SimpleQueue = queues.SimpleQueue()
    rng = random.Random(0)
    start = time.monotonic()
    window = (start + args.warmup, start + args.warmup + args.seconds)
    done, batches, queue_s = 0, {}, []

    def send():
        queue.admit(1)
        item = queue.submit(crop, time.monotonic() + 60)
        item.future.add_done_callback(lambda f: answered.put((time.monotonic(), f)))

    due = [(start, i) for i in range(concurrency)]  # (when it re-enters the queue, a tie-breaker)
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            heapq.heappop(due)
            burn(args.host_us / 1e6)
            send()
        if now >= window[1]:
            break
        try:
            finished, future = answered.get(timeout=max(0.0, due[0][0] - now) if due else 0.1)
        except queues.Empty:
            continue
        outcome = future.result()
        if window[0] <= finished < window[1]:
            done += 1
            queue_s.append(outcome.queue_s)
            batches.setdefault(outcome.device, []).append(outcome.batch_size)
        heapq.heappush(due, (finished + rng.uniform(0, args.return_ms / 1e3), rng.random()))
    queue.close(shutting_down())
    for worker in workers:
        worker.join(10)
    # each image saw its batch's size: a batch of n counts n times, so weigh by 1/n for the batches themselves
    sizes = [n for per_device in batches.values() for n in per_device]
    count_batches = sum(1 / n for n in sizes)
    full = sum(1 / n for n in sizes if n == batch)
    per_device = {d: round(sum(1 / n for n in ns) / count_batches, 3) for d, ns in sorted(batches.items())}
    return {"devices": devices, "concurrency": concurrency, "images_per_s": done / args.seconds,
            "mean_batch": done / count_batches if count_batches else 0.0,
            "full_batches": full / count_batches if count_batches else 0.0, "batch_share": per_device,
            "queue_ms_p50": float(np.median(queue_s) * 1e3) if queue_s else 0.0}


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = [run(n, args) for n in args.device_counts]
    base = rows[0]["images_per_s"]
    print(f"batch {args.max_batch_size}, --max-wait-ms {args.max_wait_ms:g}, device {args.batch_ms:g} ms + "
          f"{args.image_ms:g} ms/image, return 0-{args.return_ms:g} ms, host {args.host_us:g} us/image + "
          f"{args.submit_host_ms:g} ms/batch")
    print("devices  concurrency  images/s  x first  mean batch  full batches  queue p50 ms  batches per device")
    for row in rows:
        shares = " ".join(f"{share:.2f}" for share in row["batch_share"].values())
        print(f"{row['devices']:7d}  {row['concurrency']:11d}  {row['images_per_s']:8.0f}  "
              f"{row['images_per_s'] / base if base else 0:7.2f}  {row['mean_batch']:10.1f}  "
              f"{row['full_batches']:12.2f}  {row['queue_ms_p50']:12.1f}  {shares}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
