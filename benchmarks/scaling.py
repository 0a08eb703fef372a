"""One GPU against all of them, three ways: the batch job, the service, nginx in front of one instance per GPU.

    bash benchmarks/gpu_run.sh python3 benchmarks/scaling.py --gpus 2                  # a 2-GPU machine
    python3 benchmarks/scaling.py --gpus 4 --weights vgg16.safetensors --json scaling.json
    python3 benchmarks/scaling.py --smoke --weights tiny.safetensors                  # CPU, as if 2 devices

For each precision of --precisions (default fp32,fp16), on G = --gpus devices:
- batch: `vggserve batch` with one rank against G ranks (`mpiexec -n G`, --device gpu: rank r on GPU r), on --images
  synthetic 500x375 JPEGs (batch_scaling.py: the job's own summary, so loading and kernel builds are not counted);
- service: `vggserve serve --device gpu` against `--device all` (one process, one device worker per GPU), driven
  at saturation by serve_saturation.py's client processes (4 x batch size requests in flight per device);
- nginx: deploy/nginx-upstream.conf (nginx_front.py) in front of one `vggserve serve --device gpu:0` against G
  instances, `--device gpu:i` each, driven the same way through nginx.
Prints a Markdown table: images/s with one device, with G, and their ratio (G / one); --json FILE writes the table's
rows and every run's own figures. --rounds N measures each row N times, one device and G in turn (one, G; G, one;
...), and gives the medians: the images/s of each, and the ratio of the pairs measured back to back. On a shared or
virtual machine one run's figure moves 10-20% from run to run (BENCHMARKS.md, thirty-first session), more than
the targets' margins; a pair in turn shares the machine's state, and a median of pairs is what compares. Without nginx on the machine the nginx rows are left out, with a note.
--smoke: the same on the CPU with tiny settings (every "GPU" is the CPU device: --device cpu for each rank and
instance, `cpu,cpu` for the service's "all"), so CI runs it end to end; its ratios say nothing of GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import batch_scaling  # noqa: E402
import nginx_front  # noqa: E402
import serve_saturation  # noqa: E402
from in_turn import order as in_turn_order  # noqa: E402

RUNS = ("batch", "service", "nginx")
WHAT = {"batch": "batch job, mpiexec -n 1 vs -n {g}", "service": "service, --device gpu vs --device all",
        "nginx": "nginx + 1 instance vs {g} instances"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=None, help="devices to scale to (default: every GPU of the machine)")
    p.add_argument("--weights", default=None, help="weights file (default: vggserve's lookup, $VGGSERVE_WEIGHTS)")
    p.add_argument("--precisions", default="fp32,fp16", help="comma list (default fp32,fp16)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"which of {', '.join(RUNS)} (default all)")
    p.add_argument("--batch-size", type=int, default=32, help="the job's and the services' batch size (default 32)")
    p.add_argument("--images", type=int, default=4096, help="JPEGs for the batch job (default 4096)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per service run (default 20)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring (default 5)")
    p.add_argument("--http-workers", default=None, help="the services' --http-workers (default: theirs)")
    p.add_argument("--client-procs", type=int, default=None,
                   help="serve_saturation.py's load-generating processes (default: its own, half the cores, 1..8); "
                        "through nginx each request costs the load generator about 4x its CPU direct, so 8 of them "
                        "cap four FP16 instances")
    p.add_argument("--decode", choices=("exact", "fast", "gpu", "auto"), default=None,
                   help="the job's, the services' and the instances' --decode (default: theirs, auto: gpu on a GPU)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each row this many times, one device and all in turn, and report the medians "
                        "(default 1)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, 2 devices, 8 images, batch 2, 5 s runs: checks that everything runs, measures nothing")
    p.add_argument("--workdir", default=None, help="JPEGs, outputs and nginx's files (default: a temp dir)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows and every run's figures")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus = args.gpus or 2
        # long enough that a loaded 2-core machine answers some requests of every run (a CPU batch takes ~1 s)
        args.batch_size, args.images, args.duration, args.warmup = 2, 8, 5.0, 2.0
    return args


def gpu_count() -> int:
    from vggserve.runtime.devices import usable_gpus

    return len(usable_gpus())


def specs(args) -> dict:
    """Device specs of each run, one device and G devices (--smoke: the CPU for every one)."""
    g = args.gpus
    if args.smoke:
        return {"batch": "cpu", "service": ("cpu", ",".join(["cpu"] * g)), "instance": lambda i: "cpu"}
    return {"batch": "gpu", "service": ("gpu", "all"), "instance": lambda i: f"gpu:{i}"}


def batch_run(args, weights: str, workdir: Path, precision: str, ranks: int) -> dict:
    images = workdir / "images"
    batch_scaling.make_images(images, args.images, (500, 375))
    options = argparse.Namespace(mpirun=None, launcher_args="", device=specs(args)["batch"],
                                 batch_size=args.batch_size, weights=weights, decode_procs=None, decode_threads=None,
                                 timeout=3600)
    out = workdir / f"batch-{precision}"
    out.mkdir(parents=True, exist_ok=True)
    extra = ("--precision", precision) + (("--decode", args.decode) if args.decode else ())
    summary = batch_scaling.run_once(options, ranks, images, out, extra)
    # what holds each rank, its waits and its CPU, indented under the run (the summary table is the only one flush left)
    print("\n".join("  " + line for line in batch_scaling.rank_table({ranks: summary}).splitlines()), flush=True)
    return {"images_per_s": summary["images_per_second"], "errors": summary["errors"],
            "ranks": [{k: r.get(k) for k in ("rank", "device", "device_name", "images", "images_per_second",
                                             "host_share", "wait_ms_per_image", "cpu_ms_per_image")}
                      for r in summary["ranks"]]}


def saturate(args, precision: str, devices: int, workdir: Path, name: str, url: str | None = None,
             weights: str | None = None, device: str | None = None) -> dict:
    """serve_saturation.py against `url`, or against a service it starts on `device`: the service's figures."""
    out = workdir / f"{name}.json"
    argv = ["--max-batch-size", str(args.batch_size), "--duration", str(args.duration), "--warmup",
            str(args.warmup), "--skip-engine", "--precision", precision,
            "--concurrency", str(4 * args.batch_size * devices), "--json", str(out)]
    argv += ["--url", url] if url else ["--weights", weights, "--device", device]
    if args.client_procs:
        argv += ["--client-procs", str(args.client_procs)]
    if args.http_workers and not url:
        argv += ["--http-workers", str(args.http_workers)]
    if args.decode and not url:
        argv += ["--decode", args.decode]
    serve_saturation.main(argv)
    result = json.loads(out.read_text())
    service = result["service"]
    return {"client_procs": result["client_procs"],
            **{k: service[k] for k in ("images_per_s", "statuses", "mean_batch", "latency_ms", "cpu_ms_per_image")}}


def service_run(args, weights: str, workdir: Path, precision: str, devices: int) -> dict:
    one, every = specs(args)["service"]
    device = one if devices == 1 else every
    return {"device": device, **saturate(args, precision, devices, workdir, f"service-{precision}-{devices}",
                                         weights=weights, device=device)}


def instance_frontends(instances: int, cpus: int | None = None, decode: str | None = None) -> int:
    """Front ends of each of `instances` services on one host, one device each: what `--http-workers auto` picks on
    its share of the cores (each instance alone would count the whole host, and G of them would oversubscribe it G
    times; bound to its share with `taskset`, an instance picks this itself). `decode`: the instances' --decode
    (None: theirs, auto)."""
    from vggserve.serving.settings import auto_http_workers, host_cores

    share = max(1, (cpus or host_cores()) // instances)
    return auto_http_workers(share, 1, decode or "auto")


def nginx_run(args, weights: str, workdir: Path, precision: str, devices: int) -> dict:
    from vggserve.testing.servers import ServerProcess

    instance = specs(args)["instance"]
    queue = str(max(256, 8 * args.batch_size * devices))
    servers = []
    try:
        for i in range(devices):
            serve = ["--weights", weights, "--device", instance(i), "--max-batch-size", str(args.batch_size),
                     "--max-queue", queue, "--precision", precision, "--log-level", "warning"]
            if args.http_workers or not args.smoke:  # G instances share the host: each its share of the front ends
                serve += ["--http-workers", str(args.http_workers or instance_frontends(devices, decode=args.decode))]
            if args.decode:
                serve += ["--decode", args.decode]
            servers.append(ServerProcess.serve_cli(serve).start())
        for server in servers:
            server.wait_ready(600)
        with nginx_front.nginx_in_front([s.port for s in servers], workdir / f"nginx-{precision}-{devices}") as url:
            result = saturate(args, precision, devices, workdir, f"nginx-{precision}-{devices}", url=url)
        return {"instances": [instance(i) for i in range(devices)], **result}
    finally:
        for server in servers:
            server.stop()


def row(run: str, precision: str, ones: list[dict], everys: list[dict], g: int) -> dict:
    """A table row from its rounds: the median images/s of one device and of G, and the median of the rounds'
    ratios (each round's two runs measured back to back); `one` and `all` are the first round's own figures, and
    `later_rounds` each later round's, as {"one": ..., "all": ...} (none with one round)."""
    from statistics import median

    ratios = [e["images_per_s"] / o["images_per_s"] if o["images_per_s"] else 0.0 for o, e in zip(ones, everys)]
    return {"run": run, "what": WHAT[run].format(g=g), "precision": precision,
            "one_images_per_s": median(o["images_per_s"] for o in ones),
            "all_images_per_s": median(e["images_per_s"] for e in everys), "ratio": median(ratios),
            "rounds": len(ones), "ratios": ratios, "one": ones[0], "all": everys[0],
            "later_rounds": [{"one": o, "all": e} for o, e in zip(ones[1:], everys[1:])]}


def in_turn(rounds: int) -> list[int]:
    """The order of one round's runs, round after round: 1 then G, then G then 1, ... (drift over the call cancels
    out of the medians; in_turn.py's order for two variants): [0, 1, 1, 0, 0, 1, ...] with 0 for one device and 1
    for G."""
    return [k for turn in in_turn_order(2, rounds) for k in turn]


def table(rows: list[dict], g: int) -> str:
    rounds = max((r.get("rounds", 1) for r in rows), default=1)
    if rounds == 1:
        lines = [f"| run | precision | 1 device, images/s | {g} devices, images/s | {g} / 1 |",
                 "|---|---|---:|---:|---:|"]
    else:
        lines = [f"| run | precision | 1 device, images/s (median) | {g} devices, images/s (median) | {g} / 1 (median "
                 f"of {rounds} rounds in turn) | each round's {g} / 1 |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        line = (f"| {r['what']} | {r['precision']} | {r['one_images_per_s']:.1f} | {r['all_images_per_s']:.1f} | "
                f"{r['ratio']:.2f}x |")
        if rounds > 1:
            line += " " + ", ".join(f"{x:.2f}x" for x in r.get("ratios", [r["ratio"]])) + " |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    from vggserve.weights import find_weights

    if args.gpus is None:
        args.gpus = gpu_count()
    if args.rounds < 1:
        print(f"scaling: --rounds is 1 or more, not {args.rounds}", file=sys.stderr)
        return 2
    if args.gpus < 2:
        print(f"scaling: {args.gpus} GPU{'s' if args.gpus != 1 else ''} usable here; pass --gpus G (2 or more) on a "
              "machine with G GPUs, or --smoke to try it on the CPU", file=sys.stderr)
        return 2
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        print(f"scaling: unknown runs {unknown}; choose from {', '.join(RUNS)}", file=sys.stderr)
        return 2
    notes = []
    if "nginx" in runs and nginx_front.nginx_binary() is None:
        runs.remove("nginx")
        notes.append("nginx is not installed (apt-get install nginx-light): the nginx rows are left out")
    weights = str(find_weights(args.weights))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-scaling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    measure = {"batch": batch_run, "service": service_run, "nginx": nginx_run}
    rows = []
    for precision in [p.strip() for p in args.precisions.split(",") if p.strip()]:
        for run in runs:
            runs_of: tuple[list, list] = ([], [])  # one device's rounds, G devices' rounds
            for k in in_turn(args.rounds):
                runs_of[k].append(measure[run](args, weights, workdir, precision, args.gpus if k else 1))
            rows.append(row(run, precision, *runs_of, args.gpus))
            each = "; ".join(f"{o['images_per_s']:.1f} -> {e['images_per_s']:.1f}" for o, e in zip(*runs_of))
            print(f"scaling: {rows[-1]['what']}, {precision}: {each} images/s", file=sys.stderr, flush=True)
    print(f"\nScaling over {args.gpus} {'CPU stand-ins (--smoke)' if args.smoke else 'GPUs'}: batch size "
          f"{args.batch_size}, {args.images} JPEGs for the batch job, {args.duration:g} s per service run, "
          f"--decode {args.decode or 'auto (theirs)'}"
          f"{f', {args.rounds} rounds in turn' if args.rounds > 1 else ''}\n")
    print(table(rows, args.gpus))
    for note in notes:
        print(f"\n{note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"gpus": args.gpus, "smoke": args.smoke, "batch_size": args.batch_size,
                                               "images": args.images, "duration_s": args.duration,
                                               "rounds": args.rounds, "notes": notes,
                                               "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
