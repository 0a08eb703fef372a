"""`vggserve loadtest`: offer load to a running service, level by level, and report throughput and latency."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import VggserveError

DEFAULT_CONCURRENCY = "1,4,16,64"
API_KEY_ENV = "VGGSERVE_API_KEY"  # the variable `vggserve serve` reads too


def register(subparsers) -> None:
    """Add the `loadtest` subcommand."""
    p = subparsers.add_parser(
        "loadtest", help="measure throughput and latency of a running service",
        description="Post real images to /classify at a series of load levels (closed loop: concurrent "
                    "clients; open loop: a fixed request rate) and write per-request CSVs, a summary "
                    "(CSV + JSON) and PNG plots. Ctrl-C stops early and still writes what was measured.")
    p.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--images", required=True, type=Path, help="folder of image files to post (cycled)")
    p.add_argument("--mode", choices=("closed", "open"),
                   help="closed: N clients back to back; open: a fixed schedule (default: open if --rate)")
    p.add_argument("--concurrency", help=f"closed loop: client counts, comma-separated (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--rate", help="open loop: offered requests/s, comma-separated, e.g. 10,50,100")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per level (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="uncounted seconds before each level (default 2)")
    p.add_argument("--output", type=Path, default=Path("loadtest-out"), help="results folder (default loadtest-out)")
    p.add_argument("--max-requests", type=int, default=100_000,
                   help="cap on measured requests per level, and on warm-up requests (default 100000)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds (default 30)")
    p.add_argument("--max-inflight", type=int, default=512,
                   help="open loop: requests in flight at most (default 512)")
    p.add_argument("--overflow", choices=("wait", "drop"), default="wait",
                   help="open loop, a request due while --max-inflight are out: wait for a slot and go out "
                        "late (default), or drop it (not sent, counted)")
    p.add_argument("--lag-threshold-ms", type=float, default=10.0,
                   help="open loop: a request sent later than this after its due time is counted late (default 10)")
    p.add_argument("--protocol", choices=("classify", "v2"), default="classify",
                   help="classify: POST /classify (default); v2: the Open Inference Protocol's "
                        "/v2/models/vgg16/infer, the image as binary tensor data, top 5 by the classification "
                        "extension")
    p.add_argument("--multipart", action="store_true", help="post as multipart field 'file' instead of a raw body")
    p.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")
    p.add_argument("--wait-ready", type=float, default=0.0,
                   help="wait up to this many seconds for /health/ready to answer 200 (default 0: check once)")
    p.add_argument("--api-key", default=None,
                   help=f"send `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; prefer the variable: "
                        "arguments show in `ps`)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    """Check the flags and turn them into a LoadTestConfig (one-line VggserveError on bad input)."""
    from ..loadtest.config import HARD_REQUEST_CAP, LoadTestConfig, check_positive, normalise_url, parse_levels

    mode = args.mode or ("open" if args.rate else "closed")
    if mode == "closed" and args.rate:
        raise VggserveError("--rate is for --mode open; closed loop takes --concurrency")
    if mode == "open" and args.concurrency:
        raise VggserveError("--concurrency is for --mode closed; open loop takes --rate")
    if mode == "open" and not args.rate:
        raise VggserveError("--mode open needs --rate, e.g. --rate 10,50,100")
    levels = parse_levels(args.rate if mode == "open" else (args.concurrency or DEFAULT_CONCURRENCY), mode)
    if args.multipart and args.protocol == "v2":
        raise VggserveError("--multipart is for --protocol classify; v2 sends binary tensor data")
    check_positive("--duration", args.duration)
    check_positive("--warmup", args.warmup, allow_zero=True)
    check_positive("--timeout", args.timeout)
    check_positive("--lag-threshold-ms", args.lag_threshold_ms, allow_zero=True)
    check_positive("--wait-ready", args.wait_ready, allow_zero=True)
    for name, value in (("--max-requests", args.max_requests), ("--max-inflight", args.max_inflight)):
        if not 0 < value <= HARD_REQUEST_CAP:
            raise VggserveError(f"bad {name} {value}: must be between 1 and {HARD_REQUEST_CAP}")
    return LoadTestConfig(
        url=normalise_url(args.url), images=args.images, mode=mode, levels=levels, duration_s=args.duration,
        warmup_s=args.warmup, output=args.output, max_requests=args.max_requests, timeout_s=args.timeout,
        max_inflight=args.max_inflight, overflow=args.overflow, lag_threshold_ms=args.lag_threshold_ms,
        multipart=args.multipart, protocol=args.protocol, scrape_metrics=not args.no_metrics,
        progress=not args.quiet,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
    )


def run(args: argparse.Namespace) -> int:
    """Run the levels, print the table, name the output folder; 130 if Ctrl-C cut the run short."""
    from ..loadtest.images import ImageSet
    from ..loadtest.report import format_table
    from ..loadtest.runner import run_loadtest

    config = build_config(args)
    images = ImageSet.from_folder(config.images)
    print(f"loadtest {config.mode} loop against {config.url}: levels "
          f"{', '.join(config.level_label(v) for v in config.levels)}, {config.warmup_s:g} s warm-up + "
          f"{config.duration_s:g} s each, {images.describe()}", file=sys.stderr)
    result = run_loadtest(config, wait_ready_s=args.wait_ready, images=images)
    if result.rows:
        print(format_table(result.rows))
    state = "interrupted; partial results" if result.interrupted else "results"
    print(f"{state} in {config.output}/ (summary.csv, summary.json, requests_*.csv, *.png)", file=sys.stderr)
    return 130 if result.interrupted else 0
