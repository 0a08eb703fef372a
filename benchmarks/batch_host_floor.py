"""The batch job's host side alone: how many images/s one rank's host work can feed, with a device that takes no
time, and the CPU milliseconds each image costs by stage.

    python benchmarks/batch_host_floor.py --images 1024 --batch-size 32 --decode-procs 7
    python benchmarks/batch_host_floor.py --decode-procs 0 --decode-threads 8     # decoding on threads instead

The rank's ChunkRunner (decode processes or threads, shared memory, result lines) runs chunks of --batch-size
500x375 JPEGs (batch_scaling.py's) on an instant model: `submit` copies every image into a staging array, as the
engine copies into its pinned staging, and answers at once. images/s is then the host's ceiling for one rank;
CPU ms per image (decoding.stages) says where the time goes, summed over the rank and its decode processes, and
how many cores a rate of 8,000 images/s would need.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import batch_scaling  # noqa: E402


class InstantModel:
    """Resizes on its 'device' (takes image inputs); submit copies the images like the engine's staging, then is done."""

    resizes_on_device = True
    preprocessing = "torchvision"
    device_name = "instant stand-in"

    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self.staging = np.empty(64 << 20, np.uint8)

    def resize_matches_pillow(self) -> bool:
        return True

    def submit(self, images, want="probabilities"):
        offset = 0
        for image in images:
            pixels = getattr(image, "pixels", image)
            np.copyto(self.staging[offset:offset + pixels.nbytes], np.asarray(pixels).reshape(-1))
            offset += pixels.nbytes
        return Done(len(images))


class Done:
    def __init__(self, n: int):
        self.rows = np.full((n, 1000), 1e-3, np.float32)

    def result(self):
        return self.rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--decode-procs", type=int, default=None, help="default: the batch job's auto")
    p.add_argument("--decode-threads", type=int, default=2)
    p.add_argument("--decode", choices=("exact", "fast"), default="exact")
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    from vggserve.decoding.pool import default_procs
    from vggserve.distributed.pipeline import ChunkRunner, RankStats
    from vggserve.distributed.summary import format_stages

    procs = default_procs() if args.decode_procs is None else args.decode_procs
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-floor-")) / "images"
    batch_scaling.make_images(folder, args.images, (500, 375))
    paths = sorted(str(path) for path in folder.glob("*.jpg"))
    chunks = [paths[i:i + args.batch_size] for i in range(0, len(paths), args.batch_size)]
    runner = ChunkRunner(InstantModel(args.batch_size), decode_threads=args.decode_threads, decode_procs=procs,
                         decode=args.decode)
    stats = RankStats(0, "instant", clock=runner.clock, decoder=runner.decoder)
    try:
        runner.submit(chunks[0])  # the processes start and warm up on the first chunk, untimed
        runner.run_next()
        runner.clock.seconds.clear()
        started = time.perf_counter()
        ahead = 3
        for chunk in chunks[:ahead]:
            runner.submit(chunk)
        for index in range(len(chunks)):
            runner.run_timed(stats)
            if index + ahead < len(chunks):
                runner.submit(chunks[index + ahead])
        wall = time.perf_counter() - started
    finally:
        runner.close()
    cpu = stats.cpu_ms_per_image()
    # with decode processes, read/decode/copy ran in them; on threads they are part of the rank process's time
    decoding = sum(cpu.get(stage, 0.0) for stage in ("read", "decode", "copy")) if procs else 0.0
    total = decoding + cpu.get("rank_process", 0.0)
    rate = stats.images / wall
    where = f"{procs} decode process{'es' if procs != 1 else ''}" if procs else f"{args.decode_threads} decode threads"
    print(f"batch host floor: {stats.images} 500x375 JPEGs, batch {args.batch_size}, {where}, --decode {args.decode}: "
          f"{rate:.0f} images/s with an instant device")
    print(f"CPU ms per image: {format_stages(cpu)}")
    print(f"host CPU per image: {total:.2f} ms (decode processes {decoding:.2f} + rank process "
          f"{cpu.get('rank_process', 0.0):.2f}): 8,000 images/s would take {8 * total:.1f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
