"""How much each precision changes VGG16's answers: our engine at TF32, FP16, INT8 and FP8 (and PyTorch at TF32
and FP16), against FP32, on the same weights and natural inputs.

    python benchmarks/precision_accuracy.py --device gpu --images 512 [--precisions fp32,tf32,fp16] [--json out.json]
    python benchmarks/precision_accuracy.py --device gpu --images 512 --calibration-images 64 \
        --precisions fp32,int8,fp8 --no-torch --json out.json

Inputs: random crops of the natural photos that scikit-image and scikit-learn ship (or of the images in --photos
DIR), each preprocessed exactly as `vggserve.preprocess` (torchvision's eval transform); random weights give small
logit margins, so natural inputs make agreement a real test. Weights: deterministic random VGG16 (seed 0,
--width), written to a weights file that our engine loads as the CLI does.

The device mode (the default): our engine at every --precisions, each row against our FP32 engine: top-1
agreement, FP32's top-1 among the top 5 (issue 26's top-5 target), the top-5 sets equal, the logits' relative error
(per image, the L2 norm of the difference over FP32's norm: mean and max), the share of crops whose FP32 margin is
below that error, and, on the first --reference-images crops, the max error against float64 numpy and top-1
agreement with it. Issue 26's target (top-1 >= 0.99, top-5 >= 0.995) is marked per row. An 8-bit precision (int8,
fp8) runs once per calibration method that `vggserve calibrate` offers (--methods to choose): the calibration crops
(--calibration-images, drawn with --calibration-seed, 1) are written as PNG files and read as `vggserve calibrate`
reads them, the sidecar (`W.int8.json`, `W.fp8.json`) is written as it writes it, and the engine loads it from
beside the weights; the measured crops are drawn with --seed (0), so no row is measured on its own calibration.
The method `calibrate` uses by default for the precision is marked recommended. On a device without tensor cores
(PoCL), VGGSERVE_EMULATE_MMA=1 runs the 8-bit kernels on their exact software model, for a few crops at --width
0.0625. PyTorch's rows (its FP32, TF32, FP16; none at 8 bits) unless --no-torch.

    python benchmarks/precision_accuracy.py --fp8-model --images 512 [--calibration-images 64] [--json out.json]

`--fp8-model`: no device; the numpy FP8 model (vggserve/quant/reference.py: e4m3 activations per tensor, e4m3
weights per output channel, float32 sums) against numpy FP32, for each calibration method and each set of layers
kept at FP16 (none, the first convolution, the last FC layer, both). Calibrated on crops drawn with
--calibration-seed (1), measured on crops drawn with --seed (0: the GPU run's 512 crops), so never on the images
it was calibrated on. Each row: the agreements above, the logits' relative error against FP32 (mean and max), and
FP32's own margin between its top two logits, the measure of how hard agreement is with random weights.

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


def sample_photos(folder=None):
    """Natural RGB photos (H, W, 3) uint8: every image in `folder` (--photos: e.g. examples/images where neither
    library is installed, as in CI), else those scikit-image and scikit-learn ship (whatever of them is installed)."""
    from PIL import Image

    if folder is not None:
        from vggserve.distributed.inputs import IMAGE_EXTENSIONS

        paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not paths:
            raise SystemExit(f"precision_accuracy: --photos {folder}: no image files in it")
        return [np.asarray(Image.open(p).convert("RGB")) for p in paths]
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
        raise SystemExit("precision_accuracy: no sample photos: install scikit-image or scikit-learn, or pass "
                         "--photos DIR")
    return photos


def crop_boxes(n: int, seed: int, photos: list) -> list[tuple[int, int, int, int]]:
    """n random square crops (photo index, top, left, side; side 0.3-1.0 of the shorter side) of `photos`: the
    seed alone decides them, so the JSON's boxes show which crops were measured and which calibrated on."""
    rng = np.random.default_rng(seed)
    boxes = []
    for _ in range(n):
        k = int(rng.integers(len(photos)))
        h, w = photos[k].shape[:2]
        side = int(min(h, w) * rng.uniform(0.3, 1.0))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        boxes.append((k, y, x, side))
    return boxes


def crop_pixels(photos: list, boxes) -> list[np.ndarray]:
    return [photos[k][y:y + side, x:x + side] for k, y, x, side in boxes]


def crops(n: int, seed: int = 0, photos: list | None = None) -> np.ndarray:
    """n preprocessed (3, 224, 224) float32 inputs from random crops (crop_boxes) of the sample photos."""
    from PIL import Image

    from vggserve.preprocess import preprocess

    photos = sample_photos() if photos is None else photos
    out = np.empty((n, 3, 224, 224), np.float32)
    for i, pixels in enumerate(crop_pixels(photos, crop_boxes(n, seed, photos))):
        out[i] = preprocess(Image.fromarray(pixels))
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
    photos = sample_photos(args.photos)
    x = crops(args.images, args.seed, photos)
    key = (args.width, args.images, args.seed, args.calibration_images, args.calibration_seed, args.photos)
    cache = Path(args.cache) if args.cache else None
    stored = pickle.loads(cache.read_bytes()) if cache and cache.exists() else {}
    if key in stored:
        fp32, hists, n = stored[key]
        print(f"FP32 logits and calibration histograms from {cache}", flush=True)
        return tensors, x, fp32, hists, n
    spec, b = vgg16_spec(args.width), args.batch
    x_cal = crops(args.calibration_images, args.calibration_seed, photos)
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


# ---- the device mode: our engine at each precision, the 8-bit ones under each method `vggserve calibrate` offers ----
TARGET = {"top1": 0.99, "top1_in_top5": 0.995}  # issue 26: against FP32, on 512 natural crops


def calibrate_methods(precision: str) -> list[str]:
    """The methods `vggserve calibrate --precision P --method M` offers for `precision`, spelled as the rows name
    them: percentile at the percentile `--method percentile` writes by default (quant/methods.py, which the
    command's parser reads too)."""
    from vggserve.quant.methods import DEFAULT_METHODS, METHODS

    if precision not in DEFAULT_METHODS:
        raise ValueError(f"{precision} reads no calibration; these do: {', '.join(DEFAULT_METHODS)}")
    return [_spelled(m) for m in METHODS]


def recommended_method(precision: str) -> str:
    """The method `vggserve calibrate --precision P` uses when --method is not given."""
    from vggserve.quant.methods import DEFAULT_METHODS

    return _spelled(DEFAULT_METHODS[precision])


def _spelled(method: str, percentile: float | None = None) -> str:
    from vggserve.quant.methods import DEFAULT_PERCENTILE

    return f"percentile:{percentile or DEFAULT_PERCENTILE:g}" if method == "percentile" else method


def parse_precisions(text: str) -> list[str]:
    """--precisions as a list, FP32 (what every row is measured against) first; SystemExit in one line for a name
    the engine does not serve."""
    from vggserve.ops.precision import NAMES

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad or not names:
        raise SystemExit(f"precision_accuracy: --precisions: no precision {(bad or [text])[0]!r}; choose from "
                         f"{', '.join(NAMES)}")
    return ["fp32"] + [n for n in dict.fromkeys(names) if n != "fp32"]


def parse_methods(text: str | None, precision: str) -> list[str]:
    """--methods for one 8-bit precision: every method calibrate offers (None), or a list of max, percentile[:P],
    entropy and `default` (the precision's own); SystemExit in one line for anything else."""
    from vggserve.quant.methods import METHODS

    if text is None:
        return calibrate_methods(precision)
    out = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        method, _, p = word.partition(":")
        try:
            pct = float(p) if p else None
        except ValueError:
            pct = -1.0
        if word == "default":
            out.append(recommended_method(precision))
        elif method not in METHODS or (p and method != "percentile") or (pct is not None and not 0 < pct <= 100):
            raise SystemExit(f"precision_accuracy: --methods: {word!r} is no method of `vggserve calibrate`; give "
                             f"{', '.join(METHODS)} (percentile:P, 0 < P <= 100) or default")
        else:
            out.append(_spelled(method, pct))
    return list(dict.fromkeys(out))


def calibration_folder(photos: list, boxes, folder: Path) -> Path:
    """The calibration crops as PNG files (lossless), for `vggserve calibrate`'s own reader (quant/samples.py)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, pixels in enumerate(crop_pixels(photos, boxes)):
        Image.fromarray(np.ascontiguousarray(pixels)).save(folder / f"crop{i:05d}.png")
    return folder


def observe_folder(tensors: dict, folder: Path, batch: int):
    """(histograms, images) of the folder's images, read and preprocessed as `vggserve calibrate` reads them."""
    from vggserve.quant.calibrate import observe
    from vggserve.quant.samples import batches, check_headers, list_images

    paths = list_images(folder)
    check_headers(paths)
    return observe(tensors, batches(paths, "torchvision", batch))


def write_sidecar(weights: Path, sha256: str, precision: str, spelled: str, hists, images: int):
    """The sidecar `vggserve calibrate --precision P --method M [--percentile Q]` writes for these histograms (the
    same from_histograms call), where VGG16.load looks for it."""
    from vggserve.quant.calibrate import from_histograms
    from vggserve.quant.calibration import save, sidecar_path

    method, _, p = spelled.partition(":")
    cal = from_histograms(hists, images, sha256, method, float(p) if p else None)
    save(cal, sidecar_path(weights, precision))
    return cal


def engine_logits(weights: Path, x: np.ndarray, device: str, precision: str, batch: int) -> tuple[np.ndarray, dict]:
    """Our engine's logits of x at `precision`, loaded from the weights file as the CLI loads it (at 8 bits: the
    calibration beside it), and the load's and the run's seconds."""
    import time

    from vggserve import VGG16

    start = time.perf_counter()
    with VGG16.load(weights, device=device, max_batch_size=min(batch, len(x)), precision=precision) as model:
        loaded = time.perf_counter()
        logits = model.logits(x)
        done = time.perf_counter()
        info = {"device_name": model.device_name, "family": model.family}
    return logits, {**info, "load_s": round(loaded - start, 3), "run_s": round(done - loaded, 3)}


def _device_row(logits, fp32, ref64, gaps, **fields) -> dict:
    err = relative_error(logits, fp32)
    row = {**fields, **agreement(logits, fp32), "rel_err_mean": float(err.mean()), "rel_err_max": float(err.max()),
           "margin_below_error": float(np.mean(gaps < err))}
    if ref64 is not None:
        k = len(ref64)
        row["max_rel_err_vs_float64"] = float(np.abs(logits[:k] - ref64).max() / np.abs(ref64).max())
        row["top1_vs_float64"] = float(np.mean(logits[:k].argmax(1) == ref64.argmax(1)))
    row["meets_target"] = all(row[key] >= bound for key, bound in TARGET.items())
    return row


def _print_row(row: dict) -> None:
    method = row.get("method") or "-"
    mark = "*" if row.get("recommended") else " "
    print(f"{row['library']:9s} {row['precision']:5s} {method:17s}{mark} {row['top1']:7.4f} {row['top1_in_top5']:7.4f} "
          f"{row['top5_sets_equal']:7.4f} {row['rel_err_mean']:9.2e} {row['rel_err_max']:9.2e} "
          f"{row.get('max_rel_err_vs_float64', float('nan')):9.2e} {'yes' if row['meets_target'] else 'no':>6s}",
          flush=True)


HEADER = (f"{'library':9s} {'prec':5s} {'method':17s}  {'top-1':>7s} {'in top5':>7s} {'top5 eq':>7s} {'err mean':>9s} "
          f"{'err max':>9s} {'vs f64':>9s} {'target':>6s}")


def run_device(args) -> dict:
    """Our engine at each of --precisions against our FP32 engine, the 8-bit precisions once per calibration
    method (module docstring); PyTorch's rows for the others unless --no-torch."""
    import hashlib
    import os
    import tempfile

    from safetensors.numpy import save_file

    from vggserve.errors import DeviceError, VggserveError
    from vggserve.model.reference import reference_logits
    from vggserve.ops.precision import PRECISIONS
    from vggserve.weights.init import init_weights

    precs = parse_precisions(args.precisions)
    eight = [p for p in precs if PRECISIONS[p].eight_bit]
    methods = {p: parse_methods(args.methods, p) for p in eight}
    if eight and args.seed == args.calibration_seed:
        raise SystemExit(f"precision_accuracy: --calibration-seed must differ from --seed ({args.seed}): a "
                         f"calibration measured on the measured crops fits them")
    photos = sample_photos(args.photos)
    tensors = init_weights(seed=0, width=args.width)
    boxes = crop_boxes(args.images, args.seed, photos)
    x = crops(args.images, args.seed, photos)
    cal_boxes = crop_boxes(args.calibration_images, args.calibration_seed, photos) if eight else []
    k = min(args.reference_images, len(x))
    ref64 = reference_logits(tensors, x[:k]) if k else None
    results = {"mode": "device", "device": args.device, "images": len(x), "width": args.width, "seed": args.seed,
               "calibration_seed": args.calibration_seed if eight else None, "calibration_images": len(cal_boxes),
               "reference_images": k, "precisions": precs, "target": TARGET,
               "methods": {p: methods[p] for p in eight}, "recommended": {p: recommended_method(p) for p in eight},
               "calibrate_offers": {p: calibrate_methods(p) for p in eight},
               "measured_crops": [list(b) for b in boxes], "calibration_crops": [list(b) for b in cal_boxes],
               "rows": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            weights = Path(tmp) / f"vgg16-seed0-w{args.width:g}.safetensors"
            save_file(tensors, str(weights))
            sha = hashlib.sha256(weights.read_bytes()).hexdigest()  # what VGG16.load checks the sidecar against
            if eight:
                folder = calibration_folder(photos, cal_boxes, Path(tmp) / "calibration")
                hists, n = observe_folder(tensors, folder, min(args.batch, 8))
                print(f"calibrated on {n} crops (seed {args.calibration_seed}); measuring {len(x)} crops (seed "
                      f"{args.seed})", flush=True)
            fp32, info = engine_logits(weights, x, args.device, "fp32", args.batch)
            gaps = margins(fp32)
            results.update(device_name=info["device_name"], fp32_margin_median=float(np.median(gaps)),
                           fp32_margin_p10=float(np.percentile(gaps, 10)))
            print(f"{info['device_name']}: FP32's top-1 margin over the logits' norm: median {np.median(gaps):.2e}, "
                  f"10th percentile {np.percentile(gaps, 10):.2e}; target: top-1 >= {TARGET['top1']}, FP32 top-1 in "
                  f"top-5 >= {TARGET['top1_in_top5']} (* recommended method)\n{HEADER}", flush=True)
            for p in precs:
                for spelled in methods.get(p, [None]):
                    cal = None
                    if spelled is not None:
                        cal = write_sidecar(weights, sha, p, spelled, hists, n)
                    logits, info = (fp32, info) if p == "fp32" else engine_logits(weights, x, args.device, p,
                                                                                  args.batch)
                    fields = {"library": "vggserve", "precision": p, "method": spelled,
                              "recommended": spelled is not None and spelled == recommended_method(p), **info}
                    if cal is not None:
                        fields["amax"] = {name: float(v) for name, v in cal.amax.items()}
                    row = _device_row(logits, fp32, ref64, gaps, **fields)
                    results["rows"].append(row)
                    _print_row(row)
                    _save(args, results)
    except VggserveError as exc:
        hint = ""
        if isinstance(exc, DeviceError) and eight and os.environ.get("VGGSERVE_EMULATE_MMA", "") != "1":
            hint = ("; without tensor cores, VGGSERVE_EMULATE_MMA=1 runs the 8-bit kernels on their exact software "
                    "model (slow: CI-sized counts)")
        raise SystemExit(f"precision_accuracy: {exc}{hint}") from None
    floats = [p for p in precs if not PRECISIONS[p].eight_bit]
    if not args.no_torch:
        torch = {p: run_torch(tensors, x, p, args.batch) for p in floats}
        for p in floats:
            row = _device_row(torch[p], torch["fp32"], ref64, margins(torch["fp32"]), library="pytorch",
                              precision=p, method=None, recommended=False)
            results["rows"].append(row)
            _print_row(row)
    _save(args, results)
    return results




def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu", help="the device our engine runs on (gpu, cpu, gpu:N, ...)")
    ap.add_argument("--images", type=_positive, default=512, help="measured crops (default 512)")
    ap.add_argument("--batch", type=int, default=None, help="images per call (default 64; --fp8-model: 8)")
    ap.add_argument("--reference-images", type=int, default=4, help="images checked against float64 (slow on CPU)")
    ap.add_argument("--precisions", default="fp32,tf32,fp16",
                    help="device mode: our engine's precisions (fp32 always runs: the rows' reference); int8 and fp8 "
                         "run once per --methods")
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
    ap.add_argument("--calibration-images", type=_positive, default=64,
                    help="8-bit rows and models: crops to calibrate on")
    ap.add_argument("--calibration-seed", type=int, default=1, help="their seed (not --seed's)")
    ap.add_argument("--seed", type=int, default=0, help="the measured crops' seed")
    ap.add_argument("--methods", default=None,
                    help="calibration methods; device mode: of max, percentile[:P], entropy, default (the "
                         "precision's), default every one `vggserve calibrate` offers; --fp8-model/--int8-model: "
                         "also entropy-int8, default all")
    ap.add_argument("--photos", default=None, metavar="DIR",
                    help="crop the images in DIR (default: scikit-image's and scikit-learn's sample photos)")
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
    run_device(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
