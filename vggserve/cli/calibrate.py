"""`vggserve calibrate --weights W --images DIR [--precision int8]`: 8-bit activation ranges measured on sample
images, stored beside W (`W.fp8.json`, `W.int8.json`), by the method the precision's study recommends unless
--method says otherwise."""

import argparse
from pathlib import Path

from .common import positive_int


def register(subparsers) -> None:
    from ..quant.methods import DEFAULT_METHODS, DEFAULT_PERCENTILE, METHODS

    p = subparsers.add_parser("calibrate", help="measure 8-bit activation ranges on sample images (docs/fp8.md)")
    p.add_argument("--weights", default=None,
                   help="weights file (default: $VGGSERVE_WEIGHTS, then fetched weights; see `vggserve weights`)")
    p.add_argument("--images", required=True, metavar="DIR",
                   help="folder of sample images like those the model will serve, searched recursively "
                        "(a few hundred are plenty); an unreadable one stops the run, naming it")
    p.add_argument("--precision", choices=tuple(DEFAULT_METHODS), default="fp8",
                   help="the precision the ranges are for (default fp8); each has its own file and default method")
    p.add_argument("--method", choices=METHODS, default=None,
                   help="max: the largest value seen; percentile: --percentile of |x|; entropy: TensorRT's "
                        "KL-divergence calibrator (default: " +
                        ", ".join(f"{m} for {p}" for p, m in DEFAULT_METHODS.items()) +
                        "; docs/fp8.md compares them)")
    p.add_argument("--percentile", type=_percentile, default=None, metavar="P",
                   help=f"with --method percentile: the percentile of |x| kept unclipped "
                        f"(default {DEFAULT_PERCENTILE})")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="use the first N images (in path order) only")
    p.add_argument("--output", type=Path, default=None,
                   help="file to write (default: beside the weights, as <weights file>.fp8.json or .int8.json, "
                        "where that precision looks)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _percentile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 100], e.g. 99.99; got {text!r}")
    return value


def run(args) -> int:
    from ..errors import CalibrationError
    from ..quant.calibration import sidecar_path
    from ..quant.samples import check_headers, list_images
    from ..weights import find_weights, load_weights

    from ..quant.methods import DEFAULT_METHODS

    args.method = args.method or DEFAULT_METHODS[args.precision]
    if args.percentile is not None and args.method != "percentile":
        raise CalibrationError(f"--percentile applies to --method percentile, not {args.method}; drop it or pass "
                               f"--method percentile")
    path = find_weights(args.weights)
    output = args.output or sidecar_path(path, args.precision)
    _check_output(output)
    paths = list_images(args.images, args.limit)
    weights = load_weights(path)
    check_headers(paths)
    cal = _calibrate(weights, paths, args)
    _save(cal, output)
    print(f"path: {output}")
    print(f"precision: {args.precision}")
    print(f"method: {cal.method}" + ("" if cal.percentile is None else f" ({cal.percentile:g}th percentile)"))
    print(f"images: {cal.images}")
    print(f"weights sha256: {cal.weights_sha256}")
    return 0


def _calibrate(weights, paths: list[str], args):
    from tqdm import tqdm

    from ..errors import CalibrationError
    from ..quant.calibrate import from_histograms, observe
    from ..quant.samples import batches

    with tqdm(total=len(paths), unit="img", desc="calibrate", disable=args.no_progress) as bar:
        try:
            hists, images = observe(weights.tensors, batches(paths, weights.preprocessing, args.batch_size),
                                    progress=bar.update)
        except ValueError as exc:  # NaN or infinity in an activation: no range to store
            raise CalibrationError(f"{weights.path}: {exc}; these weights cannot run at 8 bits") from None
    return from_histograms(hists, images, weights.sha256, args.method, args.percentile)


def _check_output(output: Path) -> None:
    """Before the long pass: the file to write must be able to exist (its folder there, itself no folder)."""
    from ..errors import CalibrationError

    if output.is_dir():
        raise CalibrationError(f"--output {output} is a folder; name the file to write, e.g. {output}/vgg16.fp8.json")
    if not output.parent.is_dir():
        raise CalibrationError(f"--output {output}: the folder {output.parent} does not exist; create it first")


def _save(cal, output: Path) -> None:
    from ..errors import CalibrationError
    from ..quant.calibration import save

    try:
        save(cal, output)
    except OSError as exc:
        raise CalibrationError(f"cannot write {output}: {exc.strerror or exc}") from None
