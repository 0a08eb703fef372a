"""--precision end to end on the portable path every device runs (FP16 storage): classify, bench, the batch job,
the service's /metadata, the tuner's per-precision table; and the one-line refusal of a precision a device lacks.
The tensor-core kernels themselves are tested in test_tensorcore.py."""

import json
import time
from pathlib import Path

import pytest

from conftest import TEST_DEVICE
from test_cli import IMAGES, vggserve


def test_classify_at_fp16_agrees_with_fp32(tiny_weights_path):
    runs = {}
    for p in ("fp32", "fp16"):
        r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", "--top-k", "3",
                     "--precision", p, *IMAGES)
        assert r.returncode == 0, r.stderr
        runs[p] = [json.loads(line) for line in r.stdout.splitlines()]
    for a, b in zip(runs["fp32"], runs["fp16"]):
        assert a["predictions"][0]["index"] == b["predictions"][0]["index"]
        assert abs(a["predictions"][0]["probability"] - b["predictions"][0]["probability"]) < 1e-2


def test_bench_json_reports_precision_family_and_each_layers_kernel(tiny_weights_path):
    r = vggserve("bench", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--batch-size", "1",
                 "--iterations", "1", "--precision", "fp16", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["precision"] == "fp16" and data["family"] in ("portable", "tensorcore")
    kernels = {k["name"]: k["kernel"] for k in data["kernels"]}
    assert set(kernels) >= {"features.0", "classifier.6"} and all("(" in k for n, k in kernels.items() if n.startswith(("features", "classifier")))


def test_a_precision_the_device_lacks_is_one_line_on_the_command_line(tiny_weights_path, monkeypatch):
    from vggserve.runtime import caps as device_caps, devices as devs

    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    info = devs.resolve(TEST_DEVICE)
    has_tc = device_caps.of(devs.cl_device(info), info.kind, info.label).tensor_cores
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--precision", "tf32",
                 IMAGES[0], env={"VGGSERVE_EMULATE_MMA": ""})
    if has_tc:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 3 and "Traceback" not in r.stderr
        assert "cannot run precision tf32" in r.stderr and "supports fp32, fp16" in r.stderr
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--precision", "int4",
                 IMAGES[0])
    assert r.returncode == 2 and "invalid choice" in r.stderr
    for eight in ("fp8", "int8"):  # the device is refused before the calibration is looked for
        r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--precision", eight,
                     IMAGES[0], env={"VGGSERVE_EMULATE_MMA": ""})
        if not has_tc:
            assert r.returncode == 3 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
            assert f"cannot run precision {eight}" in r.stderr and "supports fp32, fp16" in r.stderr


def test_batch_job_at_fp16_writes_every_result(tiny_weights_path, tmp_path):
    from vggserve.distributed.job import BatchOptions, run_batch

    out = tmp_path / "results.jsonl"
    code = run_batch(BatchOptions(input=str(Path(IMAGES[0]).parent), output=str(out),
                                  weights=str(tiny_weights_path), device=TEST_DEVICE, batch_size=2,
                                  decode_procs=0, precision="fp16", progress=False))
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(x["image"] for x in lines) == sorted(IMAGES)


def test_service_metadata_reports_the_engines_precision(tiny_weights_path):
    from fastapi.testclient import TestClient

    from vggserve.serving import Settings, create_app

    app = create_app(Settings(weights=str(tiny_weights_path), devices=(TEST_DEVICE,), max_batch_size=2,
                              precision="fp16", warmup=False))
    with TestClient(app) as client:
        for _ in range(600):
            if client.get("/health/ready").status_code == 200:
                break
            time.sleep(0.1)
        meta = client.get("/metadata").json()
        assert meta["precision"] == "fp16"
        with open(IMAGES[0], "rb") as f:
            r = client.post("/classify", files={"file": ("a.jpg", f, "image/jpeg")})
        assert r.status_code == 200, r.text


def test_settings_refuse_an_unknown_precision():
    from vggserve.serving import Settings
    from vggserve.serving.settings import SettingsError

    with pytest.raises(SettingsError, match="--precision must be one of fp32, tf32, fp16, fp8, int8, got 'int4'"):
        Settings(precision="int4")
    assert Settings(precision="int8").precision == "int8"


def test_tuned_winners_are_stored_and_read_per_precision(tmp_path, monkeypatch, tiny_tensors):
    from vggserve import VGG16, tuning
    from vggserve.runtime import devices as devs
    from vggserve.runtime import params as params_module

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(params_module, "shipped_file", lambda: tmp_path / "none.json")
    info = devs.resolve(TEST_DEVICE)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] == "64x64x14"]
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=2, repeats=1, shapes=shapes,
                                  progress=lambda _: None, precision="fp16")
    assert len(trials) >= 1 and all(t.ok for t in trials)
    tuning.store(info.label, winners, batch=1, precision="fp16")
    stored = params_module.params_for(info.kind, info.label)
    assert stored["conv_by_batch_fp16"]["1"]["64x64x14"] == winners["64x64x14"]
    assert "conv_by_batch" not in stored  # the FP32 table is untouched
    with VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1, precision="fp16") as model:
        hows = {p["name"]: p["kernel"] for p in model.kernel_plan()}
    # on tensor cores (a GPU run) a tc_halo winner takes the pooling after features.28 into its store
    how = hows.get("features.28") or hows["features.28+pool"]
    assert "tuned for this shape (conv_by_batch_fp16)" in how
