"""`vggserve tune`: search conv_gemm parameters per layer shape on this device and store the winners."""

import json

from ..wording import count
from .common import add_device_args, note, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="autotune the GEMM kernels per layer shape on this device")
    p.add_argument("--candidates", type=positive_int, default=24, help="parameter sets tried per shape (default 24)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs per candidate (median; default 3)")
    p.add_argument("--winograd", action="store_true",
                   help="also time Winograd F(2x2,3x3) and F(4x4,3x3) candidates on the 3x3 layers (docs/winograd.md)")
    p.add_argument("--sparse", action="store_true",
                   help="instead: time the sparse kernels against the dense layers at sparsities 0..0.99 per layer "
                        "shape and store where each wins (the engine's choice for pruned weights, docs/sparse.md); "
                        "with --precision fp16 on tensor cores: the 2:4 kernels' tiles on 2:4 weights")
    p.add_argument("--shapes", default=None,
                   help="comma list of the shape keys to tune, e.g. 512x512x14+pool (default: every VGG16 shape; "
                        "CINxCOUTxSIZE, with +pool for a convolution that a pooling follows, at FP16/TF32)")
    p.add_argument("--algos", default=None,
                   help="comma list of the registry entries to time, e.g. wgmma_halo (default: every entry that "
                        "computes the layer; one that computes none of the shapes is refused with those that do)")
    p.add_argument("--dry-run", action="store_true", help="report, but do not store the winners")
    p.add_argument("--json", action="store_true", help="print winners and every trial as JSON")
    add_device_args(p, batch_default=16)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime import devices as devs
    from .. import tuning
    from ..runtime.params import tuned_file

    from ..errors import VggserveError

    only = None if args.shapes is None else [k.strip() for k in args.shapes.split(",") if k.strip()]
    if only == []:
        raise VggserveError("--shapes names no shape: give a comma list of shape keys, e.g. 512x512x14+pool")
    if args.sparse and (only is not None or args.precision not in ("fp32", "fp16")):
        raise VggserveError("--sparse times FP32 kernels, or the 2:4 ones at --precision fp16, on every VGG16 shape: "
                            f"it takes neither --shapes nor --precision {args.precision}")
    algos = None if args.algos is None else [a.strip() for a in args.algos.split(",") if a.strip()]
    if algos is not None and (args.sparse or not algos):
        raise VggserveError("--algos names no entry: give a comma list of registry entries, e.g. wgmma_halo"
                            if not algos else "--sparse times the sparse kernels: it takes no --algos")
    info = devs.resolve(args.device)
    if args.sparse:
        return _sparse(args, info)
    device = devs.cl_device(info)
    shapes = tuning.shapes_to_tune(info, device, args.batch_size, args.precision, only,
                                    algos)  # refused before announced
    note(f"vggserve: tuning {info.label} at batch {args.batch_size}, {args.precision}: {count(len(shapes), 'shape')}, "
         f"{count(args.candidates, 'candidate')} per shape and algorithm")
    winners, trials = tuning.tune(info, device, args.batch_size, args.candidates, args.repeats, shapes=shapes,
                                  progress=note, winograd_too=args.winograd, precision=args.precision,
                                  algos=algos)
    if not args.dry_run:
        tuning.store(info.label, winners, args.batch_size, args.precision)
        note(f"vggserve: stored in {tuned_file()}; the engine uses them from now on")
    if args.json:
        print(json.dumps({"device": info.label, "batch_size": args.batch_size, "precision": args.precision,
                          "winners": winners,
                          "trials": [t.__dict__ for t in trials]}))
    return 0


def _sparse(args, info) -> int:
    """Speed-up curves of the sparse kernels over the engine's dense layers, stored for the kernel choice."""
    from .. import sparse_tuning
    from ..model.vgg16 import VGG16
    from ..ops.sparse_select import sparse_table
    from ..runtime.params import params_for, tuned_file
    from ..weights.init import init_weights

    tensors = init_weights(seed=0)
    if args.precision == "fp16":
        return _sparse_2_4(args, info, tensors)
    limit = sparse_table(params_for(info.kind, info.label), info.kind)["codegen_max_nnz"]
    note(f"vggserve: timing sparse kernels on {info.label} at batch {args.batch_size} (codegen up to {limit:,} "
         "non-zeros)")
    with VGG16(tensors, device=info.spec, max_batch_size=args.batch_size, profile=True) as model:
        runs = sparse_tuning.measure(model, tensors, args.batch_size, iterations=args.repeats, codegen_max_nnz=limit,
                                   check=False, progress=note)
    curves = sparse_tuning.curves(runs)
    for shape, per_algo in curves.items():
        note(f"{shape:>14s} wins from: " + ", ".join(f"{algo} {sparse_tuning.crossover(c)}"
                                                     for algo, c in per_algo.items()))
    if not args.dry_run:
        sparse_tuning.store(info.label, curves, args.batch_size)
        note(f"vggserve: stored in {tuned_file()}; the engine uses them from now on")
    if args.json:
        print(json.dumps({"device": info.label, "batch_size": args.batch_size, "curves": curves}))
    return 0


def _sparse_2_4(args, info, tensors) -> int:
    """The 2:4 tensor-core kernels' tiles against the dense FP16 layers; each one's best tile and its curves stored."""
    from .. import sparse_tuning
    from ..model.vgg16 import VGG16
    from ..runtime.params import tuned_file

    note(f"vggserve: timing the 2:4 tensor-core kernel on {info.label} at batch {args.batch_size}, FP16")
    with VGG16(tensors, device=info.spec, max_batch_size=args.batch_size, profile=True, precision="fp16") as model:
        if model.family != "tensorcore":
            note("vggserve: this device has no tensor cores: nothing to tune at FP16 2:4")
            return 1
        runs = sparse_tuning.measure_2_4(model, tensors, args.batch_size, iterations=args.repeats, check=False,
                                         progress=note)
    params, curves = sparse_tuning.best_2_4(runs)
    for shape, per_algo in curves.items():
        note(f"{shape:>14s} 2:4 " + ", ".join(f"{algo} x{c[0][1]:.2f}" for algo, c in per_algo.items())
             + " over dense FP16")
    note(f"best 2:4 tiles: {params}")
    if not args.dry_run and params:
        sparse_tuning.store(info.label, curves, args.batch_size, params)
        note(f"vggserve: stored in {tuned_file()}; the engine uses them from now on")
    if args.json:
        print(json.dumps({"device": info.label, "batch_size": args.batch_size, "precision": "fp16",
                          "params": params, "curves": curves}))
    return 0

