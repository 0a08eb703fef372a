"""What a server in this ecosystem is expected to do around its protocols: X-Request-ID carried to the answer and
the logs, CORS off by default and on with --cors-origin, and API docs that work offline (issue 12, item 4)."""

import logging
import re

from fastapi.testclient import TestClient

from test_http_api import PNG, slow_app, wait_ready

IMAGE = {"content-type": "image/png"}


def test_a_clients_request_id_comes_back_in_the_header_the_body_and_the_logs(caplog):
    with TestClient(slow_app()) as client:
        wait_ready(client)
        with caplog.at_level(logging.DEBUG, logger="vggserve.requests"):
            r = client.post("/classify", content=PNG, headers={**IMAGE, "X-Request-ID": "trace-42/a"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42/a" == r.json()["request_id"]
        assert any(getattr(rec, "request_id", None) == "trace-42/a" and "/classify" in rec.getMessage()
                   for rec in caplog.records), [vars(rec) for rec in caplog.records]
        batch = client.post("/classify/batch", files={"files": ("a.png", PNG, "image/png")},
                            headers={"X-Request-ID": "batch-1"})
        assert batch.headers["x-request-id"] == "batch-1" == batch.json()["request_id"]
        v2 = client.get("/v2/models/vgg16", headers={"X-Request-ID": "meta-9"})
        assert v2.headers["x-request-id"] == "meta-9"


def test_a_request_id_is_generated_when_absent_or_unusable():
    with TestClient(slow_app()) as client:
        wait_ready(client)
        for headers in ({}, {"X-Request-ID": "has spaces in it"}, {"X-Request-ID": "x" * 200}):
            r = client.post("/classify", content=PNG, headers={**IMAGE, **headers})
            assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), r.headers
            assert r.json()["request_id"] == r.headers["x-request-id"]
        refused = client.post("/classify", content=b"", headers={**IMAGE, "X-Request-ID": "empty-1"})
        assert refused.status_code == 400 and refused.headers["x-request-id"] == "empty-1"


def test_generated_request_ids_are_unique_within_a_process_and_across_a_fork():
    """Ids are a random prefix per process and a counter (no getrandom call per request; issue 24)."""
    import os

    from vggserve.serving.web.request_id import new_id

    ids = [new_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a process of its own, so ids of its own
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child[:16] != ids[0][:16] and child not in ids


def test_log_lines_name_the_request_they_belong_to():
    from vggserve.serving.web.request_id import current

    logger = logging.getLogger("vggserve.serving")
    assert logger.makeRecord(logger.name, logging.INFO, __file__, 1, "outside", None, None).request_id == "-"
    token = current.set("abc")
    try:
        assert logger.makeRecord(logger.name, logging.INFO, __file__, 1, "inside", None, None).request_id == "abc"
    finally:
        current.reset(token)


PREFLIGHT = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type"}


def test_cors_is_off_by_default():
    with TestClient(slow_app()) as client:
        wait_ready(client)
        r = client.options("/classify", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in r.headers
        r = client.get("/metadata", headers={"Origin": "https://app.example.com"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_origin_lets_that_origin_in_even_with_an_api_key():
    with TestClient(slow_app(cors_origins=("https://app.example.com",), api_key="k3y")) as client:
        wait_ready(client)
        r = client.options("/classify", headers=PREFLIGHT)  # a browser's preflight carries no key
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
        r = client.post("/classify", content=PNG, headers={**IMAGE, "Origin": "https://app.example.com",
                                                          "Authorization": "Bearer k3y"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        other = client.options("/classify", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"


def test_a_refused_preflight_is_our_json_error_with_the_request_id():
    """Issue 22, item 18: it was Starlette's `400 Disallowed CORS origin` in text/plain, without X-Request-ID."""
    with TestClient(slow_app(cors_origins=("https://app.example.com",))) as client:
        wait_ready(client)
        r = client.options("/classify", headers={**PREFLIGHT, "Origin": "https://evil.example",
                                                 "X-Request-ID": "cors-1"})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert r.headers["x-request-id"] == "cors-1"
        assert r.json()["error"]["code"] == "cors_refused"
        assert "evil.example" in r.json()["error"]["message"] and "--cors-origin" in r.json()["error"]["message"]
        method = client.options("/v2/models/vgg16/infer", headers={**PREFLIGHT, "Access-Control-Request-Method":
                                                                   "DELETE"})
        assert method.status_code == 400 and "method" in method.json()["error"]  # v2's shape under /v2
        assert "x-request-id" in method.headers


def test_cors_origin_flag_and_its_check():
    import pytest

    from vggserve.cli import build_parser, serve
    from vggserve.serving.settings import Settings, SettingsError

    args = build_parser().parse_args(["serve", "--cors-origin", "https://a.example", "--cors-origin", "*"])
    assert serve._settings(args).cors_origins == ("https://a.example", "*")
    assert serve._settings(build_parser().parse_args(["serve"])).cors_origins == ()
    with pytest.raises(SettingsError, match="--cors-origin"):
        Settings(cors_origins=("app.example.com",))


def test_docs_load_every_asset_from_the_server_itself():
    """/docs references no CDN: its script and stylesheet are served by the app (issue 12, item 4); a headless
    browser renders it in test_docs_browser."""
    with TestClient(slow_app()) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
        assert assets and not [a for a in assets if a.startswith(("http:", "https:", "//"))], assets
        for asset in assets:
            r = client.get(asset)
            assert r.status_code == 200 and len(r.content) > 1000, asset
        assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
        assert client.get("/redoc").status_code == 200


GET_PATHS = ["/health/live", "/health/ready", "/metadata", "/metrics", "/docs", "/redoc", "/openapi.json", "/v2",
             "/v2/health/live", "/v2/health/ready", "/v2/models/vgg16", "/v2/models/vgg16/versions/1/ready",
             "/v2/models/vgg16/config", "/v2/models/stats"]


def test_head_answers_every_get_endpoint_like_get_without_a_body():
    """Issue 22, item 8: load balancers and uptime probes send HEAD; it was 405."""
    with TestClient(slow_app()) as client:
        wait_ready(client)
        for path in GET_PATHS:
            head, get = client.head(path), client.get(path)
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"], path
            assert "x-request-id" in head.headers
        assert int(client.head("/health/live").headers["content-length"]) == len(client.get("/health/live").content)
        not_get = client.head("/classify")  # a POST endpoint: still 405
        assert not_get.status_code == 405 and not_get.headers["allow"] == "POST"
        assert client.head("/nowhere").status_code == 404
        with TestClient(slow_app(api_key="k3y")) as keyed:
            assert keyed.head("/health/live").status_code == 200
            assert keyed.head("/metadata").status_code == 401
