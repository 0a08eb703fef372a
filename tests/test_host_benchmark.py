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
    assert results["engine"]["streamed_images_per_s"] > 0 and results["engine"]["streamed_raw_images_per_s"] > 0
    assert results["batch"]["images_per_s"] > 0 and results["batch"]["errors"] == 0
    assert {"read", "decode", "stage", "result"} <= set(results["batch"]["cpu_ms_per_image"])
    assert set(results["batch"]["wait_ms_per_image"]) == {"device", "decode"}
    photo = results["photo-fast"]
    assert photo["images_per_s"] > 0 and set(photo["statuses"]) == {"200"}
    assert {"load_generator", "engine_process", "decode_wall"} <= set(photo["cpu_ms_per_image"])
    assert "| batch |" in done.stdout and "| photo-fast |" in done.stdout


def test_the_batch_jobs_host_floor_runs_the_rank_on_an_instant_device(tmp_path):
    """--replay: each decode process decodes one image and answers every image with it; the rank's stages show."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "batch_host_floor.py"), "--images", "64",
                           "--repeat", "2", "--batch-size", "16", "--decode-procs", "1", "--replay", "--device-ms", "1",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch host floor: 128 500x375 JPEGs, batch 16, 1 decode process" in done.stdout
    assert "link" in done.stdout and "rank process" in done.stdout
    assert "rank waited, wall ms per image: device " in done.stdout
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 128 and all('"predictions"' in line for line in lines)


def test_the_services_host_floor_measures_each_process_on_an_instant_engine(tmp_path):
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "serve_host_floor.py"), "--http-workers", "2",
                           "--concurrency", "8", "--duration", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] > 0 and set(result["statuses"]) == {"200"}
    assert {"load_generator", "engine_process", "other_server_processes"} <= set(result["cpu_ms_per_image"])
    assert any(name.startswith("device-") for name, _ in result["engine_threads_cpu_ms_per_image"])
    assert "CPU ms per image: front ends" in done.stdout


def test_the_front_ends_own_cpu_is_measured_on_every_hot_route(tmp_path):
    """benchmarks/frontend_overhead.py: a front end's app over an instant backend, every route answered 200."""
    out = tmp_path / "overhead.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "frontend_overhead.py"), "--requests", "100",
                           "--rounds", "1", "--concurrency", "4", "--hop", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"health", "classify", "classify-form", "v2"}
    for route, result in results.items():
        assert result["statuses"] == {"200": 100} and result["cpu_ms_per_request"] > 0, (route, result)
    assert "ms CPU per request" in done.stdout
