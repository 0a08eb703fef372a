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
comes: two system calls, and two TCP segments, for an answer of one body); the hot routes' lane uses it.
"""

import json
import logging
import sys
from functools import partial

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

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

    def connection_made(self, transport) -> None:
        self._head_timer = None
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
        if self._head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # uvicorn's receive() waits on this event when unset
            self.scope[BODY_READY] = cycle.message_event.is_set
            self.scope[CLIENT_GONE] = partial(self._when_gone, cycle)

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
        self._disarm()
        self._head_timer = self.loop.call_later(self.read_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _headers_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
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
    """`cycle.send(start)`, then `cycle.send(body)`, their bytes written to the socket in one write."""
    transport = cycle.transport
    held = cycle.transport = _HeldWrites(transport)
    try:
        await cycle.send(start)
        await cycle.send(body)
    finally:
        cycle.transport = transport
        held.flush()
