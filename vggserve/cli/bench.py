"""`vggserve bench`: the engine alone: per-layer time and GFLOP/s, images/s, and start-up costs.

At fp8 and int8 a weights file's calibration is read from beside it (refused in one line where there is none); the
generated weights are calibrated on the fly on two random inputs (numpy, a few seconds), by the precision's default
method: their speed does not depend on the scales."""

import hashlib
import json
import tempfile
import time
from functools import partial

import numpy as np

from .common import add_device_args, lane_count, non_negative_int, note, positive_int
from ..wording import count


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure the engine: per-layer time, images/s, start-up costs")
    p.add_argument("--weights", default=None,
                   help="weights file (default: deterministic random VGG16 weights; speed does not depend on them)")
    p.add_argument("--iterations", type=positive_int, default=5, help="timed forward passes (default 5)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed forward passes first (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--lanes", type=lane_count, default=1, metavar="N",
                   help="forward passes the engine may run at once, each on a queue of its own (1..4, default 1): "
                        "the streamed figure then has N lanes' batches in flight")
    add_device_args(p, batch_default=1)
    p.set_defaults(func=run)


def measure(weights, device: str, batch: int, iterations: int, warmup: int = 1, precision: str = "fp32",
            lanes: int = 1) -> dict:
    """Everything `vggserve bench` reports, as a dict."""
    from ..model.vgg16 import VGG16
    from ..runtime import devices as devs
    from ..weights import load_weights
    from ..weights.init import init_weights

    t0 = time.perf_counter()
    devs.list_devices.cache_clear()
    info = devs.resolve(device)
    discovery = time.perf_counter() - t0

    # every program the model needs, built from an empty cache (a first start), then loaded from it (every later
    # start): the timed model is the second one
    loaded = load_weights(weights) if weights is not None else None
    source = loaded.tensors if loaded is not None else init_weights(seed=0)  # read once, used twice
    cal = eight_bit_calibration(precision, loaded, source)
    with tempfile.TemporaryDirectory() as tmp:
        with VGG16.load(source, device=info.spec, max_batch_size=batch, program_dir=tmp, precision=precision,
                        calibration=cal) as first:
            first_build = first.startup.build_s
        model = VGG16.load(source, device=info.spec, max_batch_size=batch, profile=True, program_dir=tmp,
                           precision=precision, calibration=first.calibration, lanes=lanes)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    for _ in range(warmup):
        model.logits(x)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        model.logits(x)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    pending = [model.submit(x) for _ in range(iterations)]  # back to back: each upload overlaps kernels
    for p in pending:
        p.result()
    streamed = (time.perf_counter() - t) / iterations
    layers = [{"name": n, "ms": round(ms, 4), "gflops": round(fl / ms / 1e6, 2) if ms > 0 and fl else 0.0}
              for n, ms, fl in model.layer_times(x)]
    median = float(np.median(times))
    result = {
        "device": model.device_name,
        "device_spec": info.spec,
        "precision": model.precision.name,
        "family": model.family,
        "batch_size": batch,
        "lanes": lanes,
        "iterations": iterations,
        "images_per_second": round(batch / median, 3),
        "ms_per_batch_median": round(median * 1e3, 3),
        "ms_per_batch_min": round(min(times) * 1e3, 3),
        "streamed_images_per_second": round(batch / streamed, 3),
        "layers": layers,
        "kernels": model.kernel_plan(),
        "layers_total_ms": round(sum(layer["ms"] for layer in layers), 3),
        "startup": {
            "platform_discovery_s": round(discovery, 4),
            "program_build_first_s": round(first_build, 4),
            "program_build_cached_s": round(model.startup.build_s, 4),
            "weight_upload_s": round(model.startup.upload_s, 4),
        },
        "params": model.params,
    }
    model.close()
    return result


GENERATED_SHA256 = hashlib.sha256(b"vggserve init_weights(seed=0)").hexdigest()  # names the generated weights


def eight_bit_calibration(precision: str, loaded, tensors):
    """None, or a function the engine calls (once it knows the device runs `precision`) for the 8-bit scales: a
    weights file's sidecar, or the generated weights' ranges on two random inputs."""
    from ..ops import precision as precisions
    from ..quant.calibrate import from_histograms, observe
    from ..quant.calibration import load_for
    from ..quant.methods import DEFAULT_METHODS

    prec = precisions.get(precision)
    if not prec.eight_bit:
        return None
    if loaded is not None and loaded.path is not None:
        return partial(load_for, loaded.path, loaded.sha256, prec.name)

    def generated():
        x = np.random.default_rng(1).standard_normal((2, 3, 224, 224), dtype=np.float32)
        hists, images = observe(tensors, [x])
        return from_histograms(hists, images, GENERATED_SHA256, DEFAULT_METHODS[prec.name])

    return generated


def run(args) -> int:
    if args.weights is None:
        note("vggserve: bench uses deterministic random weights (--weights to use a file)")
    r = measure(args.weights, args.device, args.batch_size, args.iterations, args.warmup, args.precision, args.lanes)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"device: {r['device']}  batch: {r['batch_size']}  precision: {r['precision']} ({r['family']} kernels)")
    kernels = {k["name"]: k["kernel"] for k in r["kernels"]}
    print(f"{'layer':26s} {'ms':>9s} {'GFLOP/s':>9s}  kernel (and why)")
    for layer in r["layers"]:
        print(f"{layer['name']:26s} {layer['ms']:9.3f} {layer['gflops']:9.1f}  {kernels.get(layer['name'], '')}")
    print(f"{'sum of kernels':26s} {r['layers_total_ms']:9.3f}")
    print(f"end to end: {r['ms_per_batch_median']:.2f} ms per batch (median of {r['iterations']}), "
          f"{r['images_per_second']:.2f} images/s")
    print(f"streamed (batches submitted back to back, uploads overlapping kernels, {count(r['lanes'], 'lane')}): "
          f"{r['streamed_images_per_second']:.2f} images/s")
    s = r["startup"]
    print(f"start-up: platform discovery {s['platform_discovery_s']:.3f} s, program build "
          f"{s['program_build_first_s']:.3f} s first / {s['program_build_cached_s']:.3f} s cached, "
          f"weight upload {s['weight_upload_s']:.3f} s")
    return 0
