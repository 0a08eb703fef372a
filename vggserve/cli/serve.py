"""`vggserve serve`: the HTTP service (FastAPI under uvicorn), one worker thread per device, or under mpirun
with each batch sharded over every rank's device.

    vggserve serve --weights W [--host 127.0.0.1] [--port 8000] [--device gpu:0,gpu:1] [--max-batch-size 16]
    vggserve serve --weights W --http-workers 4   # 4 HTTP front-end processes feed this process's device workers
    vggserve serve --weights W --device all --http-workers 8   # and one engine process per GPU (--engine-processes)
    mpirun -n 4 vggserve serve --weights W --device gpu      # rank 0 serves HTTP; batches go to all 4 GPUs

See docs/serving.md for the API, every setting and the deploy files.
"""

import dataclasses
import os
import signal

from ..distributed.mpi import several_ranks
from ..wording import count
from .common import add_decode_arg, add_precision_arg



def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="run the HTTP classification service",
        description="Serve POST /classify with dynamic batching over one or more devices. Binds to 127.0.0.1 "
                    "unless --host says otherwise. Under mpirun/mpiexec rank 0 serves HTTP and every batch is "
                    "sharded across all ranks. SIGTERM drains: readiness turns 503, in-flight requests finish, "
                    "then it exits 0.")
    p.add_argument("--weights", default=None,
                   help="weights file (default: $VGGSERVE_WEIGHTS, then the fetched weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--device", default=None, metavar="SPEC",
                   help="device spec, or a comma list for one worker per device, e.g. gpu:0,gpu:1; `all` = one "
                        "worker per GPU (default auto = the first GPU, else the CPU; "
                        "under mpirun: gpu, meaning GPU number <local rank>)")
    p.add_argument("--max-batch-size", type=int, default=16, help="images per device batch (default 16)")
    p.add_argument("--max-wait-ms", type=float, default=2.0,
                   help="longest wait for a batch to fill after its first image arrives, while a device is idle "
                        "(default 2; 0: a batch starts with what is waiting as soon as a device is free; under load "
                        "batches fill anyway while the devices compute)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="images admitted and not yet on a device, the whole server's (with --http-workers, every "
                        "front end's together); beyond it requests get 429 (default 256)")
    p.add_argument("--request-timeout-ms", type=int, default=30_000,
                   help="default deadline per request, queue time included; header X-Request-Timeout-Ms "
                        "overrides it (default 30000)")
    p.add_argument("--max-body-bytes", type=int, default=20 * 1024 * 1024,
                   help="largest request body; larger ones get 413 before they are read (default 20 MiB)")
    p.add_argument("--max-pixels", type=int, default=40_000_000,
                   help="largest image in pixels, from its header; larger ones get 413 (default 40000000)")
    p.add_argument("--max-files", type=int, default=16, help="files per POST /classify/batch (default 16)")
    p.add_argument("--preprocess-threads", type=int, default=None,
                   help="threads decoding and preprocessing images, in each process (default: one per core, 2..16; "
                        "with --http-workers N, twice each front end's share of the cores, at least 2)")
    p.add_argument("--preprocess-procs", type=int, default=None, metavar="N",
                   help="worker processes decoding images, past the GIL (default 0: in the threads only)")
    p.add_argument("--http-workers", default=None, metavar="N",
                   help="HTTP front-end processes (1..64, or `auto` = half the cores, less one per device past the "
                        "first: cores // 2 - (devices - 1), at least 1 and at most 64, and with --decode gpu or "
                        "auto at most 8 + 4 (devices - 1), where cores are those "
                        "of the CPU affinity within the cgroup's CPU quota): each parses requests and decodes "
                        "images in its own process and sends "
                        "the crops to this process, which batches them on the devices. Use it when the front end, "
                        "not the device, is the limit (default: `auto` when every device is a GPU, else 1 = "
                        "everything in one process)")
    p.add_argument("--engine-processes", default="auto", metavar="{auto,1,per-device}",
                   help="with several devices and HTTP front ends: `per-device` runs one engine process per device "
                        "(its own queue and GIL; each front end sends each image to the ready engine with the "
                        "fewest of its images outstanding, and an engine whose device is lost stops getting work), "
                        "`1` one engine process for every device (one queue shared by the devices); `auto` is "
                        "per-device when there are several devices and several front ends (default auto)")
    p.add_argument("--resize-on", choices=("device", "cpu"), default="device",
                   help="with HTTP front ends: where uploads are resized and centre-cropped. `device`: the front "
                        "ends send decoded images through shared memory and the engine's kernels resize them, bit "
                        "for bit as on the CPU, at a fraction of the front ends' CPU; `cpu`: in the front ends "
                        "(default device)")
    add_decode_arg(p, device=True)
    p.add_argument("--decode-group", default=None, metavar="N",
                   help="with --decode gpu or auto: when the engine takes a batch to decode on its device and more "
                        "full batches are already waiting, it decodes up to N batches' JPEGs in one launch sequence, "
                        "far cheaper for the device than N decodes; 1..16, 1 = one batch per decode (default 4)")
    p.add_argument("--lanes", type=int, default=1, metavar="N",
                   help="forward passes each device's engine may run at once, each on a queue of its own with its own "
                        "activation buffers (the weights are shared): 2 raise a GPU's images/s at small batches, "
                        "where one batch leaves most of its compute units idle; 1..4 (default 1)")
    add_precision_arg(p)
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take after SIGTERM before exit (default 30)")
    p.add_argument("--read-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a request's headers may take to arrive in full, and its body may pause; a slower "
                        "client gets 408 and its connection is closed (default 60, as nginx's "
                        "client_header_timeout and client_body_timeout)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on every endpoint but /health/* (default: "
                        "$VGGSERVE_API_KEY; none if unset). Prefer the variable: arguments show in `ps`")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN (e.g. https://app.example.com, or *) call the API; repeat for "
                        "several (default: none, CORS off)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up batch before reporting ready")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    p.set_defaults(func=_run)


def _settings(args, **overrides):
    from ..serving.settings import (API_KEY_ENV, Settings, default_preprocess_procs, default_http_workers,
                                    parse_decode_group, parse_devices, parse_http_workers)

    values = dict(
        weights=str(args.weights) if args.weights else None, host=args.host, port=args.port,
        devices=parse_devices(args.device), max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue, request_timeout_ms=args.request_timeout_ms, max_body_bytes=args.max_body_bytes,
        max_pixels=args.max_pixels, max_files=args.max_files,
        preprocess_threads=args.preprocess_threads,  # None: the default for the number of processes
        preprocess_procs=default_preprocess_procs() if args.preprocess_procs is None else args.preprocess_procs,
        drain_timeout_s=args.drain_timeout, read_timeout_s=args.read_timeout,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        warmup=not args.no_warmup, engine_processes=args.engine_processes, resize_on=args.resize_on,
        decode=args.decode, decode_group=parse_decode_group(args.decode_group), precision=args.precision,
        lanes=args.lanes,
        cors_origins=tuple(args.cors_origin))
    values.update(overrides)
    if args.http_workers is not None:
        values["http_workers"] = parse_http_workers(args.http_workers, values["devices"], values["decode"])
    elif not values.get("mpi") and not values["preprocess_procs"]:
        values["http_workers"] = default_http_workers(values["devices"], decode=values["decode"])
    return Settings(**values)



def _run(args) -> int:
    from ..weights import find_weights

    args.weights = find_weights(args.weights)  # fails now, with how to get weights, not in a worker later
    if args.precision in ("fp8", "int8"):  # and the 8-bit scales: refused now in one line, not in every worker
        from ..quant.calibration import load_for
        from ..weights.loaded import sha256_file

        load_for(args.weights, sha256_file(args.weights), args.precision)
    if several_ranks():
        return _run_mpi(args)
    from ..serving.server import run_server

    settings = _settings(args)
    fronts = f" and {settings.http_workers} HTTP front-end processes" if settings.http_workers > 1 else ""
    if settings.engine_count > 1:
        fronts += ", one engine process per device"
    banner = f"with {count(len(settings.devices), 'device worker')} ({', '.join(settings.devices)}){fronts}"
    return run_server(settings, log_level=args.log_level, access_log=args.access_log, banner=banner)


def _run_mpi(args) -> int:
    """Rank 0: HTTP with one worker whose model is the ShardedModel; other ranks: compute their pieces."""
    from ..distributed.mpi import world
    from ..distributed.sharding import run_sharded
    from ..serving.server import run_server

    comm = world()
    device = args.device or "gpu"
    if comm.Get_rank() != 0:
        # rank 0 drains and then releases this rank; a launcher's SIGTERM/SIGINT must not cut it short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # validate the flags on every rank before any collective, so a bad value fails everywhere alike
    settings = _settings(args, devices=("mpi",), mpi=True)

    def serve(model) -> int:
        front = dataclasses.replace(settings, max_batch_size=int(model.max_batch_size),
                                    max_queue=max(settings.max_queue, int(model.max_batch_size)))
        banner = f"with batches of up to {front.max_batch_size} sharded over {model.device_name}"
        return run_server(front, model_factory=lambda _device: model, log_level=args.log_level,
                          access_log=args.access_log, banner=banner)

    return run_sharded(serve, str(args.weights), device=device, max_batch_size=settings.max_batch_size, comm=comm,
                       precision=settings.precision)
