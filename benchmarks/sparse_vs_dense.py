"""Sparse kernels against our own dense engine, per VGG16 layer and sparsity, and the whole network pruned.

    python benchmarks/sparse_vs_dense.py --device gpu --batch 64 --json sparse64.json --png sparse64.png
    python benchmarks/sparse_vs_dense.py --device gpu --batch 1 --json sparse1.json --png sparse1.png --store
    python benchmarks/sparse_vs_dense.py --device cpu --batch 1 --codegen-max-nnz 20000 --network-batches 1

Per distinct layer shape (CINxCOUTxSIZE) and sparsity (magnitude pruning of random He weights, per layer): the
engine's dense layer exactly as VGG16 builds it (tuned GEMM or Winograd, GEMV or split-K for FC), the generated
kernel (conv_sparse_codegen.cl; its build time and binary size; skipped above --codegen-max-nnz non-zeros), the
compressed conv kernel (conv_sparse_compressed.cl) and the CSR FC kernels (fc_sparse.cl): median ms over OpenCL
profiling events (pad + conv launches for the sparse convolutions), speed-up over dense, max relative error
against float64 on the first image. When torch is importable, its dense conv/linear at the same shape (cuDNN on a
GPU, FP32 with TF32 off) is timed too. Then the whole network at --network-sparsity (all 16 layers pruned) against
the dense engine at each of --network-batches: images/s and the kernel each layer got (the engine's choice, no flags).
Writes a table, --json, and --png (speed-up against sparsity per layer: where sparse starts to win). --store puts
the speed-up curves in the tuned-parameter file, so the engine's kernel choice uses them.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare_torch's timer

ALGOS = ("sparse_codegen", "sparse_compressed", "sparse_csr")
SHORT = {"sparse_codegen": "codegen", "sparse_compressed": "compressed", "sparse_csr": "csr"}


def torch_timer(device: str, iterations: int):
    """A function (kind, cin, cout, size, batch) -> ms of torch's dense conv/linear, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from compare_torch import Timer  # CUDA events on a GPU, the host clock on the CPU
    dev = "cuda" if device.startswith("gpu") and torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True

    def run(kind, cin, cout, size, batch):
        with torch.inference_mode():
            if kind == "conv":
                x = torch.randn(batch, cin, size, size, device=dev)
                w, b = torch.randn(cout, cin, 3, 3, device=dev), torch.randn(cout, device=dev)
                f = lambda: torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))  # noqa: E731
            else:
                x, w = torch.randn(batch, cin, device=dev), torch.randn(cout, cin, device=dev)
                b = torch.randn(cout, device=dev)
                f = lambda: torch.nn.functional.linear(x, w, b)  # noqa: E731
            for _ in range(2):
                f()
            times = []
            for _ in range(iterations):
                with Timer(torch, dev) as t:
                    f()
                times.append(t.ms)
            return float(np.median(times))

    return run


def table(runs, sparsities):
    """The printed table: per layer shape and sparsity, dense and each sparse kernel's ms and speed-up."""
    lines = [f"{'shape':>14s} {'layers':<22s} {'sparsity':>8s} {'dense ms':>9s} {'codegen':>16s}"
             f" {'compressed/csr':>16s} {'torch ms':>9s} {'build s':>8s} {'bin MB':>7s}"]
    for r in runs:
        names = ",".join(n.split(".")[-1] for n in r.layers)
        for s in sparsities:
            pts = {p.algo: p for p in r.points if p.sparsity == s}

            def cell(algo):
                p = pts.get(algo)
                if p is None:
                    return f"{'-':>16s}"
                if p.ms is None:
                    return f"{'(too big)':>16s}"
                return f"{p.ms:9.3f} x{p.speedup:5.2f}"

            cg = pts.get("sparse_codegen")
            other = "sparse_csr" if r.kind == "fc" else "sparse_compressed"
            lines.append(f"{r.shape:>14s} {names:<22s} {s:8.2f} {r.dense_ms:9.3f} {cell('sparse_codegen')}"
                         f" {cell(other)}"
                         f" {r.torch_ms if r.torch_ms is not None else float('nan'):9.3f}"
                         f" {cg.build_s if cg and cg.build_s is not None else float('nan'):8.1f}"
                         f" {cg.binary_bytes / 1e6 if cg and cg.binary_bytes else float('nan'):7.2f}")
    return "\n".join(lines)


def plot(runs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = [a for a in ALGOS if any(p.algo == a and p.ms is not None for r in runs for p in r.points)]
    fig, axes = plt.subplots(1, len(algos), figsize=(6 * len(algos), 4.5), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        for r in runs:
            pts = sorted((p.sparsity, p.speedup) for p in r.points if p.algo == algo and p.speedup is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{r.shape} ({','.join(n.split('.')[-1] for n in r.layers)})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("sparsity (fraction of weights zero)")
        ax.set_ylabel("speed-up over our dense layer")
        ax.set_title(SHORT[algo])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def alternating(loaders: dict, n: int, iterations: int, plan_of: str, detail: bool = False) -> dict:
    """Load every model (label -> loader), one untimed pass each, then `iterations` timed passes of n images
    alternating between them (a change in the machine's load hits all alike): {label_load_s, label_images_per_s,
    "kernels": [(layer, kernel and why)] of model `plan_of`}. detail (models loaded with profile=True): also
    label_streamed_images_per_s (`iterations` batches submitted back to back, two in flight, each upload overlapping
    the previous batch's kernels, as `vggserve bench` and compare_torch.py's streamed figure), alternating by rounds,
    "layers": {label: [(layer, median device ms of 3 profiled passes)]} and "plans": {label: {layer: kernel}}."""
    x = np.random.default_rng(1).standard_normal((n, 3, 224, 224)).astype(np.float32)
    row, models, times = {}, {}, {label: [] for label in loaders}
    streamed = {label: [] for label in loaders}
    try:
        for label, load in loaders.items():
            t0 = time.perf_counter()
            models[label] = load()
            row[f"{label}_load_s"] = round(time.perf_counter() - t0, 2)
            models[label].logits(x)
        for _ in range(iterations):
            for label, model in models.items():
                t = time.perf_counter()
                model.logits(x)
                times[label].append(time.perf_counter() - t)
        if detail:
            for _ in range(3):
                for label, model in models.items():
                    t = time.perf_counter()
                    for p in [model.submit(x) for _ in range(iterations)]:
                        p.result()
                    streamed[label].append((time.perf_counter() - t) / iterations)
            row["layers"], row["plans"] = {}, {}
            for label, model in models.items():
                row["plans"][label] = {k["name"]: k["kernel"] for k in model.kernel_plan()}
                passes = [model.layer_times(x) for _ in range(3)]
                row["layers"][label] = [(name, round(float(np.median([p[i][1] for p in passes])), 4))
                                        for i, (name, _, _) in enumerate(passes[0])]
        row["kernels"] = [(k["name"], k["kernel"]) for k in models[plan_of].kernel_plan()
                          if not k["name"].startswith("pool")]
    finally:
        for model in models.values():
            model.close()
    for label in models:
        row[f"{label}_images_per_s"] = n / float(np.median(times[label]))
        if detail:
            row[f"{label}_streamed_images_per_s"] = n / float(np.median(streamed[label]))
    return row


def network(args, tensors, info, batches):
    """The engine on dense weights vs on weights with every layer pruned to --network-sparsity: images/s (both
    models loaded, their timed passes alternating, so that a change in the machine's load hits both alike) and the
    kernel each layer got (the engine's own choice from the measured sparsity)."""
    from vggserve.model.vgg16 import VGG16
    from vggserve.weights.prune import prune

    pruned = prune(tensors, args.network_sparsity).tensors
    out = []
    for n in batches:
        row = {"batch": n, "sparsity": args.network_sparsity}
        row.update(alternating({"dense": lambda: VGG16.load(tensors, device=info.spec, max_batch_size=n),
                                "sparse": lambda: VGG16.load(pruned, device=info.spec, max_batch_size=n)},
                               n, args.network_iterations, "sparse"))
        row["speedup"] = row["sparse_images_per_s"] / row["dense_images_per_s"]
        print(f"network batch {n} at {args.network_sparsity:.2f}: dense {row['dense_images_per_s']:.2f} img/s, "
              f"sparse {row['sparse_images_per_s']:.2f} img/s, x{row['speedup']:.2f} (load dense "
              f"{row['dense_load_s']:.1f} s, sparse {row['sparse_load_s']:.1f} s)", flush=True)
        for name, how in row["kernels"]:
            print(f"   {name:14s} {how}")
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="OpenCL device spec (gpu, cpu, gpu:1, ...)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--width", type=float, default=1.0, help="channel width of the network (1 = VGG16)")
    ap.add_argument("--sparsities", default="0,0.5,0.7,0.8,0.9,0.95,0.99")
    ap.add_argument("--shapes", default="", help="comma-separated CINxCOUTxSIZE keys (default: every layer shape)")
    ap.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated subset of {','.join(ALGOS)}")
    ap.add_argument("--iterations", type=int, default=5, help="timed calls per kernel (median)")
    ap.add_argument("--codegen-max-nnz", type=int, default=None,
                    help="skip the generated kernel above this many non-zeros (default: no limit)")
    ap.add_argument("--params", default="{}", help='JSON {algo: {tunable: value}} over the defaults')
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check of the first image")
    ap.add_argument("--network-batches", default="1,64", help="whole-network batches ('' for none)")
    ap.add_argument("--network-sparsity", type=float, default=0.9)
    ap.add_argument("--network-iterations", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--store", action="store_true", help="store the speed-up curves for the engine's kernel choice")
    args = ap.parse_args()

    from vggserve import sparse_tuning
    from vggserve.model.vgg16 import VGG16
    from vggserve.runtime import devices as devs
    from vggserve.weights.init import init_weights

    info = devs.resolve(args.device)
    sparsities = [float(s) for s in args.sparsities.split(",") if s.strip()]
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    tensors = init_weights(seed=0, width=args.width)
    result = {"device": info.label, "batch": args.batch, "width": args.width, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "layers": [], "crossover": {}, "network": []}

    def save(**parts):  # after every layer, so that a run cut short by a timeout keeps what it measured
        result.update(parts)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    print(f"{info.label}: batch {args.batch}, width {args.width}, sparsities {sparsities}", flush=True)
    with VGG16(tensors, device=info.spec, max_batch_size=args.batch, profile=True) as model:
        runs = sparse_tuning.measure(model, tensors, args.batch, sparsities, algos, args.iterations,
                                     args.codegen_max_nnz, not args.no_check,
                                     [s.strip() for s in args.shapes.split(",") if s.strip()] or None,
                                     torch_timer(args.device, args.iterations), print, json.loads(args.params),
                                     on_layer=lambda r: save(layers=sparse_tuning.as_json(r)))
    print(table(runs, sparsities))
    best = {}
    for r in runs:
        for algo in algos:
            points = [[p.sparsity, p.speedup] for p in r.points if p.algo == algo and p.speedup is not None]
            if any(p.algo == algo for p in r.points):
                best.setdefault(r.shape, {})[algo] = sparse_tuning.crossover(points) if points else None
    print("sparsity from which each kernel wins (None: never, in the measured range):")
    for shape, c in best.items():
        print(f"  {shape:>14s} " + "  ".join(f"{SHORT[a]} {v}" for a, v in c.items()))
    save(crossover=best)
    if args.png:
        plot(runs, args.png, f"{info.label}, batch {args.batch}: sparse kernels vs our dense layers")
    if args.store:  # before the network runs, so that their kernel choice uses the curves just measured
        sparse_tuning.store(info.label, sparse_tuning.curves(runs), args.batch)
        print(f"curves stored for {info.label} at batch {args.batch}")
    save(network=network(args, tensors, info, [int(b) for b in args.network_batches.split(",") if b.strip()]))


if __name__ == "__main__":
    main()
