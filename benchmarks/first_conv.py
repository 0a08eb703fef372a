"""features.0 on conv_first.cl: each variant (pixels per work-item, weights in local or constant memory, or the tensor
cores) timed at a few batches and precisions on one device, its output checked against the default variant's (the
fma variants and mma.sync's sums may differ by one unit in the last place: "ulps_from_default").

    python benchmarks/first_conv.py --device gpu --batches 1,64 --precisions fp16,tf32 [--json out.json]

Prints one line per (precision, batch, variant): device ms (median of --repeats, OpenCL profiling) and the useful
TFLOP/s (2 x 27 x 64 multiply-adds a pixel).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import pyopencl as cl

    from vggserve.ops import precision as precisions
    from vggserve.ops.first_conv import DEFAULT, VARIANTS, FirstConv, ulps_apart
    from vggserve.ops.launch import MF
    from vggserve.ops.registry import BuildEnv, LayerSpec
    from vggserve.runtime import caps as device_caps, devices as devs
    from vggserve.runtime.programs import ProgramCache

    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device, progress=False)
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((64, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(64)).astype(np.float32)
    rows = []
    for name in args.precisions.split(","):
        prec = precisions.get(name)
        for batch in (int(b) for b in args.batches.split(",")):
            x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
            src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
            layer = LayerSpec("conv3x3", 3, 64, 224, relu=True)
            env = BuildEnv(caps=caps, max_batch=batch)
            reference = None
            for params in [DEFAULT[name]] + [v for v in VARIANTS if v != DEFAULT[name]]:
                op = FirstConv(ctx, cache, prec, layer, weight, bias, env, params=params)
                dst = cl.Buffer(ctx, MF.READ_WRITE, batch * 224 * 224 * op.cstore * prec.itemsize)
                op.enqueue(queue, src, dst, batch, 224, 224).wait()
                times = []
                for _ in range(args.repeats):
                    ev = op.enqueue(queue, src, dst, batch, 224, 224)
                    ev.wait()
                    times.append((ev.profile.end - ev.profile.start) * 1e-6)
                out = np.empty(batch * 224 * 224 * op.cstore, prec.storage)
                cl.enqueue_copy(queue, out, dst)
                reference = out if reference is None else reference
                ms = float(np.median(times))
                row = {"precision": name, "batch": batch, **params, "ms": round(ms, 4),
                       "tflops": round(2 * 27 * 64 * batch * 224 * 224 / ms / 1e9, 2),
                       "same_bytes_as_default": bool(np.array_equal(out.view(np.uint8), reference.view(np.uint8))),
                       "ulps_from_default": float(ulps_apart(out, reference, prec.tf32).max()), "device": info.label}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ulps_from_default"] <= 1 for r in rows) else 1



if __name__ == "__main__":
    sys.exit(main())
