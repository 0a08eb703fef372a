"""Arguments and helpers that several subcommands share."""

import sys


def add_device_args(parser, batch_default: int = 16) -> None:
    parser.add_argument("--device", default="auto",
                        help="auto (a GPU if any, else the CPU), cpu, gpu, gpu:N, cpu:N or P:D from `vggserve devices`")
    parser.add_argument("--batch-size", type=positive_int, default=batch_default,
                        help=f"images per device batch (default {batch_default})")
    add_precision_arg(parser)


def add_precision_arg(parser) -> None:
    from ..ops.precision import DEFAULT, NAMES

    parser.add_argument("--precision", choices=NAMES, default=DEFAULT,
                        help="fp32 (default: results never change by surprise), tf32 (tensor cores, NVIDIA), fp16 "
                             "(tensor cores on NVIDIA, FP16 storage with FP32 math elsewhere), fp8 or int8 (tensor "
                             "cores, NVIDIA; activation scales from `vggserve calibrate`); see docs/precision.md and "
                             "docs/fp8.md")


AUTO_DECODE = "gpu where the device is a GPU, else exact"


def add_decode_arg(parser, device: bool = False) -> None:
    """--decode; `device`: with the device JPEG decoder's modes, gpu and auto, and auto the default (on a GPU the
    device decoder served 2.0-2.1x the images/s of exact in the service and 1.8x in the batch job, FP16 on an H200
    with 16 cores: BENCHMARKS.md, twenty-eighth session; its pixels are exact's, bit for bit)."""
    default = "auto" if device else "exact"
    parser.add_argument("--decode", choices=("exact", "fast") + (("gpu", "auto") if device else ()), default=default,
                        help="exact: every pixel decoded, torchvision's preprocessing bit for bit" +
                             ("" if device else " (default)") + "; fast: "
                             "large JPEGs decoded scaled down by 1/2, 1/4 or 1/8 in their DCT, never below what "
                             "Resize(256) needs (several times faster on phone photos; predictions agree with exact "
                             "on almost every image)" + ("; gpu: baseline JPEGs decoded on the model's OpenCL "
                             "device, bit for bit as exact, other files as exact; auto (default): " + AUTO_DECODE
                             if device else ""))


MAX_PIXELS_RANGE = (1, 1 << 31)  # as `serve --max-pixels` (serving/settings.py)


def add_max_pixels_arg(parser, refused: str) -> None:
    """--max-pixels, as `serve` has it; `refused`: what becomes of a larger image."""
    from ..images import DEFAULT_MAX_PIXELS

    parser.add_argument("--max-pixels", type=max_pixels, default=DEFAULT_MAX_PIXELS, metavar="N",
                        help=f"largest image in pixels (width x height, from its header); larger ones {refused} "
                             f"(default {DEFAULT_MAX_PIXELS}; a 48 MP photo needs e.g. 50000000)")


def max_pixels(text: str) -> int:
    """--max-pixels: an integer in MAX_PIXELS_RANGE, else a usage error (exit status 2) worded as serve's."""
    import argparse

    low, high = MAX_PIXELS_RANGE
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        shown = repr(text) if value is None else value
        raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, got {shown}; pass e.g. "
                                         f"--max-pixels 50000000")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "a non-negative integer")


def lane_count(text: str) -> int:
    """An argparse type: --lanes, 1 to the engine's MAX_LANES."""
    import argparse

    from ..engine.lanes import MAX_LANES

    value = _int_at_least(text, 1, f"an integer from 1 to {MAX_LANES}")
    if value > MAX_LANES:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_LANES}, got {value}")
    return value


def _int_at_least(text: str, least: int, what: str) -> int:
    """An argparse type: `text` as an int of at least `least`, else a usage error (exit status 2) expecting `what`."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def top_k(text: str) -> int:
    """--top-k: 1..1000 (the number of classes); anything else is a usage error (exit status 2) like any bad flag."""
    import argparse

    from ..weights.spec import NUM_CLASSES

    value = positive_int(text)
    if value > NUM_CLASSES:
        raise argparse.ArgumentTypeError(f"must be at most {NUM_CLASSES} (the number of classes), got {value}")
    return value


def note(message: str) -> None:
    """A status line on stderr (stdout stays machine-readable)."""
    print(message, file=sys.stderr, flush=True)


def load_model(weights, device: str, batch_size: int, profile: bool = False, precision: str = "fp32"):
    """find_weights + VGG16.load, saying on stderr which device was picked."""
    from ..model.vgg16 import VGG16
    from ..weights import find_weights

    path = find_weights(weights)
    model = VGG16.load(path, device=device, max_batch_size=batch_size, profile=profile, precision=precision)
    if device in ("auto", "gpu", "cpu"):
        note(f"vggserve: using {model.device_info.spec} {model.device_name}")
    return model
