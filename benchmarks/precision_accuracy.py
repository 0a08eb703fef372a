"""How much FP16 and TF32 change VGG16's answers, for vggserve and for PyTorch, on the same weights and inputs.

    python benchmarks/precision_accuracy.py --device gpu --images 512 [--reference-images 4] [--json out.json]

Inputs: random crops of the natural photos that scikit-image and scikit-learn ship (random weights give small
logit margins, so natural inputs make agreement a real test), each preprocessed exactly as `vggserve.preprocess`
(torchvision's eval transform). Weights: deterministic random full-size VGG16 (seed 0).
For each library and precision: top-1 agreement and top-5 agreement (FP32's top-1 among the top 5; and the top-5
sets equal) with the same library's FP32; and, on the first few images, the max relative error of the logits
against a float64 numpy reference.

    python benchmarks/precision_accuracy.py --fp8-model --images 512 [--calibration-images 64] [--json out.json]

`--fp8-model`: no device; the numpy FP8 model (vggserve/quant/reference.py: e4m3 activations per tensor, e4m3
weights per output channel, float32 sums) against numpy FP32, for each calibration method and each set of layers
kept at FP16 (none, the first convolution, the last FC layer, both). Calibrated on crops drawn with
--calibration-seed (1), measured on crops drawn with --seed (0: the GPU run's 512 crops), so never on the images
it was calibrated on. Each row: the agreements above, the logits' relative error against FP32 (per image, the L2
norm of the difference over the FP32 logits' norm: mean and max), and FP32's own margin between its top two
logits, the measure of how hard agreement is with random weights.

    python benchmarks/precision_accuracy.py --int8-model --images 32 --calibration-images 16 [--json out.json]

`--int8-model`: the same table for INT8 (vggserve/quant/int8.py: s8 per channel and per tensor, clipped to +-127,
exact integer sums), with the entropy method also on INT8's own grid (`entropy-int8`, quant/calibrate.py).

    python benchmarks/precision_accuracy.py --sensitivity --formats fp8,int8 --images 32 [--target 1.01] [--json o.json]

`--sensitivity`: per-layer sensitivity under one calibration (--sensitivity-method, max): every layer 8-bit; each
layer alone kept at FP16; then the greedy set, layers added at FP16 in order of their single benefit (the drop of
the mean logit error) until top-1 agreement reaches --target (0.99) or every layer is FP16, with the cumulative
share of VGG16's multiply-adds at FP16. Layer inputs are cached: a run that changes layer k starts from the
cached input of layer k, so each costs only the layers from k on.

`--cache FILE`: keeps the FP32 logits and the calibration histograms (a pickle, keyed by the crops and the width),
so runs in pieces compute them once.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sample_photos():
    """Natural RGB photos (H, W, 3) uint8 from scikit-image and scikit-learn (whatever of them is installed)."""
    photos = []
    try:
        from skimage import data

        for name in ("astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "hubble_deep_field", "immunohistochemistry"):
            try:
                im = getattr(data, name)()
                if im.ndim == 3 and im.shape[2] >= 3:
                    photos.append(np.ascontiguousarray(im[..., :3]))
            except Exception:  # noqa: BLE001 - a photo that needs a download or a missing plugin
                pass
    except ImportError:
        pass
    try:
        from sklearn.datasets import load_sample_images

        photos += [np.ascontiguousarray(im) for im in load_sample_images().images]
    except ImportError:
        pass
    if not photos:
        raise SystemExit("no sample photos: install scikit-image or scikit-learn")
    return photos


def crops(n: int, seed: int = 0) -> np.ndarray:
    """n preprocessed (3, 224, 224) float32 inputs from random crops (side 0.3-1.0 of the shorter side) of the
    sample photos."""
    from PIL import Image

    from vggserve.preprocess import preprocess

    rng = np.random.default_rng(seed)
    photos = sample_photos()
    out = np.empty((n, 3, 224, 224), np.float32)
    for i in range(n):
        im = photos[rng.integers(len(photos))]
        h, w = im.shape[:2]
        side = int(min(h, w) * rng.uniform(0.3, 1.0))
        y, x = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
        out[i] = preprocess(Image.fromarray(im[y:y + side, x:x + side]))
    return out


def agreement(logits: np.ndarray, ref: np.ndarray) -> dict:
    top1, ref1 = logits.argmax(1), ref.argmax(1)
    top5 = np.argsort(-logits, 1)[:, :5]
    ref5 = np.argsort(-ref, 1)[:, :5]
    return {"top1": float((top1 == ref1).mean()),
            "top1_in_top5": float(np.mean([r in t for r, t in zip(ref1, top5)])),
            "top5_sets_equal": float(np.mean([set(a) == set(b) for a, b in zip(top5, ref5)]))}


def run_vggserve(tensors, x, device, precision, batch):
    from vggserve import VGG16

    with VGG16.load(tensors, device=device, max_batch_size=batch, precision=precision) as model:
        return model.logits(x)


def run_torch(tensors, x, precision, batch):
    import torch

    from compare_torch import torch_model

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    model = torch_model(tensors, torch, "cuda")
    if precision == "fp16":
        model = model.half().to(memory_format=torch.channels_last)
    outs = []
    with torch.inference_mode():
        for s in range(0, len(x), batch):
            xt = torch.from_numpy(x[s:s + batch]).cuda()
            if precision == "fp16":
                xt = xt.half().contiguous(memory_format=torch.channels_last)
            outs.append(model(xt).float().cpu().numpy())
    return np.concatenate(outs)


FP8_METHODS = ("max", "percentile:99.9", "percentile:99.99", "percentile:99.999", "entropy")
INT8_METHODS = FP8_METHODS + ("entropy-int8",)
FP16_SETS = {"none": (), "first": ("features.0",), "last": ("classifier.6",), "both": ("features.0", "classifier.6")}


def relative_error(logits: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(logits - ref, axis=1) / np.linalg.norm(ref, axis=1)


def margins(ref: np.ndarray) -> np.ndarray:
    """FP32's gap between its top two logits over the logits' norm: the relative error that can flip its top-1."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0]) / np.linalg.norm(ref, axis=1)


def layer_macs(width: float = 1.0) -> dict:
    """Multiply-adds per image of each convolution and FC layer of VGG16 at 224x224."""
    from vggserve.weights.spec import vgg16_spec

    spec, side, macs = vgg16_spec(width), 224, {}
    for conv in spec.convs:
        macs[conv.name] = side * side * conv.cin * conv.cout * 9
        side //= 2 if conv.pool_after else 1
    for fc in spec.fcs:
        macs[fc.name] = fc.fin * fc.fout
    return macs


def calibration(hists, n: int, spelled: str):
    """The Calibration of a spelled method: max, percentile:P, entropy or entropy-int8 (INT8's grid)."""
    from vggserve.quant.calibrate import from_histograms

    method, _, p = spelled.partition(":")
    grid = "int8" if method == "entropy-int8" else "fp8"
    return from_histograms(hists, n, "0" * 64, method.replace("-int8", ""), float(p) if p else None, grid=grid)


def prepare(args):
    """(tensors, measured crops, FP32 logits, calibration histograms, their image count), from --cache if there."""
    import pickle
    import time

    from vggserve.model.reference import dense_layer, staged_logits
    from vggserve.quant.calibrate import observe
    from vggserve.weights.init import init_weights
    from vggserve.weights.spec import vgg16_spec

    tensors = init_weights(seed=0, width=args.width)
    x = crops(args.images, args.seed)
    key = (args.width, args.images, args.seed, args.calibration_images, args.calibration_seed)
    cache = Path(args.cache) if args.cache else None
    stored = pickle.loads(cache.read_bytes()) if cache and cache.exists() else {}
    if key in stored:
        fp32, hists, n = stored[key]
        print(f"FP32 logits and calibration histograms from {cache}", flush=True)
        return tensors, x, fp32, hists, n
    spec, b = vgg16_spec(args.width), args.batch
    x_cal = crops(args.calibration_images, args.calibration_seed)
    start = time.perf_counter()
    hists, n = observe(tensors, (x_cal[i:i + b] for i in range(0, len(x_cal), b)))
    print(f"calibrated on {n} crops (seed {args.calibration_seed}): {(time.perf_counter() - start) / n:.2f} s/image",
          flush=True)
    start = time.perf_counter()
    dense = dense_layer(tensors)
    fp32 = np.concatenate([staged_logits(spec, x[i:i + b], dense) for i in range(0, len(x), b)])
    print(f"FP32 on {len(x)} crops (seed {args.seed}): {(time.perf_counter() - start) / len(x):.2f} s/image",
          flush=True)
    if cache:
        stored[key] = (fp32, hists, n)
        cache.write_bytes(pickle.dumps(stored))
    return tensors, x, fp32, hists, n


def _header(args, fp32: np.ndarray, n: int, **extra) -> dict:
    gaps = margins(fp32)
    print(f"FP32's top-1 margin over the logits' norm: median {np.median(gaps):.2e}, 10th percentile "
          f"{np.percentile(gaps, 10):.2e}, min {gaps.min():.2e}", flush=True)
    return {"images": len(fp32), "calibration_images": n, "width": args.width, **extra,
            "fp32_margin_median": float(np.median(gaps)), "fp32_margin_p10": float(np.percentile(gaps, 10)),
            "fp32_margin_p1": float(np.percentile(gaps, 1)), "fp32_margin_min": float(gaps.min()),
            "fp32_margins": [float(g) for g in gaps], "rows": []}


def _save(args, results: dict) -> None:
    if args.json:  # row by row: a long run stopped early keeps what it measured
        Path(args.json).write_text(json.dumps(results, indent=1))


def run_fp8_model(args, fmt: str = "fp8") -> dict:
    """The FP8 (or INT8) accuracy study on the CPU (module docstring)."""
    from vggserve.quant.reference import LAST_FC, QuantizedWeights, fp8_layer, fp8_logits

    tensors, x, fp32, hists, n = prepare(args)
    results, b = _header(args, fp32, n, format=fmt), args.batch
    gaps = margins(fp32)
    weights = QuantizedWeights(tensors)
    for spelled in args.methods.split(","):
        cal = calibration(hists, n, spelled)
        for first in (False, True):  # the sets that share everything up to the last layer, computed once
            sets = {name: FP16_SETS[name] for name in args.fp16_sets.split(",") if
                    ("features.0" in FP16_SETS[name]) == first}
            if sets:
                feats = fp8_logits(weights, x, cal, ("features.0",) if first else (), batch_size=b, upto=LAST_FC,
                                   fmt=fmt)
            for name, layers in sets.items():
                logits = fp8_layer(weights, cal, layers, fmt)(LAST_FC, feats)
                results["rows"].append({"format": fmt, **_fp8_row(spelled, name, logits, fp32, gaps)})
                _save(args, results)
    return results


def run_sensitivity(args) -> dict:
    """Per-layer sensitivity and the greedy FP16 set, per format (module docstring)."""
    import time

    from vggserve.quant.calibration import LAYERS
    from vggserve.quant.reference import QuantizedWeights, fp8_logits

    tensors, x, fp32, hists, n = prepare(args)
    macs = layer_macs(args.width)
    total = sum(macs.values())
    results = _header(args, fp32, n, method=args.sensitivity_method, target=args.target,
                      macs={k: int(v) for k, v in macs.items()}, formats={})
    gaps = margins(fp32)
    cal = calibration(hists, n, args.sensitivity_method)
    weights = QuantizedWeights(tensors)

    def row(fmt, fp16: frozenset, logits: np.ndarray, **extra) -> dict:
        err = relative_error(logits, fp32)
        r = {**extra, "fp16_layers": [name for name in LAYERS if name in fp16], **agreement(logits, fp32),
             "rel_err_mean": float(err.mean()), "rel_err_max": float(err.max()),
             "margin_below_error": float(np.mean(gaps < err)), "fp16_mac_share": sum(macs[k] for k in fp16) / total}
        print(f"{fmt} FP16 {'+'.join(r['fp16_layers']) or 'none'}: top-1 {r['top1']:.4f}, top-5 sets "
              f"{r['top5_sets_equal']:.4f}, rel. error mean {r['rel_err_mean']:.4f} max {r['rel_err_max']:.4f}, "
              f"FP16 MAC share {r['fp16_mac_share']:.4f}", flush=True)
        return r

    for fmt in args.formats.split(","):
        out = results["formats"][fmt] = {"singles": [], "greedy": []}
        inputs: dict[str, list] = {}  # layer -> its input (batch by batch) under the FP16 set last recorded

        def recording(layer):
            def record(name, a):
                inputs.setdefault(name, []).append(a)
                return layer(name, a)
            return record

        def run(fp16: frozenset, start: str | None = None, record: bool = False) -> np.ndarray:
            """Logits with `fp16` at FP16, from `start`'s cached input (its prefix is unchanged); `record`: cache
            the inputs of `start` and every layer after it."""
            began = time.perf_counter()
            a = x if start is None else np.concatenate(inputs[start])
            if record:
                for name in LAYERS[LAYERS.index(start) if start else 0:]:
                    inputs.pop(name, None)
            logits = fp8_logits(weights, a, cal, fp16, batch_size=args.batch, start=start, fmt=fmt,
                                layer=recording if record else None)
            print(f"  {fmt} from {start or 'the input'}: {time.perf_counter() - began:.0f} s", flush=True)
            return logits

        base = out["all_8bit"] = row(fmt, frozenset(), run(frozenset(), record=True))
        _save(args, results)
        for name in LAYERS:
            single = row(fmt, frozenset([name]), run(frozenset([name]), name), layer=name)
            single["benefit"] = base["rel_err_mean"] - single["rel_err_mean"]
            out["singles"].append(single)
            _save(args, results)
        fp16, reached = frozenset(), base["top1"] >= args.target
        for single in sorted(out["singles"], key=lambda r: -r["benefit"]):
            if reached:
                break
            fp16 = fp16 | {single["layer"]}
            out["greedy"].append(row(fmt, fp16, run(fp16, single["layer"], record=True), added=single["layer"]))
            _save(args, results)
            reached = out["greedy"][-1]["top1"] >= args.target
    return results
def _fp8_row(method: str, fp16: str, logits: np.ndarray, fp32: np.ndarray, gaps: np.ndarray) -> dict:
    err = relative_error(logits, fp32)
    row = {"method": method, "fp16_layers": fp16, **agreement(logits, fp32),
           "rel_err_mean": float(err.mean()), "rel_err_max": float(err.max()),
           "margin_below_error": float(np.mean(gaps < err))}
    print(f"{method:18s} FP16 {fp16:5s}: top-1 {row['top1']:.4f}, FP32 top-1 in top-5 {row['top1_in_top5']:.4f}, "
          f"top-5 sets equal {row['top5_sets_equal']:.4f}, rel. error mean {row['rel_err_mean']:.3f} max "
          f"{row['rel_err_max']:.3f}", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=None, help="images per call (default 64; --fp8-model: 8)")
    ap.add_argument("--reference-images", type=int, default=4, help="images checked against float64 (slow on CPU)")
    ap.add_argument("--precisions", default="fp32,tf32,fp16")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fp8-model", action="store_true", help="the numpy FP8 model on the CPU (no device)")
    ap.add_argument("--int8-model", action="store_true", help="the numpy INT8 model on the CPU (no device)")
    ap.add_argument("--sensitivity", action="store_true",
                    help="per-layer FP16 sensitivity and the greedy FP16 set of the numpy 8-bit models (no device)")
    ap.add_argument("--formats", default="fp8,int8", help="--sensitivity: the 8-bit formats, of fp8 and int8")
    ap.add_argument("--sensitivity-method", default="max", help="--sensitivity: the calibration method")
    ap.add_argument("--target", type=float, default=0.99, help="--sensitivity: the top-1 agreement to reach")
    ap.add_argument("--cache", default=None, help="pickle keeping the FP32 logits and histograms between runs")
    ap.add_argument("--calibration-images", type=int, default=64, help="--fp8-model: crops to calibrate on")
    ap.add_argument("--calibration-seed", type=int, default=1, help="--fp8-model: their seed")
    ap.add_argument("--seed", type=int, default=0, help="the measured crops' seed")
    ap.add_argument("--methods", default=None,
                    help="--fp8-model/--int8-model: methods (percentile:P, entropy-int8); default all")
    ap.add_argument("--fp16-sets", default=",".join(FP16_SETS),
                    help="--fp8-model: layers kept at FP16, of none, first (features.0), last (classifier.6), both")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.fp8_model or args.int8_model or args.sensitivity:
        args.batch = args.batch or 8  # numpy's activations at batch 64 would take several GB
        if args.sensitivity:
            run_sensitivity(args)
        else:
            fmt = "int8" if args.int8_model else "fp8"
            args.methods = args.methods or ",".join(INT8_METHODS if args.int8_model else FP8_METHODS)
            run_fp8_model(args, fmt)
        return 0
    args.batch = args.batch or 64
    from vggserve.model.reference import reference_logits
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=0, width=args.width)
    x = crops(args.images, args.seed)
    precs = args.precisions.split(",")
    ref64 = reference_logits(tensors, x[:args.reference_images]) if args.reference_images else None
    results = {"images": args.images, "width": args.width, "rows": []}
    libs = {"vggserve": lambda p: run_vggserve(tensors, x, args.device, p, args.batch)}
    if not args.no_torch:
        libs["pytorch"] = lambda p: run_torch(tensors, x, p, args.batch)
    for lib, fn in libs.items():
        logits = {p: fn(p) for p in precs}
        for p in precs:
            row = {"library": lib, "precision": p, **agreement(logits[p], logits["fp32"])}
            if ref64 is not None:
                k = args.reference_images
                row["max_rel_err_vs_float64"] = float(np.abs(logits[p][:k] - ref64).max() / np.abs(ref64).max())
            results["rows"].append(row)
            print(f"{lib:9s} {p}: top-1 agreement with its FP32 {row['top1']:.4f}, FP32 top-1 in top-5 "
                  f"{row['top1_in_top5']:.4f}, top-5 sets equal {row['top5_sets_equal']:.4f}, max rel err vs "
                  f"float64 {row.get('max_rel_err_vs_float64', float('nan')):.2e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
