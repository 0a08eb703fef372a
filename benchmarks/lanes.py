"""Lanes (engine.py) against one lane, and PyTorch's CUDA graph on as many streams, at small batches (issues 25, 26).

    python benchmarks/lanes.py --precisions fp16,int8 --batches 1,4 --lanes 1,2,3 --iterations 400 --json out.json

Per precision and batch, vggserve loaded once per lane count, streamed as compare_torch.py streams (host array in,
logits out, batches submitted back to back), each lane count measured `--rounds` times in turn (the median is
kept: shared machines are noisy). PyTorch FP16 channels_last, captured as one CUDA graph per stream and replayed
in turn on 1..max(lanes) streams (pinned input copied in, logits copied out), the same rounds: the fair anchor for
lanes is PyTorch given as many streams. Also the host's seconds per submit, and the launches of one forward.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def vggserve_rate(model, x, iterations):
    model.logits(x)
    t, host = time.perf_counter(), 0.0
    pending = []
    for _ in range(iterations):
        h = time.perf_counter()
        pending.append(model.submit(x))
        host += time.perf_counter() - h
        if len(pending) > len(model.slots):
            pending.pop(0).result()
    for p in pending:
        p.result()
    return x.shape[0] * iterations / (time.perf_counter() - t), host / iterations * 1e6


class TorchGraphs:
    def __init__(self, tensors, batch, streams):
        import torch

        from compare_torch import torch_model

        self.torch = torch
        torch.backends.cudnn.benchmark = True
        self.model = torch_model(tensors, torch, "cuda").half().to(memory_format=torch.channels_last)
        self.pinned = torch.randn(batch, 3, 224, 224).half().pin_memory()
        self.graphs = []
        with torch.inference_mode():
            for _ in range(streams):
                static_in = torch.empty((batch, 3, 224, 224), device="cuda").half().to(
                    memory_format=torch.channels_last)
                static_in.copy_(self.pinned)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        self.model(static_in)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = self.model(static_in)
                out = torch.empty((batch, 1000), dtype=torch.float16, pin_memory=True)
                self.graphs.append((graph, static_in, static_out, torch.cuda.Stream(), out))
        torch.cuda.synchronize()

    def rate(self, streams, iterations):
        torch = self.torch
        with torch.inference_mode():
            t = time.perf_counter()
            for i in range(iterations):
                graph, sin, sout, stream, out = self.graphs[i % streams]
                with torch.cuda.stream(stream):
                    sin.copy_(self.pinned, non_blocking=True)
                    graph.replay()
                    out.copy_(sout, non_blocking=True)
            torch.cuda.synchronize()
        return self.pinned.shape[0] * iterations / (time.perf_counter() - t)

    def close(self):
        del self.graphs, self.model
        self.torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--precisions", default="fp16")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--lanes", default="1,2")
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from vggserve import VGG16
    from vggserve.cli.bench import eight_bit_calibration
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=0)
    lanes = [int(v) for v in args.lanes.split(",")]
    results = {"method": __doc__.split("\n\n")[2].replace("\n", " "), "rows": []}
    for batch in (int(b) for b in args.batches.split(",")):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
        torch_rates = {}
        if not args.no_torch:
            graphs = TorchGraphs(tensors, batch, max(lanes))
            runs = {s: [] for s in range(1, max(lanes) + 1)}
            for _ in range(args.rounds):
                for s in runs:
                    runs[s].append(graphs.rate(s, args.iterations))
            graphs.close()
            torch_rates = {s: float(np.median(r)) for s, r in runs.items()}
            print(f"batch {batch}: torch FP16 CUDA graph, images/s by streams: "
                  + ", ".join(f"{s}: {r:,.0f}" for s, r in torch_rates.items()), flush=True)
        for prec in args.precisions.split(","):
            calibration = eight_bit_calibration(prec, None, tensors)
            if callable(calibration):
                calibration = calibration()
            models = {n: VGG16.load(tensors, device=args.device, max_batch_size=batch, precision=prec,
                                    calibration=calibration, lanes=n) for n in lanes}
            runs = {n: [] for n in lanes}
            for _ in range(args.rounds):
                for n, m in models.items():
                    runs[n].append(vggserve_rate(m, x, args.iterations))
            for n, m in models.items():
                rate = float(np.median([r for r, _ in runs[n]]))
                host = float(np.median([h for _, h in runs[n]]))
                row = {"batch": batch, "precision": prec, "lanes": n, "img_s": round(rate, 1),
                       "host_us_per_submit": round(host, 1), "device": m.device_name,
                       "torch_graph_img_s_1_stream": round(torch_rates[1], 1) if torch_rates else None,
                       "torch_graph_img_s_same_streams": round(torch_rates[n], 1) if n in torch_rates else None}
                if torch_rates:
                    row["ratio_vs_graph_1_stream"] = round(rate / torch_rates[1], 3)
                    row["ratio_vs_graph_same_streams"] = round(rate / torch_rates[n], 3)
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                m.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
