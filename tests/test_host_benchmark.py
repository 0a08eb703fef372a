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
    assert set(results["batch"]["wait_ms_per_image"]) == {"device", "decode", "chunks"}
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


def test_the_batch_jobs_host_floor_under_mpiexec_measures_rank_0s_recording_of_the_other_ranks(tmp_path):
    """Under mpiexec every rank runs on its instant device and rank 0 records them all, saying what that costs it."""
    sys.path.insert(0, str(REPO / "tests"))
    from mpi_scripts.launch import mpiexec, subprocess_env

    done = subprocess.run([*mpiexec(2), sys.executable, str(REPO / "benchmarks" / "batch_host_floor.py"), "--images",
                           "64", "--repeat", "2", "--batch-size", "16", "--decode-procs", "1", "--replay",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("batch host floor: ") == 1  # rank 0 alone reports
    assert "2 ranks: " in done.stdout and "  rank 1: " in done.stdout
    assert "rank 0's main thread, CPU ms per image it recorded: its own " in done.stdout
    assert "other ranks' " in done.stdout
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    images = [json.loads(line)["image"] for line in lines]
    assert len(images) == 128 and len(set(images)) == 64  # each image twice (--repeat 2), in whole lines


@pytest.mark.parametrize("through", ["direct", "nginx"])
def test_the_services_host_floor_measures_each_process_on_an_instant_engine(tmp_path, through):
    """Directly, and through nginx in front (--nginx: what nginx adds to the load generator's CPU per image)."""
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "serve_host_floor.py"), "--http-workers", "2",
                           "--concurrency", "8", "--duration", "2", "--warmup", "1", "--json", str(out)]
                          + (["--nginx"] if through == "nginx" else []),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] > 0 and set(result["statuses"]) == {"200"}
    assert result["through"] == through and ("through nginx" in done.stdout) == (through == "nginx")
    assert {"load_generator", "engine_process", "other_server_processes"} <= set(result["cpu_ms_per_image"])
    assert any(name.startswith("device-") for name, _ in result["engine_threads_cpu_ms_per_image"])
    assert "CPU ms per image: front ends" in done.stdout
    threads = dict(result["frontend_threads_cpu_ms_per_image"])
    assert any("link-reader" in name for name in threads) and max(threads.values()) > 0


def test_the_host_floor_stands_in_for_the_device_decoder_so_front_ends_send_jpegs_compressed(tmp_path):
    """--decode gpu without --weights: the instant engine says it decodes on its device; every JPEG reaches it
    compressed and is counted as decoded there, and nothing is decoded in the front ends."""
    out = tmp_path / "floor.json"
    script = str(REPO / "benchmarks" / "serve_host_floor.py")
    done = subprocess.run([sys.executable, script, "--decode", "gpu", "--http-workers", "2", "--concurrency", "8",
                           "--duration", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] > 0 and set(result["statuses"]) == {"200"}
    decoded = result["decoded"]
    assert decoded["device/baseline_jpeg"] >= result["ok"]
    assert all(n == 0 for where, n in decoded.items() if where != "device/baseline_jpeg"), decoded
    refused = subprocess.run([sys.executable, script, "--decode", "gpu", "--devices", "2"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "serves one device" in refused.stderr


def test_the_engine_links_benchmark_measures_the_engine_process_with_simulated_front_ends(tmp_path):
    out = tmp_path / "links.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "engine_links.py"), "--fronts", "2",
                           "--inflight", "16", "--max-batch-size", "8", "--seconds", "1", "--warmup", "0.5",
                           "--logits", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["images_per_s"] > 0 and result["engine_cpu_ms_per_image"] > 0
    assert [role for role, _ in result["threads"]] == ["link readers", "link writers", "completers", "feeders",
                                                       "other"]
    assert "engine process CPU ms per image: " in done.stdout


def test_the_scaling_table_runs_end_to_end_in_smoke_mode(tiny_weights_path, tmp_path):
    """benchmarks/scaling.py --smoke: the batch job (1 rank vs 2), the service (one device worker vs two) and nginx in
    front of 1 instance vs 2, at FP32 and FP16, with the CPU standing in for each GPU: a row for each, with images/s
    and the ratio, in the table and the JSON. nginx must be installed (deploy/install.sh installs it)."""
    import shutil

    assert shutil.which("nginx") or Path("/usr/sbin/nginx").exists(), \
        "nginx is not installed: apt-get install nginx-light (deploy/install.sh does, with the dev extras)"
    out = tmp_path / "scaling.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--smoke", "--weights",
                           str(tiny_weights_path), "--workdir", str(tmp_path / "work"), "--json", str(out),
                           "--client-procs", "1"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["gpus"] == 2 and result["smoke"] is True and result["notes"] == []
    rows = [(r["run"], r["precision"]) for r in result["rows"]]
    assert rows == [(run, p) for p in ("fp32", "fp16") for run in ("batch", "service", "nginx")]
    for r in result["rows"]:
        assert r["one_images_per_s"] > 0 and r["all_images_per_s"] > 0, r
        assert r["ratio"] == pytest.approx(r["all_images_per_s"] / r["one_images_per_s"])
    assert [r["all"]["device"] for r in result["rows"] if r["run"] == "service"] == ["cpu,cpu"] * 2
    assert [len(r["all"]["instances"]) for r in result["rows"] if r["run"] == "nginx"] == [2, 2]
    assert all(set(r["all"]["statuses"]) == {"200"} for r in result["rows"] if r["run"] != "batch")
    for r in result["rows"]:  # the load generator's processes as asked, and what each image cost them
        if r["run"] != "batch":
            assert r["one"]["client_procs"] == r["all"]["client_procs"] == 1, r
            assert r["all"]["cpu_ms_per_image"]["load_generator"] > 0, r
    for r in result["rows"]:  # each rank of the batch runs: its waits and CPU, in the JSON and under the run
        if r["run"] == "batch":
            assert [x["rank"] for x in r["all"]["ranks"]] == [0, 1], r
            assert all({"device", "decode", "chunks"} <= set(x["wait_ms_per_image"]) for x in r["all"]["ranks"]), r
    assert done.stdout.count("  | ranks | rank | device | images | images/s | wait device ms |") == 4
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "| run | precision | 1 device, images/s | 2 devices, images/s | 2 / 1 |"
    assert len(table) == 2 + 6 and all(line.count("|") == 6 and line.endswith("x |") for line in table[2:])


def test_the_scaling_tables_instances_behind_nginx_get_what_auto_picks_on_their_share_of_the_cores():
    """Each of G instances on one host: `--http-workers auto` on the host's cores divided by G (device decoding: at
    most FRONTS_FIRST each), so the one-instance run gets what `vggserve serve --device gpu:0` picks alone."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import scaling
    from vggserve.serving.settings import FRONTS_FIRST

    assert [scaling.instance_frontends(g, 32, "exact") for g in (1, 2, 4)] == [16, 8, 4]
    assert [scaling.instance_frontends(g, 32, "gpu") for g in (1, 2, 4)] == [FRONTS_FIRST, FRONTS_FIRST, 4]
    assert scaling.instance_frontends(2, 32) == scaling.instance_frontends(2, 32, "auto") == FRONTS_FIRST
    assert scaling.instance_frontends(8, 4, "exact") == 1


def test_the_services_host_floor_runs_the_engine_with_device_decoding(tmp_path, tiny_weights_path):
    """--weights with --decode gpu: the real engine (here on the test device) decodes the JPEGs the front ends sent
    compressed, and the benchmark says so; --decode gpu on the instant stand-in, which decodes nothing, is refused."""
    from conftest import TEST_DEVICE

    script = str(REPO / "benchmarks" / "serve_host_floor.py")
    refused = subprocess.run([sys.executable, script, "--decode", "auto"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--decode auto needs --weights" in refused.stderr
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, script, "--weights", str(tiny_weights_path), "--device", TEST_DEVICE,
                           "--decode", "gpu", "--http-workers", "2", "--max-batch-size", "4", "--concurrency", "4",
                           "--duration", "5", "--warmup", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] > 0 and set(result["statuses"]) == {"200"}
    assert result["decoded"]["device/baseline_jpeg"] >= result["ok"] and "decoded: device/baseline_jpeg" in done.stdout


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


def test_the_apps_own_cpu_is_measured_in_process(tmp_path):
    """benchmarks/app_overhead.py: the front end's app called in this process, every request answered 200."""
    out = tmp_path / "app.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "app_overhead.py"), "--requests", "50",
                           "--rounds", "2", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["statuses"] == {"200": 100} and len(result["rounds"]) == 2 and result["cpu_ms_per_request"] > 0
    assert "ms CPU per request" in done.stdout


def test_host_vs_engine_passes_decode_group_and_concurrency_to_the_service_with_decode_gpu(tiny_weights_path,
                                                                                            tmp_path):
    """serve-gpu with --decode-group and --concurrency: the service started with them (the engine decoding the JPEGs
    on the test device), the load at that concurrency, and the mean decode group it formed, in the table and JSON."""
    from conftest import TEST_DEVICE

    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "host_vs_engine.py"), "--weights",
                           str(tiny_weights_path), "--device", TEST_DEVICE, "--batch-size", "2", "--runs", "serve-gpu",
                           "--decode-group", "3", "--concurrency", "12", "--duration", "8", "--warmup", "2",
                           "--engine-seconds", "1", "--workdir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    run = results["serve-gpu"]
    assert (results["decode_group"], results["concurrency"]) == (3, 12)
    assert (run["decode_group"], run["concurrency"]) == (3, 12) and set(run["statuses"]) == {"200"}
    assert run["images_per_s"] > 0 and 1.0 <= run["mean_decode_group"] <= 3.0
    assert "--decode-group 3, 12 requests in flight" in done.stdout
    assert f"| serve-gpu | {run['images_per_s']:.1f} |" in done.stdout
