"""2:4 structured sparsity on sparse tensor cores (mma.sp) against our own dense FP16 engine: every VGG16 conv layer
at one batch, then the whole network pruned 2:4 against the dense one, at FP16.

    python benchmarks/sparse_tc.py --device gpu --batch 64 --json sparse24.json --store
    VGGSERVE_EMULATE_MMA=1 python benchmarks/sparse_tc.py --device cpu --batch 1 --width 0.0625 --shapes 4x8x112

Per distinct conv shape (CINxCOUTxSIZE), on random He weights pruned 2:4 (weights prune --pattern 2:4's rule: 2 of
every 4 input channels of a tap): the engine's dense FP16 layer exactly as VGG16 builds it (the tuned tc_gemm or
tc_halo), every tile candidate of both 2:4 kernels (tc_sparse24, kernels/conv_tc_sparse.cl, and tc_halo_sparse24,
kernels/conv_tc_halo_sparse.cl: ms, speed-up, max relative error on the first image against float64 on the
FP16-rounded operands), and, when torch is importable, cuDNN's dense FP16 convolution (channels_last) at the same
shape. Per kernel the best candidate (geometric mean over the shapes) is its tile; --store writes them and their
per-shape speed-ups to the tuned-parameter file, so the engine takes, per shape, the faster 2:4 kernel exactly where
it measured faster than dense. Then the whole network at each of --network-batches: FP16 images/s on dense weights
and on the same weights with every conv pruned 2:4, by logits() and streamed (batches submitted back to back), the
per-layer device times of both models (profiled, as `vggserve bench` prints them) and the kernel each layer got
(the engine's own choice, no flags). Writes tables and --json (after every layer: a run cut short keeps what it
measured).
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
    """Per shape and 2:4 kernel, its best tile against the dense FP16 layer (and cuDNN)."""
    lines = [f"{'shape':>14s} {'layers':<16s} {'dense FP16 ms':>13s} {'2:4 kernel':>16s} {'2:4 ms':>8s} "
             f"{'x dense':>8s} {'cuDNN ms':>9s} {'x cuDNN':>8s} {'err':>8s}  best tile / dense kernel"]
    for r in runs:
        names = ",".join(n.split(".")[-1] for n in r.layers)
        cudnn = r.torch_ms if r.torch_ms is not None else float("nan")
        for algo in dict.fromkeys(p.algo for p in r.points):
            pts = [p for p in r.points if p.ms is not None and p.algo == algo]
            if not pts:
                continue
            best = min(pts, key=lambda p: p.ms)
            err = best.err if best.err is not None else float("nan")
            lines.append(f"{r.shape:>14s} {names:<16s} {r.dense_ms:13.3f} {algo:>16s} {best.ms:8.3f} "
                         f"{best.speedup:8.2f} {cudnn:9.3f} {cudnn / best.ms:8.2f} {err:8.1e}  {best.params} / "
                         f"{r.dense_algo}")
    return "\n".join(lines)


def layer_table(row) -> str:
    """Per-layer device milliseconds of both models (profiled passes, as `vggserve bench` prints them), the 2:4
    model's over the dense one's, and the kernel each got."""
    dense, sparse = dict(row["layers"]["dense"]), dict(row["layers"]["2:4"])
    plans = row["plans"]
    lines = [f"   {'layer':22s} {'dense ms':>9s} {'2:4 ms':>9s} {'2:4/dense':>9s}  dense kernel | 2:4 kernel"]
    for name in dict.fromkeys(list(dense) + list(sparse)):
        d, s = dense.get(name, float("nan")), sparse.get(name, float("nan"))
        kd, ks = plans["dense"].get(name, ""), plans["2:4"].get(name, "")
        lines.append(f"   {name:22s} {d:9.3f} {s:9.3f} {s / d if d else float('nan'):9.2f}  "
                     f"{kd.split(' (')[0].split(';')[0]} | {ks.split(';')[0]}")
    total_d, total_s = sum(dense.values()), sum(sparse.values())
    lines.append(f"   {'sum of kernels':22s} {total_d:9.3f} {total_s:9.3f} {total_s / total_d:9.2f}")
    return "\n".join(lines)


def network(tensors, info, batches, iterations):
    """Dense FP16 vs every conv pruned 2:4, FP16: images/s by logits() (both models loaded with profile=True, timed
    passes alternating) and streamed (batches submitted back to back, two in flight), the per-layer device times of
    both (where the 2:4 network wins or loses its time) and the kernel each layer got."""
    from sparse_vs_dense import alternating
    from vggserve.model.vgg16 import VGG16
    from vggserve.weights.prune import prune

    pruned = prune(tensors, None, pattern="2:4", layers="conv").tensors
    out = []
    for n in batches:
        row = {"batch": n}
        row.update(alternating({"dense": lambda: VGG16.load(tensors, device=info.spec, max_batch_size=n,
                                                            precision="fp16", profile=True),
                                "2:4": lambda: VGG16.load(pruned, device=info.spec, max_batch_size=n,
                                                          precision="fp16", profile=True)},
                               n, iterations, "2:4", detail=True))
        row["speedup"] = row["2:4_images_per_s"] / row["dense_images_per_s"]
        row["streamed_speedup"] = row["2:4_streamed_images_per_s"] / row["dense_streamed_images_per_s"]
        print(f"network FP16 batch {n}: dense {row['dense_images_per_s']:.1f} img/s, 2:4 "
              f"{row['2:4_images_per_s']:.1f} img/s, x{row['speedup']:.2f} (target 1.5x); streamed: dense "
              f"{row['dense_streamed_images_per_s']:.1f} img/s, 2:4 {row['2:4_streamed_images_per_s']:.1f} img/s, "
              f"x{row['streamed_speedup']:.2f}", flush=True)
        print(layer_table(row), flush=True)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="OpenCL device spec (gpu, cpu, gpu:1, ...)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=float, default=1.0, help="channel width of the network (1 = VGG16)")
    ap.add_argument("--shapes", default="", help="comma-separated CINxCOUTxSIZE keys (default: every conv shape)")
    ap.add_argument("--iterations", type=int, default=5, help="timed calls per kernel (median)")
    ap.add_argument("--candidates", default="",
                    help="JSON list of 2:4 tunables, each naming its kernel in ALGO (default tc_sparse24); default: "
                         "both 2:4 entries' candidates")
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
    for algo, p in params.items():
        print(f"best {algo} tile over the shapes: {p}")
    for shape, c in curves.items():
        print(f"  {shape:>14s} " + ", ".join(f"{algo} x{pts[0][1]:.2f}" for algo, pts in c.items())
              + " over dense FP16 with them")
    save(best_params=params, curves=curves)
    if args.store and params:
        sparse_tuning.store(info.label, curves, args.batch, params)
        print(f"stored for {info.label} at batch {args.batch}: the engine takes the faster 2:4 kernel where it "
              f"measured faster than dense")
    batches = [int(b) for b in args.network_batches.split(",") if b.strip()]
    save(network=network(tensors, info, batches, args.network_iterations))
    return 0


if __name__ == "__main__":
    sys.exit(main())
