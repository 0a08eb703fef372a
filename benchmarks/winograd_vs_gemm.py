"""Winograd F(2x2,3x3) and F(4x4,3x3) (conv_winograd.cl) against the implicit GEMM (conv_gemm.cl), per VGG16 conv
shape.

    python benchmarks/winograd_vs_gemm.py --device gpu --batch 256 --iterations 10 --json wino256.json
    python benchmarks/winograd_vs_gemm.py --device cpu --batch 1 --iterations 2 --shapes 512x512x14,256x512x28

For every distinct VGG16 3x3 conv shape (CINxCOUTxSIZE) at the given batch, for each variant (gemm, F2 =
Winograd F(2x2,3x3), F4 = Winograd F(4x4,3x3); --variants picks some): median milliseconds over OpenCL profiling
events (GemmLayer: its one launch; WinogradLayer: first launch's start to last launch's end, with the three
kernels' shares input/GEMM/output), effective TFLOP/s = DIRECT-convolution flops / time (so the figures compare
with conv_gemm's and cuDNN's), and the max relative error (max |err| / max |ref|) against a float64 direct
convolution of the first image (--no-reference skips it). The winner per shape is marked. GemmLayer uses the
device kind's default parameters (params.TABLE; --tuned: the tuned table for this batch), the Winograd variants
the defaults in vggserve/ops/winograd.py unless --winograd-params / --winograd4-params '{"TM": 128, ...}'
override some.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("gemm", "F2", "F4")


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
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--winograd-params", default="{}", help="JSON overrides of the F(2x2) Winograd tunables")
    ap.add_argument("--winograd4-params", default="{}", help="JSON overrides of the F(4x4) Winograd tunables")
    ap.add_argument("--tuned", action="store_true", help="GemmLayer with this device's tuned params, if stored")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 check of the first image")
    ap.add_argument("--json", default=None, help="write all figures to this file")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: a comma-separated subset of {','.join(VARIANTS)}")

    import pyopencl as cl

    from vggserve.ops import winograd
    from vggserve.ops.gemm import GemmLayer
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
    wparams = {"F2": {**winograd.default_params(info.kind, 2), **json.loads(args.winograd_params)},
               "F4": {**winograd.default_params(info.kind, 4), **json.loads(args.winograd4_params), "WINO_M": 4}}
    wprogs = {v: cache.build(winograd.KERNEL_FILE, winograd.defines(p)) for v, p in wparams.items() if v in variants}
    shapes, names = vgg_shapes()
    keys = [k.strip() for k in args.shapes.split(",") if k.strip()] or list(shapes)
    n, rng = args.batch, np.random.default_rng(0)
    print(f"{info.label}: batch {n}, {args.iterations} iterations; "
          + "; ".join(f"{v} {wparams[v]}" for v in variants if v in wparams), flush=True)
    head = f"{'shape':>12s} {'layers':<14s}"
    for v in variants:
        head += f" {v + ' ms':>9s} {'TFLOP/s':>8s} {'f64 err':>8s}"
        if v != "gemm":
            head += f" {'in/gemm/out %':>13s}"
    print(head + f" {'best':>5s} {'vs gemm':>7s}")
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
        ref = None
        if not args.no_reference:
            ref = conv3x3_relu(x[:1].astype(np.float64), weight.astype(np.float64), bias.astype(np.float64))
            rscale = max(float(np.abs(ref).max()), 1e-30)
        flops = 2.0 * n * size * size * cin * cout * 9
        row = {"shape": key, "layers": names.get(key, []), "batch": n, "flops": flops, "gemm_params": gparams}
        for v in variants:
            if v == "gemm":
                layer = GemmLayer(ctx, cache.build("conv_gemm.cl", {**gparams, "KS": 3, "PAD": 1, "RELU": 1}),
                                  gparams, weight, bias)
            else:
                layer = winograd.WinogradLayer(ctx, wprogs[v], wparams[v], weight, bias, max_batch=n, max_h=size,
                                               max_w=size)
            cl.enqueue_fill_buffer(queue, dst, np.float32(np.nan), 0, dst.size)  # unwritten outputs show as NaN
            layer.enqueue(queue, src, dst, n, size, size)  # warm-up
            queue.finish()
            out1 = np.empty((1, cout, size, size), np.float32)
            cl.enqueue_copy(queue, out1, dst)  # the first image, as the first call left it
            calls, parts = [], []
            for _ in range(args.iterations):
                ev = layer.enqueue(queue, src, dst, n, size, size)
                queue.finish()
                evs = [ev] if v == "gemm" else list(layer.events)
                calls.append(evs)
                if v != "gemm":
                    parts.append([sum((e.profile.end - e.profile.start) for e in evs[i::3]) for i in range(3)])
            ms = median_ms(calls)
            row[f"{v}_ms"], row[f"{v}_tflops"] = ms, flops / ms * 1e-9
            if parts:
                share = np.median(np.array(parts, dtype=np.float64), axis=0)
                row[f"{v}_parts_pct"] = (100 * share / share.sum()).round(0).astype(int).tolist()
                row[f"{v}_params"] = wparams[v]
                for per_queue in (layer.ws.v, layer.ws.m):
                    per_queue.release()
            if ref is not None:
                row[f"{v}_err_f64"] = float(np.abs(out1 - ref).max() / rscale)  # NaN if an output was not written
            del layer
        best = min(variants, key=lambda v: row[f"{v}_ms"])
        row["best"] = best
        line = f"{key:>12s} {','.join(nm.split('.')[-1] for nm in row['layers']) or '-':<14s}"
        for v in variants:
            line += f" {row[f'{v}_ms']:9.3f} {row[f'{v}_tflops']:8.3f} {row.get(f'{v}_err_f64', float('nan')):8.1e}"
            if v != "gemm":
                line += f" {'/'.join(map(str, row[f'{v}_parts_pct'])):>13s}"
        vs = f"{row['gemm_ms'] / row[f'{best}_ms']:7.2f}" if "gemm" in variants else f"{'-':>7s}"
        print(f"{line} {best:>5s} {vs}", flush=True)
        rows.append(row)
        for buf in (src, dst):
            buf.release()
    count = {r["shape"]: len(r["layers"] or [1]) for r in rows}
    totals = {v: sum(r[f"{v}_ms"] * count[r["shape"]] for r in rows) for v in variants}
    best_total = sum(min(r[f"{v}_ms"] for v in variants) * count[r["shape"]] for r in rows)
    print("all conv layers: " + "; ".join(f"{v} {t:.2f} ms" for v, t in totals.items())
          + f"; best per layer {best_total:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": info.label, "batch": n, "variants": variants,
                                               "rows": rows, "totals_ms": totals, "best_total_ms": best_total},
                                              indent=1))


if __name__ == "__main__":
    main()
