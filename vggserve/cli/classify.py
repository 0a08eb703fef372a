"""`vggserve classify IMAGE...`: top-k ImageNet classes for each image."""

import sys

from .common import add_decode_arg, add_device_args, add_max_pixels_arg, load_model, top_k


def register(subparsers) -> None:
    p = subparsers.add_parser("classify", help="print the top-k ImageNet classes of images")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, WEBP, GIF, BMP, TIFF)")
    p.add_argument("--weights", default=None,
                   help="weights file (default: $VGGSERVE_WEIGHTS, then fetched weights; see `vggserve weights`)")
    p.add_argument("--top-k", type=top_k, default=5, help="classes per image, 1..1000 (default 5)")
    p.add_argument("--json", action="store_true",
                   help='one JSON object per image per line: {"image", "predictions": [{"index", "label", "probability"}]}')
    add_device_args(p, batch_default=8)
    add_decode_arg(p, device=True)
    add_max_pixels_arg(p, "are refused with an error line, and the exit status is 5")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..decoding import decode_input, decodes_on_device
    from ..distributed.pipeline import classify_decoded
    from ..errors import ImageError
    from ..modelinput import uses_device_resize

    model = load_model(args.weights, args.device, args.batch_size, precision=args.precision)
    on_device = uses_device_resize(model)  # the device resizes and crops, bit for bit as on the CPU
    on_gpu = decodes_on_device(model, args.decode)  # gpu, or auto on a GPU, where the device decoder builds
    failures = 0
    for start in range(0, len(args.images), args.batch_size):
        paths = args.images[start:start + args.batch_size]
        if on_gpu:
            from ..decoding.device import decode_inputs

            decoded = decode_inputs(paths, model, model.preprocessing, on_device, max_pixels=args.max_pixels)
        else:
            decode = "exact" if args.decode == "auto" else args.decode
            decoded = (decode_input(path, model.preprocessing, on_device=on_device, decode=decode,
                                    catch=ImageError, max_pixels=args.max_pixels) for path in paths)
        classified, failed = classify_decoded(model, paths, decoded, args.top_k)
        failures += len(failed)
        for _path, (reason, _kind) in failed:  # an ImageError's message names the file
            print(f"vggserve: error: {reason}", file=sys.stderr)
        for path, preds in classified:
            _print(path, preds, args.json)
    return 5 if failures else 0


def _print(path: str, predictions: list[dict], as_json: bool) -> None:
    if as_json:
        from ..distributed.store import result_line  # the batch job's results.jsonl line, by design the same

        print(result_line(path, predictions), flush=True)
        return
    print(path)
    for p in predictions:
        print(f"  {p['probability']:7.2%}  {p['index']:4d}  {p['label']}")
