"""A front end's admission on its own: microseconds per request of `admit(1)` then `release(1)` on its queue
(RemoteQueue), as every request does once (release: its answer's `count_held`, under the queue's lock).

    python benchmarks/admission_cost.py                      # local count, and shared with 2, 8, 32, 64 front ends
    python benchmarks/admission_cost.py --rounds 1000000

`local`: the queue counts alone (one process; the front ends' per-front-end share until issue 24). `shared N`: it
counts in the server's shared block of N front-end slots (processes.admission), the others idle; `shared N full`:
the block is full, so every admission is refused (QueueFull raised and caught, the 429's path). Best of --repeat.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def per_request_us(queue, rounds: int, repeat: int, refused: bool = False) -> float:
    from vggserve.serving.scheduling.errors import QueueFull

    best = float("inf")
    admit, release = queue.admit, queue.release
    for _ in range(repeat):
        start = time.perf_counter()
        if refused:
            for _ in range(rounds):
                try:
                    admit(1)
                except QueueFull:
                    pass
        else:
            for _ in range(rounds):
                admit(1)
                release(1)
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--front-ends", default="2,8,32,64", help="shared blocks of these many slots (default 2,8,32,64)")
    args = p.parse_args(argv)
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.processes.engine_link import RemoteQueue

    def queue(shared=None):
        return RemoteQueue(256, Metrics(), lambda message: None, shared)

    print(f"local: {per_request_us(queue(), args.rounds, args.repeat):.3f} us per request")
    try:
        from vggserve.serving.processes.admission import AdmissionBlock
    except ImportError:  # a tree from before the shared count
        return 0
    for n in map(int, args.front_ends.split(",")):
        block = AdmissionBlock(n)
        mine = queue(block.count(0, 256))
        print(f"shared {n}: {per_request_us(mine, args.rounds, args.repeat):.3f} us per request")
        other = queue(block.count(n - 1, 256))
        other.admit(256)
        print(f"shared {n} full: {per_request_us(mine, args.rounds, args.repeat, refused=True):.3f} us per refusal")
        other.release(256)
    return 0


if __name__ == "__main__":
    sys.exit(main())
