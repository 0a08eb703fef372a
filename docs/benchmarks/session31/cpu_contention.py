"""How fast one Python thread runs while k other processes keep cores busy: the host's per-core speed under load.

    python docs/benchmarks/session31/cpu_contention.py [K ...]

For each k, k busy-loop processes start, then the measuring process times a fixed pure-Python loop (best of 5) and
numpy copies of 4.3 MB (a batch of compressed JPEGs), against k = 0. A machine whose vCPUs are hyperthreads of fewer
physical cores slows down once k passes their count; one that lowers its clock under load slows down gradually."""
import multiprocessing as mp
import os
import sys
import time

import numpy as np


def spin(stop):
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x += i


def loop_s() -> float:
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i * i
        best = min(best, time.perf_counter() - t)
    return best


def copy_s(src, dst) -> float:
    best = 1e9
    for _ in range(20):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ks = [int(a) for a in sys.argv[1:]] or [0, 4, 8, 12, 16, 20, 24, 28, 31]
    n = os.cpu_count()
    os.sched_setaffinity(0, {0})
    src, dst = np.ones(4_300_000, np.uint8), np.zeros(4_300_000, np.uint8)
    base = None
    for k in ks:
        stop = mp.Event()
        procs = [mp.Process(target=spin, args=(stop,)) for _ in range(k)]
        for i, p in enumerate(procs):
            p.start()
            os.sched_setaffinity(p.pid, {1 + i % (n - 1)})
        time.sleep(0.5)
        loop, copy = loop_s(), copy_s(src, dst)
        stop.set()
        for p in procs:
            p.join()
        base = base or (loop, copy)
        print(f"busy {k:2d} of {n}: python loop {loop * 1e3:7.2f} ms ({loop / base[0]:.2f}x), "
              f"4.3 MB copy {copy * 1e6:7.1f} us ({copy / base[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
