"""What happens on the connection, under a real uvicorn on 127.0.0.1 (TestClient sends whole, well-formed requests):
clients too slow with their headers or body get 408 and lose the connection (issue 22, item 3), and requests the
HTTP parser refuses get the project's JSON error body with an X-Request-ID, not uvicorn's text/plain (item 18)."""

import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn

from vggserve.serving.hosting import listening_socket, uvicorn_config
from test_http_api import PNG, slow_app

READ_TIMEOUT_S = 0.5


@contextmanager
def serving(app):
    """`app` under uvicorn (our configuration) in a thread, on a free loopback port; yields the port."""
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(app, "warning", False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            thread.join(0.02)
            assert thread.is_alive(), "the server stopped while starting"
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def port():
    with serving(slow_app(read_timeout_s=READ_TIMEOUT_S)) as p:
        ready = b"GET /health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        end = time.monotonic() + 30
        while exchange(p, ready)[0] != 200:
            assert time.monotonic() < end, "not ready after 30 s"
            time.sleep(0.02)
        yield p


def exchange(port: int, data: bytes, wait_s: float = 30.0) -> tuple[int, dict, bytes, bool]:
    """Send `data` and read until the server closes: (status, headers, body, closed by the server)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
            closed = True
        except socket.timeout:
            closed = False
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body, closed


def request(path: str, *headers: str, body: bytes = b"") -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode() + body


@pytest.mark.parametrize("path, shape", [("/classify", "ours"), ("/v2/models/vgg16/infer", "v2")])
def test_a_body_that_stops_arriving_is_408_and_the_connection_closed(port, path, shape):
    status, headers, body, closed = exchange(port, request(path, "Content-Type: image/png", "Content-Length: 1000",
                                                           "X-Request-ID: slow-1", body=b"abc"))
    assert (status, closed) == (408, True), body
    assert headers["content-type"] == "application/json" and headers["x-request-id"] == "slow-1"
    message = json.loads(body)["error"]
    if shape == "ours":
        assert message["code"] == "request_timeout"
        message = message["message"]
    assert "--read-timeout" in message and "0.5 s" in message


def test_a_body_already_arrived_is_read_without_a_deadline_and_a_late_one_with_it(port, monkeypatch):
    """The connection tells the app when the body's next piece is in (web.limits.BODY_READY): no timer is set for a
    read that cannot wait (a small upload arrives with its headers; issue 24), and a body that comes later is still
    read within --read-timeout."""
    from vggserve.serving.web import limits

    timed, waiting = [], threading.Event()
    within = limits._within

    def counting(awaitable, seconds):
        timed.append(seconds)
        waiting.set()
        return within(awaitable, seconds)

    monkeypatch.setattr(limits, "_within", counting)
    head = request("/classify", "Content-Type: image/png", f"Content-Length: {len(PNG)}", "Connection: close")
    assert exchange(port, head + PNG)[0] == 200
    assert timed == []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        assert waiting.wait(30), "the app never waited for the body"
        s.sendall(PNG)
        assert s.makefile("rb").readline().split()[1] == b"200"
    assert timed == [READ_TIMEOUT_S]


def test_headers_that_do_not_arrive_in_time_are_408_and_the_connection_closed(port):
    # the last header is still coming; the ones before it have arrived
    partial = b"POST /classify HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: slow-2\r\nContent-Type: ima"
    status, headers, body, closed = exchange(port, partial)
    assert (status, closed) == (408, True), body
    assert headers["content-type"] == "application/json" and headers["x-request-id"] == "slow-2"
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and "headers" in error["message"]


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        assert s.recv(1024) == b""


def test_slow_clients_do_not_hold_up_the_others_and_are_counted(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(request("/classify", "Content-Type: image/png", "Content-Length: 1000", body=b"abc"))
        status, _, body, _ = exchange(port, request("/classify", "Content-Type: image/png",
                                                    f"Content-Length: {len(PNG)}", "Connection: close", body=PNG))
        assert status == 200, body
        assert slow.recv(65536).startswith(b"HTTP/1.1 408 ")
    status, _, metrics, _ = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert 'vggserve_requests_total{endpoint="/classify",status="408"}' in metrics.decode()


def test_an_answer_sent_before_the_body_was_read_closes_the_connection(port):
    """A client that declared a body and never sends it holds no connection after its answer (here a 405)."""
    status, headers, body, closed = exchange(port, request("/metadata", "Content-Length: 1000", body=b"abc"))
    assert (status, closed) == (405, True) and headers["connection"] == "close", body


@pytest.mark.parametrize("length", ["abc", "-5", "9" * 20])
def test_a_content_length_the_parser_refuses_is_400_in_our_json_shape(port, length):
    status, headers, body, closed = exchange(port, request("/classify", "X-Request-ID: bad-length",
                                                           "Content-Type: image/png", f"Content-Length: {length}",
                                                           "Accept: */*"))
    assert (status, closed) == (400, True), body
    assert headers["content-type"] == "application/json" and headers["x-request-id"] == "bad-length"
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and "Content-Length" in error["message"], error


def test_a_malformed_v2_request_is_400_in_the_v2_shape(port):
    status, headers, body, _ = exchange(port, request("/v2/models/vgg16/infer", "Content-Length: x"))
    assert status == 400 and headers["x-request-id"]
    assert set(json.loads(body)) == {"error"} and "Content-Length" in json.loads(body)["error"]


def test_the_read_timeout_setting_and_flag():
    from vggserve.cli import build_parser, serve
    from vggserve.serving.settings import Settings, SettingsError

    assert Settings().read_timeout_s == 60.0
    assert serve._settings(build_parser().parse_args(["serve", "--read-timeout", "2.5"])).read_timeout_s == 2.5
    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises(SettingsError, match="--read-timeout must be a number"):
            Settings(read_timeout_s=bad)
