"""Request bodies sent compressed (`Content-Encoding: gzip` or `deflate`, as tritonclient and curl --compressed
can send them), for /classify, /classify/batch and v2 infer: inflated within the same --max-body-bytes as any
body, so a small body that inflates past it (a "gzip bomb") is refused with 413 and never held whole. Any other
coding is 415: RFC 9110's answer for a content coding the server does not support."""

import asyncio
import zlib

from starlette.requests import ClientDisconnect, Request

from .errors import ApiError

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # deflate: the zlib format, as RFC 9110 defines it


def content_coding(request: Request) -> str | None:
    """The request body's one content coding (None: identity); 415 for one we cannot undo."""
    codings = [c.strip().lower() for c in request.headers.get("content-encoding", "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _WBITS:
        raise ApiError(415, "unsupported_media_type", f"Content-Encoding {', '.join(codings)!r} is not supported; "
                       "send the body uncompressed, or compressed once with gzip or deflate")
    return codings[0]


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """`body` inflated, at most `limit` bytes of it: 413 beyond, 400 for data that is not `coding` or stops early."""
    inflater = zlib.decompressobj(wbits=_WBITS[coding])
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ApiError(400, "bad_request", f"the body is not valid {coding} data ({exc}); send it compressed as "
                       "its Content-Encoding says, or drop the header") from None
    if len(out) > limit:
        raise ApiError(413, "payload_too_large", f"the {coding} body inflates to more than {limit} bytes; this "
                       "server accepts at most that much (send a smaller image, or raise the server's "
                       "--max-body-bytes)")
    if not inflater.eof:
        raise ApiError(400, "bad_request", f"the {coding} body ends before its compressed data does (truncated); "
                       "send all of it")
    return out


async def inflated_body(request: Request, limit: int) -> bytes:
    """The request's body, inflated if it came compressed (off the event loop: it may be megabytes)."""
    if not any(name == b"content-encoding" for name, _ in request.scope["headers"]):  # as most come: read directly
        return await raw_body(request)
    coding = content_coding(request)
    body = await request.body()
    if coding is None or not body:
        return body
    return await asyncio.get_running_loop().run_in_executor(None, inflate, body, coding, limit)


async def raw_body(request: Request) -> bytes:
    """`request.body()` without its stream generator: the chunks until the last; ClientDisconnect if the client
    goes away first."""
    chunks = []
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            request._is_disconnected = True
            raise ClientDisconnect()
    request._body = body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return body


async def decoded(request: Request, limit: int) -> Request:
    """`request` itself when its body came uncompressed, else a request over the inflated body (for the multipart
    parser, which reads a request's stream)."""
    if content_coding(request) is None:
        return request
    body = await inflated_body(request, limit)
    headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"content-encoding", b"content-length")]
    scope = {**request.scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return await request.receive()  # after the body: the client going away
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)
