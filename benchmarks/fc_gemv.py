"""VGG16's three FC layers at FP16, small batches: tc_gemm (the family's default, split K as the engine builds it)
against every tc_gemv candidate (kernels/fc_half_gemv.cl), each checked against tc_gemm's output as the tuner does.

    python benchmarks/fc_gemv.py --device gpu [--batches 1 2 4 8] [--repeats 50]
    VGGSERVE_EMULATE_MMA=1 python benchmarks/fc_gemv.py --device cpu --width 0.125 --repeats 2   # a smoke run

Prints, per layer and batch: each kernel's median device ms (profiling events, first launch to last), the weights'
bandwidth it reaches (FP16 bytes / time: the ceiling is the GPU's memory bandwidth, about 3.35 TB/s on an H100 SXM),
its error against tc_gemm relative to the largest output, and per batch the three layers' sum with each kernel's
best (the figure issue 25 asks about: tc_gemm 0.136 ms at batch 1 on the H100).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vggserve import tuning  # noqa: E402
from vggserve.ops import precision as precisions, registry  # noqa: E402
from vggserve.ops.registry import BuildEnv, LayerSpec  # noqa: E402
from vggserve.runtime import caps as device_caps, devices as devs  # noqa: E402
from vggserve.runtime.params import params_for  # noqa: E402
from vggserve.runtime.programs import ProgramCache  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--width", type=float, default=1.0, help="VGG16's width (1.0; 0.125 for a smoke run on a CPU)")
    args = ap.parse_args(argv)
    fp16 = precisions.FP16
    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    precisions.check(fp16, caps.tensor_cores, info.label, fp8=caps.fp8)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device, progress=False)
    gemm, gemv = registry.get("tc_gemm"), registry.get("tc_gemv")
    print(f"{info.label}: FP16 FC layers, {args.repeats} timed runs each (median)")
    for batch in args.batches:
        env = BuildEnv(caps=caps, max_batch=batch, tables=params_for(info.kind, info.label))
        best = {"tc_gemm": 0.0, "tc_gemv": 0.0}
        for key, cin, cout, size, _ in [s for s in tuning.layer_shapes(batch, args.width) if s[4] == 1]:
            layer = LayerSpec("fc", cin, cout, size)
            bench = tuning.LayerBench(ctx, "tensorcore", fp16, layer, batch, np.random.default_rng(0))
            mb = 2 * cin * cout / 1e6
            ref_ms, ref = tuning.time_op(queue, gemm.make(ctx, cache, gemm.default(caps, fp16), fp16, layer,
                                                          bench.weight, bench.bias, env), bench, batch, 1, args.repeats)
            scale = max(float(np.abs(ref).max()), 1e-30)
            print(f"{key:>13s} batch {batch}: tc_gemm {ref_ms:8.4f} ms {mb / ref_ms:7.0f} GB/s")
            best["tc_gemm"] += ref_ms
            top = None
            for p in gemv.candidates(caps, fp16, layer):
                op = gemv.make(ctx, cache, p, fp16, layer, bench.weight, bench.bias, env)
                ms, out = tuning.time_op(queue, op, bench, batch, 1, args.repeats)
                err = float(np.abs(out - ref).max() / scale) if np.all(np.isfinite(out)) else float("inf")
                ok = err < tuning.TOLERANCE["fp16"]
                print(f"{'':>13s}          {op.describe():42s} {ms:8.4f} ms {mb / ms:7.0f} GB/s  "
                      f"err {err:.1e}{'' if ok else '  WRONG'}")
                if ok and (top is None or ms < top[0]):
                    top = (ms, op.describe())
            if top is not None:
                best["tc_gemv"] += top[0]
                print(f"{'':>13s}          best tc_gemv: {top[1]}, {ref_ms / top[0]:.2f}x tc_gemm")
        print(f"batch {batch}: the FC layers take {best['tc_gemm']:.4f} ms on tc_gemm, {best['tc_gemv']:.4f} ms on "
              "tc_gemv's best per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
