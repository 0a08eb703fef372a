"""The service's host side alone: images/s and CPU milliseconds per image of each of its processes, with a device
that takes no time.

    python benchmarks/serve_host_floor.py --http-workers 2 --duration 10
    python benchmarks/serve_host_floor.py --http-workers 8 --client-procs 4 --duration 20     # a 16-core host
    python benchmarks/serve_host_floor.py --http-workers 2 --duration 10 --size 64x48         # beside the decode
    python benchmarks/serve_host_floor.py --http-workers 2 --duration 10 --size 64x48 --route v2   # v2 infer
    python benchmarks/serve_host_floor.py --http-workers 2 --devices 4 --size 64x48          # four engine processes

`vggserve serve` runs with --http-workers front-end processes on an instant stand-in engine
(vggserve.testing.models.InstantModel: it takes decoded images as the GPU engine does, copies them into a staging
array and answers at once), driven at saturation by serve_saturation.py's raw-HTTP client processes with one
500x375 JPEG (POST /classify). Printed: images/s, and the CPU ms per image of the engine process, of the front ends
together, and of the load generator, measured over the window from /proc (serve_saturation.drive). On a machine of
few cores every process competes for them, so images/s is low; the CPU per image of each process is the figure
that carries over to a larger host: cores needed = images/s x CPU ms per image / 1000.

    python benchmarks/serve_host_floor.py --weights W --device gpu --decode gpu --http-workers 8 --duration 20

With --weights the real engine serves instead (on --device; images/s is then the device's). With --decode gpu its
front ends send the JPEGs compressed and the engine decodes them on its device, so the front ends' CPU per image is
that of the header parse, not of the decode. Compare with --decode exact on the same machine; the line "decoded:"
says where the images were decoded (vggserve_decoded_images_total).

    python benchmarks/serve_host_floor.py --http-workers 2 --duration 10 --decode gpu      # no GPU: a stand-in

Without --weights, --decode gpu serves the instant stand-in as an engine that decodes on its device: its worker tells
the front ends so, and 'decodes' every JPEG they send into one blank crop, at once. The front ends then do what they
do in front of a GPU under --decode gpu or auto (the default there): parse each JPEG's header (`encoded_here`) and
send it compressed. Their CPU per image is the figure; the engine process's is not the real decoder's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import serve_saturation  # noqa: E402

SERVER = """
import sys
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
from vggserve.testing.models import InstantModels

settings = Settings(port=PORT, devices=("cpu",) * DEVICES, http_workers=FRONTS, max_batch_size=BATCH, max_wait_ms=WAIT,
                    max_queue=QUEUE, decode=DECODE, preprocess_threads=THREADS,
                    engine_processes="per-device" if DEVICES > 1 else "auto")
if DECODE == "gpu":  # the stand-in decoder (the module's docstring)
    from vggserve.testing.decoding import stand_in_device_decoder

    stand_in_device_decoder()
sys.exit(run_server(settings, InstantModels(BATCH), log_level="warning"))
"""

ENGINE = """
import sys
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings

settings = Settings(port=PORT, devices=(DEVICE,), weights=WEIGHTS, http_workers=FRONTS, max_batch_size=BATCH,
                    max_wait_ms=WAIT, max_queue=QUEUE, decode=DECODE, preprocess_threads=THREADS)
sys.exit(run_server(settings, log_level="warning"))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http-workers", type=int, default=2, help="front-end processes (default 2)")
    p.add_argument("--devices", type=int, default=1,
                   help="instant stand-in devices, each in an engine process of its own (default 1)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    p.add_argument("--client-procs", type=int, default=1, help="load-generating processes (default 1)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--preprocess-threads", type=int, default=None,
                   help="decoding threads per front end (default: the server's)")
    p.add_argument("--decode", choices=("exact", "fast", "gpu", "auto"), default="exact",
                   help="the server's --decode (auto needs --weights; gpu without --weights: a stand-in decoder that "
                        "takes no time, for the front ends' CPU in front of a GPU)")
    p.add_argument("--weights", default=None, help="serve the real engine with these weights on --device instead of "
                   "the instant stand-in")
    p.add_argument("--device", default="gpu", help="the engine's device with --weights (default gpu)")
    p.add_argument("--image", default=None, help="JPEG to send (default: serve_saturation's synthetic one)")
    p.add_argument("--size", default="500x375", metavar="WxH",
                   help="the synthetic JPEG's size (default 500x375; 64x48 leaves the decode out of the picture)")
    p.add_argument("--nginx", action="store_true",
                   help="drive the service through nginx (deploy/nginx-upstream.conf, as benchmarks/nginx_front.py runs "
                        "it) instead of directly: what nginx adds to the load generator's CPU per image")
    p.add_argument("--route", choices=("classify", "v2"), default="classify",
                   help="one image a request: POST /classify as image/jpeg (default), or POST /v2/models/vgg16/infer "
                        "with the image as binary tensor data")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.decode == "auto" and not args.weights:
        p.error("--decode auto needs --weights (off a GPU it is exact); --decode gpu without --weights serves a "
                "stand-in decoder")
    if args.decode == "gpu" and not args.weights and args.devices > 1:
        p.error("the stand-in decoder (--decode gpu without --weights) serves one device: its engine is this process")
    from vggserve.testing.servers import ServerProcess

    queue = max(256, 2 * args.concurrency) * args.http_workers
    code = ENGINE if args.weights else SERVER
    for name, value in (("DEVICES", args.devices), ("FRONTS", args.http_workers), ("BATCH", args.max_batch_size), ("WAIT", args.max_wait_ms),
                        ("QUEUE", queue), ("DECODE", repr(args.decode)), ("DEVICE", repr(args.device)),
                        ("WEIGHTS", repr(str(Path(args.weights).resolve()) if args.weights else None)),
                        ("THREADS", args.preprocess_threads)):
        code = code.replace(name, str(value))
    width, height = (int(n) for n in args.size.lower().split("x"))
    body = Path(args.image).read_bytes() if args.image else serve_saturation.synthetic_jpeg(width, height)
    with ServerProcess.python_code(code) as server, contextlib.ExitStack() as stack:
        server.wait_ready(600 if args.weights else 120)
        url = server.url
        if args.nginx:
            import tempfile

            import nginx_front

            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="serve-host-floor-nginx-")))
            url = stack.enter_context(nginx_front.nginx_in_front([server.port], workdir))
        result = serve_saturation.drive(url, [body], args.concurrency, args.client_procs, args.warmup,
                                        args.duration, client="raw" if args.route == "classify" else "v2",
                                        server_pid=server.proc.pid)
        result["decoded"] = decoded_counts(server.url)
        result["through"] = "nginx" if args.nginx else "direct"
        result["route"] = args.route
    cpu = result["cpu_ms_per_image"]
    fronts = cpu.get("other_server_processes", 0.0)
    total = fronts + cpu.get("engine_process", 0.0) + cpu.get("load_generator", 0.0)
    engine = f"the engine on {args.device}" if args.weights else "an instant device"
    print(f"serve host floor: {result['images_per_s']:.0f} images/s with {engine}"
          f"{' through nginx' if args.nginx else ''}, {'v2 infer' if args.route == 'v2' else 'POST /classify'}, "
          f"--decode {args.decode}, "
          f"{args.http_workers} "
          f"front ends, batch {args.max_batch_size} (mean {result['mean_batch']:.1f}), {args.concurrency} in "
          f"flight, statuses {result['statuses']}")
    print(f"CPU ms per image: front ends {fronts:.2f} (decode {cpu.get('decode_wall', 0.0):.2f} wall in their "
          f"threads), engine process {cpu.get('engine_process', 0.0):.2f}, load generator "
          f"{cpu.get('load_generator', 0.0):.2f}; all {total:.2f}: 8,000 images/s would take {8 * total:.1f} cores")
    print("engine process's busiest threads, CPU ms per image: " + ", ".join(
        f"{name} {ms:.2f}" for name, ms in result["engine_threads_cpu_ms_per_image"]))
    print("front ends' threads, CPU ms per image: " + ", ".join(
        f"{name} {ms:.3f}" for name, ms in result["frontend_threads_cpu_ms_per_image"]))
    if result["decoded"]:
        print("decoded: " + ", ".join(f"{where} {n:.0f}" for where, n in sorted(result["decoded"].items())))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def decoded_counts(url: str) -> dict:
    """{"path/reason": images} of the server's vggserve_decoded_images_total (empty under exact and fast)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {f"{s.labels['path']}/{s.labels['reason']}": s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "vggserve_decoded_images_total"}


if __name__ == "__main__":
    sys.exit(main())
