"""A minimal asyncio HTTP/1.1 keep-alive client for load generators, which must leave the CPU to the server.

httpx costs ~0.5 ms of CPU per request (loopback, 2 cores); this client 25-65 us. It does what a benchmark needs:

    conn = RawConnection("127.0.0.1", 8000, timeout_s=30)
    status, headers, body = await conn.request("POST", "/classify", jpeg, {"content-type": "image/jpeg"})
    await conn.close()

Plain http only (`parse_url` refuses https with a ValueError); one request at a time per connection. The request
bytes (request line, Host, Content-Length, the caller's headers, body) are built once per distinct request
(`prepare`) and reused. Response header names come back lower-case (repeats joined by ", "); the body is read by
Content-Length, `Transfer-Encoding: chunked`, or until the server closes. After `Connection: close` the socket is
closed and the next request connects again; a kept-alive connection found closed before any response byte (the
server dropped it while idle: the keep-alive race) is reconnected and the request sent once more. Errors:
`RequestTimeout` (a TimeoutError), `ProtocolError` (malformed response), `ConnectionClosed` (the server left
mid-response), OSErrors from connecting; any error closes the connection, so the next request starts clean.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class RawHTTPError(Exception):
    """Base of this module's errors."""


class ProtocolError(RawHTTPError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class ConnectionClosed(RawHTTPError, ConnectionError):
    """The server closed the connection before the response was complete."""


class RequestTimeout(RawHTTPError, TimeoutError):
    """No complete response within the request's timeout."""


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, base path without a trailing /) of an http:// URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"rawhttp speaks plain http only, not {parts.scheme or 'a URL without scheme'}: {url!r} "
                         "(use an httpx client for https)")
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def prepare(method: str, path: str, body: bytes, headers: dict, host: str) -> bytes:
    """The complete request: request line, Host, Content-Length (unless the caller gives them), headers, body."""
    given = {name.lower() for name in headers}
    lines = [f"{method} {path} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {host}")
    if "content-length" not in given and (body or method not in ("GET", "HEAD")):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """(HTTP version, status, headers with lower-case names) of a response head ending in CRLF CRLF."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not (version.startswith("HTTP/1.") and len(code) == 3 and code.isascii() and code.isdigit()
            and rest[3:4] in ("", " ")):
        raise ProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:-2]:  # the head ends in an empty line
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"malformed header line {line[:100]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, int(code), headers


class RawConnection:
    """One keep-alive HTTP/1.1 connection to host:port, opened on the first request."""

    def __init__(self, host: str, port: int, timeout_s: float | None = 60.0):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.host_header = host if port == 80 else f"{host}:{port}"
        self.connects = 0  # TCP connections opened so far
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._prepared: dict[tuple, bytes] = {}

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None,
                      timeout_s: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; see the module's docstring for the errors."""
        headers = headers or {}
        key = (method, path, body, tuple(headers.items()))
        data = self._prepared.get(key)
        if data is None:
            if len(self._prepared) >= 32:
                self._prepared.clear()
            data = self._prepared[key] = prepare(method, path, body, headers, self.host_header)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(self._exchange(data, method == "HEAD"), timeout_s)
        except BaseException as exc:
            self._drop()  # whatever happened, the connection's state is unknown
            if isinstance(exc, asyncio.TimeoutError):
                raise RequestTimeout(f"{method} {path}: no complete response within {timeout_s} s") from None
            if isinstance(exc, asyncio.IncompleteReadError):
                raise ConnectionClosed(f"{method} {path}: the server closed the connection after "
                                       f"{len(exc.partial)} bytes of a response part") from exc
            if isinstance(exc, asyncio.LimitOverrunError):
                raise ProtocolError(f"{method} {path}: response line over {exc.consumed} bytes") from exc
            raise

    async def _exchange(self, data: bytes, head_only: bool) -> tuple[int, dict[str, str], bytes]:
        reused = self._writer is not None and not self._reader.at_eof() and not self._writer.is_closing()
        if not reused:
            await self._connect()
        self._writer.write(data)
        try:
            head = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
            if not reused or getattr(exc, "partial", b""):
                raise
            await self._connect()  # the keep-alive race: the server closed the idle connection; try once more
            self._writer.write(data)
            head = await self._reader.readuntil(b"\r\n\r\n")
        version, status, headers = parse_head(head)
        while 100 <= status < 200 and status != 101:  # interim answers (100 Continue): the real one follows
            version, status, headers = parse_head(await self._reader.readuntil(b"\r\n\r\n"))
        connection = headers.get("connection", "").lower()
        close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if head_only or status < 200 or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._read_chunked()
        elif "content-length" in headers:
            length = headers["content-length"]
            if not (length.isascii() and length.isdigit()):
                raise ProtocolError(f"malformed Content-Length {length[:40]!r}")
            body = await self._reader.readexactly(int(length))
        else:
            body, close = await self._reader.read(), True  # neither: the body ends when the server closes
        if close:
            self._drop()
        return status, headers, body

    async def _read_chunked(self) -> bytes:
        chunks, reader = [], self._reader
        while True:
            line = await reader.readuntil(b"\r\n")
            size = line.split(b";", 1)[0].strip()
            if not size or size.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"malformed chunk size line {line[:40]!r}")
            size = int(size, 16)
            if size == 0:
                break
            chunk = await reader.readexactly(size + 2)
            if chunk[-2:] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            chunks.append(chunk[:-2])
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, ignored
            pass
        return b"".join(chunks)

    async def _connect(self) -> None:
        self._drop()
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self.connects += 1

    def _drop(self) -> None:
        """Close the socket now (without waiting); the next request connects again."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            try:
                await writer.wait_closed()
            except OSError:
                pass
