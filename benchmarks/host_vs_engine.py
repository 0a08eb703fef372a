"""Does the host keep up with the GPU? The batch job and the service next to the engine, in one call, at one batch
size and precision.

    python benchmarks/host_vs_engine.py --weights vgg16.safetensors --device gpu --batch-size 32 --images 8192
    python benchmarks/host_vs_engine.py --weights tiny.safetensors --device cpu --batch-size 4 --images 16 \\
        --duration 4 --warmup 1 --engine-seconds 1                                       # smoke test on the CPU

1. engine: `VGG16.submit` streaming uint8 crops, two batches in flight, at --batch-size (and --precision where the
   model takes it): the rate the host has to feed (serve_saturation.engine_images_per_second); and streaming
   500x375 images resized on the device, the batch job's input (its larger upload and the resize included).
2. batch: `vggserve batch` with one rank over --images synthetic 500x375 JPEGs (batch_scaling.py: written once
   into --workdir), decode processes as the job chooses them (--decode-procs to override); images/s of the
   classification phase, the job's CPU ms per image by stage and the wall ms per image its rank waited for the
   device's results and for decodes, from its summary (a device wait near 0: the host side is the limit); with
   --batch-decode gpu, its device-decode groups too: decodes, mean chunks per decode, and how many groups were due
   by each rule (full, end, starve, timeout; decoding.device.chunks), printed under the table.
3. serve: `vggserve serve` at saturation (serve_saturation.py: its own client processes on the same host): one
   500x375 JPEG; then the phone-photo mix (1 in 8 at 12 MP, 1 in 8 at 2 MP) with --decode exact and fast; on
   request (--runs) both with --decode gpu or auto (serve-gpu, photo-gpu, serve-auto, photo-auto: the engine
   decodes JPEGs on its device; under auto a front end with a decoding thread to spare decodes them itself; with
   --decode-group N, up to N waiting batches per device decode; --concurrency C requests in flight).
Prints one table: images/s, the engine's streamed images/s measured in this call, their ratio (targets: 0.9 for the
batch job and the service on 500x375 JPEGs; the photo mix: exact twice the 224 images/s of the issue's H100 run,
fast half the engine's rate), and where the host CPU goes. --json FILE writes everything.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import batch_scaling  # noqa: E402
import serve_saturation  # noqa: E402

RUNS = ("batch", "serve", "photo-exact", "photo-fast", "serve-gpu", "photo-gpu", "serve-auto", "photo-auto")
DEFAULT_RUNS = RUNS[:4]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default=None, help="weights file (default: vggserve's lookup)")
    p.add_argument("--device", default="gpu", help="one device (default gpu)")
    p.add_argument("--batch-size", type=int, default=32, help="the engine's, the batch job's and the server's")
    p.add_argument("--precision", default=None, help="fp32, fp16...: passed where the model and CLI take it")
    p.add_argument("--images", type=int, default=8192, help="JPEGs for the batch job (default 8192)")
    p.add_argument("--decode-procs", default=None, help="the batch job's --decode-procs (default: auto)")
    p.add_argument("--batch-decode", default=None, help="the batch job's --decode (exact, fast, gpu, auto; default: "
                   "the job's)")
    p.add_argument("--http-workers", default=None, help="the server's --http-workers (default: the server's)")
    p.add_argument("--decode-group", type=int, default=None, metavar="N",
                   help="the server's --decode-group, for the serve-gpu, photo-gpu, serve-auto and photo-auto runs "
                        "(batches per device decode at most; default: the server's, 4)")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="requests the service runs keep in flight (default: serve_saturation's, 4 x batch size)")
    p.add_argument("--duration", type=float, default=25.0, help="measured seconds per service run (default 25)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring (default 5)")
    p.add_argument("--engine-seconds", type=float, default=8.0, help="seconds timing the engine (default 8)")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"which of {', '.join(RUNS)} (default "
                   f"{', '.join(DEFAULT_RUNS)}; serve-gpu, photo-gpu, serve-auto, photo-auto: the service with "
                   "--decode gpu or auto)")
    p.add_argument("--workdir", default=None, help="where the JPEGs and outputs go (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def engine(args, weights: str) -> dict:
    one_at_a_time, name, streamed = serve_saturation.engine_images_per_second(
        weights, args.device, args.batch_size, args.engine_seconds, args.precision)
    return {"device_name": name, "images_per_s": one_at_a_time, "streamed_images_per_s": streamed,
            "streamed_raw_images_per_s": raw_images_streamed(args, weights)}


def raw_images_streamed(args, weights: str) -> float:
    """images/s of 500x375 images (the batch job's input) streamed through `submit`, two batches in flight, resized
    on the device: the most the batch job's device side gives (the crops' rate leaves out the larger upload and
    the resize)."""
    import numpy as np

    from vggserve.model.vgg16 import VGG16
    from vggserve.modelinput import ModelInput

    rng = np.random.default_rng(0)
    images = [ModelInput.image(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)) for _ in range(args.batch_size)]
    with VGG16.load(weights, device=args.device, max_batch_size=args.batch_size,
                    **serve_saturation.precision_options(args.precision)) as model:
        model.submit(images, "probabilities").result()
        done, started, last = 0, time.perf_counter(), None
        while time.perf_counter() - started < args.engine_seconds / 2 or done == 0:
            last = model.submit(images, "probabilities")
            done += args.batch_size
        last.result()
        return done / (time.perf_counter() - started)


def batch(args, weights: str, workdir: Path) -> dict:
    images = workdir / "images"
    batch_scaling.make_images(images, args.images, (500, 375))
    options = argparse.Namespace(mpirun=None, launcher_args="", device=args.device, batch_size=args.batch_size,
                                 weights=weights, decode_procs=args.decode_procs, decode_threads=None, timeout=3600)
    extra = ("--precision", args.precision) if args.precision and serve_saturation.cli_takes("batch", "--precision") \
        else ()
    if args.batch_decode:
        extra += ("--decode", args.batch_decode)
    summary = batch_scaling.run_once(options, 1, images, workdir, extra)
    rank = summary["ranks"][0]
    return {"images_per_s": summary["images_per_second"], "cpu_ms_per_image": rank.get("cpu_ms_per_image", {}),
            "wait_ms_per_image": rank.get("wait_ms_per_image", {}),
            "decode_processes": rank.get("decode_processes"), "errors": summary["errors"],
            "decode_groups": rank.get("decode_groups", {})}


def serve(args, weights: str, workdir: Path, mix: str, decode: str) -> dict:
    out = workdir / f"serve-{mix}-{decode}.json"
    argv = ["--weights", weights, "--device", args.device, "--max-batch-size", str(args.batch_size),
            "--duration", str(args.duration), "--warmup", str(args.warmup), "--skip-engine", "--image-mix", mix,
            "--decode", decode, "--json", str(out)]
    if args.http_workers:
        argv += ["--http-workers", str(args.http_workers)]
    if args.decode_group is not None and decode in ("gpu", "auto"):
        argv += ["--decode-group", str(args.decode_group)]
    if args.concurrency is not None:
        argv += ["--concurrency", str(args.concurrency)]
    if args.precision:
        argv += ["--precision", args.precision]
    serve_saturation.main(argv)
    result = json.loads(out.read_text())
    service = result["service"]
    return {"images_per_s": service["images_per_s"], "cpu_ms_per_image": service["cpu_ms_per_image"],
            "mean_batch": service["mean_batch"], "mean_decode_group": service.get("mean_decode_group"),
            "decode_group": result.get("decode_group"), "concurrency": result["concurrency"],
            "latency_ms": service["latency_ms"], "statuses": service["statuses"]}


def ms_text(cpu: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in cpu.items())


def main(argv=None) -> int:
    args = parse_args(argv)
    from vggserve.weights import find_weights

    weights = str(find_weights(args.weights))
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = set(runs) - set(RUNS)
    if unknown:
        print(f"host_vs_engine: unknown runs {sorted(unknown)}; choose from {', '.join(RUNS)}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-host-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = {"engine": engine(args, weights), "decode_group": args.decode_group, "concurrency": args.concurrency}
    streamed = results["engine"]["streamed_images_per_s"]
    print(f"engine: {streamed:.1f} images/s streamed at batch {args.batch_size} on "
          f"{results['engine']['device_name']} ({results['engine']['streamed_raw_images_per_s']:.1f} streaming "
          f"500x375 images resized on the device, the batch job's input)", flush=True)
    for run in runs:
        if run == "batch":
            results[run] = batch(args, weights, workdir)
        else:
            mix = "single" if run.startswith("serve") else "photo"
            decode = run.split("-")[1] if "-" in run else "exact"
            results[run] = serve(args, weights, workdir, mix, decode)
        results[run]["ratio_to_streamed"] = results[run]["images_per_s"] / streamed if streamed else 0.0
        print(f"{run}: {results[run]['images_per_s']:.1f} images/s", flush=True)
    serving = (f"; service: --decode-group {args.decode_group or 'default'}, "
               f"{args.concurrency or 'default'} requests in flight")
    print(f"\nHost against engine: batch {args.batch_size}, precision {args.precision or 'default'}{serving}, "
          f"{results['engine']['device_name']}; engine streamed {streamed:.1f} images/s in this call "
          f"({results['engine']['streamed_raw_images_per_s']:.1f} on 500x375 images resized on the device)\n")
    print("| run | images/s | engine streamed | ratio | mean decode group | CPU ms per image | "
          "rank waited, wall ms per image |")
    print("|---|---:|---:|---:|---:|---|---|")
    for run in runs:
        r = results[run]
        group = r.get("mean_decode_group")
        print(f"| {run} | {r['images_per_s']:.1f} | {streamed:.1f} | {r['ratio_to_streamed']:.3f} | "
              f"{'-' if group is None else f'{group:.2f}'} | {ms_text(r['cpu_ms_per_image'])} | "
              f"{ms_text(r.get('wait_ms_per_image', {}))} |")
    groups = results.get("batch", {}).get("decode_groups")
    if groups and groups.get("decodes"):
        from vggserve.distributed.summary import format_groups  # the job's own summary line

        print(f"\nbatch decode groups: {format_groups(groups)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
