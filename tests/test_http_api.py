"""The HTTP API through TestClient with stand-in models: shapes, errors, limits, auth, readiness, queueing."""

import gzip
import io
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vggserve.serving import Settings, create_app
from vggserve.testing.models import SlowModel

ERROR_KEYS = {"error"}


def png_bytes(size=(64, 48), color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


PNG = png_bytes()


def slow_app(seconds=0.02, load_seconds=0.0, fail_after=None, **settings):
    settings.setdefault("max_batch_size", 4)
    settings.setdefault("max_wait_ms", 10)
    s = Settings(**settings)
    return create_app(s, model_factory=lambda device: SlowModel(device, seconds, s.max_batch_size, load_seconds,
                                                                fail_after))


def wait_ready(client, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if client.get("/health/ready").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError(f"not ready after {timeout_s} s: {client.get('/health/ready').json()}")


def assert_error(response, status, code, *words):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == ERROR_KEYS and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code, body
    for word in words:
        assert word in body["error"]["message"], body


@pytest.fixture
def client():
    with TestClient(slow_app()) as c:
        wait_ready(c)
        yield c


def test_classify_multipart_returns_predictions_and_timings(client):
    r = client.post("/classify?top_k=3", files={"file": ("red.png", PNG, "image/png")})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"request_id", "model", "predictions", "timing_ms"}
    assert r.headers["x-request-id"] == body["request_id"] and body["model"] == "vgg16"
    assert len(body["predictions"]) == 3
    assert set(body["predictions"][0]) == {"index", "label", "probability"}
    probs = [p["probability"] for p in body["predictions"]]
    assert probs == sorted(probs, reverse=True)
    timing = body["timing_ms"]
    assert set(timing) == {"queue", "preprocess", "inference", "total"}
    assert timing["inference"] >= 15  # the stand-in sleeps 20 ms per batch
    assert timing["total"] >= timing["inference"]


def test_classify_raw_body_matches_multipart(client):
    raw = client.post("/classify", content=PNG, headers={"content-type": "image/png"}).json()
    form = client.post("/classify", files={"file": ("x.png", PNG, "image/png")}).json()
    assert raw["predictions"] == form["predictions"]
    assert len(raw["predictions"]) == 5  # default top_k


def test_octet_stream_uploads_are_sniffed_like_any_image(client):
    """Many clients send application/octet-stream for any file: the bytes decide (issue 12, item 9)."""
    typed = client.post("/classify", content=PNG, headers={"content-type": "image/png"}).json()
    untyped = client.post("/classify", content=PNG, headers={"content-type": "application/octet-stream"})
    assert untyped.status_code == 200, untyped.text
    assert untyped.json()["predictions"] == typed["predictions"]
    refused = client.post("/classify", content=b"%PDF-1.4 not an image", headers={"content-type":
                                                                                   "application/octet-stream"})
    assert refused.status_code in (400, 415) and refused.json()["error"]["code"] in ("invalid_image",
                                                                                     "unsupported_media_type")


@pytest.mark.parametrize("query", ["top_k=0", "top_k=1001", "top_k=abc"])
def test_top_k_out_of_bounds_is_422_in_our_shape(client, query):
    r = client.post(f"/classify?{query}", content=PNG, headers={"content-type": "image/png"})
    assert_error(r, 422, "invalid_request", "top_k")


def test_top_k_reaches_every_class_as_in_the_cli_and_v2(client):
    """1..1000 everywhere (issue 22, item 17): the CLI's --top-k and v2's `classification` take 1000 too."""
    r = client.post("/classify?top_k=1000", content=PNG, headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    assert sorted(p["index"] for p in r.json()["predictions"]) == list(range(1000))
    batch = client.post("/classify/batch?top_k=1000", files={"files": ("a.png", PNG, "image/png")})
    assert len(batch.json()["results"][0]["predictions"]) == 1000


def test_request_timeout_header_is_validated(client):
    r = client.post("/classify", content=PNG, headers={"content-type": "image/png", "x-request-timeout-ms": "0"})
    assert_error(r, 422, "invalid_request", "x-request-timeout-ms")


@pytest.mark.parametrize("kwargs, status, code, words", [
    ({"content": b"", "headers": {"content-type": "image/png"}}, 400, "empty_body", ["empty"]),
    ({}, 400, "empty_body", ["empty"]),  # nothing at all, no Content-Type either (issue 22, item 19)
    ({"content": b"", "headers": {"content-type": "text/plain"}}, 400, "empty_body", ["empty"]),
    ({"content": b"just text", "headers": {"content-type": "image/jpeg"}}, 400, "invalid_image", ["not a recognised"]),
    ({"content": PNG, "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type", ["text/plain"]),
    ({"content": PNG}, 415, "unsupported_media_type", ["no Content-Type"]),
    ({"files": {"image": ("x.png", PNG, "image/png")}}, 400, "missing_file", ["'file'"]),
    ({"files": {"file": ("x.png", b"", "image/png")}}, 400, "empty_body", ["x.png"]),
    ({"data": {"file": "not a file"}, "files": {"other": ("a", b"a")}}, 400, "missing_file", ["not a text value"]),
    ({"content": b"--x\r\nbroken", "headers": {"content-type": "multipart/form-data; boundary=x"}}, 400, None, []),
])
def test_bad_requests_get_a_clear_4xx_and_the_server_stays_up(client, kwargs, status, code, words):
    r = client.post("/classify", **kwargs)
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["message"]
    if code:
        assert body["code"] == code
    for word in words:
        assert word in body["message"]
    assert client.post("/classify", content=PNG, headers={"content-type": "image/png"}).status_code == 200


def test_batch_returns_one_result_or_error_per_file_in_order(client):
    files = [("files", ("a.png", PNG, "image/png")), ("files", ("b.txt", b"hello", "text/plain")),
             ("files", ("c.png", b"", "image/png")), ("files", ("d.png", png_bytes(color=(0, 0, 250)), "image/png"))]
    r = client.post("/classify/batch?top_k=2", files=files)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["filename"] for x in results] == ["a.png", "b.txt", "c.png", "d.png"]
    assert len(results[0]["predictions"]) == 2 and "error" not in results[0]
    assert results[1]["error"]["code"] == "invalid_image"
    assert results[2]["error"]["code"] == "empty_body"
    assert results[3]["predictions"][0]["index"] != results[0]["predictions"][0]["index"]
    single = client.post("/classify?top_k=2", content=PNG, headers={"content-type": "image/png"}).json()
    assert results[0]["predictions"] == single["predictions"]


def test_batch_limits_and_content_type(client):
    too_many = [("files", (f"{i}.png", PNG, "image/png")) for i in range(17)]
    assert_error(client.post("/classify/batch", files=too_many), 400, "invalid_multipart", "16")
    assert_error(client.post("/classify/batch", content=PNG, headers={"content-type": "image/png"}),
                 415, "unsupported_media_type", "multipart")
    assert_error(client.post("/classify/batch", files={"file": ("a.png", PNG)}), 400, "missing_file", "'files'")
    assert_error(client.post("/classify/batch"), 400, "empty_body", "empty")


@pytest.mark.parametrize("coding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_compressed_body_is_inflated_first(client, coding, compress):
    """Issue 22, item 30: `Content-Encoding: gzip` was ignored and the body called "not a recognised image"."""
    plain = client.post("/classify", content=PNG, headers={"content-type": "image/png"}).json()["predictions"]
    r = client.post("/classify", content=compress(PNG), headers={"content-type": "image/png",
                                                                 "content-encoding": coding})
    assert r.status_code == 200, r.text
    assert r.json()["predictions"] == plain
    form = httpx.Request("POST", "http://127.0.0.1/", files={"files": ("a.png", PNG, "image/png")})
    batch = client.post("/classify/batch", content=compress(form.read()),
                        headers={"content-type": form.headers["content-type"], "content-encoding": coding})
    assert batch.status_code == 200 and batch.json()["results"][0]["predictions"] == plain, batch.text


def test_a_body_that_inflates_past_the_limit_is_413_and_other_encodings_415():
    with TestClient(slow_app(max_body_bytes=64 * 1024)) as client:
        wait_ready(client)
        bomb = gzip.compress(b"\0" * (10 << 20))  # 10 MB of zeros in about 10 KB
        r = client.post("/classify", content=bomb, headers={"content-type": "image/png", "content-encoding": "gzip"})
        assert_error(r, 413, "payload_too_large", "inflates", "65536")
        for coding in ("br", "gzip, gzip"):
            r = client.post("/classify", content=PNG, headers={"content-type": "image/png",
                                                               "content-encoding": coding})
            assert_error(r, 415, "unsupported_media_type", "Content-Encoding", "gzip or deflate")
        r = client.post("/classify", content=PNG, headers={"content-type": "image/png", "content-encoding": "gzip"})
        assert_error(r, 400, "bad_request", "not valid gzip")
        r = client.post("/classify", content=gzip.compress(PNG)[:-30],
                        headers={"content-type": "image/png", "content-encoding": "gzip"})
        assert_error(r, 400, "bad_request", "truncated")


def test_body_over_the_limit_is_413_from_content_length_and_while_streaming():
    with TestClient(slow_app(max_body_bytes=4096)) as c:
        wait_ready(c)
        big = b"\x89PNG" + b"0" * 10_000
        assert_error(c.post("/classify", content=big, headers={"content-type": "image/png"}),
                     413, "payload_too_large", "4096")

        def chunks():  # no Content-Length: the limit is enforced while the body streams in
            for _ in range(10):
                yield b"0" * 1000

        assert_error(c.post("/classify", content=chunks(), headers={"content-type": "image/png"}),
                     413, "payload_too_large", "4096")
        assert_error(c.post("/classify/batch", files=[("files", ("a.png", big, "image/png"))]),
                     413, "payload_too_large")
        assert c.post("/classify", content=PNG, headers={"content-type": "image/png"}).status_code == 200


def test_unknown_paths_and_methods_use_the_error_shape(client):
    assert_error(client.get("/nope"), 404, "not_found", "/nope")
    assert_error(client.get("/classify"), 405, "method_not_allowed", "GET")


def test_api_key_guards_everything_but_health():
    with TestClient(slow_app(api_key="s3cret")) as c:
        wait_ready(c)
        assert c.get("/health/live").status_code == 200
        assert c.get("/health/ready").status_code == 200
        for path in ("/metadata", "/metrics", "/openapi.json", "/docs"):
            r = c.get(path)
            assert_error(r, 401, "unauthorized", "Bearer")
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert c.get("/metadata", headers={"authorization": "Bearer wrong"}).status_code == 401
        good = {"authorization": "Bearer s3cret"}
        assert c.get("/metadata", headers=good).status_code == 200
        r = c.post("/classify", content=PNG, headers={**good, "content-type": "image/png"})
        assert r.status_code == 200
        schema = c.get("/openapi.json", headers=good).json()
        assert schema["paths"]["/classify"]["post"]["security"] == [{"bearer": []}]
        assert schema["paths"]["/health/ready"]["get"]["security"] == []


def test_readiness_waits_for_loading_and_warmup():
    with TestClient(slow_app(seconds=0.3, load_seconds=1.0)) as c:
        r = c.get("/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "not_ready"
        assert c.get("/health/live").status_code == 200
        assert_error(c.post("/classify", content=PNG, headers={"content-type": "image/png"}), 503, "not_ready")
        assert "vggserve_ready 0.0" in c.get("/metrics").text
        wait_ready(c)
        model_batches = c.get("/metadata").json()["devices"][0]["batches"]
        assert model_batches == 0  # the warm-up batch ran before readiness and is not counted
        assert "vggserve_ready 1.0" in c.get("/metrics").text


def test_the_only_worker_dead_turns_readiness_503_and_requests_get_a_clear_error():
    with TestClient(slow_app(fail_after=1)) as c:  # the warm-up batch is the one that succeeds
        wait_ready(c)
        r = c.post("/classify", content=PNG, headers={"content-type": "image/png"})
        assert_error(r, 500, "inference_failed", "simulated device failure")
        ready = c.get("/health/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "worker_failed"
        assert_error(c.post("/classify", content=PNG, headers={"content-type": "image/png"}), 503, "no_workers")
        assert c.get("/health/live").status_code == 503


def test_one_worker_per_device_and_batches_larger_than_one_under_concurrency():
    models = []

    def factory(device):
        models.append(SlowModel(device, 0.15, 4))
        return models[-1]

    app = create_app(Settings(devices=("cpu:0", "cpu:1"), max_batch_size=4, max_wait_ms=50), model_factory=factory)
    with TestClient(app) as c:
        wait_ready(c)
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda _: c.post("/classify", content=PNG,
                                                      headers={"content-type": "image/png"}).status_code, range(16)))
        assert statuses == [200] * 16
        served = [m.batch_sizes[1:] for m in models]  # after the warm-up batch
        assert all(served), f"each device took work: {served}"
        assert max(max(s) for s in served) > 1
        text = c.get("/metrics").text
        assert 'vggserve_batch_size_bucket{le="1.0"}' in text
        count = float(text.split("vggserve_batch_size_count ")[1].split()[0])
        assert count < 16  # 16 images in fewer batches
        assert c.get("/metadata").json()["devices"][1]["spec"] == "cpu:1"


def test_full_queue_answers_429_with_retry_after_at_once():
    with TestClient(slow_app(seconds=0.6, max_batch_size=1, max_queue=2, max_files=2)) as c:
        wait_ready(c)

        def post(_):
            r = c.post("/classify", content=PNG, headers={"content-type": "image/png"})
            return r, time.monotonic()

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(post, range(6)))
        refused = [(r, t) for r, t in results if r.status_code == 429]
        assert len(refused) >= 2, [r.status_code for r, _ in results]
        first_done = min(t for r, t in results if r.status_code == 200)
        for r, finished in refused:
            assert_error(r, 429, "queue_full", "retry", "--max-queue 2")
            assert r.headers["retry-after"] == "1"
            assert finished < first_done  # at once, not after the device frees up
        assert {r.status_code for r, _ in results} <= {200, 429}
        assert 'vggserve_rejected_total{reason="queue_full"}' in c.get("/metrics").text


def test_deadline_passing_in_the_queue_is_504_and_the_image_is_not_computed():
    models = []

    def factory(device):
        models.append(SlowModel(device, 0.8, 1))
        return models[-1]

    app = create_app(Settings(max_batch_size=1, max_wait_ms=0), model_factory=factory)
    with TestClient(app) as c:
        wait_ready(c)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(lambda: (c.post("/classify", content=PNG, headers={"content-type": "image/png"}),
                                         time.monotonic()))
            end = time.monotonic() + 10
            while len(models[0].batch_sizes) < 2 and time.monotonic() < end:  # until the first is on the device
                time.sleep(0.01)
            late = c.post("/classify", content=PNG, headers={"content-type": "image/png",
                                                              "x-request-timeout-ms": "200"})
            late_done = time.monotonic()
            response, first_done = first.result()
            assert response.status_code == 200
        assert_error(late, 504, "deadline_exceeded", "not computed")
        assert late_done < first_done  # answered at its deadline, not after the device freed up
        time.sleep(0.1)
        assert models[0].batch_sizes == [1, 1]  # warm-up and the first request only
        assert "vggserve_timeouts_total 1.0" in c.get("/metrics").text


def test_metadata_and_metrics_describe_the_service(client):
    meta = client.get("/metadata").json()
    assert meta["model"] == "vgg16" and meta["labels"] == 1000
    assert meta["input"]["shape"] == [3, 224, 224]
    assert meta["devices"][0]["state"] == "ready" and meta["max_batch_size"] == 4
    assert set(meta["weights"]) == {"path", "format", "sha256"}
    client.post("/classify", content=PNG, headers={"content-type": "image/png"})
    text = client.get("/metrics").text
    for name in ("vggserve_requests_total", "vggserve_queue_seconds_bucket", "vggserve_preprocess_seconds_bucket",
                 "vggserve_inference_seconds_bucket", "vggserve_request_seconds_bucket", "vggserve_batch_size_bucket",
                 "vggserve_queue_length", "vggserve_timeouts_total", "vggserve_ready"):
        assert name in text, name
    assert 'vggserve_requests_total{endpoint="/classify",status="200"} 1.0' in text


def test_openapi_documents_every_endpoint_parameter_and_error(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    assert set(paths) >= {"/classify", "/classify/batch", "/health/live", "/health/ready", "/metadata", "/metrics"}
    classify = paths["/classify"]["post"]
    assert {p["name"] for p in classify["parameters"]} == {"top_k", "x-request-timeout-ms"}
    assert set(classify["requestBody"]["content"]) == {"multipart/form-data", "image/*", "application/octet-stream"}
    for status in ("400", "413", "415", "422", "429", "503", "504"):
        assert classify["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorBody")
    assert client.get("/docs").status_code == 200
    v2 = {p for p in paths if p.startswith("/v2")}
    assert {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model}", "/v2/models/{model}/infer",
            "/v2/models/{model}/versions/{version}/infer", "/v2/models/{model}/config"} <= v2
    infer = paths["/v2/models/{model}/infer"]["post"]
    for status in ("400", "404", "429", "503", "504"):
        assert infer["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("V2Error")


def test_draining_refuses_new_requests_and_flips_readiness(client):
    client.app.state.service.drain.begin()
    ready = client.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert_error(client.post("/classify", content=PNG, headers={"content-type": "image/png"}), 503, "draining")
    assert 'vggserve_rejected_total{reason="draining"} 1.0' in client.get("/metrics").text


def test_an_unexpected_error_is_a_500_in_our_shape_with_the_request_id_in_the_header_and_the_log(caplog):
    app = slow_app()

    async def broken():
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        app.state.service.describe = broken
        with caplog.at_level("ERROR", logger="vggserve.serving"):
            r = client.get("/metadata", headers={"X-Request-ID": "trace-500"})
        assert_error(r, 500, "internal_error", "logged")
        assert r.headers["x-request-id"] == "trace-500"  # so the client can quote it and the log be searched
        logged = [record for record in caplog.records if "unexpected error" in record.getMessage()]
        assert [record.request_id for record in logged] == ["trace-500"]
        metrics = client.get("/metrics").text
    assert 'vggserve_requests_total{endpoint="/metadata",status="500"} 1.0' in metrics
