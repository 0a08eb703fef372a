"""X-Request-ID: a client's id (or one generated when it sends none, or an unusable one) is carried to the answer's
header, to /classify's body, and to every log line written while the request runs (`%(request_id)s`)."""

import contextvars
import itertools
import logging
import os
import re
import time

HEADER = "X-Request-ID"
_USABLE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")  # printable, no spaces, short: safe in headers and logs
current = contextvars.ContextVar("vggserve_request_id", default="-")
log = logging.getLogger("vggserve.requests")


class _Ids:
    """Fresh request ids: 32 hex digits, a random 64-bit prefix of the process and a counter (unique without a
    getrandom call per request, which uuid4 makes and which cost 5% of a front end's CPU; BENCHMARKS.md)."""

    def __init__(self):
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count(int.from_bytes(os.urandom(8), "little"))

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


new_id = _Ids()


def usable_id(given: str) -> str | None:
    """A client's X-Request-ID if it is usable as it is (printable, no spaces, short), else None."""
    given = given.strip()
    return given if _USABLE.fullmatch(given) else None


def request_id(scope) -> str:
    """The id of the request in `scope` (set by the middleware), or a fresh one."""
    return (scope.get("state") or {}).get("request_id") or new_id()


def _install_record_factory() -> None:
    """Every log record gets `request_id`: the running request's, or "-" outside requests, whichever handler
    writes it (ours, pytest's, an embedding application's)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "adds_request_id", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        record.request_id = current.get()
        return record

    factory.adds_request_id = True
    logging.setLogRecordFactory(factory)


_install_record_factory()


class RequestIdMiddleware:
    """Pure ASGI middleware: picks the request's id, sets it for the logs, sends it back as X-Request-ID."""

    def __init__(self, app):
        self.app = app
        self.header = HEADER.lower().encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = self.header
        given = ""
        for name, value in scope.get("headers", ()):
            if name == header:
                given = value.decode("latin-1")
                break
        rid = usable_id(given) if given else None
        rid = rid or new_id()
        scope.setdefault("state", {})["request_id"] = rid
        token = current.set(rid)
        started, status = time.perf_counter(), 500

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0].lower() != header]
                message["headers"] = [*headers, (header, rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s -> %s in %.1f ms", scope.get("method"), scope.get("path"), status,
                          (time.perf_counter() - started) * 1000)
            current.reset(token)
