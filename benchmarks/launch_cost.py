"""The host's cost of one batch-1 forward on this OpenCL driver, split by call (issues 25, 26).

    python benchmarks/launch_cost.py --precisions fp16,int8 --iterations 300

1. A trivial kernel launched back to back: pyopencl's enqueue_nd_range_kernel (which makes an event) against a
   direct clEnqueueNDRangeKernel through ctypes, with an event and without one (NULL): host microseconds each.
2. The model's streamed batch-1 submit with every pyopencl call it makes timed and counted (kernels, copies,
   barriers, flushes, argument setting): host microseconds per submit, per call kind. Twice: the forward pass run
   step by step (VGGSERVE_REPLAY=0's way), and replayed (engine/replay.py, the default), whose launches go through
   ctypes and are counted as the plan's.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_timing import per_call_us  # noqa: E402

DEVICE = os.environ.get("LAUNCH_COST_DEVICE", "gpu")
SRC = "__kernel void nop(__global float *x, const int n) { const int i = get_global_id(0); if (i < n) x[i] += 1.0f; }"


def launch_micro(cl, iterations: int) -> dict:
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(DEVICE))
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, SRC).build()
    k = cl.Kernel(prg, "nop")
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    k.set_args(buf, np.int32(4096))
    from vggserve.runtime.clib import enqueue_nd_range_kernel, library

    f = enqueue_nd_range_kernel()  # the replay's own binding (engine/replay.py)
    sz = ctypes.c_size_t
    release = library().clReleaseEvent
    release.argtypes = [ctypes.c_void_p]
    gsize, lsize = (sz * 1)(4096), (sz * 1)(256)
    qp, kp = ctypes.c_void_p(q.int_ptr), ctypes.c_void_p(k.int_ptr)
    out = {}

    def timed(name, body):
        for _ in range(2):  # the second round is kept
            host, total = per_call_us(q, body, iterations)
        out[name] = {"host_us": host, "with_device_us": total}

    timed("pyopencl_enqueue_nd_range_kernel", lambda: cl.enqueue_nd_range_kernel(q, k, (4096,), (256,)))
    ev = ctypes.c_void_p()

    def with_event():
        f(qp, kp, 1, None, gsize, lsize, 0, None, ctypes.byref(ev))
        release(ev)

    timed("ctypes_with_event", with_event)
    timed("ctypes_no_event", lambda: f(qp, kp, 1, None, gsize, lsize, 0, None, None))
    timed("pyopencl_flush", q.flush)
    return out


def submit_profile(cl, prec: str, iterations: int, replay: bool) -> dict:
    from vggserve import VGG16
    from vggserve.cli.bench import eight_bit_calibration
    from vggserve.ops import launch
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=0)
    calibration = eight_bit_calibration(prec, None, tensors)
    if callable(calibration):
        calibration = calibration()
    model = VGG16.load(tensors, device=DEVICE, max_batch_size=1, precision=prec, calibration=calibration)
    model.replay = replay
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    stats = defaultdict(lambda: [0, 0.0])
    names = ["enqueue_nd_range_kernel", "enqueue_copy", "enqueue_barrier", "enqueue_marker"]
    originals = {n: getattr(cl, n) for n in names}

    def wrap(name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                s = stats[name]
                s[0] += 1
                s[1] += time.perf_counter() - t
        return timed

    original_call = launch.Launch.__call__

    def call(self, queue, grid, local, *args, wait_for=None):
        if not any(held == args for held, _ in self.copies):  # a kernel copy's arguments are set
            stats["set_args (changed)"][0] += 1
        return original_call(self, queue, grid, local, *args, wait_for=wait_for)

    def run(n):
        pending = []
        t = time.perf_counter()
        host = 0.0
        for _ in range(n):
            h = time.perf_counter()
            pending.append(model.submit(x))
            host += time.perf_counter() - h
            if len(pending) > 2:
                pending.pop(0).result()
        for p in pending:
            p.result()
        return n / (time.perf_counter() - t), host / n * 1e6

    model.logits(x)
    record_ms = None
    if replay:  # what one recording and its plan cost the host (engine/replay.py makes one per batch size, lane
        # and slot; a service's warm-up makes them all): the steps run into a Recording, a kernel object per launch
        model.plans.clear()
        t = time.perf_counter()
        made = model.prepare_replays()
        record_ms = round((time.perf_counter() - t) * 1e3 / max(1, made), 3)
    plain_rate, plain_host = run(iterations)
    for n, fn in originals.items():
        setattr(cl, n, wrap(n, fn))
    launch.Launch.__call__ = call
    queue_flush = cl.CommandQueue.flush
    cl.CommandQueue.flush = wrap("flush", queue_flush)
    try:
        stats.clear()
        rate, host = run(iterations)
    finally:
        for n, fn in originals.items():
            setattr(cl, n, fn)
        launch.Launch.__call__ = original_call
        cl.CommandQueue.flush = queue_flush
    replayed = [len(p.launches) for p in model.plans.kept()]
    model.close()
    return {"replay": replay, "record_ms": record_ms, "replayed_launches_per_submit": replayed[0] if replayed else 0,
            "img_s": round(plain_rate, 1), "host_us_per_submit": round(plain_host, 1),
            "instrumented_host_us_per_submit": round(host, 1),
            "calls_per_submit": {k: {"count": round(v[0] / iterations, 2), "us_each": round(v[1] / max(1, v[0]) * 1e6, 2)}
                                 for k, v in stats.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="fp16")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import pyopencl as cl

    res = {"micro": launch_micro(cl, 2000)}
    print(json.dumps(res["micro"]), flush=True)
    for prec in args.precisions.split(","):
        for replay in (False, True, False, True):  # in turn, twice: the host's pace drifts
            key = f"{prec}{' replayed' if replay else ''}"
            res.setdefault(key, []).append(submit_profile(cl, prec, args.iterations, replay))
            print(key, json.dumps(res[key][-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
