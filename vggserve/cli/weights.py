"""`vggserve weights init|fetch|convert|prune|info|where`: make, download, convert, prune and inspect VGG16 weights."""

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser("weights", help="make, fetch, convert and inspect VGG16 weights")
    sub = parser.add_subparsers(dest="weights_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("init", help="write deterministic random weights (for tests and benchmarks)")
    p.add_argument("--seed", type=_seed, required=True,
                   help="random seed, a whole number >= 0; the same seed gives the same file")
    p.add_argument("--output", type=Path, required=True, help="safetensors file to write")
    p.add_argument("--width", type=_width, default=1.0,
                   help="channel width multiplier in (0, 1], snapped to a multiple of 1/64, for tests "
                        "(default 1 = VGG16; 0.125 = the tiny test net)")
    p.set_defaults(func=_init)

    p = sub.add_parser("fetch", help="download published ImageNet weights and verify their checksum")
    p.add_argument("--source", choices=("timm", "torchvision"), default="timm",
                   help="timm: vgg16.tv_in1k from the Hugging Face hub (default); torchvision: vgg16-397923af.pth")
    p.add_argument("--dir", type=Path, default=None,
                   help="folder to put the file in (default: the cache folder the default lookup searches)")
    p.add_argument("--url", default=None, help="torchvision only: download from this URL instead")
    p.add_argument("--endpoint", default=None, help="timm only: Hugging Face endpoint (default: $HF_ENDPOINT)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_fetch)

    p = sub.add_parser("convert", help="write any supported weights file as safetensors in torchvision names")
    p.add_argument("input", type=Path, help="safetensors, .npz, torch .pth or Keras .h5 file")
    p.add_argument("output", type=Path, help="safetensors file to write")
    p.set_defaults(func=_convert)

    p = sub.add_parser("prune", help="magnitude-prune the weights and write safetensors with provenance")
    p.add_argument("input", type=Path, help="any supported weights file")
    p.add_argument("output", type=Path, help="safetensors file to write")
    p.add_argument("--sparsity", type=_fraction, default=None,
                   help="fraction of each layer's weights to zero, e.g. 0.9 (2:4: 0.5, implied)")
    p.add_argument("--pattern", choices=("unstructured", "2:4"), default="unstructured",
                   help="unstructured (default): the smallest weights anywhere; 2:4: 2 of every 4 along the input")
    p.add_argument("--layers", choices=("conv", "fc", "all"), default="all", help="which layers to prune (default all)")
    p.add_argument("--scope", choices=("layer", "global"), default="layer",
                   help="layer (default): the same fraction in every layer; global: one threshold over all of them")
    p.set_defaults(func=_prune)

    p = sub.add_parser("info", help="format, key scheme, parameter count, width, SHA256, preprocessing, sparsity")
    p.add_argument("path", type=Path)
    p.set_defaults(func=_info)

    p = sub.add_parser("where", help="print the weights file the default lookup finds")
    p.set_defaults(func=_where)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed must be a whole number >= 0, got {value}")
    return value


def _width(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"width must be in (0, 1], got {value}")
    return value


def _fraction(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"sparsity must be between 0 and 1, got {value}")
    return value


def _init(args) -> int:
    from ..weights.init import init_weights
    from ..weights.loaded import sha256_file
    from ..weights.safetensors_io import save_safetensors
    from ..weights.spec import snap_width

    width = snap_width(args.width)
    tensors = init_weights(args.seed, width)
    metadata = {"source": "vggserve weights init", "seed": str(args.seed), "width": repr(width),
                "key_scheme": "torchvision", "preprocessing": "torchvision"}
    path = save_safetensors(tensors, args.output, metadata)
    count = sum(t.size for t in tensors.values())
    print(f"path: {path}")
    print(f"width: {width:g}" + ("" if width == args.width else f" ({args.width:g} snapped to a multiple of 1/64)"))
    print(f"parameters: {count:,}")
    print(f"sha256: {sha256_file(path)}")
    return 0


def _fetch(args) -> int:
    from ..weights.fetch import fetch

    path = fetch(args.source, folder=args.dir, url=args.url, endpoint=args.endpoint, progress=not args.no_progress)
    print(f"path: {path}")
    if args.dir is not None:
        print(f"use it with --weights {path} or VGGSERVE_WEIGHTS={path}")
    return 0


def _convert(args) -> int:
    from ..weights.convert import convert

    loaded, out = convert(args.input, args.output)
    print(f"{args.input} ({loaded.format}, {loaded.key_scheme} names) -> {out}")
    print(f"preprocessing: {loaded.preprocessing}")
    return 0


def _info(args) -> int:
    from ..weights.loading import load_weights

    w = load_weights(args.path)
    rows = [
        ("path", str(w.path)),
        ("format", w.format),
        ("key scheme", w.key_scheme),
        ("parameters", f"{w.parameter_count:,}"),
        ("width", f"{w.width:g}" + ("" if w.width == 1 else " (narrow test network, not VGG16 itself)")),
        ("sha256", w.sha256),
        ("preprocessing", w.preprocessing + _PREPROCESSING_NOTE[w.preprocessing]),
    ]
    for name, value in rows:
        print(f"{name + ':':15}{value}")
    _print_sparsity(w)
    return 0


def _prune(args) -> int:
    from ..weights.loading import load_weights
    from ..weights.prune import check_options, prune, provenance
    from ..weights.safetensors_io import save_safetensors

    try:
        target = check_options(args.sparsity, args.pattern, args.scope)
    except ValueError as exc:
        print(f"vggserve: error: {exc}", file=sys.stderr)
        return 2
    w = load_weights(args.input)
    result = prune(w.tensors, target, args.pattern, args.layers, args.scope)
    metadata = provenance(args.input.name, w.sha256, w.metadata, target, args.pattern, args.layers, args.scope,
                          result.layer_sparsity, w.preprocessing, w.width)
    path = save_safetensors(result.tensors, args.output, metadata)
    print(f"{args.input} -> {path}: {args.pattern} pruning, {_target(f'{target:g}', args.scope)}, "
          f"layers: {args.layers}")
    _print_layers(result.layer_sparsity, result.tensors)
    return 0


def _print_sparsity(w) -> None:
    from ..weights.prune import layer_sparsities

    sparsity = layer_sparsities(w.tensors)
    weights = sum(w.tensors[f"{name}.weight"].size for name in sparsity)
    zeros = sum(round(s * w.tensors[f"{name}.weight"].size) for name, s in sparsity.items())
    print(f"{'sparsity:':15}{zeros / weights:.4f} of the weights are zero ({zeros:,} of {weights:,})")
    if "prune_pattern" in w.metadata:
        m = w.metadata
        print(f"{'pruned:':15}{m['prune_pattern']}, {_target(m.get('prune_sparsity', '?'), m.get('prune_scope'))}, "
              f"layers {m.get('prune_layers', '?')}, from {m.get('source_file', '?')} "
              f"(sha256 {m.get('source_sha256', '?')})")
    _print_layers(sparsity, w.tensors)


def _target(sparsity: str, scope: str | None) -> str:
    """How a pruning target reads: "0.9 per layer", "0.9 overall (one threshold over the layers)"."""
    if scope == "global":
        return f"{sparsity} overall (one threshold over the layers)"
    return f"{sparsity} per {scope or '?'}"


def _print_layers(sparsity: dict, tensors: dict) -> None:
    import numpy as np

    from ..weights.prune import is_2_4

    print(f"{'layer':15}{'shape':>22} {'non-zeros':>12} {'sparsity':>9} {'2:4':>4}")
    for name, s in sparsity.items():
        t = tensors[f"{name}.weight"]
        shape = "x".join(map(str, t.shape))
        print(f"{name:15}{shape:>22} {np.count_nonzero(t):>12,} {s:9.4f} {'yes' if is_2_4(t) else 'no':>4}")


_PREPROCESSING_NOTE = {
    "torchvision": " (RGB, scaled to 0..1, ImageNet mean/std)",
    "caffe": " (BGR, 0..255 minus the ImageNet mean, no scaling)",
}


def _where(args) -> int:
    from ..weights.lookup import find_weights

    print(find_weights())
    return 0

