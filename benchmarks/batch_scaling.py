"""Scaling of `vggserve batch` over 1, 2, 4 ranks (one GPU each): images/s and parallel efficiency.

    python benchmarks/batch_scaling.py --weights vgg16.safetensors                  # 4-GPU machine
    python benchmarks/batch_scaling.py --weights tiny.safetensors --device cpu --ranks 1,2 --images 16  # smoke
    python benchmarks/batch_scaling.py --ranks 1,2 --precision fp16 --decode gpu   # JPEGs decoded on each GPU

Writes N synthetic JPEGs (once, into --workdir), then for each rank count runs
`mpirun -n R python -m vggserve batch --device gpu ...` on them into a fresh output and reads the job's own
summary (`--summary`): throughput counts the classification phase only (weights loading and kernel builds
are the "setup" column); --precision and --decode go to every run as given. Efficiency is images/s at R ranks /
(R x images/s at 1 rank). With Open MPI the launcher gets `--bind-to none`, and `--allow-run-as-root
--oversubscribe` when run as root.
Prints a Markdown table (for BENCHMARKS.md) and, with --json FILE, the raw summaries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default=None, help="weights file (default: vggserve's lookup)")
    parser.add_argument("--images", type=int, default=512, help="synthetic images to classify (default 512)")
    parser.add_argument("--ranks", default="1,2,4", help="rank counts to run, comma separated (default 1,2,4)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="gpu", help="--device for vggserve batch (default gpu)")
    parser.add_argument("--decode-procs", default=None, help="decode processes per rank (default: the job's, auto)")
    parser.add_argument("--decode-threads", type=int, default=None,
                        help="per rank, with --decode-procs 0 (default: the job's)")
    parser.add_argument("--image-size", default="500x375", help="WxH of the synthetic JPEGs (default 500x375)")
    parser.add_argument("--workdir", default=None, help="where images and outputs go (default: a temp dir)")
    parser.add_argument("--mpirun", default=None, help="launcher (default: mpirun, else mpiexec)")
    parser.add_argument("--launcher-args", default="", help="extra launcher arguments, e.g. '--hostfile h'")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run (default 3600)")
    parser.add_argument("--precision", default=None, help="--precision for vggserve batch (default: its own)")
    parser.add_argument("--decode", default=None, choices=("exact", "fast", "gpu", "auto"),
                        help="--decode for vggserve batch (default: its own, exact)")
    parser.add_argument("--json", default=None, help="also write every run's summary here")
    return parser.parse_args(argv)


UNIQUE_IMAGES = 512


def make_images(folder: Path, count: int, size: tuple[int, int]) -> None:
    """`count` JPEGs of smooth colour gradients plus noise (decoding costs what a photo's does): UNIQUE_IMAGES distinct
    ones (each takes ~20 ms to make), repeated under new names up to `count`."""
    folder.mkdir(parents=True, exist_ok=True)
    existing = sorted(folder.glob("*.jpg"))
    if len(existing) == count:
        return
    for path in existing:
        path.unlink()
    width, height = size
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    made = []
    for index in range(count):
        if index >= UNIQUE_IMAGES:
            (folder / f"{index:06d}.jpg").write_bytes(made[index % UNIQUE_IMAGES])
            continue
        phase = rng.uniform(0, 2 * np.pi, 3)
        channels = [127 + 100 * np.sin(xs / (17 + 7 * c) + ys / (29 + 5 * c) + phase[c]) for c in range(3)]
        noisy = np.stack(channels, axis=2) + rng.normal(0, 12, (height, width, 3))
        path = folder / f"{index:06d}.jpg"
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(path, quality=90)
        made.append(path.read_bytes())


def launcher_command(explicit: str | None, ranks: int, extra: str) -> list[str]:
    launcher = explicit or shutil.which("mpirun") or shutil.which("mpiexec")
    if not launcher:
        sys.exit("batch_scaling: neither mpirun nor mpiexec found")
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout.lower()
    command = [launcher, "-n", str(ranks)]
    if "open mpi" in version or "openrte" in version:
        command.append("--bind-to")
        command.append("none")
        if os.geteuid() == 0:
            command += ["--allow-run-as-root", "--oversubscribe"]
    return command + extra.split()


def run_once(args, ranks: int, images: Path, workdir: Path, extra: tuple = ()) -> dict:
    """One `vggserve batch` run over `images` with `ranks` ranks (and the `extra` CLI arguments): its summary."""
    output = workdir / f"results-{ranks}.jsonl"
    summary = workdir / f"summary-{ranks}.json"
    for stale in (output, output.with_name(f"{output.stem}.errors.jsonl"), summary):
        stale.unlink(missing_ok=True)
    command = launcher_command(args.mpirun, ranks, args.launcher_args) + [
        sys.executable, "-m", "vggserve", "batch", "--input", str(images), "--output", str(output),
        "--device", args.device, "--batch-size", str(args.batch_size), "--no-progress", "--summary", str(summary)]
    if args.weights:
        command += ["--weights", args.weights]
    if args.decode_procs is not None:
        command += ["--decode-procs", str(args.decode_procs)]
    if args.decode_threads:
        command += ["--decode-threads", str(args.decode_threads)]
    command += list(extra)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print(f"$ {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, timeout=args.timeout, stdout=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"batch_scaling: the {ranks}-rank run failed (exit {done.returncode})")
    result = json.loads(summary.read_text())
    result["process_seconds"] = round(elapsed, 3)
    return result


def table(runs: dict[int, dict]) -> str:
    base = runs[min(runs)]
    per_rank_base = base["images_per_second"] / min(runs)
    lines = ["| ranks | images | errors | wall s | images/s | speedup | efficiency | setup s | slowest rank img/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ranks, run in sorted(runs.items()):
        speedup = run["images_per_second"] / base["images_per_second"] if base["images_per_second"] else 0.0
        efficiency = run["images_per_second"] / (ranks * per_rank_base) if per_rank_base else 0.0
        slowest = min(r["images_per_second"] for r in run["ranks"])
        lines.append(f"| {ranks} | {run['images']} | {run['errors']} | {run['wall_seconds']:.2f} | "
                     f"{run['images_per_second']:.1f} | {speedup:.2f}x | {efficiency:.0%} | "
                     f"{run['setup_seconds']:.1f} | {slowest:.1f} |")
    return "\n".join(lines)


def rank_table(runs: dict[int, dict]) -> str:
    """Every rank of every run: its rate, and the wall ms per image its runner waited for its device, its decodes and
    rank 0's next chunk (the coordinator behind), with its own process's CPU ms per image and its decodes' (in its
    decode processes)."""
    lines = ["| ranks | rank | device | images | images/s | wait device ms | wait decode ms | wait chunks ms | "
             "rank CPU ms | decode CPU ms |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for ranks, run in sorted(runs.items()):
        for r in run["ranks"]:
            waits, cpu = r.get("wait_ms_per_image") or {}, r.get("cpu_ms_per_image") or {}
            lines.append(f"| {ranks} | {r.get('rank', '')} | {r.get('device', '')} | {r.get('images', '')} | "
                         f"{r['images_per_second']:.1f} | {waits.get('device', 0):.3f} | "
                         f"{waits.get('decode', 0):.3f} | {waits.get('chunks', 0):.3f} | "
                         f"{cpu.get('rank_process', 0):.3f} | {cpu.get('decode', 0):.3f} |")
    return "\n".join(lines)


def job_arguments(args) -> tuple[str, ...]:
    """The `vggserve batch` options passed through as given: --precision and --decode (the job's own defaults
    where not given)."""
    return tuple(item for flag, value in (("--precision", args.precision), ("--decode", args.decode))
                 if value for item in (flag, value))


def main(argv=None) -> int:
    args = parse_args(argv)
    rank_counts = [int(r) for r in args.ranks.split(",")]
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-scaling-"))
    images = workdir / "images"
    print(f"batch_scaling: {args.images} synthetic {width}x{height} JPEGs in {images}", file=sys.stderr)
    make_images(images, args.images, (width, height))
    runs = {ranks: run_once(args, ranks, images, workdir, job_arguments(args)) for ranks in rank_counts}
    device = runs[min(runs)]["ranks"][0]["device_name"]
    passed = "".join(f" {flag} {value}" for flag, value in zip(*[iter(job_arguments(args))] * 2))
    print(f"\n`vggserve batch` scaling: {args.images} images, batch size {args.batch_size}, --device {args.device}"
          f"{passed} ({device})\n")
    print(table(runs))
    print()
    print(rank_table(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
