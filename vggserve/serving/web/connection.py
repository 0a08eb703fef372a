"""The HTTP/1.1 connection under uvicorn (its httptools protocol, specialised): what happens before a request reaches
the app.

- A request's headers must all arrive within `read_timeout_s` of its first byte (of the connection's opening, for
  its first request), as nginx's client_header_timeout: else 408 and the connection is closed. A connection that
  sends nothing at all in that time is closed without an answer (as an idle keep-alive connection is), since
  browsers open spare connections they may never use. The body's timeout is the app's (web.limits); the connection
  tells it, in the scope, when the body's next piece has already arrived (then there is no wait to time).
- A request the parser refuses (a Content-Length that is not a number, a malformed request line, ...) gets 400.

Both answers are the project's JSON error body (v2's shape under /v2) with an X-Request-ID, not uvicorn's text/plain,
and are counted in vggserve_requests_total like any answer.

The connection also tells a request when its client goes away (`CLIENT_GONE` in the scope: `when_gone(callback)`
calls `callback()` then, and returns a function that takes the wish back), so that the request need not keep a
task waiting on `receive()` for it.

`send_whole` writes an answer's head and body with one write to the socket (uvicorn writes each message as it
comes: two system calls, and two TCP segments, for an answer of one body); the hot routes' lane uses it. For an
answer of one body with its Content-Length it writes the head itself, as uvicorn's `send` would (its checks of
every header name and value made in one pass); anything else goes through uvicorn's `send`.

A plain request to a hot route (what the lane takes, `HotRoutesApp.direct`) is answered by the connection: the task
uvicorn starts for it runs the lane's answer itself, not uvicorn's proxy headers middleware, Starlette and the
adapter's dispatch, which would come to the same answer (a request with X-Forwarded-For or -Proto from a trusted
proxy still meets the proxy headers middleware first). The request keeps uvicorn's response cycle (its keep-alive,
pipelining, flow control, 100-continue, the client's going, shutdown) and a task of its own: a coroutine driven
without a task would save about 2 us here and break code that asks for its task (anyio's thread pool, which
Starlette's uploads use past 1 MB; asyncio.timeout).

One timer per connection watches the headers' deadline: set when none is, it sets itself again for a later
deadline when it comes before it (a timer set and cancelled per request cost more).
"""

import copy
import json
import logging
import sys
from functools import partial

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import (HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol,
                                                   RequestResponseCycle)

from ..metrics import Metrics, endpoint_label
from ..protocols.errors import error_body
from .limits import BODY_READY
from .request_id import HEADER as REQUEST_ID_HEADER, new_id, usable_id

log = logging.getLogger("vggserve.serving")

# scope key: `when_gone(callback) -> take_back`, set by the connection (GuardedProtocol); absent under another server
CLIENT_GONE = "vggserve.client_gone"


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on the headers and JSON answers for what the parser refuses.
    `protocol_class` makes the subclass a server uses, with its timeout and metrics."""

    read_timeout_s = 60.0
    metrics: Metrics | None = None
    hot_direct = True  # False: every request goes to the app's own dispatch (the tests compare both)

    def connection_made(self, transport) -> None:
        self._hot = hot_answers(self.app) if self.hot_direct else None
        self._head_timer = None
        self._head_due = None  # loop time by which the headers awaited must have arrived; None: none awaited
        self._in_head = False  # between the first byte of a request and the end of its headers
        self._gone: list = []  # (cycle, callback) of the requests that wait to hear that their client has gone
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)
        waiting, self._gone = self._gone, []
        for cycle, callback in waiting:
            if cycle.disconnected:  # as the cycle's receive() would then answer http.disconnect
                try:
                    callback()
                except Exception:  # noqa: BLE001 - one request's failure ends neither the others' nor the connection
                    log.exception("failed to tell a request that its client has gone")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_due is None:  # (the first request's deadline counts from the connection's opening)
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_due = None  # the timer, when it comes, finds nothing due: cheaper than a timer per request
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # uvicorn's receive() waits on this event when unset
            self.scope[BODY_READY] = cycle.message_event.is_set
            self.scope[CLIENT_GONE] = partial(self._when_gone, cycle)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app) -> None:
        """uvicorn's: the task that runs `app` for `cycle`'s request (now, or when the one before it is answered);
        a plain request to a hot route runs the app's own answer to it, not the app's dispatch."""
        hot = self._hot
        if hot is not None and app is self.app:
            try:
                app = hot(cycle.scope) or app
            except Exception:  # noqa: BLE001 - the app's own dispatch meets it again, in the task: its 500, as before
                log.debug("the connection left a request to the app's dispatch", exc_info=True)
        super()._start_asgi_task(cycle, app)

    def _when_gone(self, cycle, callback):
        """Call `callback()` once the client of `cycle`'s request has gone (at once if it has), as a task waiting
        on the cycle's receive() for http.disconnect would learn it; returns a function that takes this back."""
        if cycle.disconnected or cycle.response_complete:  # receive() would answer http.disconnect at once
            callback()
            return _nothing
        self.flow.resume_reading()  # as receive() does before it waits
        entry = (cycle, callback)
        self._gone.append(entry)
        return partial(_discard, self._gone, entry)

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn while it handles the parser's error (in its `except` block)."""
        why = sys.exc_info()[1]
        self._answer(400, "bad_request", f"the request is not valid HTTP/1.1: {why or msg}; check the request line "
                     "and headers (a Content-Length must be a decimal number of bytes)")

    # the deadline on the headers --------------------------------------------------------------------------------
    def _arm(self) -> None:
        """Headers due `read_timeout_s` from now; one timer serves the connection's requests in turn (set when
        none is, it sets itself again for a later deadline when it comes before it)."""
        self._head_due = due = self.loop.time() + self.read_timeout_s
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(due, self._headers_late)

    def _disarm(self) -> None:
        self._head_due = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _headers_late(self) -> None:
        self._head_timer = None
        due = self._head_due
        if due is None or self.transport.is_closing():
            return
        if self.loop.time() < due:  # the deadline of a later request than the one the timer was set for
            self._head_timer = self.loop.call_at(due, self._headers_late)
            return
        self._head_due = None
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # a pipelined request waits for the answer to the one before it; so does its deadline
        elif not self._in_head:
            self.transport.close()
        else:
            self._answer(408, "request_timeout", f"the request's headers did not arrive within the server's "
                         f"{self.read_timeout_s:g} s (--read-timeout); send the whole request at once")

    # answering without the app ----------------------------------------------------------------------------------
    def _path(self) -> str:
        url = getattr(self, "url", b"") or b""
        return url.split(b"?", 1)[0].decode("latin-1")

    def _answer(self, status: int, code: str, message: str) -> None:
        """Write one JSON error answer and close the connection."""
        path = self._path()
        given = next((v.decode("latin-1") for k, v in self.headers or () if k == REQUEST_ID_HEADER.lower().encode()),
                     "")
        rid = usable_id(given) or new_id()
        body = json.dumps(error_body(code, message, path), separators=(",", ":")).encode()
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
                            (REQUEST_ID_HEADER.lower().encode(), rid.encode())]:
            head.extend([name, b": ", value, b"\r\n"])
        self.transport.write(b"".join([*head, b"\r\n", body]))
        self.transport.close()
        if self.metrics is not None:
            self.metrics.requests.labels(endpoint=endpoint_label(path), status=str(status)).inc()


_FORWARDED = (b"x-forwarded-for", b"x-forwarded-proto")
_DIRECT = "vggserve.direct"  # scope key: the answer the proxy headers middleware passes a forwarded request on to


def hot_answers(app):
    """For the app uvicorn runs (`config.loaded_app`): `answer(scope)`, the ASGI app that answers a plain request to a
    hot route of ours without the app's dispatch (`HotRoutesApp.direct`), or None for a request the app must see
    itself; None when the app is not ours (or is wrapped in more than uvicorn's proxy headers middleware). A request
    with X-Forwarded-For or -Proto from a trusted proxy still meets that middleware first (it rewrites the scope's
    client and scheme), and the answer after it; without them the middleware would leave the scope as it is."""
    proxy = None
    if type(app) is ProxyHeadersMiddleware:
        proxy, app = app, app.app
    direct = getattr(app, "direct", None)
    if direct is None or not callable(direct):
        return None
    if proxy is None:
        return direct
    trusted = proxy.trusted_hosts
    forwarded = copy.copy(proxy)
    forwarded.app = _run_direct

    def answer(scope):
        found = direct(scope)
        if found is not None:
            client = scope.get("client")
            if client and client[0] in trusted:
                for name, _ in scope["headers"]:
                    if name in _FORWARDED:
                        scope[_DIRECT] = found
                        return forwarded
        return found

    return answer


def _run_direct(scope, receive, send):
    return scope[_DIRECT](scope, receive, send)


def _nothing() -> None:
    pass


def _discard(entries: list, entry) -> None:
    try:
        entries.remove(entry)
    except ValueError:  # called already, or the connection ended
        pass


def protocol_class(read_timeout_s: float, metrics: Metrics | None = None) -> type[GuardedProtocol]:
    """The protocol class for uvicorn.Config(http=...): headers due within `read_timeout_s`, answers counted in
    `metrics`."""
    return type("VggserveHttpProtocol", (GuardedProtocol,), {"read_timeout_s": read_timeout_s, "metrics": metrics})


class _HeldWrites:
    """The connection's transport, as a response cycle writes to it, holding what is written until `flush`."""

    __slots__ = ("transport", "held")

    def __init__(self, transport):
        self.transport = transport
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.held.append(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def flush(self) -> None:
        if self.held:
            data = self.held[0] if len(self.held) == 1 else b"".join(self.held)
            self.held = []
            self.transport.write(data)

    def __getattr__(self, name):
        return getattr(self.transport, name)


def joinable(send) -> RequestResponseCycle | None:
    """The response cycle whose `send` this is (uvicorn's httptools protocol), for `send_whole`; else None."""
    cycle = getattr(send, "__self__", None)
    return cycle if type(cycle) is RequestResponseCycle else None


async def send_whole(cycle: RequestResponseCycle, start: dict, body: dict) -> None:
    """`cycle.send(start)`, then `cycle.send(body)`, their bytes written to the socket in one write: for an answer
    of one body with its Content-Length, the head is written here as uvicorn's `send` writes it (its checks of the
    headers in one pass); anything else (HEAD, no length, chunks, a header uvicorn refuses, writes paused, the access
    log on) through `cycle.send` itself, its writes held and joined."""
    whole = _whole(cycle, start, body)
    if whole is None:
        return await _send_held(cycle, start, body)
    data, keep_alive = whole
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    cycle.expected_content_length = 0
    cycle.keep_alive = keep_alive
    cycle.response_complete = True
    cycle.transport.write(data)
    cycle.message_event.set()
    if not keep_alive:
        cycle.transport.close()
    cycle.on_response()


def _whole(cycle: RequestResponseCycle, start: dict, body: dict) -> tuple[bytes, bool] | None:
    """(the answer's bytes, keep-alive after it) as `cycle.send` would write them for `start` and `body`, or None
    where `cycle.send` must judge or write them itself."""
    if (cycle.response_started or cycle.disconnected or cycle.flow.write_paused or cycle.access_log
            or start["type"] != "http.response.start" or body["type"] != "http.response.body"
            or body.get("more_body", False) or cycle.scope["method"] == "HEAD"):
        return None
    line = STATUS_LINE.get(start["status"])
    headers = [*cycle.default_headers, *start.get("headers", ())]
    if line is None or HEADER_RE.search(b"".join([h[0] for h in headers])) or HEADER_VALUE_RE.search(
            b"".join([h[1] for h in headers])):  # a character that no name or value may hold (uvicorn's checks)
        return None
    content = [line]
    keep_alive, closes, length = cycle.keep_alive, False, None
    for name, value in headers:
        name = name.lower()
        if name == b"content-length":
            if length is None:
                length = value
        elif name == b"transfer-encoding":
            if value.lower() == b"chunked":
                return None
        elif name == b"connection":
            if b"close" in [token.lower().strip() for token in value.split(b",")]:
                keep_alive, closes = False, True
        content += (name, b": ", value, b"\r\n")
    data = body.get("body", b"")
    if length is None or not length.isdigit() or int(length) != len(data):  # uvicorn's send raises, or chunks
        return None
    if not keep_alive and not closes:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", data)
    return b"".join(content), keep_alive


async def _send_held(cycle: RequestResponseCycle, start: dict, body: dict) -> None:
    """`cycle.send(start)`, then `cycle.send(body)`, what they write held and written at once."""
    transport = cycle.transport
    held = cycle.transport = _HeldWrites(transport)
    try:
        await cycle.send(start)
        await cycle.send(body)
    finally:
        cycle.transport = transport
        held.flush()
