"""How much FP16 and TF32 change VGG16's answers, for vggserve and for PyTorch, on the same weights and inputs.

    python benchmarks/precision_accuracy.py --device gpu --images 512 [--reference-images 4] [--json out.json]

Inputs: random crops of the natural photos that scikit-image and scikit-learn ship (random weights give small
logit margins, so natural inputs make agreement a real test), each preprocessed exactly as `vggserve.preprocess`
(torchvision's eval transform). Weights: deterministic random full-size VGG16 (seed 0).
For each library and precision: top-1 agreement and top-5 agreement (FP32's top-1 among the top 5; and the top-5
sets equal) with the same library's FP32; and, on the first few images, the max relative error of the logits
against a float64 numpy reference.
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reference-images", type=int, default=4, help="images checked against float64 (slow on CPU)")
    ap.add_argument("--precisions", default="fp32,tf32,fp16")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vggserve.model.reference import reference_logits
    from vggserve.weights.init import init_weights

    tensors = init_weights(seed=0, width=args.width)
    x = crops(args.images)
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
