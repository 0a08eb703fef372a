"""The batch job's host side alone: how many images/s one rank's host work can feed, with a device that takes no
time, and the CPU milliseconds each image costs by stage.

    python benchmarks/batch_host_floor.py --images 1024 --batch-size 32 --decode-procs 7
    python benchmarks/batch_host_floor.py --decode-procs 0 --decode-threads 8     # decoding on threads instead
    python benchmarks/batch_host_floor.py --decode-procs 1 --replay               # the rank's own ceiling

One rank runs as in `vggserve batch -n 1` (its Coordinator and Worker, ChunkRunner, decode processes or threads,
shared memory, result lines, the output file and a progress bar) over chunks of --batch-size 500x375 JPEGs
(batch_scaling.py's) on an instant model: `submit` copies every image into a staging array, as the
engine copies into its pinned staging, and answers at once. images/s is then the host's ceiling for one rank;
CPU ms per image (decoding.stages) says where the time goes, summed over the rank and its decode processes, and
how many cores a rate of 8,000 images/s would need.

With --replay each decode process decodes one image and then answers every image with a copy of it
(vggserve.testing.decoding): they keep up with any rank, so images/s is the ceiling of the rank's own process, the
figure that decides whether one rank can feed a fast GPU (on a machine of few cores, give it --decode-procs 1).

Under mpiexec (`mpiexec -n 2 python benchmarks/batch_host_floor.py --replay --decode-procs 1`) every rank runs so,
rank 0 dealing the chunks and recording every rank's results as in the job; rank 0 then also prints each rank's CPU
ms per image, and its main thread's CPU per image it recorded for another rank (receiving the report, writing its
lines, answering with the next chunk) against per image of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from tqdm import tqdm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import batch_scaling  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--decode-procs", type=int, default=None, help="default: the batch job's auto")
    p.add_argument("--decode-threads", type=int, default=2)
    p.add_argument("--decode", choices=("exact", "fast"), default="exact")
    p.add_argument("--replay", action="store_true",
                   help="decode processes answer from a copy after the first decode: measures the rank alone")
    p.add_argument("--replay-ms", type=float, default=0.0,
                   help="with --replay: each image also takes this long asleep in its decode process (the wall time "
                        "of a decode, without its CPU: 15 processes decoding at 2.3 ms each on 2 cores)")
    p.add_argument("--device-ms", type=float, default=0.0,
                   help="the stand-in device takes this long per batch (default 0: instant)")
    p.add_argument("--slots", type=int, default=2,
                   help="the stand-in device's staging slots: a submit waits for the batch this many submits back, "
                        "as the engine's does (default 2, the engine's)")
    p.add_argument("--repeat", type=int, default=1, help="go over the images this many times (default 1)")
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error(f"--slots {args.slots}: the stand-in device needs at least one staging slot")
    from vggserve.decoding.pool import default_procs
    from vggserve.distributed.coordinator import Coordinator
    from vggserve.distributed.job import _recorder
    from vggserve.distributed.mpi import barrier, helper_threads_allowed, world
    from vggserve.distributed.pipeline import ChunkRunner, RankStats
    from vggserve.distributed.store import ResultStore
    from vggserve.distributed.workqueue import CoordinatorLink, work_for_coordinator
    from vggserve.testing.models import InstantModel
    from vggserve.distributed.summary import format_stages

    if args.replay:
        from vggserve.decoding import worker
        from vggserve.testing.decoding import REPLAY, REPLAY_MS

        worker.DEFAULT_TASK = REPLAY
        os.environ[REPLAY_MS] = str(args.replay_ms)

    procs = default_procs() if args.decode_procs is None else args.decode_procs
    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = None
    if rank == 0:
        folder = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-floor-")) / "images"
        batch_scaling.make_images(folder, args.images, (500, 375))
    folder = Path(comm.bcast(str(folder) if folder else None, root=0))
    paths = sorted(str(path) for path in folder.glob("*.jpg"))
    chunks = [paths[i:i + args.batch_size] for i in range(0, len(paths), args.batch_size)] * args.repeat
    model = InstantModel(max_batch_size=args.batch_size, seconds_per_batch=args.device_ms / 1000,
                         slots=args.slots)
    runner = ChunkRunner(model, decode_threads=args.decode_threads, decode_procs=procs,
                         decode=args.decode)
    stats = RankStats(rank, "instant", clock=runner.clock, waits=runner.waits, decoder=runner.decoder)
    store = progress = meter = None
    if rank == 0:
        for old in ("results.jsonl", "results.errors.jsonl"):
            (folder.parent / old).unlink(missing_ok=True)
        store = ResultStore(folder.parent / "results.jsonl")
        store.start()
        progress = tqdm(total=len(chunks) * args.batch_size, unit="img", file=open(os.devnull, "w"),
                        mininterval=2.0)
    try:
        runner.submit(chunks[0])  # the processes start and warm up on the first chunk, untimed
        runner.run_next()
        runner.clock.seconds.clear()
        runner.waits.seconds.clear()
        copies_before = copy_threads_cpu()
        barrier(comm)
        started = time.perf_counter()
        if rank == 0:
            coordinator = Coordinator(CoordinatorLink(comm), runner, stats, deque(chunks), _recorder(store, progress),
                                      threaded=helper_threads_allowed())
            meter = RecordingMeter(coordinator)
            main_cpu = time.thread_time()
            stats_by_rank = coordinator.run()
            meter.main_seconds = time.thread_time() - main_cpu
        else:
            work_for_coordinator(comm, runner, stats)
        wall = time.perf_counter() - started
        copies = copy_threads_cpu() - copies_before
    finally:
        runner.close()
        if store is not None:
            store.close()
            progress.close()
    barrier(comm)
    if rank != 0:
        return 0
    cpu = stats.cpu_ms_per_image()
    # with decode processes, read/decode/copy ran in them; on threads they are part of the rank process's time
    decoding = sum(cpu.get(stage, 0.0) for stage in ("read", "decode", "copy")) if procs else 0.0
    total = decoding + cpu.get("rank_process", 0.0)
    rate = stats.images / wall
    device = f"a device of {args.device_ms:g} ms per batch" if args.device_ms else "an instant device"
    if args.device_ms:
        ceiling = args.batch_size / (args.device_ms / 1000)
        device += f" ({ceiling:.0f} images/s if it never waits: busy {rate / ceiling:.2f})"
    if args.replay:
        device += f" (replayed decodes{f' of {args.replay_ms:g} ms asleep' if args.replay_ms else ''})"
    where = f"{procs} decode process{'es' if procs != 1 else ''}" if procs else f"{args.decode_threads} decode threads"
    print(f"batch host floor: {stats.images} 500x375 JPEGs, batch {args.batch_size}, {where}, --decode {args.decode}: "
          f"{rate:.0f} images/s with {device}")
    print(f"CPU ms per image: {format_stages(cpu)} (of which the staging copies on the copying threads, as the "
          f"engine's: {1000 * copies / stats.images:.2f})")
    print(f"rank waited, wall ms per image: {format_stages(stats.wait_ms_per_image())} (device: "
          f"{args.device_ms / args.batch_size:.2f} ms per image of work)")
    print(f"host CPU per image: {total:.2f} ms (decode processes {decoding:.2f} + rank process "
          f"{cpu.get('rank_process', 0.0):.2f}): 8,000 images/s would take {8 * total:.1f} cores")
    if size > 1:
        rate = sum(entry["images"] for entry in stats_by_rank.values()) / wall
        print(f"{size} ranks: {rate:.0f} images/s in all")
        for other, entry in sorted(stats_by_rank.items()):
            print(f"  rank {other}: {entry['images']} images, CPU ms per image: "
                  f"{format_stages(entry['cpu_ms_per_image'])}")
        print(f"  rank 0's main thread, CPU ms per image it recorded: {meter.describe()}; in all (waits for reports "
              f"included) {1000 * meter.main_seconds / sum(meter.images.values()):.3f}")
    return 0


def copy_threads_cpu() -> float:
    """CPU seconds so far of this process's copying threads (vggserve.runtime.hostcopy's, which `submit` copies on)."""
    from vggserve.runtime import hostcopy

    pool = hostcopy._pool
    seconds = 0.0
    for thread in list(getattr(pool, "_threads", ())):
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # not Linux, or the thread has ended
            continue
        seconds += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


class RecordingMeter:
    """The CPU time of rank 0's main thread in each report it answers (receive, record, answer with a chunk), summed
    by the rank the report came from, and that rank's images."""

    def __init__(self, coordinator):
        self.seconds, self.images, self._source = {}, {}, None
        self.main_seconds = 0.0  # the main thread's CPU over the whole run
        for link in (coordinator.local, coordinator.remote):
            link.next_report = self._noting(link.next_report)
        answer_one = coordinator._answer_one

        def timed() -> bool:
            started = time.thread_time()
            answered = answer_one()
            if answered:
                source, images = self._source
                self.seconds[source] = self.seconds.get(source, 0.0) + time.thread_time() - started
                self.images[source] = self.images.get(source, 0) + images
            return answered

        coordinator._answer_one = timed

    def _noting(self, next_report):
        def noted():
            found = next_report()
            if found is not None:
                self._source = (found[0] != 0, report_images(found[1]))
            return found

        return noted

    def describe(self) -> str:
        parts = []
        for other, name in ((False, "its own"), (True, "other ranks'")):
            if self.images.get(other):
                parts.append(f"{name} {1000 * self.seconds[other] / self.images[other]:.3f} "
                             f"({self.images[other]} images)")
        return ", ".join(parts)


def report_images(report: dict) -> int:
    """Images a rank's report answers for."""
    from vggserve.distributed.pipeline import ChunkOutcome

    return ChunkOutcome(report["results"], report["errors"]).images


if __name__ == "__main__":
    sys.exit(main())
