"""The hot routes' adapter (issue 24, item A): POST /classify and v2 infer of plain requests answered ahead of
FastAPI's per-request machinery, with the same answers (status, headers in order, body) the FastAPI routes give;
the raw-body upload; and the one-row top-k both routes use."""

import base64
import gzip
import io
import json
import socket
import struct

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vggserve.serving.app import create_app
from vggserve.serving.metrics import Metrics
from vggserve.serving.web.frontend_header import FrontendHeaderMiddleware
from vggserve.serving.protocols import classify as classify_module
from vggserve.serving.protocols import hotpath
from vggserve.serving.protocols.answers import predictions, top_k_row
from vggserve.serving.web import lane as lane_module
from vggserve.serving.service import Service
from vggserve.serving.settings import Settings
from vggserve.testing.backends import InstantBackend
from vggserve.predictions import top_k

KEY = "k3y"
ORIGIN = "https://app.example.com"
MAX_BODY = 4096


def jpeg_bytes(size=(64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (30, 120, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


JPEG = jpeg_bytes()


class DecodingBackend(InstantBackend):
    """The instant backend, with the service's own decode refusals (a body that is not an image is 400)."""

    async def prepare(self, data: bytes):
        from vggserve.serving.scheduling.imaging import decode_and_crop

        crop, _ = decode_and_crop(data, "torchvision", self.settings.max_pixels)
        return crop, 0.0


def instant_app(cors_origins=(ORIGIN,), **settings):
    """The front end's app (API key, CORS unless told, X-Vggserve-Frontend) over a backend that answers at once."""
    s = Settings(devices=("cpu",), api_key=KEY, cors_origins=cors_origins, max_body_bytes=MAX_BODY, **settings)
    metrics = Metrics()
    app = create_app(s, service=Service(s, backend=DecodingBackend(s, metrics), metrics=metrics))
    app.add_middleware(FrontendHeaderMiddleware, value="4242")
    return app


@pytest.fixture
def client(monkeypatch):
    # the one thing that differs between two answers to the same request: the time it took
    monkeypatch.setattr(classify_module, "_timing", lambda result, started: {"queue": 0.0, "preprocess": 0.0,
                                                                             "inference": 0.0, "total": 1.5})
    app = instant_app()
    with TestClient(app) as c:
        c.app_under_test = app
        yield c


@pytest.fixture
def hot_calls(monkeypatch):
    """How many requests the adapter answered."""
    calls = []
    answer = hotpath.HotRoute.__call__

    async def counted(self, scope, receive, send):
        calls.append(scope["path"])
        await answer(self, scope, receive, send)

    monkeypatch.setattr(hotpath.HotRoute, "__call__", counted)
    return calls


def headers(**extra) -> dict:
    return {"authorization": f"Bearer {KEY}", "origin": ORIGIN, "x-request-id": "same-id", **extra}


def v2_binary(image: bytes, **params) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": 4 + len(image)}}],
                       "outputs": [{"name": "probabilities", "parameters": {"classification": 3, **params}}]}
                      ).encode()
    return head + struct.pack("<I", len(image)) + image, headers(**{
        "content-type": "application/octet-stream", "inference-header-content-length": str(len(head))})


def v2_json(image: bytes, model: str = "vgg16") -> dict:
    return {"url": f"/v2/models/{model}/infer", "headers": headers(**{"content-type": "application/json"}),
            "content": json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                               "data": [base64.b64encode(image).decode()]}]}).encode()}


def oversize_chunks():
    for _ in range(4):
        yield b"\xff" * 2048


BODY, V2_HEADERS = v2_binary(JPEG)
REQUESTS = {
    "raw jpeg": {"url": "/classify", "content": JPEG, "headers": headers(**{"content-type": "image/jpeg"})},
    "raw octet-stream, top_k=3": {"url": "/classify?top_k=3", "content": JPEG,
                                  "headers": headers(**{"content-type": "application/octet-stream"})},
    "raw with a deadline": {"url": "/classify", "content": JPEG,
                            "headers": headers(**{"content-type": "image/jpeg", "x-request-timeout-ms": "5000"})},
    "multipart": {"url": "/classify", "files": {"file": ("a.jpg", JPEG, "image/jpeg")}, "headers": headers()},
    "gzip body": {"url": "/classify", "content": gzip.compress(JPEG),
                  "headers": headers(**{"content-type": "image/jpeg", "content-encoding": "gzip"})},
    "wrong content type": {"url": "/classify", "content": JPEG, "headers": headers(**{"content-type": "text/plain"})},
    "empty body": {"url": "/classify", "content": b"", "headers": headers(**{"content-type": "image/jpeg"})},
    "not an image": {"url": "/classify", "content": b"just text", "headers": headers(**{"content-type": "image/png"})},
    "oversize": {"url": "/classify", "content": b"\xff" * (MAX_BODY + 1),
                 "headers": headers(**{"content-type": "image/jpeg"})},
    "oversize, chunked": {"url": "/classify", "content": oversize_chunks(),
                          "headers": headers(**{"content-type": "image/jpeg"})},
    "no API key": {"url": "/classify", "content": JPEG,
                   "headers": {"content-type": "image/jpeg", "origin": ORIGIN, "x-request-id": "same-id"}},
    "v2 binary": {"url": "/v2/models/vgg16/infer", "content": BODY, "headers": V2_HEADERS},
    "v2 binary, version 1": {"url": "/v2/models/vgg16/versions/1/infer", "content": BODY, "headers": V2_HEADERS},
    "v2 json": v2_json(JPEG),
    "v2 unknown model": v2_json(JPEG, model="resnet"),
    "v2 unknown version": {"url": "/v2/models/vgg16/versions/2/infer", "content": BODY, "headers": V2_HEADERS},
    "v2 not json": {"url": "/v2/models/vgg16/infer", "content": b"{", "headers": headers()},
    "v2 not an image": {"url": "/v2/models/vgg16/infer", "content": v2_binary(b"just text")[0],
                        "headers": v2_binary(b"just text")[1]},
}


ANSWERED_BY_MIDDLEWARE = {"oversize", "no API key"}  # refused from the headers alone, before any route


def answer(client, request: dict) -> tuple[int, list, bytes]:
    request = dict(request)
    if callable(getattr(request.get("content"), "__next__", None)):
        request["content"] = oversize_chunks()  # a generator is spent once sent
    r = client.post(**request)
    return r.status_code, r.headers.multi_items(), r.content


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_adapter_answers_as_the_fastapi_route_does(client, hot_calls, name):
    app = client.app_under_test
    app.hot_routes = False
    by_fastapi = answer(client, REQUESTS[name])
    assert hot_calls == []
    app.hot_routes = True
    by_adapter = answer(client, REQUESTS[name])
    assert len(hot_calls) == (name not in ANSWERED_BY_MIDDLEWARE), "the adapter did not take the request"
    assert by_adapter == by_fastapi
    assert ("x-vggserve-frontend", "4242") in by_adapter[1] and ("x-request-id", "same-id") in by_adapter[1]


def test_raw_body_uploads_are_classified_and_refused_in_our_shape(client, hot_calls):
    for media in ("image/jpeg", "image/png", "application/octet-stream"):  # the bytes decide, not the type
        r = client.post("/classify?top_k=2", content=JPEG, headers=headers(**{"content-type": media}))
        assert r.status_code == 200, r.text
        assert [set(p) for p in r.json()["predictions"]] == [{"index", "label", "probability"}] * 2
    wrong = client.post("/classify", content=JPEG, headers=headers(**{"content-type": "text/plain"}))
    assert wrong.status_code == 415 and wrong.headers["content-type"] == "application/json"
    assert wrong.json()["error"]["code"] == "unsupported_media_type" and "text/plain" in wrong.text
    empty = client.post("/classify", content=b"", headers=headers(**{"content-type": "image/jpeg"}))
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_body"
    big = client.post("/classify", content=b"\xff" * (MAX_BODY + 1), headers=headers(**{"content-type": "image/jpeg"}))
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    assert big.headers["connection"] == "close"
    assert len(hot_calls) == 3 + 2  # the 413 is answered from Content-Length, before any route


def test_v2_binary_upload_through_the_adapter(client, hot_calls):
    body, sent = v2_binary(JPEG)
    r = client.post("/v2/models/vgg16/infer", content=body, headers=sent)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["name"] == "probabilities" and out["datatype"] == "BYTES" and out["shape"] == [1, 3]
    assert hot_calls == ["/v2/models/vgg16/infer"]


@pytest.mark.parametrize("method, path, query, timeout, taken", [
    ("POST", "/classify", b"", None, True),
    ("POST", "/classify", b"top_k=1000", b"600000", True),
    ("POST", "/classify", b"top_k=05", None, False),  # FastAPI reads it as 5: its answer, not a guess
    ("POST", "/classify", b"top_k=0", None, False),  # out of range: FastAPI's 422
    ("POST", "/classify", b"top_k=1001", None, False),
    ("POST", "/classify", b"top_k=3&debug=1", None, False),
    ("POST", "/classify", b"", b"0", False),
    ("POST", "/classify", b"", b"600001", False),
    ("POST", "/classify/", b"", None, False),
    ("GET", "/classify", b"", None, False),
    ("POST", "/classify/batch", b"", None, False),
    ("POST", "/v2/models/vgg16/infer", b"", None, True),
    ("POST", "/v2/models/vgg16/versions/1/infer", b"", None, True),
    ("POST", "/v2/models/vgg16/versions//infer", b"", None, False),
    ("POST", "/v2/models/vgg16/ready/infer", b"", None, False),
])
def test_the_adapter_takes_only_plain_requests(method, path, query, timeout, taken):
    headers = [(b"host", b"x")] + ([(b"x-request-timeout-ms", timeout)] if timeout is not None else [])
    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": headers}
    assert (hotpath.hot_call(scope) is not None) == taken
    twice = {**scope, "headers": [*headers, (b"x-request-timeout-ms", b"10")]}
    if taken and path == "/classify" and timeout is not None:
        assert hotpath.hot_call(twice) is None  # the header twice: FastAPI's to decide


def test_one_row_top_k_is_the_stable_sort_of_the_scores():
    rng = np.random.default_rng(0)
    rows = [rng.random(1000, dtype=np.float32), np.full(1000, 0.001, np.float32),
            np.round(rng.random(1000), 2).astype(np.float32), rng.standard_normal(1000).astype(np.float32)]
    with_nan = rows[0].copy()
    with_nan[[3, 500]] = np.nan
    with_inf = rows[0].copy()
    with_inf[[7, 9]], with_inf[[1, 2]] = -np.inf, np.inf
    rows += [with_nan, with_inf, np.full(1000, -np.inf, np.float32)]
    for row in rows:
        for k in (1, 2, 5, 16, 17, 100, 999, 1000):
            assert top_k_row(row, k).tolist() == np.argsort(-row, kind="stable")[:k].tolist(), k
    for k in (1, 5, 1000):
        assert predictions(rows[2], k) == top_k(rows[2], k)[0]


# the lane (web.lane): the middlewares fused into one for plain requests, on an app without CORS --------------------

def lane_app(**settings):
    """The front end's app without CORS origins (with them, every request goes through the middlewares), with an
    API key and X-Vggserve-Frontend."""
    return instant_app(cors_origins=(), **settings)


@pytest.fixture
def same_timing(monkeypatch):
    monkeypatch.setattr(classify_module, "_timing", lambda result, started: {"queue": 0.0, "preprocess": 0.0,
                                                                             "inference": 0.0, "total": 1.5})


@pytest.fixture
def lane_calls(monkeypatch):
    """The paths of the requests the lane answered."""
    calls = []
    answer_in_lane = lane_module.Lane.answer

    async def counted(self, scope, *args):
        calls.append(scope["path"])
        await answer_in_lane(self, scope, *args)

    monkeypatch.setattr(lane_module.Lane, "answer", counted)
    return calls


# refused from the headers by a middleware, or chunked: through the middlewares themselves
NOT_IN_LANE = {"oversize", "oversize, chunked", "no API key"}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_lane_answers_as_the_middlewares_and_fastapi_do(same_timing, lane_calls, name):
    app = lane_app()
    with TestClient(app) as client:
        app.hot_routes = False
        by_fastapi = answer(client, REQUESTS[name])
        app.hot_routes, app.lane = True, False
        by_middlewares = answer(client, REQUESTS[name])
        assert lane_calls == []
        app.lane = True
        by_lane = answer(client, REQUESTS[name])
    assert len(lane_calls) == (name not in NOT_IN_LANE), "the lane did not take a plain request"
    assert by_lane == by_middlewares == by_fastapi
    assert ("x-vggserve-frontend", "4242") in by_lane[1] and ("x-request-id", "same-id") in by_lane[1]


def counted_samples(metrics: Metrics) -> dict:
    """The metrics' samples that count (not the seconds summed, which differ run to run)."""
    return {k: v for k, v in metrics.samples().items() if not k[0].endswith("_sum") and not k[0].endswith("_created")
            and "_seconds_bucket" not in k[0]}


def test_the_lane_counts_in_the_metrics_what_the_middlewares_count(same_timing, lane_calls):
    counted = {}
    for lane in (False, True):
        app = lane_app()
        app.lane = lane
        with TestClient(app) as client:
            for request in REQUESTS.values():
                answer(client, request)
            counted[lane] = counted_samples(app.state.service.metrics)
    assert len(lane_calls) == len(REQUESTS) - len(NOT_IN_LANE)
    assert counted[True] == counted[False]
    ok = ("vggserve_requests_total", ("endpoint", "/classify"), ("status", "200"))
    assert counted[True][ok] == 5  # raw (3), multipart, gzip


def test_the_lane_makes_a_new_request_id_as_the_middleware_does(lane_calls):
    app = lane_app()
    with TestClient(app) as client:
        for given in ("", "has spaces", "x" * 129):
            sent = {**REQUESTS["raw jpeg"]["headers"], "x-request-id": given}
            r = client.post("/classify", content=JPEG, headers=sent)
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            assert len(rid) == 32 and rid != given and r.json()["request_id"] == rid
    assert len(lane_calls) == 3


def test_while_draining_the_lane_leaves_the_refusal_to_the_middleware(lane_calls):
    app = lane_app()
    with TestClient(app) as client:
        app.state.service.drain.begin(announce=False)
        r = client.post(**REQUESTS["raw jpeg"])
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "draining"
    assert lane_calls == []


def test_with_cors_origins_there_is_no_lane(client, lane_calls):
    # CORS adds `Vary: Origin` to every answer, Origin sent or not: the middlewares answer everything
    r = client.post("/classify", content=JPEG, headers={"authorization": f"Bearer {KEY}",
                                                        "content-type": "image/jpeg"})
    assert r.status_code == 200 and r.headers["vary"] == "Origin"
    assert lane_calls == [] and client.app_under_test._lane is None


def test_an_unexpected_error_in_the_lane_is_the_middlewares_500(same_timing, lane_calls, monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(classify_module, "predictions", broken)
    answers = []
    for lane in (False, True):
        app = lane_app()
        app.lane = lane
        with TestClient(app, raise_server_exceptions=False) as client:
            answers.append(answer(client, REQUESTS["raw jpeg"]))
    assert answers[0] == answers[1] and answers[1][0] == 500
    assert json.loads(answers[1][2])["error"]["code"] == "internal_error"
    assert len(lane_calls) == 1


# under a real uvicorn: the bytes on the wire, head and body written at once ---------------------------------------

def raw_request(name: str, connection: str = "keep-alive") -> bytes:
    request = REQUESTS[name]
    body = request["content"]
    head = [f"POST {request['url']} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}",
            f"Connection: {connection}", *(f"{k}: {v}" for k, v in request["headers"].items())]
    return "\r\n".join([*head, "", ""]).encode() + body


def read_answer(stream) -> bytes:
    """One HTTP answer from `stream` (a socket's file), its Date header's value masked."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = stream.readline()
        assert line, "the connection closed before the answer's head"
        head += b"date: <masked>\r\n" if line.lower().startswith(b"date:") else line
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + stream.read(length)


WIRE = ["raw jpeg", "raw octet-stream, top_k=3", "wrong content type", "not an image", "empty body", "v2 binary",
        "v2 not json"]


def test_on_the_wire_the_lane_answers_byte_for_byte_as_the_middlewares_in_one_write(same_timing, lane_calls,
                                                                                      monkeypatch):
    from test_http_connections import serving

    from vggserve.serving.web import connection

    whole = []
    send_whole = connection.send_whole

    async def counted(cycle, start, body):
        whole.append(start["status"])
        await send_whole(cycle, start, body)

    monkeypatch.setattr(lane_module, "send_whole", counted)
    app = lane_app()
    seen = {}
    with serving(app) as port:
        for lane in (False, True):
            app.lane = lane
            for name in WIRE:  # a connection each: an answer before the whole body closes it
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(raw_request(name))
                    seen[lane, name] = read_answer(s.makefile("rb"))
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:  # the server closes after it
                s.sendall(raw_request("raw jpeg", "close"))
                stream = s.makefile("rb")
                seen[lane, "close"] = read_answer(stream)
                assert stream.read() == b""
    for name in [*WIRE, "close"]:
        assert seen[True, name] == seen[False, name], name
    assert b"\r\nx-request-id: same-id\r\nx-vggserve-frontend: 4242\r\n" in seen[True, "raw jpeg"]
    assert b"connection: close" in seen[True, "close"]
    assert len(lane_calls) == len(whole) == len(WIRE) + 1  # every answer of the lane in one write


class Transport:
    """What a response cycle writes, write by write."""

    def __init__(self):
        self.writes, self.closed = [], False

    def write(self, data):
        assert not self.closed
        self.writes.append(bytes(data))

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed


def cycle_on(transport, keep_alive: bool):
    import asyncio

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    return RequestResponseCycle(scope={"method": "POST"}, transport=transport, flow=FlowControl(transport),
                                logger=None, access_logger=None, access_log=False,
                                default_headers=[(b"date", b"today")], message_event=asyncio.Event(),
                                expect_100_continue=False, keep_alive=keep_alive, on_response=lambda: None)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_send_whole_writes_what_two_sends_write_in_one_write(keep_alive):
    import asyncio

    from vggserve.serving.web.connection import joinable, send_whole

    def messages():
        return ({"type": "http.response.start", "status": 200,
                 "headers": [(b"content-length", b"2"), (b"content-type", b"application/json")]},
                {"type": "http.response.body", "body": b"{}"})

    async def both():
        apart, whole = Transport(), Transport()
        cycle = cycle_on(apart, keep_alive)
        for message in messages():
            await cycle.send(message)
        joined = cycle_on(whole, keep_alive)
        assert joinable(joined.send) is joined and joinable(lambda message: None) is None
        await send_whole(joined, *messages())
        return apart, whole, joined

    apart, whole, joined = asyncio.run(both())
    assert len(apart.writes) == 2 and whole.writes == [b"".join(apart.writes)]
    assert whole.closed == apart.closed == (not keep_alive) and joined.transport is whole and joined.response_complete


RAW_VARIANTS = {
    "image/jpeg": [("content-type", "image/jpeg")],
    "with parameters, upper case": [("content-type", " IMAGE/PNG ; q=1")],
    "octet-stream": [("content-type", "application/octet-stream")],
    "text/plain": [("content-type", "text/plain")],
    "no content type": [],
    "two content types, the first counts": [("content-type", "text/plain"), ("content-type", "image/jpeg")],
    "identity coding": [("content-type", "image/jpeg"), ("content-encoding", "identity")],
    "gzip coding": [("content-type", "image/jpeg"), ("content-encoding", "gzip")],
    "an unknown coding": [("content-type", "image/jpeg"), ("content-encoding", "br")],
}


@pytest.mark.parametrize("name", list(RAW_VARIANTS))
@pytest.mark.parametrize("body", [JPEG, b"", b"not an image"], ids=["jpeg", "empty", "text"])
def test_a_raw_upload_read_the_short_way_is_answered_as_the_long_way(same_timing, monkeypatch, name, body):
    from vggserve.serving.protocols import uploads

    if body and "gzip" in name:
        body = gzip.compress(body)
    sent = [*RAW_VARIANTS[name], ("authorization", f"Bearer {KEY}"), ("x-request-id", "same-id")]
    app = lane_app()
    answers = []
    with TestClient(app) as client:
        for short in (True, False):
            if not short:
                monkeypatch.setattr(uploads, "_plain_raw", lambda scope: False)
            r = client.post("/classify", content=body, headers=sent)
            answers.append((r.status_code, r.headers.multi_items(), r.content))
    assert answers[0] == answers[1]


def multipart_of(*parts: bytes, boundary: str = "b0undary", end: bytes = b"--\r\n", before: bytes = b"") -> bytes:
    joined = b"".join(b"--%s\r\n%s\r\n" % (boundary.encode(), part) for part in parts)
    return before + joined + b"--" + boundary.encode() + end


def file_part(data: bytes, disposition: bytes = b'form-data; name="file"; filename="a.jpg"',
              extra: bytes = b"Content-Type: image/jpeg\r\n") -> bytes:
    return b"Content-Disposition: " + disposition + b"\r\n" + extra + b"\r\n" + data


MULTIPART_VARIANTS = {  # (body, Content-Type); the short way takes the first ones, the parser judges the others
    "one file": (multipart_of(file_part(JPEG)), None),
    "one file, no part content type": (multipart_of(file_part(JPEG, extra=b"")), None),
    "lower-case part header": (multipart_of(file_part(JPEG).replace(b"Content-Disposition", b"content-disposition")),
                               None),
    "data holding a near-boundary": (multipart_of(file_part(JPEG + b"\r\n--b0undarX\r\n--b0undar")), None),
    "a file name of utf-8": (multipart_of(file_part(JPEG, b'form-data; name="file"; filename="\xc3\xa9t\xc3\xa9.jpg"')),
                             None),
    "a quoted boundary": (multipart_of(file_part(JPEG)), 'multipart/form-data; boundary="b0undary"'),
    "a charset": (multipart_of(file_part(JPEG)), "multipart/form-data; boundary=b0undary; charset=latin-1"),
    "an empty file": (multipart_of(file_part(b"")), None),
    "two files": (multipart_of(file_part(JPEG), file_part(JPEG)), None),
    "a file and a field": (multipart_of(file_part(JPEG), b'Content-Disposition: form-data; name="x"\r\n\r\n1'), None),
    "a text field named file": (multipart_of(b'Content-Disposition: form-data; name="file"\r\n\r\nhello'), None),
    "another field name": (multipart_of(file_part(JPEG, b'form-data; name="image"; filename="a.jpg"')), None),
    "a file name with a path": (multipart_of(file_part(JPEG, b'form-data; name="file"; filename="C:\\\\x\\\\a.jpg"')),
                                None),
    "filename*": (multipart_of(file_part(JPEG, b"form-data; name=\"file\"; filename*=UTF-8''a.jpg")), None),
    "two dispositions": (multipart_of(file_part(JPEG, extra=b'Content-Disposition: form-data; name="y"\r\n')), None),
    "a preamble": (multipart_of(file_part(JPEG), before=b"hello\r\n"), None),
    "an epilogue": (multipart_of(file_part(JPEG), end=b"--\r\nbye"), None),
    "no last line end": (multipart_of(file_part(JPEG), end=b"--"), None),
    "no end": (multipart_of(file_part(JPEG))[:-12], None),
    "a wrong boundary": (multipart_of(file_part(JPEG), boundary="other"), None),
    "not multipart at all": (b"just text", None),
    "not an image": (multipart_of(file_part(b"just text")), None),
}
SHORT = {"one file", "one file, no part content type", "lower-case part header", "data holding a near-boundary",
         "a file name of utf-8", "not an image"}


@pytest.mark.parametrize("name", list(MULTIPART_VARIANTS))
def test_a_multipart_upload_read_the_short_way_is_answered_as_the_parser_answers(same_timing, monkeypatch, name):
    """A multipart upload of one file is read without Starlette's parser when its body is of the plain shape and
    came in one piece; the answer (and, read directly, the upload and its file name) is the parser's, whatever the
    body."""
    import asyncio

    from starlette.requests import Request

    from vggserve.serving.protocols import uploads
    from vggserve.serving.protocols.errors import ApiError

    body, media = MULTIPART_VARIANTS[name]
    media = media or "multipart/form-data; boundary=b0undary"
    short = []
    one_file = uploads._one_file
    monkeypatch.setattr(uploads, "_one_file", lambda *args: short.append(one_file(*args)) or short[-1])

    async def read(pieces):
        scope = {"type": "http", "app": None, "method": "POST", "path": "/classify", "query_string": b"", "headers": [
            (b"content-type", media.encode()), (b"content-length", str(len(body)).encode())]}
        messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
                    for i, p in enumerate(pieces)]

        async def receive():
            return messages.pop(0)

        try:
            upload = await uploads.read_single(Request(scope, receive), 1 << 20)
            return upload.filename, upload.data
        except ApiError as exc:
            return exc.status, exc.code, exc.message

    whole = asyncio.run(read([body]))
    in_pieces = asyncio.run(read([body[:100], body[100:]]))  # the parser reads it: the same
    taken = [u for u in short if u is not None]
    monkeypatch.setattr(uploads, "_plain_multipart", lambda scope: None)
    by_parser = asyncio.run(read([body]))
    assert whole == in_pieces == by_parser
    assert len(taken) == (name in SHORT)
    answers = []
    with TestClient(lane_app()) as client:
        for way in ("short", "parser"):
            if way == "short":
                monkeypatch.setattr(uploads, "_plain_multipart", uploads.__dict__["_plain_multipart"])
            r = client.post("/classify", content=body, headers={**headers(), "content-type": media})
            answers.append((r.status_code, r.headers.multi_items(), r.content))
    assert answers[0] == answers[1]
