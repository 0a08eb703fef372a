"""How often `--decode fast` gives the exact mode's classes: top-1 and top-5 agreement over photo-like images.

    python benchmarks/decode_agreement.py                          # 512 photos, VGG16 at width 1/8, random weights
    python benchmarks/decode_agreement.py --weights vgg16.safetensors --device gpu   # real weights, if you have them

1. Images: --images random crops of the real photos shipped with scikit-image and scikit-learn (where installed;
   else vggserve's synthetic photo-like pictures), each upscaled to a phone-photo size (longer side 1200 to 4000,
   so the fast mode has something to scale down) with a little grain, saved as JPEG (quality 90, 4:2:0).
2. Each image is decoded in both modes (`decoding.model_input`, float32 inputs) and classified by the same network:
   --weights, or a VGG16 of --width with random weights (seed 0).
3. Agreement, as fractions of the images: top-1 equal; the exact top-1 within the fast top-5; the top-5 sets
   equal; mean overlap of the top-5 sets. Random weights give nearly every image the same top class, which makes
   the plain figures easy; so the same figures are also given on logits standardised per class over the images
   (each class's mean and spread across the exact mode's images removed): image-specific predictions, a far
   stricter test. A control row compares the exact mode with itself on the same photos saved at quality 89
   instead of 90: disagreement at that level is what re-saving a photo already causes.
4. The 224x224 inputs: mean absolute difference between the modes, in grey levels.
Prints a Markdown table; --json FILE writes it.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="photos to compare (default 512)")
    p.add_argument("--weights", default=None, help="weights file (default: random weights at --width)")
    p.add_argument("--width", type=float, default=0.125, help="channel width of the random network (default 1/8)")
    p.add_argument("--device", default="cpu", help="engine device (default cpu)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def load_model(args):
    from vggserve.model.vgg16 import VGG16

    if args.weights:
        return VGG16.load(args.weights, device=args.device, max_batch_size=args.batch_size), args.weights
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=0, width=args.width)
    return VGG16(tensors, device=args.device, max_batch_size=args.batch_size), f"random, width {args.width:g}"


def photos(count: int, seed: int):
    """(source description, iterator of (name, PIL image))."""
    from vggserve.decoding.corpus import photo_crops, photo_like, sample_photos

    real = sample_photos()
    if real:
        return f"crops of {len(real)} scikit-image/scikit-learn photos", photo_crops(real, count, seed)
    rng = np.random.default_rng(seed)
    sized = ((f"synthetic{i:04d}.jpg", photo_like(int(s), int(s) * 3 // 4, seed=i))
             for i, s in enumerate(rng.choice([1200, 1600, 2000, 3000, 4000], count)))
    return "synthetic photo-like pictures (install scikit-image/scikit-learn for real photos)", sized


def jpeg(image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """Agreement of b's classes with a's, row by row."""
    top_a, top_b = np.argsort(-a, axis=1)[:, :5], np.argsort(-b, axis=1)[:, :5]
    return {"top1": float(np.mean(top_a[:, 0] == top_b[:, 0])),
            "top1_in_top5": float(np.mean([x[0] in y for x, y in zip(top_a, top_b)])),
            "top5_sets": float(np.mean([set(x) == set(y) for x, y in zip(top_a, top_b)])),
            "top5_overlap": float(np.mean([len(set(x) & set(y)) / 5 for x, y in zip(top_a, top_b)])),
            "distinct_top1": int(len(set(top_a[:, 0])))}


def logits_of(model, inputs: list, batch: int) -> np.ndarray:
    return np.concatenate([model.logits(np.stack(inputs[i:i + batch])) for i in range(0, len(inputs), batch)])


def main(argv=None) -> int:
    args = parse_args(argv)
    from vggserve.decoding import model_input

    model, weights = load_model(args)
    described, images = photos(args.images, args.seed)
    exact, fast, control, sizes, started = [], [], [], [], time.perf_counter()
    mode = model.preprocessing
    for _, image in images:
        data = jpeg(image, 90)
        sizes.append(image.width * image.height)
        exact.append(model_input(data, mode, False, "exact").array)
        fast.append(model_input(data, mode, False, "fast").array)
        control.append(model_input(jpeg(image, 89), mode, False, "exact").array)
    print(f"decode_agreement: {len(exact)} images ({described}), {np.median(sizes) / 1e6:.1f} MP median, decoded "
          f"in {time.perf_counter() - started:.0f} s; network: VGG16, weights {weights}, on {model.device_name}",
          file=sys.stderr)
    le, lf, lc = (logits_of(model, x, args.batch_size) for x in (exact, fast, control))
    mean, spread = le.mean(axis=0), le.std(axis=0) + 1e-12
    rows = {"fast vs exact": agreement(le, lf), "fast vs exact, standardised logits":
            agreement((le - mean) / spread, (lf - mean) / spread),
            "control: exact at quality 89 vs 90": agreement(le, lc),
            "control, standardised logits": agreement((le - mean) / spread, (lc - mean) / spread)}
    pixels = float(np.mean([np.abs(e - f).mean() for e, f in zip(exact, fast)]))
    model.close()
    print(f"\n`--decode fast` against `--decode exact`: {len(exact)} photos, VGG16 weights {weights}\n")
    print("| comparison | top-1 | exact top-1 in top-5 | top-5 sets equal | top-5 overlap | distinct top-1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['top1']:.1%} | {r['top1_in_top5']:.1%} | {r['top5_sets']:.1%} | "
              f"{r['top5_overlap']:.1%} | {r['distinct_top1']} |")
    print(f"\nmean |exact - fast| of the normalised 224x224 inputs: {pixels:.4f} "
          f"(~{pixels * 0.226 * 255:.2f} grey levels)")
    if args.json:
        Path(args.json).write_text(json.dumps({"images": len(exact), "source": described, "weights": weights,
                                               "rows": rows, "mean_abs_input": pixels}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
