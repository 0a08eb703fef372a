"""VGG16's three FC layers at small batches: tc_gemm (the tuned table's entry for the layer where it names tc_gemm,
else the family's default; split K as the engine builds it) against every candidate of the matrix-vector entry,
each checked against tc_gemm's output as the tuner does (outputs_agree): at FP16 tc_gemv (kernels/fc_half_gemv.cl),
at FP8 and INT8 tc_gemv8 (kernels/fc_eightbit_gemv.cl; the layers as the tuner times them: 8-bit codes in and out).

    python benchmarks/fc_gemv.py --device gpu [--precision fp16|fp8|int8] [--batches 1 2 4 8] [--repeats 50]
    VGGSERVE_EMULATE_MMA=1 python benchmarks/fc_gemv.py --device cpu --width 0.125 --repeats 2   # a smoke run

Prints, per layer and batch: each kernel's median device ms (profiling events, first launch to last), the weights'
bandwidth it reaches (weight bytes / time: the ceiling is the GPU's memory bandwidth, about 3.35 TB/s on an H100 SXM,
4.8 on an H200), its error against tc_gemm relative to the largest output, and per batch the three layers' sum with
each kernel's best (the figure issue 25 asks about: tc_gemm 0.136 ms at batch 1 on the H100).
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
from vggserve.runtime.params import conv_params_for, params_for  # noqa: E402
from vggserve.runtime.programs import ProgramCache  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--width", type=float, default=1.0, help="VGG16's width (1.0; 0.125 for a smoke run on a CPU)")
    ap.add_argument("--precision", default="fp16", choices=("fp16", "fp8", "int8"))
    ap.add_argument("--store", action="store_true",
                    help="store each layer's fastest agreeing candidate in the tuned table (as `vggserve tune` does) "
                         "where it beats tc_gemm")
    args = ap.parse_args(argv)
    prec = precisions.get(args.precision)
    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    precisions.check(prec, caps.tensor_cores, info.label, fp8=caps.fp8)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device, progress=False)
    name = "tc_gemv" if prec.half else "tc_gemv8"
    gemm, gemv = registry.get("tc_gemm"), registry.get(name)
    scales = tuning.EIGHT_BIT_SCALES.get(prec.name, {})
    print(f"{info.label}: {prec.name} FC layers, {args.repeats} timed runs each (median)")
    for batch in args.batches:
        env = BuildEnv(caps=caps, max_batch=batch, tables=params_for(info.kind, info.label))
        best, winners = {"tc_gemm": 0.0, name: 0.0}, {}
        for key, cin, cout, size, _ in [s for s in tuning.layer_shapes(batch, args.width) if s[4] == 1]:
            layer = LayerSpec("fc", cin, cout, size)
            bench = tuning.LayerBench(ctx, "tensorcore", prec, layer, batch, np.random.default_rng(0))
            mb = prec.itemsize * cin * cout / 1e6
            # the table's own tc_gemm entry where it has one (what --store would replace), else the default
            tuned = conv_params_for(env.tables, cin, cout, 1, batch, prec.name, default={})
            ref_params = tuned if tuned.get("ALGO") == "tc_gemm" else gemm.default(caps, prec)
            ref_ms, ref = tuning.time_op(queue, gemm.make(ctx, cache, ref_params, prec, layer, bench.weight,
                                                          bench.bias, env, **scales), bench, batch, 1, args.repeats)
            scale = max(float(np.abs(ref).max()), 1e-30)
            print(f"{key:>13s} batch {batch}: tc_gemm {ref_ms:8.4f} ms {mb / ref_ms:7.0f} GB/s")
            best["tc_gemm"] += ref_ms
            top = None
            for p in gemv.candidates(caps, prec, layer):
                op = gemv.make(ctx, cache, p, prec, layer, bench.weight, bench.bias, env, **scales)
                ms, out = tuning.time_op(queue, op, bench, batch, 1, args.repeats)
                err = float(np.abs(out - ref).max() / scale) if np.all(np.isfinite(out)) else float("inf")
                ok = tuning.outputs_agree(prec, out, ref, scale, tuning.TOLERANCE[prec.name])
                print(f"{'':>13s}          {op.describe():42s} {ms:8.4f} ms {mb / ms:7.0f} GB/s  "
                      f"err {err:.1e}{'' if ok else '  WRONG'}")
                if ok and (top is None or ms < top[0]):
                    top = (ms, op.describe(), p)
            if top is not None and top[0] < ref_ms:
                winners[key] = top[2]
            if top is not None:
                best[name] += top[0]
                print(f"{'':>13s}          best {name}: {top[1]}, {ref_ms / top[0]:.2f}x tc_gemm")
        print(f"batch {batch}: the FC layers take {best['tc_gemm']:.4f} ms on tc_gemm, {best[name]:.4f} ms on "
              f"{name}'s best per layer")
        if args.store and winners:
            tuning.store(info.label, winners, batch, prec.name)
            print(f"batch {batch}: stored {', '.join(f'{k} {v}' for k, v in winners.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
