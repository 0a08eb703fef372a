"""`vggserve tune`: search conv_gemm parameters per layer shape on this device and store the winners."""

import json

from .common import add_device_args, note, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="autotune the GEMM kernels per layer shape on this device")
    p.add_argument("--candidates", type=positive_int, default=24, help="parameter sets tried per shape (default 24)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs per candidate (median; default 3)")
    p.add_argument("--winograd", action="store_true",
                   help="also time Winograd F(2x2,3x3) and F(4x4,3x3) candidates on the 3x3 layers (docs/winograd.md)")
    p.add_argument("--dry-run", action="store_true", help="report, but do not store the winners")
    p.add_argument("--json", action="store_true", help="print winners and every trial as JSON")
    add_device_args(p, batch_default=16)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime import devices as devs
    from .. import tuning
    from ..runtime.params import tuned_file

    info = devs.resolve(args.device)
    note(f"vggserve: tuning {info.label} at batch {args.batch_size}, {args.precision}, {args.candidates} candidates "
         f"per shape and algorithm")
    winners, trials = tuning.tune(info, devs.cl_device(info), args.batch_size, args.candidates, args.repeats,
                                  progress=note, winograd_too=args.winograd, precision=args.precision)
    if not args.dry_run:
        tuning.store(info.label, winners, args.batch_size, args.precision)
        note(f"vggserve: stored in {tuned_file()}; the engine uses them from now on")
    if args.json:
        print(json.dumps({"device": info.label, "batch_size": args.batch_size, "precision": args.precision,
                          "winners": winners,
                          "trials": [t.__dict__ for t in trials]}))
    return 0
