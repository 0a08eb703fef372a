"""A batch's compressed JPEGs (64 x 66 KB) copied into one array by `tables._joined`, over the copying threads
(hostcopy's MIN_SPLIT and MIN_PAIR at 1) or on the calling thread (MIN_PAIR's default), with 0 or 2 other Python
threads busy beside it (each: 200 us of Python, then 300 us asleep), as in a busy engine process. Run from the
repository root:
    python docs/benchmarks/session30/copy_contention.py
"""
import sys
import threading
import time

sys.path.insert(0, ".")
import numpy as np  # noqa: E402

from vggserve.decoding.device import tables  # noqa: E402
from vggserve.runtime import hostcopy  # noqa: E402

datas = [bytes(np.random.default_rng(i).integers(0, 255, 66_586, dtype=np.uint8)) for i in range(64)]
total = sum(map(len, datas))
out = np.empty(total + 16, np.uint8)
stop = False


def busy():
    while not stop:
        until = time.perf_counter() + 200e-6
        while time.perf_counter() < until:
            pass
        time.sleep(300e-6)


def wall_us(n=200):
    for _ in range(5):
        tables._joined(datas, total, lambda nbytes: out)
    t = time.perf_counter()
    for _ in range(n):
        tables._joined(datas, total, lambda nbytes: out)
    return (time.perf_counter() - t) / n * 1e6


pair = hostcopy.MIN_PAIR
for load in (0, 2):
    stop = False
    threads = [threading.Thread(target=busy, daemon=True) for _ in range(load)]
    for th in threads:
        th.start()
    hostcopy.MIN_SPLIT, hostcopy.MIN_PAIR = 1, 1
    over = wall_us()
    hostcopy.MIN_SPLIT, hostcopy.MIN_PAIR = 4 << 20, pair
    here = wall_us()
    print(f"{load} busy threads: over the copying threads {over:7.1f} us, on the calling thread {here:7.1f} us "
          f"per batch of 64")
    stop = True
    for th in threads:
        th.join()
