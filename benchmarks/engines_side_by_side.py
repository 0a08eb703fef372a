"""Do the devices of a machine slow each other down? One process per device, each streaming the engine on ready crops
and then device decode + network (`decode_for_model`, one batch a call), first on one device alone, then on every
device at once (processes started together, timed from a common instant).

    bash benchmarks/gpu_run.sh python3 benchmarks/engines_side_by_side.py --devices gpu:0,gpu:1,gpu:2,gpu:3
    python3 benchmarks/engines_side_by_side.py --devices cpu,cpu --seconds 0.5 --width 0.0625 --images 64  # smoke

If the sum at once is the number of devices times the rate alone, the GPUs, their links and the driver scale, and a
multi-GPU service or batch job that falls short loses its images elsewhere: in the host's processes around the
engine (front ends, the load generator, file reads). Prints one line per process and a summary line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def one(device: str, seconds: float, start_at: float, width: float, images: int, batch: int) -> None:
    """This process's device: its rates, printed as `device: engine X images/s; decode + network Y images/s`."""
    import numpy as np

    from device_decode import corpus, streamed_network
    from vggserve.decoding.device.onmodel import decode_for_model
    from vggserve.model.vgg16 import VGG16
    from vggserve.weights.init import init_weights

    files = corpus(images, 500, 375, 90)
    model = VGG16(init_weights(seed=0, width=width), device=device, max_batch_size=batch, precision="fp16")
    groups = [files[i:i + batch] for i in range(0, len(files), batch)]
    crops = np.zeros((batch, 224, 224, 3), np.uint8)

    model.submit(crops, "logits").result()  # warm: kernels built, buffers made
    model.submit(decode_for_model(model, groups[0]), "logits").result()
    while time.time() < start_at:
        time.sleep(0.01)
    engine, _ = streamed_network(model, groups, lambda g: crops, seconds)
    decoded, cpu = streamed_network(model, groups, lambda g: decode_for_model(model, g), seconds)
    print(f"{device}: engine {engine:.1f} images/s; decode + network {decoded:.1f} images/s "
          f"({cpu:.3f} ms CPU per image)", flush=True)


def run(devices: list[str], args) -> list[tuple[float, float]]:
    """Start one process per device, timed from the same instant; their (engine, decode + network) rates."""
    start_at = time.time() + args.lead
    procs = [subprocess.Popen([sys.executable, __file__, "--one", d, "--seconds", str(args.seconds),
                               "--start-at", str(start_at), "--width", str(args.width), "--images", str(args.images),
                               "--batch", str(args.batch)], stdout=subprocess.PIPE, text=True) for d in devices]
    rates = []
    for d, p in zip(devices, procs):
        out, _ = p.communicate()
        line = next((x for x in out.splitlines() if x.startswith(f"{d}: engine ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"engines_side_by_side: the process on {d} failed (exit {p.returncode})")
        print("  " + line, flush=True)
        parts = line.split()
        rates.append((float(parts[2]), float(parts[7])))
    return rates


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="gpu:0,gpu:1", help="comma list, one process each (default gpu:0,gpu:1)")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds of each stream (default 8)")
    p.add_argument("--width", type=float, default=1.0, help="VGG16's channel width (random weights; default 1)")
    p.add_argument("--images", type=int, default=512, help="500x375 JPEGs per process (default 512)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lead", type=float, default=30.0,
                   help="seconds from start to the common instant the streams begin (program builds; default 30)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        one(args.one, args.seconds, args.start_at, args.width, args.images, args.batch)
        return
    devices = [d for d in args.devices.split(",") if d]
    print(f"{devices[0]} alone:", flush=True)
    (alone_engine, alone_decoded), = run(devices[:1], args)
    print(f"{len(devices)} at once:", flush=True)
    together = run(devices, args)
    engine, decoded = sum(r[0] for r in together), sum(r[1] for r in together)
    print(f"side by side: {len(devices)} devices, engine {engine:.1f} images/s ({engine / alone_engine:.2f}x one "
          f"alone), decode + network {decoded:.1f} images/s ({decoded / alone_decoded:.2f}x one alone)")


if __name__ == "__main__":
    main()
