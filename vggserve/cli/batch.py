"""`vggserve batch`: classify a directory or list of images over every MPI rank (one device per rank).

    mpirun -n 4 vggserve batch --weights W --input DIR_OR_LIST --output results.jsonl --device gpu

Without mpirun it runs as one rank. See docs/batch.md for the output files, the exit status (5 when images are in
the errors file), resuming and deploy/ scripts.
mpi4py is imported only when the command runs, so other subcommands never start MPI.
"""

import argparse

from .common import add_decode_arg, add_max_pixels_arg, add_precision_arg, positive_int, top_k


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="classify many images under mpirun, one device per rank; resumable",
        description="Classify every image of --input into --output (one JSON line per image, as `classify "
                    "--json` prints it). Run under mpirun/mpiexec for several devices; a rerun with the same "
                    "--output finishes what is missing. Exit status 0 when every image has a result, 5 when some "
                    "are in the errors file; SIGTERM or Ctrl-C stop it cleanly (143, 130).",
    )
    parser.add_argument("--input", required=True, metavar="DIR_OR_LIST",
                        help="directory (searched recursively for image files), list file (one path per line, "
                             "relative to the list's folder) or one image file")
    parser.add_argument("--output", required=True, metavar="RESULTS.jsonl",
                        help="results file, appended to; unreadable images go to <stem>.errors.jsonl beside it")
    parser.add_argument("--weights", default=None, metavar="PATH",
                        help="weights file (default: $VGGSERVE_WEIGHTS, then the fetched weights)")
    parser.add_argument("--batch-size", type=positive_int, default=16, metavar="B",
                        help="images per chunk handed to a rank and per device batch (default 16)")
    parser.add_argument("--device", default="auto", metavar="SPEC",
                        help="gpu (GPU number <local rank>), cpu, auto, or one device per local rank: "
                             "gpu:0,gpu:2 (default auto)")
    parser.add_argument("--top-k", type=top_k, default=5, metavar="K", help="predictions per image (default 5)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="classify again the images listed in the errors file (default: skip them)")
    parser.add_argument("--decode-procs", type=_decode_procs, default="auto", metavar="N",
                        help="decode processes per rank, reading and preprocessing images ahead into shared memory: "
                             "auto (the rank's share of its host's cores, less one), or N; 0 decodes on "
                             "--decode-threads threads of the rank instead (default auto)")
    parser.add_argument("--decode-threads", type=_auto_or_positive, default="auto", metavar="T",
                        help="with --decode-procs 0: threads per rank decoding ahead: auto (as many as decode "
                             "processes would be), or T (default auto)")
    parser.add_argument("--decode-timeout", type=_seconds, default=60.0, metavar="S",
                        help="longest decode of one image; a decode process that takes longer is killed and "
                             "replaced, and the image is recorded as an error (default 60)")
    add_decode_arg(parser, device=True)
    add_max_pixels_arg(parser, "are recorded in the errors file")
    add_precision_arg(parser)
    parser.add_argument("--summary", default=None, metavar="FILE.json",
                        help="also write the final summary (per-rank throughput) as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_run)


def _decode_procs(text: str) -> int | str:
    """`auto`, 0 (threads) or a positive number of processes."""
    word = text.strip().lower()
    if word in ("auto", "0"):
        return "auto" if word == "auto" else 0
    return positive_int(text)


def _auto_or_positive(text: str) -> int | str:
    """`auto` or a positive number."""
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _run(args) -> int:
    from ..distributed.job import BatchOptions, run_batch

    options = BatchOptions(
        input=args.input,
        output=args.output,
        weights=args.weights,
        batch_size=args.batch_size,
        device=args.device,
        top_k=args.top_k,
        retry_errors=args.retry_errors,
        decode_threads=args.decode_threads,
        decode_procs=args.decode_procs,
        decode_timeout_s=args.decode_timeout,
        decode=args.decode,
        max_pixels=args.max_pixels,
        precision=args.precision,
        progress=not args.no_progress,
        summary_path=args.summary,
    )
    return run_batch(options)
