"""The connection's own way for a plain request to a hot route (issue 24, "a lean hot path"): `GuardedProtocol`
runs the lane's answer to it without the app's dispatch (uvicorn's proxy headers middleware, Starlette, the
adapter's routing), and `send_whole` writes a one-body answer's head itself. On the wire every answer is the same,
byte for byte, as the ordinary way gives (`GuardedProtocol.hot_direct = False`), and so are the metrics."""

import os
import socket
import time

import pytest

from test_http_api import PNG, slow_app
from test_http_connections import serving
from test_http_hotpath import JPEG, REQUESTS, counted_samples, lane_app, read_answer, same_timing  # noqa: F401
from test_http_hotpath import raw_request as _raw_request
from vggserve.serving.protocols import hotpath
from vggserve.serving.web.connection import GuardedProtocol

PLAIN = ["raw jpeg", "raw octet-stream, top_k=3", "raw with a deadline", "multipart", "gzip body", "wrong content type",
         "empty body", "not an image", "v2 binary", "v2 binary, version 1", "v2 json", "v2 unknown model",
         "v2 unknown version", "v2 not json", "v2 not an image"]
NOT_PLAIN = ["oversize", "no API key"]  # refused by a middleware from the headers: the app's own dispatch


BOUNDARY = "b0undary"
MULTIPART = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n'
             f"Content-Type: image/jpeg\r\n\r\n").encode() + JPEG + f"\r\n--{BOUNDARY}--\r\n".encode()


def raw_request(name: str, connection: str = "keep-alive") -> bytes:
    """The request `name` of test_http_hotpath's REQUESTS as bytes (its multipart one with a boundary of ours)."""
    if name != "multipart":
        return _raw_request(name, connection)
    head = ["POST /classify HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(MULTIPART)}",
            f"Connection: {connection}", f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
            *(f"{k}: {v}" for k, v in REQUESTS[name]["headers"].items())]
    return "\r\n".join([*head, "", ""]).encode() + MULTIPART


@pytest.fixture
def directs(monkeypatch):
    """The paths of the requests the connection answered itself (the app's `direct` gave it an answer)."""
    taken = []
    direct = hotpath.HotRoutesApp.direct

    def counted(self, scope):
        answer = direct(self, scope)
        if answer is not None:
            taken.append(scope["path"])
        return answer

    monkeypatch.setattr(hotpath.HotRoutesApp, "direct", counted)
    return taken


def both_ways(monkeypatch, exchange) -> dict:
    """{direct: what `exchange(port)` returned} with the connection's own way off, then on, one app each."""
    seen = {}
    for direct in (False, True):
        monkeypatch.setattr(GuardedProtocol, "hot_direct", direct)
        app = lane_app()
        with serving(app) as port:
            answers = exchange(port)
        seen[direct] = answers, counted_samples(app.state.service.metrics)  # the server stopped: all counted
    return seen


def one_each(names):
    def exchange(port):
        answers = {}
        for name in names:  # a connection each: an answer before the whole body was read closes it
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(raw_request(name))
                answers[name] = read_answer(s.makefile("rb"))
        return answers
    return exchange


@pytest.mark.usefixtures("same_timing")
def test_every_answer_of_the_hot_routes_is_the_ordinary_ways_byte_for_byte(monkeypatch, directs):
    seen = both_ways(monkeypatch, one_each(PLAIN + NOT_PLAIN))
    (ordinary, ordinary_counts), (direct, direct_counts) = seen[False], seen[True]
    for name in PLAIN + NOT_PLAIN:
        assert direct[name] == ordinary[name], name
    statuses = {name: direct[name].split(b" ", 2)[1] for name in PLAIN + NOT_PLAIN}
    assert {statuses[n] for n in ("raw jpeg", "multipart", "v2 binary", "v2 json", "gzip body")} == {b"200"}
    assert statuses["wrong content type"] == b"415" and statuses["empty body"] == b"400"
    assert statuses["not an image"] == b"400" and statuses["v2 unknown model"] == b"404"
    assert statuses["oversize"] == b"413" and statuses["no API key"] == b"401"
    assert len(directs) == len(PLAIN), "the connection did not answer every plain request itself"
    assert direct_counts == ordinary_counts  # the metrics count the same


@pytest.mark.usefixtures("same_timing")
def test_pipelined_requests_are_answered_in_order_as_the_ordinary_way_answers_them(monkeypatch, directs):
    names = ["raw jpeg", "v2 binary", "raw octet-stream, top_k=3", "multipart", "v2 json"]

    def pipelined(port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"".join(raw_request(name) for name in names))  # all at once, before any answer
            stream = s.makefile("rb")
            return [read_answer(stream) for _ in names]

    seen = both_ways(monkeypatch, pipelined)
    assert seen[True] == seen[False]
    answers = seen[True][0]
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200"] * len(names)
    assert b'"predictions"' in answers[0] and b'"model_name"' in answers[1] and answers[2].count(b'"index"') == 3
    assert len(directs) == len(names)


@pytest.mark.usefixtures("same_timing")
def test_a_keep_alive_connection_serves_request_after_request_until_one_says_close(monkeypatch, directs):
    names = ["raw jpeg", "v2 binary", "raw jpeg", "not an image"]

    def kept(port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            stream = s.makefile("rb")
            answers = []
            for name in names:
                s.sendall(raw_request(name))
                answers.append(read_answer(stream))
            s.sendall(raw_request("raw jpeg", "close"))
            answers.append(read_answer(stream))
            answers.append(stream.read())  # the server closes after the answer to `Connection: close`
            return answers

    seen = both_ways(monkeypatch, kept)
    assert seen[True] == seen[False]
    answers = seen[True][0]
    assert b"connection: close" in answers[-2] and answers[-1] == b""
    assert all(b"connection: close" not in a for a in answers[:-2])
    assert len(directs) == len(names) + 1


def test_the_answers_head_is_written_as_uvicorns_send_writes_it(monkeypatch):
    """`send_whole` writes the head itself only where it is sure of uvicorn's bytes; compared here with uvicorn's
    own two sends for answers of every kind it takes and some it leaves to uvicorn."""
    from test_http_hotpath import Transport, cycle_on
    from vggserve.serving.web import connection

    body = {"type": "http.response.body", "body": b"{}"}
    starts = [[(b"content-type", b"application/json"), (b"content-length", b"2")],
              [(b"Content-Length", b"2"), (b"X-Request-ID", b"abc"), (b"connection", b"Keep-Alive, close")],
              [(b"content-length", b"2"), (b"content-length", b"7")],  # the first counts, for uvicorn too
              [(b"content-length", b" 2")],  # not plain digits: uvicorn's send judges it
              [(b"content-type", b"text/plain")]]  # no length: chunks, by uvicorn's send
    import asyncio

    async def both(headers, keep_alive):
        written = []
        for whole in (False, True):
            transport = Transport()
            cycle = cycle_on(transport, keep_alive)
            start = {"type": "http.response.start", "status": 200, "headers": list(headers)}
            if whole:
                await connection.send_whole(cycle, start, dict(body))
            else:
                await cycle.send(start)
                await cycle.send(dict(body))
            written.append((b"".join(transport.writes), transport.closed, cycle.response_complete, cycle.keep_alive))
        return written

    leaned = []
    monkeypatch.setattr(connection, "_send_held", _counting(connection._send_held, leaned))
    for headers in starts:
        for keep_alive in (True, False):
            ordinary, whole = asyncio.run(both(headers, keep_alive))
            assert whole == ordinary, (headers, keep_alive)
    assert len(leaned) == 4  # the last two kinds, both ways: left to uvicorn's send


def _counting(function, calls):
    async def counted(*args):
        calls.append(args)
        return await function(*args)
    return counted


def test_a_client_that_goes_away_while_its_image_waits_is_dropped_as_on_the_ordinary_way(monkeypatch, tmp_path,
                                                                                          directs):
    """A request on the device (held there by a file), then one from a client that goes away while its image waits:
    that image is withdrawn and counted as the ordinary way counts it; the first is answered."""
    request = (b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: %d\r\n\r\n"
               % len(PNG) + PNG)
    counted = {}
    for direct in (False, True):
        monkeypatch.setattr(GuardedProtocol, "hot_direct", direct)
        hold = tmp_path / f"hold-{direct}"
        from vggserve.testing.models import SlowModel
        from vggserve.serving.app import create_app
        from vggserve.serving.settings import Settings

        settings = Settings(max_batch_size=1, max_wait_ms=1)
        app = create_app(settings, model_factory=lambda device: SlowModel(device, 0.0, 1, hold_file=str(hold)))
        metrics = app.state.service.metrics
        with serving(app) as port:
            wait_until(lambda: app.state.service.readiness()[0], "the service ready")
            before = value(metrics, "vggserve_batch_size_count")  # (a warm-up batch, if the worker runs one)
            hold.touch()
            with socket.create_connection(("127.0.0.1", port), timeout=30) as busy:
                busy.sendall(request)
                wait_until(lambda: value(metrics, "vggserve_batch_size_count") == before + 1,
                           "the first image on the device")
                with socket.create_connection(("127.0.0.1", port), timeout=30) as gone:
                    gone.sendall(request)
                    wait_until(lambda: value(metrics, "vggserve_queue_length") == 1, "the second image waiting")
                wait_until(lambda: value(metrics, "vggserve_abandoned_total") == 1, "the second image withdrawn")
                os.remove(hold)
                assert read_answer(busy.makefile("rb")).split(b" ", 2)[1] == b"200"
            wait_until(lambda: not app.state.service.backend.queue, "the queue empty")
            assert value(metrics, "vggserve_batch_size_count") == before + 1  # the withdrawn image never computed
            counted[direct] = {k: v for k, v in counted_samples(metrics).items() 
                             if k[0] not in ("vggserve_ready", "vggserve_last_inference_timestamp_seconds")}
    assert counted[True] == counted[False]
    assert counted[True][("vggserve_abandoned_total",)] == 1
    assert len(directs) == 2


def value(metrics, name: str) -> float:
    return metrics.samples().get((name,), 0.0)


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"not seen within {timeout_s} s: {what}"
        time.sleep(0.01)


@pytest.mark.usefixtures("same_timing")
def test_while_draining_a_hot_request_meets_the_ordinary_refusal(monkeypatch, directs):
    def draining(port):
        app_drain.begin(announce=False)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(raw_request("raw jpeg"))
            return read_answer(s.makefile("rb"))

    seen = {}
    for direct in (False, True):
        monkeypatch.setattr(GuardedProtocol, "hot_direct", direct)
        app = lane_app()
        app_drain = app.state.service.drain
        with serving(app) as port:
            seen[direct] = draining(port)
    assert seen[True] == seen[False] and seen[True].split(b" ", 2)[1] == b"503"
    assert directs == []


@pytest.mark.usefixtures("same_timing")
def test_forwarded_headers_from_a_trusted_proxy_meet_uvicorns_proxy_middleware_first(monkeypatch, directs):
    """uvicorn's proxy headers middleware rewrites the client and scheme of such a request (here seen in the access
    log's client address) before the connection's answer runs: the same access log lines and answers as the ordinary
    way."""
    import logging

    forwarded = raw_request("raw jpeg").replace(b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\r\n"
                                                b"X-Forwarded-For: 10.1.2.3\r\nX-Forwarded-Proto: https\r\n")
    lines = {}
    for direct in (False, True):
        monkeypatch.setattr(GuardedProtocol, "hot_direct", direct)
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        access = logging.getLogger("uvicorn.access")
        app = lane_app()
        try:
            with serving(app) as port:
                access.addHandler(handler)  # the access log on (a connection looks when it opens)
                level, access.level = access.level, logging.INFO
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    stream = s.makefile("rb")
                    s.sendall(forwarded)
                    first = read_answer(stream)
                    s.sendall(raw_request("v2 binary"))
                    second = read_answer(stream)
                access.level = level
        finally:
            access.removeHandler(handler)
        lines[direct] = first, second, [r.split(" - ", 1)[0].rsplit(":", 1)[0] + " - " + r.split(" - ", 1)[1]
                                        for r in records]  # the client's port differs from run to run
    assert lines[True] == lines[False]
    assert lines[True][2] == ['10.1.2.3 - "POST /classify HTTP/1.1" 200',
                              '127.0.0.1 - "POST /v2/models/vgg16/infer HTTP/1.1" 200']
    assert len(directs) == 2


def test_a_later_requests_headers_have_their_own_deadline_on_one_timer(monkeypatch):
    """One timer per connection: a second request's headers that began after the first was answered are due
    --read-timeout after their own first byte, not the first request's (they arrive in time here); when they do
    not arrive, 408."""
    app = slow_app(read_timeout_s=2.0)
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
    whole = head + b"Content-Length: %d\r\n\r\n" % len(PNG) + PNG
    with serving(app) as port:
        wait_until(lambda: app.state.service.readiness()[0], "the service ready")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            stream = s.makefile("rb")
            s.sendall(whole)
            assert read_answer(stream).startswith(b"HTTP/1.1 200 ")
            time.sleep(1.2)
            s.sendall(head)  # the second request's headers begin ...
            time.sleep(1.2)  # ... are still coming when the first request's deadline would have passed ...
            s.sendall(b"Content-Length: %d\r\n\r\n" % len(PNG) + PNG)  # ... and end within their own
            assert read_answer(stream).startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            stream = s.makefile("rb")
            s.sendall(whole)
            assert stream.readline().split()[1] == b"200"
            s.sendall(head)
            rest = stream.read()  # the server answers 408 and closes
            assert b"HTTP/1.1 408 " in rest and b'"request_timeout"' in rest


def test_the_header_deadline_holds_for_every_request_on_a_connection():
    """The lone timer still closes a connection whose first request's headers never end (the deadline counts from
    the connection's opening) and one that sends nothing."""
    app = slow_app(read_timeout_s=0.5)
    with serving(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            assert s.recv(1024) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\n")
            assert s.makefile("rb").read().startswith(b"HTTP/1.1 408 ")


@pytest.mark.usefixtures("same_timing")
def test_a_request_answered_by_the_connection_runs_in_a_task_of_its_own(monkeypatch, directs):
    """Code under a route may ask for its task (anyio's thread pool, asyncio.timeout): the connection's way keeps
    one task per request."""
    import asyncio

    tasks = []
    route = hotpath.HotRoute.__call__

    async def recorded(self, scope, receive, send):
        tasks.append(asyncio.current_task())
        await route(self, scope, receive, send)

    monkeypatch.setattr(hotpath.HotRoute, "__call__", recorded)
    app = lane_app()
    with serving(app) as port:
        one_each(["raw jpeg", "v2 binary"])(port)
    assert len(directs) == 2 and len(tasks) == 2 and None not in tasks and tasks[0] is not tasks[1]


def test_a_failure_while_choosing_the_way_leaves_the_request_to_the_app(monkeypatch):
    """Were the connection's choice itself to fail, the request still goes to the app, whose own dispatch answers
    it, and the connection serves the next request."""
    calls = []

    def broken(self, scope):
        calls.append(scope["path"])
        raise RuntimeError("a bug")

    monkeypatch.setattr(hotpath.HotRoutesApp, "direct", broken)
    app = lane_app()
    with serving(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            stream = s.makefile("rb")
            s.sendall(raw_request("raw jpeg"))
            assert read_answer(stream).startswith(b"HTTP/1.1 200 ")  # the app's own dispatch answered it
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(stream).startswith(b"HTTP/1.1 200 ")
    assert calls == ["/classify", "/health/live"]


@pytest.mark.usefixtures("same_timing")
def test_expect_100_continue_is_answered_as_the_ordinary_way_answers_it(monkeypatch, directs):
    """A client that waits for `100 Continue` before its body gets it (uvicorn's response cycle, which the
    connection's way keeps, sends it when the lane first reads the body), then the same answer."""
    request = raw_request("raw jpeg")
    head, _, body = request.partition(b"\r\n\r\n")

    def expecting(port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            stream = s.makefile("rb")
            s.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
            interim = stream.readline() + stream.readline()
            s.sendall(body)
            return interim, read_answer(stream)

    seen = both_ways(monkeypatch, expecting)
    assert seen[True] == seen[False]
    assert seen[True][0][0] == b"HTTP/1.1 100 Continue\r\n\r\n" and seen[True][0][1].startswith(b"HTTP/1.1 200 ")
    assert directs == ["/classify"]
