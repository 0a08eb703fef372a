"""2:4 structured sparsity on sparse tensor cores (mma.sp) against our own dense FP16 engine: every VGG16 conv layer
at one batch, then the whole network pruned 2:4 against the dense one, at FP16.

    python benchmarks/sparse_tc.py --device gpu --batch 64 --json sparse24.json --store
    VGGSERVE_EMULATE_MMA=1 python benchmarks/sparse_tc.py --device cpu --batch 1 --width 0.0625 --shapes 4x8x112

Per distinct conv shape (CINxCOUTxSIZE), on random He weights pruned 2:4 (weights prune --pattern 2:4's rule: 2 of
every 4 input channels of a tap): the engine's dense FP16 layer exactly as VGG16 builds it (the tuned tc_gemm or
tc_halo), every tile candidate of the 2:4 kernel (kernels/conv_tc_sparse.cl: ms, speed-up, max relative error on the
first image against float64 on the FP16-rounded operands), and, when torch is importable, cuDNN's dense FP16
convolution (channels_last) at the same shape. The best candidate (geometric mean over the shapes) is the 2:4
entry's tile; --store writes it and its per-shape speed-ups to the tuned-parameter file, so the engine takes the
2:4 kernel exactly where it measured faster. Then the whole network at each of --network-batches: FP16 images/s on
dense weights and on the same weights with every conv pruned 2:4, and the kernel each layer got (the engine's own
choice, no flags). Writes a table and --json (after every layer: a run cut short keeps what it measured).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare_torch's timer


def torch_fp16_timer(device: str, iterations: int):
    """A function (kind, cin, cout, size, batch) -> ms of torch's dense FP16 conv + ReLU (channels_last, cuDNN), or
    None without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not (device.startswith("gpu") and torch.cuda.is_available()):
        return None
    from compare_torch import Timer

    torch.backends.cudnn.benchmark = True

    def run(kind, cin, cout, size, batch):
        with torch.inference_mode():
            mf = torch.channels_last
            x = torch.randn(batch, cin, size, size, device="cuda").half().to(memory_format=mf)
            w = torch.randn(cout, cin, 3, 3, device="cuda").half().to(memory_format=mf)
            b = torch.randn(cout, device="cuda").half()
            f = lambda: torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))  # noqa: E731
            for _ in range(3):
                f()
            times = []
            for _ in range(iterations):
                with Timer(torch, "cuda") as t:
                    f()
                times.append(t.ms)
            return float(np.median(times))

    return run


def table(runs) -> str:
    lines = [f"{'shape':>14s} {'layers':<16s} {'dense FP16 ms':>13s} {'2:4 ms':>8s} {'x dense':>8s} "
             f"{'cuDNN ms':>9s} {'x cuDNN':>8s} {'err':>8s}  best tile / dense kernel"]
    for r in runs:
        pts = [p for p in r.points if p.ms is not None]
        if not pts:
            continue
        best = min(pts, key=lambda p: p.ms)
        cudnn = r.torch_ms if r.torch_ms is not None else float("nan")
        names = ",".join(n.split(".")[-1] for n in r.layers)
        lines.append(f"{r.shape:>14s} {names:<16s} {r.dense_ms:13.3f} {best.ms:8.3f} {best.speedup:8.2f} "
                     f"{cudnn:9.3f} {cudnn / best.ms:8.2f} {best.err if best.err is not None else float('nan'):8.1e}"
                     f"  {best.params} / {r.dense_algo}")
    return "\n".join(lines)


def network(tensors, info, batches, iterations):
    """Dense FP16 vs every conv pruned 2:4, FP16: images/s (both models loaded, timed passes alternating) and the
    kernel each layer got."""
    from sparse_vs_dense import alternating
    from vggserve.model.vgg16 import VGG16
    from vggserve.weights.prune import prune

    pruned = prune(tensors, None, pattern="2:4", layers="conv").tensors
    out = []
    for n in batches:
        row = {"batch": n}
        row.update(alternating({"dense": lambda: VGG16.load(tensors, device=info.spec, max_batch_size=n,
                                                            precision="fp16"),
                                "2:4": lambda: VGG16.load(pruned, device=info.spec, max_batch_size=n,
                                                          precision="fp16")}, n, iterations, "2:4"))
        row["speedup"] = row["2:4_images_per_s"] / row["dense_images_per_s"]
        print(f"network FP16 batch {n}: dense {row['dense_images_per_s']:.1f} img/s, 2:4 "
              f"{row['2:4_images_per_s']:.1f} img/s, x{row['speedup']:.2f} (target 1.5x)", flush=True)
        for name, how in row["kernels"]:
            print(f"   {name:14s} {how}")
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="OpenCL device spec (gpu, cpu, gpu:1, ...)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=float, default=1.0, help="channel width of the network (1 = VGG16)")
    ap.add_argument("--shapes", default="", help="comma-separated CINxCOUTxSIZE keys (default: every conv shape)")
    ap.add_argument("--iterations", type=int, default=5, help="timed calls per kernel (median)")
    ap.add_argument("--candidates", default="", help="JSON list of tc_sparse24 tunables (default: the entry's)")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check of the first image")
    ap.add_argument("--network-batches", default="64", help="whole-network batches ('' for none)")
    ap.add_argument("--network-iterations", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--store", action="store_true",
                    help="store the best tile and its speed-ups for the engine's choice (before the network runs)")
    args = ap.parse_args(argv)

    from vggserve import sparse_tuning
    from vggserve.model.vgg16 import VGG16
    from vggserve.ops.sparse_select import TC_SPARSE24
    from vggserve.runtime import devices as devs
    from vggserve.weights.init import init_weights

    info = devs.resolve(args.device)
    tensors = init_weights(seed=0, width=args.width)
    result = {"device": info.label, "batch": args.batch, "width": args.width, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "layers": [], "network": []}

    def save(**parts):
        result.update(parts)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    candidates = [{"ALGO": TC_SPARSE24, **c} for c in json.loads(args.candidates)] if args.candidates else None
    print(f"{info.label}: 2:4 FP16 vs dense FP16, batch {args.batch}, width {args.width}", flush=True)
    with VGG16(tensors, device=info.spec, max_batch_size=args.batch, profile=True, precision="fp16") as model:
        if model.family != "tensorcore":
            print("no tensor cores on this device (VGGSERVE_EMULATE_MMA=1 runs their software model)")
            return 1
        runs = sparse_tuning.measure_2_4(model, tensors, args.batch, args.iterations, not args.no_check,
                                         [s.strip() for s in args.shapes.split(",") if s.strip()] or None,
                                         torch_fp16_timer(args.device, args.iterations), print, candidates,
                                         on_layer=lambda r: save(layers=sparse_tuning.as_json(r)))
    print(table(runs))
    params, curves = sparse_tuning.best_2_4(runs)
    print(f"best 2:4 tile over the shapes: {params}")
    for shape, c in curves.items():
        print(f"  {shape:>14s} x{c[TC_SPARSE24][0][1]:.2f} over dense FP16 with it")
    save(best_params=params, curves=curves)
    if args.store and params:
        sparse_tuning.store(info.label, curves, args.batch, {TC_SPARSE24: params})
        print(f"stored for {info.label} at batch {args.batch}: the engine takes 2:4 where it measured faster")
    batches = [int(b) for b in args.network_batches.split(",") if b.strip()]
    save(network=network(tensors, info, batches, args.network_iterations))
    return 0


if __name__ == "__main__":
    sys.exit(main())
