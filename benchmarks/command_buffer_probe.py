"""Does this device record kernels into a command buffer (cl_khr_command_buffer), and what does a replay cost?

    python benchmarks/command_buffer_probe.py [--device gpu] [--kernels 24] [--iterations 2000]

Prints the device's extensions that name command buffers (with their versions), then, where the extension is there:
records K trivial kernels (each adds 1 to a buffer) into one command buffer, checks that a replay adds K, and times
the host's cost of one replay against K launches through pyopencl. Issues 25 and 26: batch 1 is bound by the host's
launches (8-9 us each on NVIDIA's driver).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_timing import per_call_us  # noqa: E402

RING = 3
SRC = "__kernel void add1(__global float *x, const int n) { const int i = get_global_id(0); if (i < n) x[i] += 1.0f; }"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--kernels", type=int, default=24)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import pyopencl as cl

    from vggserve.runtime import cmdbuf
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(args.device))
    out = {"device": dev.name, "driver": dev.driver_version, "extensions": cmdbuf.extension_versions(dev)}
    print(json.dumps(out), flush=True)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    api = cmdbuf.Api.of(dev)
    if api is None:
        out["supported"] = False
        print("no cl_khr_command_buffer on this device", flush=True)
    else:
        out["supported"] = True
        n, k = 4096, args.kernels
        kern = cl.Kernel(cl.Program(ctx, SRC).build(), "add1")
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(n, np.float32))
        kern.set_args(buf, np.int32(n))
        out.update(api.capabilities(dev))
        ring = []
        for _ in range(RING):  # a buffer is enqueued again only once its last run is done, as the engine's slots do
            recording = api.record(q)
            for _ in range(k):
                recording.kernel(kern, (n,), (256,))
            ring.append([recording.finish(), None])
        cb = ring[0][0]
        ev = ring[0][1] = cb.enqueue(q)
        q.finish()
        got = np.empty(n, np.float32)
        cl.enqueue_copy(q, got, buf)
        out["replay_adds"] = float(got[0])
        out["replay_correct"] = bool(np.all(got == k))
        print(json.dumps({"replay_adds": out["replay_adds"], "correct": out["replay_correct"], "event": bool(ev)}),
              flush=True)

        def launches():
            for _ in range(k):
                cl.enqueue_nd_range_kernel(q, kern, (n,), (256,))

        turn = [0]

        def replay():
            held = ring[turn[0] % RING]
            turn[0] += 1
            if held[1] is not None:
                held[1].wait()
            held[1] = held[0].enqueue(q)

        iters = max(1, args.iterations // k)
        for _ in range(2):
            out["launches_host_us"], out["launches_with_device_us"] = per_call_us(q, launches, iters)
            out["replay_host_us"], out["replay_with_device_us"] = per_call_us(q, replay, iters)
        for cb, _ in ring:
            cb.release()
        print(json.dumps({key: out[key] for key in ("launches_host_us", "launches_with_device_us", "replay_host_us",
                                                      "replay_with_device_us")}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
