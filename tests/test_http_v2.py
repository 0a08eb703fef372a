"""The Open Inference Protocol (KServe v2) against real servers, with `tritonclient.http` as the client: every input
and output, JSON and binary, the classification extension, a mixed batch with one bad image, the bad requests, and
the same limits, API key and deadlines as /classify. The engine's server runs in one process and with HTTP front
ends (the FP32 tensors then cross the shared-memory arena); the mpirun layout is in test_http_mpi."""

import base64
import gzip
import io
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from conftest import TEST_DEVICE
from fastapi.testclient import TestClient
from PIL import Image
from tritonclient.utils import InferenceServerException

from test_http_api import PNG, slow_app, wait_ready
from test_http_frontends import running
from test_http_process import wait_until
from vggserve.labels import imagenet_labels
from vggserve.serving.scheduling.imaging import prepare_image
from vggserve.testing.servers import ServerProcess

SIZES = [(500, 375), (64, 48), (300, 400)]


def jpeg(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


IMAGES = [jpeg(w, h, i) for i, (w, h) in enumerate(SIZES)]


def client_for(server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120.0,
                                        connection_timeout=30.0)


def image_input(images: list[bytes], binary: bool = True) -> triton.InferInput:
    given = triton.InferInput("image", [len(images)], "BYTES")
    if binary:
        given.set_data_from_numpy(np.array(images, dtype=object), binary_data=True)
    else:  # JSON: each file base64-encoded
        given.set_data_from_numpy(np.array([base64.b64encode(x) for x in images], dtype=object), binary_data=False)
    return given


def tensor_input(x: np.ndarray, binary: bool = True) -> triton.InferInput:
    given = triton.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    return given


@pytest.fixture(scope="module")
def reference(tiny_weights_path):
    """The engine itself, for the expected numbers."""
    from vggserve.model.vgg16 import VGG16

    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as model:
        tensors = np.stack([prepare_image(x, model.preprocessing, 10**8)[0].array for x in IMAGES])
        rng = np.random.default_rng(5)
        x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
        yield {"image_logits": model.logits(tensors), "image_probs": model.probabilities(tensors),
               "x": x, "x_logits": model.logits(x), "x_probs": model.probabilities(x)}


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two front ends"])
def engine_server(request, tiny_weights_path):
    args = ["--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--max-batch-size", "4",
            "--max-wait-ms", "50", "--preprocess-threads", "2", "--http-workers", request.param, "--log-level",
            "warning"]
    with running(ServerProcess.serve_cli(args)) as server:
        server.wait_ready(180)
        yield server


def close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=what)


def test_metadata_health_and_configuration(engine_server):
    client = client_for(engine_server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("vgg16") and client.is_model_ready("vgg16", "1")
    server = client.get_server_metadata()
    assert server["name"] == "vggserve" and {"classification", "binary_tensor_data"} <= set(server["extensions"])
    meta = client.get_model_metadata("vgg16")
    assert meta["name"] == "vgg16" and meta["versions"] == ["1"] and meta["parameters"]["precision"] == "fp32"
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]} == {
        "image": ("BYTES", [-1]), "input": ("FP32", [-1, 3, 224, 224])}
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]} == {
        "logits": ("FP32", [-1, 1000]), "probabilities": ("FP32", [-1, 1000])}
    assert client.get_model_metadata("vgg16", "1") == meta
    config = client.get_model_config("vgg16")
    assert config["name"] == "vgg16" and config["max_batch_size"] >= 1
    assert [t["dims"] for t in config["input"]] == [[1], [3, 224, 224]]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 50_000


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_image_input_gives_both_outputs_of_the_engine(engine_server, reference, binary):
    client = client_for(engine_server)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("logits", "probabilities")]
    result = client.infer("vgg16", [image_input(IMAGES, binary)], outputs=outputs, request_id="req-7")
    assert result.get_response()["id"] == "req-7" and result.get_response()["model_name"] == "vgg16"
    close(result.as_numpy("logits"), reference["image_logits"], "logits")
    close(result.as_numpy("probabilities"), reference["image_probs"], "probabilities")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp32_input_gives_the_engines_logits(engine_server, reference, binary):
    client = client_for(engine_server)
    result = client.infer("vgg16", [tensor_input(reference["x"], binary)])  # no outputs named: both, binary
    assert result.as_numpy("logits").shape == (2, 1000)
    close(result.as_numpy("logits"), reference["x_logits"], "logits")
    close(result.as_numpy("probabilities"), reference["x_probs"], "probabilities")


def test_classification_extension_gives_score_index_label_highest_first(engine_server, reference):
    client = client_for(engine_server)
    result = client.infer("vgg16", [image_input(IMAGES)],
                          outputs=[triton.InferRequestedOutput("probabilities", class_count=3)])
    got = result.as_numpy("probabilities")
    assert got.shape == (len(IMAGES), 3)
    labels = imagenet_labels()
    for row, probs in zip(got, reference["image_probs"]):
        entries = [x.decode().split(":", 2) for x in row]
        indices = [int(i) for _, i, _ in entries]
        assert indices == list(np.argsort(-probs, kind="stable")[:3])
        assert [label for _, _, label in entries] == [labels[i] for i in indices]
        close(np.array([float(s) for s, _, _ in entries]), probs[indices], "scores")


def test_a_mixed_batch_with_one_bad_image_is_a_400_naming_it(engine_server):
    client = client_for(engine_server)
    with pytest.raises(InferenceServerException) as info:
        client.infer("vgg16", [image_input([IMAGES[0], b"this is not an image", IMAGES[1]])])
    assert info.value.status() == "400" and "image 1 of the batch" in info.value.message()


@pytest.mark.parametrize("body, fragment", [
    ({"inputs": [{"name": "input", "datatype": "FP16", "shape": [1, 3, 224, 224], "data": [0]}]}, "datatype"),
    ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0]}]}, "shape"),
    ({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1], "data": [0]}]}, "unknown input"),
    ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": [0.5] * 7}]},
     "has 150528 elements"),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["%%%"]}]}, "base64"),
    ({"inputs": []}, "exactly one input"),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["AAAA"]}],
      "outputs": [{"name": "features"}]}, "unknown output"),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["AAAA"]}],
      "outputs": [{"name": "logits", "parameters": {"classification": 5000}}]}, "classification"),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["AAAA"]}],
      "outputs": [{"name": "logits", "parameters": {"classification": 0}}]}, "classification"),
])
def test_bad_requests_are_400_in_the_v2_shape(engine_server, body, fragment):
    r = httpx.post(engine_server.url + "/v2/models/vgg16/infer", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"} and fragment in r.json()["error"], r.text


def test_tritonclient_reads_the_statistics_extension(engine_server):
    """Issue 22, item 21: get_inference_statistics() was `404 unknown model 'stats'`. With front ends, the batches
    are counted in the engine process and the requests in the front ends."""
    client = client_for(engine_server)
    assert "statistics" in client.get_server_metadata()["extensions"]
    before = client.get_inference_statistics()["model_stats"][0]
    client.infer("vgg16", [image_input(IMAGES[:2])])
    (after,) = client.get_inference_statistics()["model_stats"]  # GET /v2/models/stats
    assert (after["name"], after["version"]) == ("vgg16", "1")
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 1
    assert after["last_inference"] >= before["last_inference"] > 0
    assert client.get_inference_statistics("vgg16")["model_stats"] == [after]
    assert client.get_inference_statistics("vgg16", "1")["model_stats"] == [after]


def test_broken_json_wrong_binary_size_and_unknown_model_or_version(engine_server):
    url = engine_server.url
    r = httpx.post(url + "/v2/models/vgg16/infer", content=b'{"inputs": [', timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224],
                                     "parameters": {"binary_data_size": 100}}]}).encode()
    r = httpx.post(url + "/v2/models/vgg16/infer", content=header + b"\0" * 100, timeout=30,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "602112 bytes" in r.json()["error"], r.text
    client = client_for(engine_server)
    for model, version in (("resnet50", ""), ("vgg16", "2")):
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [image_input(IMAGES[:1])], model_version=version)
        assert info.value.status() == "404", info.value
    assert httpx.get(url + "/v2/models/vgg16/versions/3", timeout=10).status_code == 404


def test_v2_requests_and_the_devices_opencl_figures_are_in_the_metrics(engine_server):
    client_for(engine_server).infer("vgg16", [image_input(IMAGES[:1])])
    text = httpx.get(engine_server.url + "/metrics", timeout=10).text
    assert 'vggserve_requests_total{endpoint="/v2/models/vgg16/infer",status="200"}' in text
    # the per-device figures OpenCL gives, in every layout (the engine process's, with front ends)
    figures = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vggserve_device_") and f'device="{TEST_DEVICE}"' in line}
    assert figures["vggserve_device_engine_bytes"] > 1e6, figures
    assert figures["vggserve_device_global_memory_bytes"] >= figures["vggserve_device_engine_bytes"]
    assert figures["vggserve_device_compute_units"] >= 1
    device = httpx.get(engine_server.url + "/metadata", timeout=10).json()["devices"][0]
    assert device["memory"]["engine_bytes"] == figures["vggserve_device_engine_bytes"]


SLOW_SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings

settings = Settings(port=PORT, max_batch_size=2, max_wait_ms=20, max_queue=4, max_files=4, api_key="k3y",
                    preprocess_threads=2)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.05, 2, hold_file=HOLD), log_level="warning"))
"""
KEY = {"Authorization": "Bearer k3y"}  # tritonclient adds to the dict it is given: pass it copies


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """While `server.hold` exists, every batch stays on the device (SlowModel's hold_file)."""
    hold = tmp_path_factory.mktemp("slow_server") / "hold"
    with running(ServerProcess.python_code(SLOW_SERVER.replace("HOLD", repr(str(hold))))) as server:
        server.wait_ready(60)
        server.hold = hold
        yield server


def test_api_key_is_needed_except_for_health(slow_server):
    client = client_for(slow_server)
    assert client.is_server_live() and client.is_server_ready()  # open, as /health/*
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("vgg16")
    assert info.value.status() == "401" and "API key" in info.value.message()
    assert client.get_model_metadata("vgg16", headers=dict(KEY))["name"] == "vgg16"
    result = client.infer("vgg16", [image_input([PNG])], headers=dict(KEY))
    assert result.as_numpy("probabilities").shape == (1, 1000)


def test_a_full_queue_is_429_and_a_passed_deadline_504(slow_server):
    client = client_for(slow_server)
    with ThreadPoolExecutor(3) as pool:
        # --max-queue 4 counts the images waiting or being decoded: one request of 2 images held on the device
        # (sent alone, so that it is there before the others arrive), two waiting fill it
        with holding_the_device(slow_server):
            busy = busy_requests(slow_server, pool, 1, on_the_device=True)
            busy += busy_requests(slow_server, pool, 2)
            wait_until(lambda: waiting(slow_server) == 4, 60, "four images waiting")
            with pytest.raises(InferenceServerException) as full:
                client.infer("vgg16", [image_input([PNG])], headers=dict(KEY))
            assert full.value.status() == "429" and "queue is full" in full.value.message()
        assert [f.result(timeout=60).status_code for f in busy] == [200] * 3
        # parameters.timeout (microseconds): a request that cannot reach a device within 100 ms
        with holding_the_device(slow_server):
            busy = busy_requests(slow_server, pool, 1, on_the_device=True)
            busy += busy_requests(slow_server, pool, 1)
            wait_until(lambda: waiting(slow_server) == 2, 60, "two images waiting")
            with pytest.raises(InferenceServerException) as late:
                client.infer("vgg16", [image_input([PNG])], headers=dict(KEY), timeout=100_000)
            assert late.value.status() == "504" and "deadline" in late.value.message()
        assert [f.result(timeout=60).status_code for f in busy] == [200] * 2


@contextmanager
def holding_the_device(server):
    """Holds every batch on the slow server's device (SlowModel's hold_file) until the block ends."""
    server.hold.touch()
    try:
        yield
    finally:
        server.hold.unlink()


def busy_requests(server, pool, count: int, on_the_device: bool = False) -> list:
    """`count` requests of two images each, sent with httpx from other threads (a tritonclient client is gevent's,
    not for threads). `on_the_device`: returns once their batch has left the queue (for the first request sent
    while the device is held)."""
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [2],
                        "data": [base64.b64encode(PNG).decode()] * 2}]}
    taken = metric(server, "vggserve_batch_size_count")
    sent = [pool.submit(httpx.post, server.url + "/v2/models/vgg16/infer", json=body, headers=KEY, timeout=120)
            for _ in range(count)]
    if on_the_device:
        wait_until(lambda: metric(server, "vggserve_batch_size_count") > taken, 60, "a batch on the device")
    return sent


def waiting(server) -> float:
    return metric(server, "vggserve_queue_length")


def metric(server, name: str) -> float:
    """`name`'s value in the server's /metrics (the images waiting in its queue, for vggserve_queue_length)."""
    text = httpx.get(server.url + "/metrics", headers=KEY, timeout=10).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


# --- through TestClient, with a stand-in model ----------------------------------------------------------------

def infer_body(*images: bytes, **output_parameters) -> dict:
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [len(images)],
                        "data": [base64.b64encode(x).decode() for x in images]}]}
    if output_parameters:
        body["outputs"] = [{"name": "probabilities", "parameters": output_parameters}]
    return body


@pytest.mark.parametrize("count", [0, -3])
def test_a_classification_count_below_one_is_refused_like_one_above_the_classes(count):
    """Issue 22, item 20: `"classification": 0` was ignored silently (the whole tensor came back)."""
    with TestClient(slow_app()) as client:
        wait_ready(client)
        for given in (count, 5000):
            r = client.post("/v2/models/vgg16/infer", json=infer_body(PNG, classification=given))
            assert r.status_code == 400 and "classification must be a count from 1 to 1000" in r.json()["error"], r.text
        assert client.post("/v2/models/vgg16/infer", json=infer_body(PNG, classification=1000)).status_code == 200


def test_statistics_count_every_request_image_and_batch_of_the_model_in_tritons_shape():
    with TestClient(slow_app()) as client:
        wait_ready(client)
        empty = client.get("/v2/models/stats").json()["model_stats"][0]
        assert empty["inference_count"] == empty["execution_count"] == empty["last_inference"] == 0
        assert set(empty["inference_stats"]) >= {"success", "fail", "queue", "compute_input", "compute_infer",
                                                 "compute_output"}
        for _ in range(2):
            assert client.post("/classify", content=PNG, headers={"content-type": "image/png"}).status_code == 200
        assert client.post("/v2/models/vgg16/infer", json=infer_body(PNG, PNG)).status_code == 200
        assert client.post("/classify", content=b"not an image", headers={"content-type": "image/png"}
                           ).status_code == 400
        (stats,) = client.get("/v2/models/stats").json()["model_stats"]
        assert (stats["name"], stats["version"]) == ("vgg16", "1") and stats["last_inference"] > 0
        inference = stats["inference_stats"]
        assert (inference["success"]["count"], inference["fail"]["count"]) == (3, 1)
        assert stats["inference_count"] == 4 == inference["queue"]["count"] == inference["compute_infer"]["count"]
        assert inference["compute_input"]["count"] == 4
        assert all(inference[k]["ns"] > 0 for k in ("success", "fail", "queue", "compute_input", "compute_infer"))
        batches = stats["batch_stats"]
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 4
        assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"] >= 1
        assert client.get("/v2/models/vgg16/stats").json()["model_stats"] == [stats]
        assert client.get("/v2/models/vgg16/versions/1/stats").json()["model_stats"] == [stats]
        for path in ("/v2/models/resnet50/stats", "/v2/models/vgg16/versions/2/stats"):
            r = client.get(path)
            assert r.status_code == 404 and set(r.json()) == {"error"}, path


def test_a_compressed_infer_body_is_inflated_and_other_encodings_are_415():
    with TestClient(slow_app()) as client:
        wait_ready(client)
        body = json.dumps(infer_body(PNG)).encode()
        r = client.post("/v2/models/vgg16/infer", content=gzip.compress(body),
                        headers={"content-type": "application/json", "content-encoding": "gzip"})
        assert r.status_code == 200, r.text
        r = client.post("/v2/models/vgg16/infer", content=body,
                        headers={"content-type": "application/json", "content-encoding": "br"})
        assert r.status_code == 415 and "Content-Encoding 'br'" in r.json()["error"], r.text
