"""A real uvicorn process on 127.0.0.1: readiness around warm-up, 429, 504, clients that go away, graceful drain
on SIGTERM (with a sleeping stand-in model), and with the real engine: results identical to the engine's own
classify, batching under concurrent requests, the body limit, and a clean exit."""

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import TEST_DEVICE
from image_corpus import build_corpus
from prometheus_client.parser import text_string_to_metric_families

from vggserve.testing.servers import ServerProcess, python_env
from test_http_api import PNG

SLOW_SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, max_batch_size=2, max_wait_ms=50, max_queue=4, max_files=4, drain_timeout_s=10)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.5, 2, load_seconds=1.5), log_level="warning"))
"""
IMAGE = {"content-type": "image/png"}
MEDIA = {".png": "image/png", ".gif": "image/gif", ".jpg": "image/jpeg"}
# one pooled client for every request of these tests: building a client per request costs ~0.1 s of CPU here
HTTP = httpx.Client(limits=httpx.Limits(max_connections=32, max_keepalive_connections=0))


def samples(url: str) -> dict:
    """{(name, labels...): value} of the server's /metrics."""
    out = {}
    for family in text_string_to_metric_families(HTTP.get(url + "/metrics", timeout=5).text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def classify(url: str, headers=None, timeout=30.0) -> httpx.Response:
    return HTTP.post(url + "/classify", content=PNG, headers={**IMAGE, **(headers or {})}, timeout=timeout)


def concurrently(n: int, fn):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: fn(), range(n)))


def wait_until(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def readiness(url: str) -> str | None:
    """/health/ready's status; None where the connection was reset: with several front ends, one with nothing in
    flight finishes its drain and closes while the others still serve, and a connection it had just accepted is
    reset (a load balancer's next probe reaches one still serving)."""
    try:
        return HTTP.get(url + "/health/ready", timeout=5).json()["status"]
    except httpx.TransportError:
        return None


def live(url: str) -> bool:
    try:
        return HTTP.get(url + "/health/live", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def metric(url: str, name: str) -> float:
    return samples(url).get((name,), 0.0)


def wait_metric(url: str, name: str, predicate, what: str, timeout_s: float = 20.0) -> None:
    wait_until(lambda: predicate(metric(url, name)), timeout_s, what)


def timed(url: str, headers=None) -> tuple[httpx.Response, float]:
    """A /classify answer and the time it arrived."""
    response = classify(url, headers)
    return response, time.monotonic()


def check_full_queue_answers_429_at_once(url: str) -> None:
    """12 requests at once, more than the queue holds: at least 4 get 429 with Retry-After, each one before the
    first image has left the device."""
    results = concurrently(12, lambda: timed(url))
    codes = [r.status_code for r, _ in results]
    assert codes.count(429) >= 4 and set(codes) <= {200, 429}, codes
    first_done = min(t for r, t in results if r.status_code == 200)
    for r, finished in results:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
            assert finished < first_done


def check_deadline_in_the_queue_is_504_and_not_computed(url: str) -> dict:
    """Two images on the device, then one with a 150 ms deadline: 504 without waiting for the device, and never
    computed. The metrics samples afterwards."""
    before = samples(url)
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(timed, url) for _ in range(2)]
        wait_metric(url, "vggserve_batch_size_sum", lambda v: v == before[("vggserve_batch_size_sum",)] + 2,
                    "the two busy images on the device")
        late, late_done = timed(url, {"x-request-timeout-ms": "150"})
        assert [f.result()[0].status_code for f in busy] == [200, 200]
        assert late_done < min(f.result()[1] for f in busy)  # answered without waiting for the device
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    after = samples(url)
    assert after[("vggserve_batch_size_sum",)] == before[("vggserve_batch_size_sum",)] + 2
    assert after[("vggserve_timeouts_total",)] == before[("vggserve_timeouts_total",)] + 1
    return after


def check_a_gone_client_is_withdrawn(url: str, port: int, images: float) -> None:
    """Two images on the device (`images` computed before them), then a third from a client that goes away while
    it waits: it is withdrawn (vggserve_abandoned_total 1), and the two busy ones are answered 200."""
    with ThreadPoolExecutor(2) as pool:
        busy = [pool.submit(classify, url) for _ in range(2)]
        wait_metric(url, "vggserve_batch_size_sum", lambda v: v == images + 2, "the busy images on the device")
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(PNG) + PNG)
            wait_metric(url, "vggserve_queue_length", lambda v: v == 1, "the third image waiting")
        wait_metric(url, "vggserve_abandoned_total", lambda v: v == 1, "the abandoned image withdrawn")
        assert [f.result().status_code for f in busy] == [200, 200]


def check_sigterm_lets_the_requests_in_flight_finish(server: ServerProcess) -> None:
    """SIGTERM with two images on the device and a third waiting: readiness turns 503 "draining", a new request is
    refused with 503 draining, the three in flight are answered 200, and the server exits 0."""
    url = server.url
    images = metric(url, "vggserve_batch_size_sum")
    with ThreadPoolExecutor(3) as pool:
        inflight = [pool.submit(classify, url) for _ in range(3)]
        wait_metric(url, "vggserve_batch_size_sum", lambda v: v == images + 2, "two images on the device")
        wait_metric(url, "vggserve_queue_length", lambda v: v == 1, "the third image waiting")
        server.signal(signal.SIGTERM)
        wait_until(lambda: readiness(url) == "draining", 10, "readiness to report draining")
        assert HTTP.get(url + "/health/ready", timeout=5).status_code == 503
        refused = classify(url)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert [f.result().status_code for f in inflight] == [200, 200, 200]
    assert server.wait(30) == 0, server.output()[-3000:]


def test_slow_model_server_readiness_429_504_gone_clients_and_drain():
    with ServerProcess.python_code(SLOW_SERVER) as server:
        url = server.url
        # readiness: live at once, ready only after the 1.5 s load and the warm-up batch
        wait_until(lambda: live(url), 30, "liveness")
        r = HTTP.get(url + "/health/ready", timeout=2)
        assert r.status_code == 503 and r.json()["status"] == "not_ready"
        assert classify(url).json()["error"]["code"] == "not_ready"
        server.wait_ready(30)

        # a full queue answers 429 with Retry-After at once (2 on the device + 4 admitted fit): every 429
        # arrives before the first image has left the device
        check_full_queue_answers_429_at_once(url)

        # a deadline that passes in the queue: 504, and the image is never computed
        after = check_deadline_in_the_queue_is_504_and_not_computed(url)

        # a client that goes away while its image waits: the image is not computed
        images = after[("vggserve_batch_size_sum",)]
        check_a_gone_client_is_withdrawn(url, server.port, images)
        time.sleep(0.7)  # time enough for the abandoned image to have run, had it not been withdrawn
        assert metric(url, "vggserve_batch_size_sum") == images + 2

        # a client that goes away halfway through its upload: nothing logged as an error, counted as 499
        key = ("vggserve_requests_total", ("endpoint", "/classify"), ("status", "499"))
        gone = samples(url).get(key, 0)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                         b"Content-Length: %d\r\n\r\n" % (2 * len(PNG)) + PNG)
            time.sleep(0.2)
        wait_until(lambda: samples(url).get(key) == gone + 1, 10, "the cut-off upload counted as 499")

        # SIGTERM with requests in flight: readiness 503, new requests refused, in-flight ones finish, exit 0
        check_sigterm_lets_the_requests_in_flight_finish(server)
        assert "Traceback" not in server.output()


@pytest.fixture(scope="module")
def engine_server(tiny_weights_path):
    args = ["--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--max-batch-size", "4", "--max-wait-ms", "300",
            "--max-body-bytes", "65536", "--preprocess-threads", "2", "--log-level", "warning"]
    with ServerProcess.serve_cli(args) as server:
        server.wait_ready(180)
        yield server


def test_results_identical_to_the_engine_for_the_same_files(engine_server, tiny_weights_path, tmp_path):
    from vggserve.model.vgg16 import VGG16

    files = build_corpus(tmp_path)
    names = ["rgba.png", "cmyk.jpg", "exif_orientation_6.jpg", "gray16.png"]
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as model:
        expected = model.classify([files[n] for n in names], top_k=5)
    for name, want in zip(names, expected):
        with open(files[name], "rb") as f:
            r = HTTP.post(engine_server.url + "/classify", files={"file": (name, f)}, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()["predictions"]
        assert [(p["index"], p["label"]) for p in got] == [(p["index"], p["label"]) for p in want], name
        assert [p["probability"] for p in got] == pytest.approx([p["probability"] for p in want], rel=1e-5, abs=1e-7)


def test_results_identical_to_vggserve_classify_json(engine_server, tiny_weights_path, tmp_path):
    files = build_corpus(tmp_path)
    names = ["palette.png", "animated.gif", "exif_orientation_8.jpg"]
    command = [sys.executable, "-m", "vggserve", "classify", "--json", "--weights", str(tiny_weights_path),
               "--device", TEST_DEVICE, "--top-k", "5", *(str(files[n]) for n in names)]
    done = subprocess.run(command, env=python_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    cli = {Path(line["image"]).name: line["predictions"] for line in map(json.loads, done.stdout.splitlines())}
    with ThreadPoolExecutor(3) as pool:  # concurrently, so the server batches them
        responses = list(pool.map(lambda n: HTTP.post(engine_server.url + "/classify", content=files[n].read_bytes(),
                                                      headers={"content-type": MEDIA[files[n].suffix]},
                                                      timeout=60), names))
    for name, r in zip(names, responses):
        assert r.status_code == 200, r.text
        got, want = r.json()["predictions"], cli[name]
        assert [(p["index"], p["label"]) for p in got] == [(p["index"], p["label"]) for p in want], name
        assert [p["probability"] for p in got] == pytest.approx([p["probability"] for p in want], rel=1e-5, abs=1e-7)


def test_concurrent_requests_are_batched(engine_server):
    url = engine_server.url
    before = samples(url)
    codes = [r.status_code for r in concurrently(8, lambda: classify(url, timeout=120))]
    assert codes == [200] * 8
    after = samples(url)
    images = after[("vggserve_batch_size_sum",)] - before[("vggserve_batch_size_sum",)]
    batches = after[("vggserve_batch_size_count",)] - before[("vggserve_batch_size_count",)]
    le1 = ("vggserve_batch_size_bucket", ("le", "1.0"))
    singles = after[le1] - before[le1]
    assert images == 8 and batches < 8 and singles < batches, (images, batches, singles)
    assert after[("vggserve_requests_total", ("endpoint", "/classify"), ("status", "200"))] >= 8


def test_body_over_the_limit_is_refused_before_it_is_read(engine_server):
    r = HTTP.post(engine_server.url + "/classify", content=b"\x89PNG" + b"0" * 200_000, headers=IMAGE, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert classify(engine_server.url, timeout=60).status_code == 200


def test_sigterm_when_idle_exits_zero(engine_server):
    engine_server.signal(signal.SIGTERM)
    assert engine_server.wait(30) == 0, engine_server.output()[-3000:]


def test_server_exits_3_with_the_reason_when_every_device_worker_dies():
    code = """
import sys
from vggserve.errors import DeviceError
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
def no_device(device):
    raise DeviceError(f"no gpu device number 7 (usable devices: cpu)")
sys.exit(run_server(Settings(port=PORT, devices=("gpu:7",)), no_device, log_level="warning"))
"""
    with ServerProcess.python_code(code) as server:
        assert server.wait(30) == 3
        assert "no device worker is alive (gpu:7: DeviceError: no gpu device number 7" in server.output()


@pytest.mark.parametrize("http_workers", ["1", "2"])
def test_a_taken_port_is_one_line_and_its_own_exit_status(tiny_weights_path, http_workers):
    """Issue 12, item 6: no "serving on", no traceback; exit status 6, not 3 (every device worker dead)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "vggserve", "serve", "--weights", str(tiny_weights_path),
                               "--device", TEST_DEVICE, "--port", str(port), "--http-workers", http_workers],
                              env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 6, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"vggserve: error: cannot listen on 127.0.0.1:{port}: the address is already in use (another "
                     "server on that port?); pass another --port, or --port 0"], done.stderr


def test_serving_on_is_said_once_the_port_is_bound_and_the_devices_ready(tiny_weights_path):
    args = ["--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--max-batch-size", "4",
            "--log-level", "warning"]
    with ServerProcess.serve_cli(args) as server:
        end = time.monotonic() + 120
        while "serving on" not in server.output() and time.monotonic() < end:
            assert server.proc.poll() is None, server.output()
            time.sleep(0.02)
        said = [line for line in server.output().splitlines() if "serving on" in line]
        ready = HTTP.get(server.url + "/health/ready", timeout=10)
        assert ready.status_code == 200, (said, ready.text)  # true when said: bound, model loaded and warm
        assert said == [f"vggserve: serving on {server.url} with 1 device worker ({TEST_DEVICE})"], said
