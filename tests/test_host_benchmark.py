"""benchmarks/host_vs_engine.py runs on the CPU with tiny sizes: the batch job and the service against the engine in
one call (the GPU figures come from benchmarks/gpu_run.sh's `host` stage)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.mpi


def test_host_vs_engine_runs_the_batch_job_and_the_photo_mix_on_the_cpu(tiny_weights_path, tmp_path):
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "host_vs_engine.py"), "--weights",
                           str(tiny_weights_path), "--device", "cpu", "--batch-size", "4", "--images", "8",
                           "--runs", "batch,photo-fast", "--duration", "3", "--warmup", "1", "--engine-seconds", "1",
                           "--workdir", str(tmp_path / "work"), "--precision", "fp32", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["engine"]["streamed_images_per_s"] > 0
    assert results["batch"]["images_per_s"] > 0 and results["batch"]["errors"] == 0
    assert {"read", "decode", "stage", "result"} <= set(results["batch"]["cpu_ms_per_image"])
    photo = results["photo-fast"]
    assert photo["images_per_s"] > 0 and set(photo["statuses"]) == {"200"}
    assert {"load_generator", "engine_process", "decode_wall"} <= set(photo["cpu_ms_per_image"])
    assert "| batch |" in done.stdout and "| photo-fast |" in done.stdout
