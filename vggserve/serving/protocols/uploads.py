"""Reading images out of a request: a multipart file field, or the raw body with an image/* content type or
application/octet-stream (what many clients send for any file). The bytes decide the format either way: the
decoder sniffs them, whatever the content type claims. A request without a body is `empty_body` whatever its
content type; a compressed body is inflated first (protocols.encodings)."""

import re
from dataclasses import dataclass

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import _user_safe_decode, parse_options_header
from starlette.exceptions import HTTPException as StarletteHTTPException

from .encodings import decoded, raw_body
from .errors import ApiError

SINGLE_FIELD = "file"
BATCH_FIELD = "files"
MAX_FORM_FIELDS = 16
RAW_BINARY = "application/octet-stream"


@dataclass(frozen=True)
class Upload:
    filename: str | None
    data: bytes


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _unsupported(media: str, how: str) -> ApiError:
    got = f"Content-Type {media!r}" if media else "no Content-Type"
    return ApiError(415, "unsupported_media_type", f"got {got}; {how}")


def _empty(name: str | None) -> ApiError:
    what = f"file {name!r}" if name else "request body"
    return ApiError(400, "empty_body", f"the {what} is empty; send the image's bytes")


def _without_body(request: Request) -> bool:
    """Whether the request says it has no body: Content-Length 0, or neither a length nor chunks (RFC 9112)."""
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() == "0"
    return "transfer-encoding" not in request.headers


async def _opened(request: Request, max_body_bytes: int) -> Request:
    """The request to read the images from: `empty_body` first, whatever the content type, then inflated if it
    came compressed."""
    if _without_body(request):
        raise _empty(None)
    return await decoded(request, max_body_bytes)


async def _read_form(request: Request, max_files: int):
    try:
        return await request.form(max_files=max_files, max_fields=MAX_FORM_FIELDS)
    except StarletteHTTPException as exc:
        raise ApiError(400, "invalid_multipart", f"could not read the multipart body: {exc.detail}") from exc


async def _read_file(value, field: str) -> Upload:
    if not isinstance(value, UploadFile):
        raise ApiError(400, "missing_file", f"form field {field!r} must be a file upload, not a text value; "
                       f"send it as e.g. curl -F {field}=@image.jpg")
    data = await value.read()
    if not data:
        raise _empty(value.filename)
    return Upload(value.filename, data)


def _plain_body_type(scope) -> bytes | None:
    """The Content-Type of a body with a Content-Length above 0 and no Content-Encoding (the first of each header,
    as `request.headers` gives them), read from the scope's headers in one pass; else None."""
    media = length = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            if media is None:
                media = value
        elif name == b"content-length":
            if length is None:
                length = value
        elif name == b"content-encoding":
            return None
    if media is None or length is None or length.strip() == b"0":
        return None
    return media


def _plain_raw(scope) -> bool:
    """Whether the request is a raw upload as most are: an image/* or octet-stream body of a Content-Length above
    0, not compressed. Read from the scope's headers in one pass (the first of each, as `request.headers` gives
    them), not through a Headers object and four lookups."""
    media = _plain_body_type(scope)
    if media is None:
        return False
    media = media.split(b";")[0].strip().lower()
    return media.startswith(b"image/") or media == b"application/octet-stream"


_MULTIPART = b"multipart/form-data; boundary="
_BOUNDARY = re.compile(rb"[A-Za-z0-9'()+_,\-./:=?]{1,70}")  # RFC 2046's characters, less the space; no quotes
_PART_HEADER = re.compile(rb"([A-Za-z0-9-]+): [^\r\n]*")
_ONE_FILE = re.compile(rb'form-data; name="%s"; filename="[^"\\\r\n]*"' % SINGLE_FIELD.encode())


def _plain_multipart(scope) -> bytes | None:
    """The boundary of a multipart upload as most clients send one (curl -F, requests, httpx): a Content-Type of
    exactly `multipart/form-data; boundary=B` (B plain), a Content-Length above 0, not compressed; else None."""
    media = _plain_body_type(scope)
    if media is None or not media.startswith(_MULTIPART):
        return None
    boundary = media[len(_MULTIPART):]
    return boundary if _BOUNDARY.fullmatch(boundary) else None


def _one_file(body: bytes, boundary: bytes) -> Upload | None:
    """The upload of a multipart body that holds one part and nothing else: a file of at least one byte in the field
    `file` (`Content-Disposition: form-data; name="file"; filename="..."`, other part headers plain), as Starlette's
    parser reads it (its own functions read the file's name); None for any other body, which the parser judges."""
    first, last = b"--" + boundary + b"\r\n", b"\r\n--" + boundary + b"--\r\n"
    if not body.startswith(first) or not body.endswith(last):
        return None
    end = len(body) - len(last)
    head_end = body.find(b"\r\n\r\n", len(first), end)
    if head_end < 0 or body.find(last[:-4], head_end + 2) != end or head_end + 4 >= end:  # one part, not empty
        return None
    disposition = None
    for line in body[len(first):head_end].split(b"\r\n"):
        header = _PART_HEADER.fullmatch(line)
        if header is None:
            return None
        if header[1].lower() == b"content-disposition":
            if disposition is not None:
                return None
            disposition = line[len(header[1]) + 2:]
    if disposition is None or _ONE_FILE.fullmatch(disposition) is None:
        return None
    filename = _user_safe_decode(parse_options_header(disposition)[1][b"filename"], "utf-8")
    return Upload(filename, body[head_end + 4:end])


async def _whole_body(request: Request) -> bytes | None:
    """The body when it comes in one piece (a small upload arrives with its headers), kept as `request.body()`
    keeps it; else None, the piece read given again to whatever reads the request next."""
    receive = request.receive
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        request._body = body = message.get("body", b"")
        return body
    given = [message]

    async def again():
        return given.pop() if given else await receive()

    request._receive = again
    return None


async def read_single(request: Request, max_body_bytes: int) -> Upload:
    """The one image of POST /classify."""
    if _plain_raw(request.scope):  # the common case, read with the least work: what the code below does for it
        data = await raw_body(request)
        if not data:
            raise _empty(None)
        return Upload(None, data)
    boundary = _plain_multipart(request.scope)
    if boundary is not None:  # likewise, a multipart upload of the one file: else the parser reads what came
        body = await _whole_body(request)
        upload = _one_file(body, boundary) if body is not None else None
        if upload is not None:
            return upload
    request = await _opened(request, max_body_bytes)
    media = media_type(request)
    if media == "multipart/form-data":
        form = await _read_form(request, max_files=1)
        try:
            value = form.get(SINGLE_FIELD)
            if value is None:
                raise ApiError(400, "missing_file", f"the multipart body has no field named {SINGLE_FIELD!r}; send "
                               f"the image as e.g. curl -F {SINGLE_FIELD}=@image.jpg")
            return await _read_file(value, SINGLE_FIELD)
        finally:
            await form.close()
    if media.startswith("image/") or media == RAW_BINARY:
        data = await request.body()
        if not data:
            raise _empty(None)
        return Upload(None, data)
    raise _unsupported(media, f"send the image as the multipart/form-data field {SINGLE_FIELD!r} or as the raw "
                       "body with an image/* Content-Type such as image/jpeg (or application/octet-stream)")


async def read_batch(request: Request, max_files: int, max_body_bytes: int) -> list[Upload | ApiError]:
    """The images of POST /classify/batch, in order; an empty file becomes an error in its place."""
    request = await _opened(request, max_body_bytes)
    media = media_type(request)
    if media != "multipart/form-data":
        raise _unsupported(media, f"send the images as multipart/form-data, each in a field named {BATCH_FIELD!r}")
    form = await _read_form(request, max_files=max_files)
    try:
        values = form.getlist(BATCH_FIELD)
        if not values:
            raise ApiError(400, "missing_file", f"the multipart body has no field named {BATCH_FIELD!r}; send one "
                           f"or more images as e.g. curl -F {BATCH_FIELD}=@a.jpg -F {BATCH_FIELD}=@b.png")
        for value in values:
            if not isinstance(value, UploadFile):  # a malformed request, not a bad file: refuse all of it
                await _read_file(value, BATCH_FIELD)
        uploads: list[Upload | ApiError] = []
        for value in values:
            try:
                uploads.append(await _read_file(value, BATCH_FIELD))
            except ApiError as exc:
                exc.filename = getattr(value, "filename", None)
                uploads.append(exc)
        return uploads
    finally:
        await form.close()
