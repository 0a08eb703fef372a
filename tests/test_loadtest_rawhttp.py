"""vggserve.loadtest.rawhttp against a real uvicorn server on 127.0.0.1 (a tiny ASGI app in this file, served
from a thread), against hand-written answers from a raw asyncio server (read-until-close, malformed answers,
the keep-alive race), and benchmarks/serve_saturation.py's raw client against the real service with a
sleeping stand-in model."""

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from vggserve.loadtest.rawhttp import (ConnectionClosed, ProtocolError, RawConnection, RequestTimeout, parse_url,
                                       prepare)
from vggserve.testing.servers import ServerProcess

REPO = Path(__file__).resolve().parents[1]


class TinyApp:
    """Routes: /echo (JSON with the body's length and a header), /chunked (StreamingResponse-style chunks),
    /close (answers with Connection: close), /too-large (413 without reading the body), /slow (2 s).
    `clients` holds the client (host, port) of every request: one port per TCP connection."""

    def __init__(self):
        self.clients: list[tuple] = []

    async def __call__(self, scope, receive, send):
        assert scope["type"] == "http"
        self.clients.append(tuple(scope["client"]))
        path = scope["path"]
        if path == "/too-large":
            return await self.answer(send, 413, b'{"detail":"too large"}')
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if path == "/echo":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            data = json.dumps({"length": len(body), "method": scope["method"], "x-test": headers.get("x-test")})
            await self.answer(send, 200, data.encode(), [(b"x-echo", b"yes"), (b"x-echo", b"twice")])
        elif path == "/chunked":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"alpha-", b"b" * 70_000, b"-omega"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/close":
            await self.answer(send, 200, b"bye", [(b"connection", b"close")])
        elif path == "/slow":
            await asyncio.sleep(2.0)
            await self.answer(send, 200, b"late")
        else:
            await self.answer(send, 404, b"")

    @staticmethod
    async def answer(send, status, body, headers=()):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def tiny():
    """(app, port) of TinyApp under uvicorn in a thread, on a port the OS chose."""
    app = TinyApp()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield app, sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_status_headers_and_body_are_parsed_and_one_connection_is_kept_alive(tiny):
    app, port = tiny

    async def main():
        conn = RawConnection("127.0.0.1", port, timeout_s=10)
        answers = [await conn.request("POST", "/echo", b"x" * n, {"X-Test": "hello", "content-type": "a/b"})
                   for n in (0, 10, 150_000, 10, 10)]
        answers.append(await conn.request("GET", "/echo"))
        await conn.close()
        return conn, answers

    before = len(app.clients)
    conn, answers = run(main())
    for (status, headers, body), n in zip(answers, (0, 10, 150_000, 10, 10, 0)):
        assert status == 200
        assert headers["x-echo"] == "yes, twice" and headers["content-length"] == str(len(body))
        assert all(name == name.lower() for name in headers)
        assert json.loads(body)["length"] == n
    assert json.loads(answers[0][2]) == {"length": 0, "method": "POST", "x-test": "hello"}
    assert json.loads(answers[-1][2])["method"] == "GET"
    assert conn.connects == 1 and len(set(app.clients[before:])) == 1 and len(app.clients) - before == 6


def test_chunked_answer_is_reassembled(tiny):
    _, port = tiny

    async def main():
        conn = RawConnection("127.0.0.1", port, timeout_s=10)
        first = await conn.request("GET", "/chunked")
        second = await conn.request("POST", "/echo", b"abc")  # the connection is still in step after the chunks
        await conn.close()
        return conn, first, second

    conn, (status, headers, body), second = run(main())
    assert status == 200 and headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert body == b"alpha-" + b"b" * 70_000 + b"-omega"
    assert json.loads(second[2])["length"] == 3 and conn.connects == 1


def test_connection_close_and_413_are_answered_and_the_next_request_reconnects(tiny):
    app, port = tiny

    async def main():
        conn = RawConnection("127.0.0.1", port, timeout_s=10)
        closing = await conn.request("GET", "/close")
        after_close = await conn.request("POST", "/echo", b"12345")
        rejected = await conn.request("POST", "/too-large", b"z" * 200_000)
        after_413 = await conn.request("POST", "/echo", b"1")
        await conn.close()
        return conn, closing, after_close, rejected, after_413

    before = len(app.clients)
    conn, closing, after_close, rejected, after_413 = run(main())
    assert closing[0] == 200 and closing[1]["connection"] == "close" and closing[2] == b"bye"
    assert after_close[0] == 200 and json.loads(after_close[2])["length"] == 5
    assert rejected[0] == 413 and json.loads(rejected[2]) == {"detail": "too large"}
    assert after_413[0] == 200 and json.loads(after_413[2])["length"] == 1
    clients = app.clients[before:]
    assert clients[0] != clients[1]  # a new TCP connection after Connection: close
    assert conn.connects == len(set(clients)) >= 2


def test_timeout_raises_and_the_connection_recovers(tiny):
    _, port = tiny

    async def main():
        conn = RawConnection("127.0.0.1", port, timeout_s=10)
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="no complete response within 0.3 s"):
            await conn.request("GET", "/slow", timeout_s=0.3)
        waited = time.monotonic() - started
        status, _, _ = await conn.request("GET", "/echo")
        await conn.close()
        return waited, status

    waited, status = run(main())
    assert waited < 1.5 and status == 200
    assert issubclass(RequestTimeout, TimeoutError)


@pytest.mark.parametrize("url", ["https://127.0.0.1:8443", "ftp://host/", "127.0.0.1:8000"])
def test_only_plain_http_urls(url):
    with pytest.raises(ValueError, match="plain http only"):
        parse_url(url)


def test_url_and_request_bytes():
    assert parse_url("http://127.0.0.1:8000/vgg/") == ("127.0.0.1", 8000, "/vgg")
    assert parse_url("http://example.org") == ("example.org", 80, "")
    assert prepare("POST", "/a", b"xy", {"X-A": "1"}, "h:1") == \
        b"POST /a HTTP/1.1\r\nHost: h:1\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nxy"
    assert prepare("GET", "/", b"", {}, "h") == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def scripted(connections, script):
    """Run `script(conn)` against a raw asyncio server whose n-th connection reads one request head per entry of
    connections[n] and writes that entry (None: write nothing), then closes. Returns (script's result,
    connections the server accepted)."""
    async def main():
        accepted = []

        async def handle(reader, writer):
            answers = connections[len(accepted)]
            accepted.append(1)
            for answer in answers:
                await reader.readuntil(b"\r\n\r\n")
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = RawConnection("127.0.0.1", server.sockets[0].getsockname()[1], timeout_s=5)
        try:
            return await script(conn), len(accepted)
        finally:
            await conn.close()
            server.close()

    return run(main())


def test_body_until_close():
    connections = [[b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nall of it"], [OK]]

    async def script(conn):
        return await conn.request("GET", "/"), await conn.request("GET", "/")

    (first, second), accepted = scripted(connections, script)
    assert first == (200, {"x-a": "1"}, b"all of it") and second[2] == b"ok" and accepted == 2


def test_keep_alive_race_is_retried_once():
    # connection 1 answers, then reads the next request and closes without a byte: the client sends it again
    connections = [[OK, None], [OK]]

    async def script(conn):
        return [await conn.request("GET", "/") for _ in range(2)], conn.connects

    (answers, connects), accepted = scripted(connections, script)
    assert [a[2] for a in answers] == [b"ok", b"ok"] and connects == accepted == 2


def test_fresh_connection_closed_without_answer_is_an_error():
    connections = [[None], [None]]

    async def script(conn):
        with pytest.raises(ConnectionClosed, match="closed the connection after 0 bytes"):
            await conn.request("GET", "/")
        return conn.connects

    assert scripted(connections, script) == (1, 1)  # no retry on a connection that never answered


@pytest.mark.parametrize("answer, error", [
    (b"HTTP/1.1 OK\r\n\r\n", "malformed status line"),
    (b"SPDY/3 200 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd", "chunk not followed by CRLF"),
])
def test_malformed_answers_raise(answer, error):
    connections = [[answer]]

    async def script(conn):
        with pytest.raises(ProtocolError, match=error):
            await conn.request("GET", "/")
        return conn._writer is None  # closed after the error

    assert scripted(connections, script) == (True, 1)


def test_answer_cut_short_is_connection_closed():
    connections = [[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]]

    async def script(conn):
        with pytest.raises(ConnectionClosed, match="after 3 bytes"):
            await conn.request("GET", "/")

    scripted(connections, script)


SERVICE = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, max_batch_size=4, max_wait_ms=5, max_queue=64, max_files=4, preprocess_threads=2,
                    preprocess_procs=0)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.005, 4), log_level="warning"))
"""


def test_serve_saturation_raw_client_against_the_service(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import serve_saturation

    with ServerProcess.python_code(SERVICE) as server:
        server.wait_ready(60)
        out = tmp_path / "out.json"
        assert serve_saturation.main(["--url", server.url, "--skip-engine", "--client", "raw", "--concurrency", "4",
                                      "--client-procs", "1", "--warmup", "0.5", "--duration", "2",
                                      "--json", str(out)]) == 0
        batch = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2, procs=1,
                                       warmup=0.3, duration=1.5, files=3, client="raw")
        # v2 infer with the image as binary tensor data (serve_host_floor.py --route v2): answered with "outputs"
        v2 = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2, procs=1,
                                    warmup=0.3, duration=1.5, client="v2")
    result = json.loads(out.read_text())
    assert result["client"] == "raw"
    for service, files in ((result["service"], 1), (batch, 3), (v2, 1)):
        assert service["ok"] > 0 and service["ok"] % files == 0
        assert service["statuses"] == {"200": service["ok"] // files}
        assert service["latency_ms"]["p50"] > 0 and sum(service["images_per_frontend"]) == service["ok"]
        assert 0 < service["device_busy"] < 1.5  # one device: its batches' seconds per second of the window


def test_serve_saturation_raw_client_refuses_https_before_it_starts(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import serve_saturation

    assert serve_saturation.main(["--url", "https://127.0.0.1:8443", "--skip-engine"]) == 2
    assert "plain http only" in capsys.readouterr().err

