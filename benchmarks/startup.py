"""Start-up: from process start to the first classification, with warm caches.

    python benchmarks/startup.py --weights vgg16.safetensors --device gpu [--runs 5] [--json out.json]

Starts a fresh `python` process per run that starts the early device discovery (as the `vggserve` commands do:
vggserve/runtime/warmstart.py), imports vggserve, loads the weights file, builds the engine on --device and
classifies one image (batch 1), then prints its phase times. --no-early adds alternating runs without the early
discovery. The first run warms the caches (the program binary cache and the OS page cache of the weights file)
and is reported apart; the median of the other runs is the figure.

Phases: interpreter + imports; reading the weights file (`load_weights`, every tensor copied into memory, so the
file is read here and nowhere later; the issue does not count it); device discovery (what is left of it after the
early discovery); program builds (cache hits); weight upload with the on-device re-layout; the first result.
"total" is the parent's wall clock from spawning the process to reading the child's report line, so it includes
the interpreter's own start; "total_without_weights_read_s" takes the read out but counts back any part of the
early discovery that ran during it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import vggserve
early = sys.argv[3] == "early" and vggserve.start_device_discovery(sys.argv[2])  # as the vggserve commands do
import numpy as np
from vggserve.model.vgg16 import VGG16
from vggserve.runtime import warmstart
from vggserve.weights import load_weights
t1 = time.perf_counter()
loaded = load_weights(sys.argv[1])
loaded.tensors = {k: np.array(v) for k, v in loaded.tensors.items()}  # read it all now: not counted by the issue
t2 = time.perf_counter()
model = VGG16(loaded.tensors, device=sys.argv[2], max_batch_size=1, preprocessing=loaded.preprocessing)
t3 = time.perf_counter()
crop = np.random.default_rng(0).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
top = int(model.probabilities_from_pixels(crop)[0].argmax())
t4 = time.perf_counter()
s = model.startup
span = warmstart.times() if early else None
# the part of the early discovery that ran while the file was read: counted back in, since the read is not
overlap = max(0.0, min(span[1], t2) - max(span[0], t1)) if span else 0.0
print(json.dumps({"imports_s": t1 - t0, "weights_read_s": t2 - t1, "discovery_s": s.discovery_s,
                  "early_discovery_s": span[1] - span[0] if span else 0.0, "early_during_read_s": overlap,
                  "build_s": s.build_s, "upload_s": s.upload_s, "engine_s": t3 - t2, "first_result_s": t4 - t3,
                  "programs_cached": s.programs_cached, "programs_compiled": s.programs_compiled,
                  "device": model.device_name, "top1": top}), flush=True)
"""


def one_run(weights: str, device: str, early: bool = True) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, weights, device, "early" if early else "late"],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    total = time.perf_counter() - started
    proc.wait()
    if proc.returncode or not line.strip():
        raise SystemExit(f"startup.py: the child process failed (exit {proc.returncode})")
    report = json.loads(line)
    report["total_s"] = total
    report["total_without_weights_read_s"] = total - report["weights_read_s"] + report["early_during_read_s"]
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--runs", type=int, default=5, help="measured runs after the warming one (default 5)")
    ap.add_argument("--no-early", action="store_true",
                    help="also time runs without the early device discovery (alternating with the others)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warm = one_run(args.weights, args.device)
    runs, late = [], []
    for _ in range(args.runs):
        runs.append(one_run(args.weights, args.device))
        if args.no_early:
            late.append(one_run(args.weights, args.device, early=False))
    keys = [k for k, v in runs[0].items() if k.endswith("_s")]
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    median_late = {k: statistics.median(r[k] for r in late) for k in keys} if late else {}
    print(f"device: {runs[0]['device']}; programs from the cache: {runs[0]['programs_cached']}, compiled: "
          f"{runs[0]['programs_compiled']}")
    print(f"{'phase':32s} {'first (cold) run':>16s} {'median of ' + str(args.runs):>14s}"
          + (f" {'without early discovery':>24s}" if late else ""))
    for k in keys:
        print(f"{k:32s} {warm[k]:16.3f} {median[k]:14.3f}" + (f" {median_late[k]:24.3f}" if late else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": runs[0]["device"], "cold": warm, "runs": runs,
                                               "median": median, "runs_without_early": late,
                                               "median_without_early": median_late}, indent=1))


if __name__ == "__main__":
    main()
