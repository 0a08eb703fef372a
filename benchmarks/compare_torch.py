"""vggserve against PyTorch/cuDNN, in one process, on the same GPU, weights and inputs (or both on the CPU).

    python benchmarks/compare_torch.py --device gpu --batches 1,16,64 --iterations 10 [--json out.json]
    python benchmarks/compare_torch.py --device gpu --precision fp16 --batches 1,16,64,256
    python benchmarks/compare_torch.py --device gpu --precision fp16 --vggserve-precision int8 --batches 1,64,256
    python benchmarks/compare_torch.py --device cpu --torch-device cpu --batches 1 --iterations 3

--precision picks both sides' arithmetic: fp32 (PyTorch with TF32 off), tf32 (PyTorch with allow_tf32 for cuDNN
and matmul, its default for convolutions), fp16 (PyTorch `.half()` with channels_last). Always cudnn.benchmark.
--vggserve-precision sets vggserve's alone (default: --precision's), e.g. int8 or fp8 against cuDNN FP16 (issue
26's targets); the 8-bit engine's scales come from the generated weights' calibration on two random inputs, as
`vggserve bench` makes them (cli/bench.py).

For each batch, also "streamed": batches submitted back to back, host array in, host array out (vggserve's
`submit`, whose uploads overlap the previous batch's kernels; PyTorch with pinned input and non-blocking copies
on a GPU, its end-to-end loop on the CPU), and on CUDA PyTorch's streamed loop again with the model replayed as a
CUDA graph (the anchor at batch 1, where launch overheads dominate).
For each batch: images/s of vggserve end to end (input upload, all kernels, logits read back) and of
torchvision's VGG16 (rebuilt layer for layer in torch.nn) in FP32 with TF32 off (input already on the GPU,
CUDA-event timed; host clock on the CPU), their ratio, per-layer
milliseconds and TFLOP/s of both, and the largest relative difference of the logits (vs PyTorch, and both vs a
float64 CPU reference on the first image). Needs torch; vggserve's engine needs only OpenCL.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def torch_model(tensors, torch, device):
    """torchvision's VGG16 layer for layer (torchvision itself is not needed), with the given weights."""
    from vggserve.weights.spec import CONFIG_D, HIDDEN, NUM_CLASSES, POOLED_SIZE

    nn = torch.nn
    layers, cin = [], 3
    for item in CONFIG_D:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, item, 3, padding=1), nn.ReLU(inplace=True)]
            cin = item
    model = nn.Module()
    model.features = nn.Sequential(*layers)
    model.avgpool = nn.AdaptiveAvgPool2d((POOLED_SIZE, POOLED_SIZE))
    model.classifier = nn.Sequential(nn.Linear(cin * POOLED_SIZE * POOLED_SIZE, HIDDEN), nn.ReLU(True), nn.Dropout(),
                                     nn.Linear(HIDDEN, HIDDEN), nn.ReLU(True), nn.Dropout(),
                                     nn.Linear(HIDDEN, NUM_CLASSES))
    model.forward = lambda x: model.classifier(torch.flatten(model.avgpool(model.features(x)), 1))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()})
    return model.eval().to(device)


class Timer:
    """CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.startswith("cuda")

    def __enter__(self):
        if self.cuda:
            self.s, self.e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            self.s.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.e.record()
            self.torch.cuda.synchronize()
            self.ms = self.s.elapsed_time(self.e)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


CEILING_TFLOPS = {"fp32": 64.0, "tf32": 313.0, "fp16": 625.0,  # FFMA and mma.sync peaks on the H100 (issue 13)
                  "fp8": 625.0, "int8": 1265.0}  # e4m3 mma.sync runs as FP16 HMMA on sm_90; s8 IMMA (issue 26)


def to_torch_input(x, torch, precision):
    """The model input as PyTorch takes it at this precision (FP16: half, channels_last)."""
    if precision == "fp16":
        return x.half().contiguous(memory_format=torch.channels_last)
    return x


def time_torch(model, x, iterations, torch, device):
    with torch.inference_mode():
        for _ in range(2):
            model(x)
        times = []
        for _ in range(iterations):
            with Timer(torch, device) as t:
                out = model(x)
            times.append(t.ms)
    return float(np.median(times)), out.float().cpu().numpy()


def time_torch_end_to_end(model, x_np, iterations, torch, device):
    """Host numpy input to host logits, as vggserve's logits() is timed (host clock)."""
    times = []
    with torch.inference_mode():
        for _ in range(iterations + 2):
            t = time.perf_counter()
            model(model.prepare(torch.from_numpy(x_np).to(device))).float().cpu()
            times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times[2:]))


def time_torch_streamed(model, x_np, iterations, torch, device):
    """Host to host as a serving loop would do it in PyTorch: pinned input, non-blocking copies, one sync at the end."""
    if not device.startswith("cuda"):
        return time_torch_end_to_end(model, x_np, iterations, torch, device)
    pinned = torch.from_numpy(x_np).pin_memory()
    outs = [torch.empty((x_np.shape[0], 1000), pin_memory=True) for _ in range(iterations)]
    with torch.inference_mode():
        for _ in range(2):
            model(model.prepare(pinned.to(device, non_blocking=True))).cpu()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for out in outs:
            out.copy_(model(model.prepare(pinned.to(device, non_blocking=True))), non_blocking=True)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / iterations


def time_torch_graph_streamed(model, x_np, iterations, torch, device):
    """As time_torch_streamed, with the model replayed as a CUDA graph (captured once on a static input; each
    iteration copies the pinned input in, replays, copies the logits out): PyTorch's fastest serving loop, the
    anchor at batch 1 where launch overheads dominate (issues 25, 26). None off CUDA."""
    if not device.startswith("cuda"):
        return None
    pinned = torch.from_numpy(x_np).pin_memory()
    static_in = torch.empty(pinned.shape, dtype=pinned.dtype, device=device)
    outs = [torch.empty((x_np.shape[0], 1000), pin_memory=True) for _ in range(iterations)]
    with torch.inference_mode():
        static_in.copy_(pinned)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs recommends before capture
            for _ in range(3):
                model(model.prepare(static_in))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(model.prepare(static_in))
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for out in outs:
            static_in.copy_(pinned, non_blocking=True)
            graph.replay()
            out.copy_(static_out, non_blocking=True)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / iterations


def time_vggserve_streamed(model, x, iterations):
    """vggserve host to host with batches submitted back to back (each upload overlaps the previous kernels)."""
    model.logits(x)
    t = time.perf_counter()
    pending = [model.submit(x) for _ in range(iterations)]
    for p in pending:
        p.result()
    return (time.perf_counter() - t) * 1e3 / iterations


def torch_layers(model, x, torch, device):
    """Milliseconds per conv/linear layer (timed around each module; ReLU/pool folded into the next)."""
    rows = []
    with torch.inference_mode():
        a = x
        for name, seq in (("features", model.features), ("classifier", model.classifier)):
            if name == "classifier":
                a = torch.flatten(model.avgpool(a), 1)
            for i, mod in enumerate(seq):
                with Timer(torch, device) as t:
                    b = mod(a)
                if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                    macs = (b.numel() * mod.weight[0].numel())
                    rows.append((f"{name}.{i}", t.ms, 2.0 * macs))
                a = b
    return rows


def torch_wording(torch_device: str) -> dict:
    """How the report names PyTorch's two timings on its device. On a GPU: the input already on the GPU, and the
    streamed loop's pinned input with non-blocking copies. On the CPU there is no copy: the input is in place, and
    the streamed loop is the end-to-end one, batch after batch."""
    if torch_device.startswith("cuda"):
        return {"resident": "on-GPU input", "streamed": "pinned, non-blocking"}
    return {"resident": "input in place", "streamed": "back to back"}


def batch_report(row: dict, wording: dict) -> list[str]:
    """The lines printed per batch, from its row of the results (a third against the CUDA graph, on CUDA)."""
    resident = wording["resident"]
    lines = [f"batch {row['batch']:4d}: vggserve {row['vggserve_img_s']:8.1f} img/s ({row['vggserve_ms']:8.2f} ms host "
            f"to host, kernels {row['vggserve_kernels_ms']:.2f} ms) | torch {row['torch_img_s']:8.1f} img/s "
            f"({row['torch_ms']:8.2f} ms {resident}, {row['torch_end_to_end_ms']:8.2f} ms host to host) | ratio "
            f"{row['ratio_vggserve_over_torch']:.3f} vs {resident}, {row['ratio_end_to_end']:.3f} host to host | "
            f"max rel diff {row['max_rel_diff_vs_torch']:.2e}",
            f"            streamed: vggserve {row['vggserve_streamed_img_s']:8.1f} img/s | torch ({wording['streamed']}) "
            f"{row['torch_streamed_img_s']:8.1f} img/s | ratio {row['ratio_streamed']:.3f}; vggserve streamed over "
            f"torch {resident} {row['ratio_vggserve_streamed_over_torch_on_gpu']:.3f}"]
    if row.get("torch_graph_streamed_img_s") is not None:
        lines.append(f"            streamed against torch replayed as a CUDA graph (pinned, non-blocking): "
                     f"{row['torch_graph_streamed_img_s']:8.1f} img/s | ratio {row['ratio_streamed_over_graph']:.3f}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="vggserve device spec (default gpu)")
    ap.add_argument("--torch-device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--json", default=None, help="write all figures to this file")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"),
                    help="both sides' precision (default fp32: PyTorch with TF32 off)")
    ap.add_argument("--vggserve-precision", default=None, choices=("fp32", "tf32", "fp16", "fp8", "int8"),
                    help="vggserve's precision where it differs from PyTorch's (e.g. int8 against cuDNN fp16)")
    args = ap.parse_args()
    mine = args.vggserve_precision or args.precision

    import torch

    from vggserve import VGG16
    from vggserve.model.reference import reference_logits
    from vggserve.weights.init import init_weights

    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    batches = [int(b) for b in args.batches.split(",")]
    tensors = init_weights(seed=0)
    tdev = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    tmodel = torch_model(tensors, torch, tdev)
    if args.precision == "fp16":
        tmodel = tmodel.half().to(memory_format=torch.channels_last)
    tmodel.prepare = lambda x: to_torch_input(x, torch, args.precision)
    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, 3, 224, 224), dtype=np.float32) for b in batches}
    # PyTorch first, at every batch, then its cache emptied: neither library competes for the other's memory
    torch_runs = {}
    for batch in batches:
        xt = to_torch_input(torch.from_numpy(inputs[batch]).to(tdev), torch, args.precision)
        t_ms, t_logits = time_torch(tmodel, xt, args.iterations, torch, tdev)
        e2e = time_torch_end_to_end(tmodel, inputs[batch], args.iterations, torch, tdev)
        streamed = time_torch_streamed(tmodel, inputs[batch], args.iterations, torch, tdev)
        graphed = time_torch_graph_streamed(tmodel, inputs[batch], args.iterations, torch, tdev)
        torch_runs[batch] = (t_ms, t_logits, torch_layers(tmodel, xt, torch, tdev), e2e, streamed, graphed)
        del xt
    del tmodel
    if tdev.startswith("cuda"):
        torch.cuda.empty_cache()
    from vggserve.cli.bench import eight_bit_calibration

    calibration = eight_bit_calibration(mine, None, tensors)
    if callable(calibration):
        calibration = calibration()  # once, not per batch
    results = {"device": None, "precision": args.precision, "vggserve_precision": mine, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "torch_device": torch.cuda.get_device_name() if tdev.startswith("cuda") else f"cpu, {torch.get_num_threads()} threads",
               "method": "PyTorch timed first at every batch, then its CUDA cache emptied; vggserve loaded once per "
                         "batch with max_batch_size = batch (so it uses the kernels tuned nearest that batch)",
               "batches": []}
    for batch in batches:
        x = inputs[batch]
        t_ms, t_logits, tl, t_e2e, t_stream, t_graph = torch_runs[batch]
        t0 = time.perf_counter()
        vmodel = VGG16.load(tensors, device=args.device, max_batch_size=batch, profile=True,
                            precision=mine, calibration=calibration)
        load_s = time.perf_counter() - t0
        results["device"] = vmodel.device_name
        vmodel.logits(x)
        times = []
        for _ in range(args.iterations):
            t = time.perf_counter()
            v_logits = vmodel.logits(x)
            times.append((time.perf_counter() - t) * 1e3)
        v_ms = float(np.median(times))
        v_stream = time_vggserve_streamed(vmodel, x, args.iterations)
        results["driver"] = vmodel.device.driver_version
        vl = {n: (ms, fl) for n, ms, fl in vmodel.layer_times(x)}
        # per layer, a conv with its pooling fused ("features.2+pool") is listed under the conv's name
        by_layer = {n.removesuffix("+pool"): v for n, v in vl.items()}
        vmodel.close()
        del vmodel
        diff = float(np.abs(v_logits - t_logits).max() / np.abs(t_logits).max())
        row = {"batch": batch, "vggserve_ms": round(v_ms, 3), "torch_ms": round(t_ms, 3),
               "vggserve_img_s": round(batch / v_ms * 1e3, 1), "torch_img_s": round(batch / t_ms * 1e3, 1),
               "ratio_vggserve_over_torch": round(t_ms / v_ms, 3), "vggserve_kernels_ms": round(sum(m for m, _ in vl.values()), 3),
               "torch_end_to_end_ms": round(t_e2e, 3), "torch_end_to_end_img_s": round(batch / t_e2e * 1e3, 1),
               "ratio_end_to_end": round(t_e2e / v_ms, 3),
               "vggserve_streamed_ms": round(v_stream, 3), "torch_streamed_ms": round(t_stream, 3),
               "vggserve_streamed_img_s": round(batch / v_stream * 1e3, 1),
               "torch_streamed_img_s": round(batch / t_stream * 1e3, 1),
               "ratio_streamed": round(t_stream / v_stream, 3),
               "ratio_vggserve_streamed_over_torch_on_gpu": round(t_ms / v_stream, 3),
               "torch_graph_streamed_ms": None if t_graph is None else round(t_graph, 3),
               "torch_graph_streamed_img_s": None if t_graph is None else round(batch / t_graph * 1e3, 1),
               "ratio_streamed_over_graph": None if t_graph is None else round(t_graph / v_stream, 3),
               "vggserve_load_s": round(load_s, 3), "max_rel_diff_vs_torch": diff,
               "layers": [{"name": n, "torch_ms": round(ms, 4), "torch_tflops": round(fl / ms / 1e9, 2),
                           "vggserve_ms": round(by_layer.get(n, (0, 0))[0], 4),
                           "vggserve_tflops": round(fl / by_layer[n][0] / 1e9, 2)
                           if n in by_layer and by_layer[n][0] else None,
                           "vggserve_ceiling_fraction": round(fl / by_layer[n][0] / 1e9 / CEILING_TFLOPS[mine],
                                                              3) if n in by_layer and by_layer[n][0] else None}
                          for n, ms, fl in tl],
               "vggserve_steps": [{"name": n, "ms": round(ms, 4)} for n, (ms, _) in vl.items()]}
        if batch == batches[0]:
            ref = reference_logits(tensors, x[:1])
            row["max_rel_err_vs_float64"] = {"vggserve": float(np.abs(v_logits[:1] - ref).max() / np.abs(ref).max()),
                                             "torch": float(np.abs(t_logits[:1] - ref).max() / np.abs(ref).max())}
        results["batches"].append(row)
        for line in batch_report(row, torch_wording(tdev)):
            print(line, flush=True)
    print(f"\nper layer at batch {batches[-1]}, {mine} (H100 ceiling {CEILING_TFLOPS[mine]:.0f} TFLOP/s)")
    print(f"{'layer':16s} {'torch ms':>9s} {'TFLOP/s':>8s} {'vggserve ms':>12s} {'TFLOP/s':>8s} {'of ceiling':>10s}")
    for layer in results["batches"][-1]["layers"]:
        print(f"{layer['name']:16s} {layer['torch_ms']:9.3f} {layer['torch_tflops']:8.2f} {layer['vggserve_ms']:12.3f} "
              f"{layer['vggserve_tflops'] or 0:8.2f} {layer['vggserve_ceiling_fraction'] or 0:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
