"""Large host copies into pinned staging memory, split over a few threads.

One core copies at about 7 GB/s on the H100's host, so a batch of 64 float32 inputs (38.5 MB) takes ~5.5 ms on one
thread: longer than the DMA that follows it, and in the way of two batches in flight. numpy lets go of the GIL
while it copies, so a few threads copy in parallel: one array split along its first axis (`copy_into`), or a
batch given as many images, each to its own place (`copy_many`: 32 decoded 500x375 photos are 18 MB).

Many small pieces (a batch's compressed JPEGs: 64 x 66 KB) stay on the calling thread however many bytes they add
up to (`small_pieces`; `join_into`, when they go back to back, copies them with one call). Each copy lets go of the
GIL and takes it back, and in a busy engine process a copying thread waits for it each time: 64 such copies over the
threads took twice as long as on the calling thread with two busy Python threads beside them, and the device worker
waited for them (0.7 ms per batch on an H200 host, BENCHMARKS.md).
"""

import os
import threading

import numpy as np

THREADS = 4            # at most this many copying threads (never more than the cores)
MIN_SPLIT = 4 << 20    # bytes below which one thread copies (a thread hop costs more than it saves)
MIN_PAIR = 256 << 10   # mean bytes per pair below which one thread copies, whatever the total

_pool = None
_lock = threading.Lock()


def _executor():
    global _pool
    with _lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_threads(), thread_name_prefix="vggserve-copy")
        return _pool


def _threads() -> int:
    return max(1, min(THREADS, os.cpu_count() or 1))


def small_pieces(nbytes: int, pieces: int) -> bool:
    """Whether `pieces` pieces of `nbytes` in all stay on the calling thread whatever their total: below MIN_PAIR
    bytes each on average."""
    return nbytes < MIN_PAIR * pieces


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src (same shape; src is cast to dst's dtype as np.copyto does), split along the first axis over
    the copying threads when it is large (`copy_many` of its row blocks)."""
    if dst.ndim == 0 or dst.shape[0] < 2:
        np.copyto(dst, src)
        return
    step = -(-dst.shape[0] // _threads())
    copy_many([(dst[s:s + step], src[s:s + step]) for s in range(0, dst.shape[0], step)])


def join_into(out: np.ndarray, srcs: list) -> None:
    """The one-dimensional arrays `srcs` back to back into `out`, which is exactly as long: small pieces (below
    MIN_PAIR on average) by one np.concatenate on the calling thread, large ones through `copy_many`."""
    if small_pieces(sum(src.nbytes for src in srcs), len(srcs)):
        np.concatenate(srcs, out=out)
        return
    pairs, at = [], 0
    for src in srcs:
        pairs.append((out[at:at + src.size], src))
        at += src.size
    copy_many(pairs)


def copy_many(pairs: list) -> None:
    """dst[...] = src for each (dst, src) in `pairs` (as np.copyto), the pairs dealt over the copying threads in runs
    of about equal bytes when they add up to a large copy of large pieces."""
    threads = _threads()
    total = sum(src.nbytes for _, src in pairs)
    if total < MIN_SPLIT or threads == 1 or len(pairs) < 2 or small_pieces(total, len(pairs)):
        for dst, src in pairs:
            np.copyto(dst, src)
        return
    runs, run, filled, share = [], [], 0, total / threads
    for pair in pairs:  # consecutive pairs up to one thread's share of the bytes
        run.append(pair)
        filled += pair[1].nbytes
        if filled >= share * (len(runs) + 1) and len(runs) < threads - 1:
            runs.append(run)
            run = []
    runs.append(run)
    list(_executor().map(lambda r: [np.copyto(dst, src) for dst, src in r], [r for r in runs if r]))
