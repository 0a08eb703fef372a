"""Winograd F(2x2,3x3) (conv_winograd.cl) against the implicit GEMM (conv_gemm.cl), per VGG16 conv shape.

    python benchmarks/winograd_vs_gemm.py --device gpu --batch 64 --iterations 10 [--json out.json]
    python benchmarks/winograd_vs_gemm.py --device cpu --batch 1 --iterations 2 --shapes 512x512x14,256x512x28

For every distinct VGG16 3x3 conv shape (CINxCOUTxSIZE) at the given batch: median milliseconds over OpenCL
profiling events (GemmLayer: its one launch; WinogradLayer: first launch's start to last launch's end, with the
three kernels' shares), effective TFLOP/s = DIRECT-convolution flops / time for both (so the figures compare with
conv_gemm's and cuDNN's), the speed-up, the max relative difference between the two outputs, and each one's
max relative error against a float64 direct convolution of the first image. GemmLayer uses the device kind's
default parameters (params.TABLE; --tuned: the tuned table for this batch), WinogradLayer the defaults in
vggserve/model/winograd.py unless --winograd-params '{"TM": 128, ...}' overrides some.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def vgg_shapes(width: float = 1.0):
    from vggserve.weights.spec import INPUT_SIZE, vgg16_spec

    shapes, names, size = {}, {}, INPUT_SIZE
    for c in vgg16_spec(width).convs:
        key = f"{c.cin}x{c.cout}x{size}"
        shapes.setdefault(key, (c.cin, c.cout, size))
        names.setdefault(key, []).append(c.name)
        size //= 2 if c.pool_after else 1
    return shapes, names


def median_ms(events_list):
    """Per call: first event's start to last event's end; the median over calls, in ms."""
    return float(np.median([(evs[-1].profile.end - evs[0].profile.start) * 1e-6 for evs in events_list]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="OpenCL device spec (gpu, cpu, gpu:1, ...)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=10, help="timed calls per layer (median)")
    ap.add_argument("--shapes", default="", help="comma-separated CINxCOUTxSIZE keys (default: all 3x3 shapes)")
    ap.add_argument("--winograd-params", default="{}", help="JSON overrides of the Winograd tunables")
    ap.add_argument("--tuned", action="store_true", help="GemmLayer with this device's tuned params, if stored")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 check of the first image")
    ap.add_argument("--json", default=None, help="write all figures to this file")
    args = ap.parse_args()

    import pyopencl as cl

    from vggserve.model import winograd
    from vggserve.model.layers import GemmLayer
    from vggserve.model.reference import conv3x3_relu
    from vggserve.runtime import devices as devs
    from vggserve.runtime.params import TABLE, GPU_DEFAULT, conv_params_for, params_for
    from vggserve.runtime.programs import ProgramCache

    mf = cl.mem_flags
    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device)
    table = params_for(info.kind, info.label) if args.tuned else TABLE.get(info.kind, GPU_DEFAULT)
    wparams = {**winograd.default_params(info.kind), **json.loads(args.winograd_params)}
    wprog = cache.build(winograd.KERNEL_FILE, winograd.defines(wparams))
    shapes, names = vgg_shapes()
    keys = [k.strip() for k in args.shapes.split(",") if k.strip()] or list(shapes)
    n, rng = args.batch, np.random.default_rng(0)
    print(f"{info.label}: batch {n}, {args.iterations} iterations; Winograd {wparams}", flush=True)
    head = (f"{'shape':>12s} {'layers':<22s} {'gemm ms':>9s} {'TFLOP/s':>8s} {'wino ms':>9s} {'TFLOP/s':>8s} "
            f"{'speedup':>7s} {'in/gemm/out %':>14s} {'maxrel':>8s} {'gemm f64':>8s} {'wino f64':>8s}")
    print(head)
    rows = []
    for key in keys:
        cin, cout, size = (int(v) for v in key.split("x")) if key not in shapes else shapes[key]
        gparams = conv_params_for(table, cin, cout, size, n) if args.tuned else dict(table["conv"])
        if winograd.is_winograd(gparams):
            gparams = dict(table["conv"])
        weight = (rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        bias = (rng.standard_normal(cout, dtype=np.float32) * 0.05).astype(np.float32)
        x = rng.standard_normal((n, cin, size, size), dtype=np.float32)
        src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        dst = cl.Buffer(ctx, mf.READ_WRITE, 4 * n * cout * size * size)
        gemm = GemmLayer(ctx, cache.build("conv_gemm.cl", {**gparams, "KS": 3, "PAD": 1, "RELU": 1}), gparams,
                         weight, bias)
        wino = winograd.WinogradLayer(ctx, wprog, wparams, weight, bias, max_batch=n, max_h=size, max_w=size)
        outs, times = {}, {}
        for name, layer in (("gemm", gemm), ("wino", wino)):
            layer.enqueue(queue, src, dst, n, size, size)  # warm-up
            queue.finish()
            calls, parts = [], []
            for _ in range(args.iterations):
                ev = layer.enqueue(queue, src, dst, n, size, size)
                queue.finish()
                evs = list(layer.events) if name == "wino" else [ev]
                calls.append(evs)
                if name == "wino":
                    parts.append([sum((e.profile.end - e.profile.start) for e in evs[i::3]) for i in range(3)])
            times[name] = median_ms(calls)
            if parts:
                share = np.median(np.array(parts, dtype=np.float64), axis=0)
                times["parts"] = (100 * share / share.sum()).round(0).astype(int).tolist()
            out = np.empty((n, cout, size, size), np.float32)
            cl.enqueue_copy(queue, out, dst)
            outs[name] = out
        flops = gemm.flops(n, size, size)
        scale = max(float(np.abs(outs["gemm"]).max()), 1e-30)
        row = {"shape": key, "layers": names.get(key, []), "batch": n, "flops": flops,
               "gemm_ms": times["gemm"], "wino_ms": times["wino"], "wino_parts_pct": times["parts"],
               "gemm_tflops": flops / times["gemm"] * 1e-9, "wino_tflops": flops / times["wino"] * 1e-9,
               "max_rel_diff": float(np.abs(outs["wino"] - outs["gemm"]).max() / scale),
               "gemm_params": gparams, "wino_params": wparams}
        if not args.no_reference:
            ref = conv3x3_relu(x[:1].astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
            rs = max(float(np.abs(ref).max()), 1e-30)
            row["gemm_err_f64"] = float(np.abs(outs["gemm"][:1] - ref).max() / rs)
            row["wino_err_f64"] = float(np.abs(outs["wino"][:1] - ref).max() / rs)
        rows.append(row)
        print(f"{key:>12s} {','.join(nm.split('.')[-1] for nm in row['layers']) or '-':<22s} "
              f"{row['gemm_ms']:9.3f} {row['gemm_tflops']:8.3f} {row['wino_ms']:9.3f} {row['wino_tflops']:8.3f} "
              f"{row['gemm_ms'] / row['wino_ms']:7.2f} {'/'.join(map(str, row['wino_parts_pct'])):>14s} "
              f"{row['max_rel_diff']:8.1e} {row.get('gemm_err_f64', float('nan')):8.1e} "
              f"{row.get('wino_err_f64', float('nan')):8.1e}", flush=True)
        for buf in (src, dst, wino.ws.v, wino.ws.m):
            buf.release()
    total_g = sum(r["gemm_ms"] * len(r["layers"] or [1]) for r in rows)
    total_w = sum(min(r["gemm_ms"], r["wino_ms"]) * len(r["layers"] or [1]) for r in rows)
    print(f"all conv layers: gemm {total_g:.2f} ms; best of both per layer {total_w:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": info.label, "batch": n, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
