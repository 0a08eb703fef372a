"""The Open Inference Protocol's (KServe v2) inference body, read and written: JSON tensors, the binary tensor data
extension, and the classification extension. Pure functions on bytes and arrays, with no HTTP framework in them;
every problem with a request is a `V2RequestError` whose message says what to fix (the route answers it 400).

Request body: the JSON inference request, then (binary tensor data extension) each input whose parameters carry
`binary_data_size` as that many raw bytes, in input order; the `Inference-Header-Content-Length` header gives the
JSON's length. FP32 data is little-endian float32, row major; each BYTES element is a 4-byte little-endian length
and the bytes. In JSON, a BYTES element of the `image` input is the image file in base64 (image files are not
UTF-8 text); FP32 data is a flat or nested list of numbers.

Response: the JSON inference response, then the outputs asked for as binary (`binary_data` on the output, or the
request's `binary_data_output`), in output order, each output's `binary_data_size` in its parameters. An output with
`"classification": K` is BYTES [N, K] of "score:index:label", highest score first, as Triton writes them.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from functools import lru_cache
from json.encoder import encode_basestring_ascii as _string  # a str as json.dumps writes it

import numpy as np

from ...labels import imagenet_labels
from ..modelcard import ModelCard
from .answers import top_k_row

HEADER_LENGTH = "Inference-Header-Content-Length"
DATATYPE_BYTES = {"FP32": 4}


class V2RequestError(ValueError):
    """A malformed or unacceptable inference request (a 400 in v2)."""


@dataclass
class RequestedOutput:
    name: str
    binary: bool
    classes: int = 0  # the classification extension's count; 0: the tensor itself


@dataclass
class InferRequest:
    id: str | None
    input_name: str
    batch: int
    images: list[bytes] = field(default_factory=list)  # the `image` input: encoded files
    tensor: np.ndarray | None = None  # the `input` input: float32 (N, 3, 224, 224)
    outputs: list[RequestedOutput] = field(default_factory=list)
    timeout_us: int | None = None


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(the JSON part, the binary part) of a request body."""
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise V2RequestError(f"{HEADER_LENGTH} must be the JSON part's length in bytes, got "
                             f"{header_length!r}") from None
    if not 0 <= n <= len(body):
        raise V2RequestError(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    return body[:n], body[n:]


def _json_object(text: bytes) -> dict:
    try:
        request = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise V2RequestError(f"the inference request is not valid JSON ({exc}); send a JSON object, followed by "
                             f"binary tensor data only with the {HEADER_LENGTH} header") from None
    if not isinstance(request, dict):
        raise V2RequestError("the inference request must be a JSON object with an `inputs` list")
    return request


def _parameters(obj: dict, what: str, name=None) -> dict:
    """`obj`'s parameters; the message names `what` (and `name`, when given) only when they are wrong."""
    params = obj.get("parameters") or {}
    if not isinstance(params, dict):
        where = what if name is None else f"{what} {name!r}"
        raise V2RequestError(f"`parameters` of {where} must be an object")
    return params


def _flat(data) -> list:
    """A nested list flattened row-major (v2 allows either)."""
    if not isinstance(data, list):
        return [data]
    out: list = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def _shape(spec_shape: tuple, shape, name: str, max_batch: int) -> int:
    """The batch size of a request shape that matches the declared one (-1: the batch)."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise V2RequestError(f"input {name!r}: `shape` must be a list of integers, got {shape!r}")
    if len(shape) != len(spec_shape) or any(d != s for d, s in zip(shape[1:], spec_shape[1:])):
        want = "[" + ", ".join("N" if d == -1 else str(d) for d in spec_shape) + "]"
        raise V2RequestError(f"input {name!r} has shape {shape}; it takes {want}")
    if not 1 <= shape[0] <= max_batch:
        raise V2RequestError(f"input {name!r} has a batch of {shape[0]}; send 1 to {max_batch} per request "
                             "(the server's --max-files)")
    return shape[0]


def _bytes_elements(raw: bytes, count: int, name: str) -> list[bytes]:
    """BYTES elements from the binary extension's encoding: a 4-byte little-endian length before each."""
    out, offset, end = [], 0, len(raw)
    for i in range(count):
        if offset + 4 > end:
            raise V2RequestError(f"input {name!r}: binary data ends before element {i} of {count}")
        length = int.from_bytes(raw[offset:offset + 4], "little")
        offset += 4
        if offset + length > end:
            raise V2RequestError(f"input {name!r}: element {i} claims {length} bytes, past the end of its data")
        out.append(raw[offset:offset + length])
        offset += length
    if offset != end:
        raise V2RequestError(f"input {name!r}: {len(raw) - offset} bytes left after its {count} elements")
    return out


def _base64_elements(data, count: int, name: str) -> list[bytes]:
    values = _flat(data)
    if len(values) != count:
        raise V2RequestError(f"input {name!r}: shape says {count} elements, `data` has {len(values)}")
    out = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise V2RequestError(f"input {name!r}: element {i} must be a base64 string of an image file")
        try:
            out.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            raise V2RequestError(f"input {name!r}: element {i} is not valid base64; in JSON, send each image file "
                                 "base64-encoded (or send it as binary data)") from None
    return out


def _fp32(data, raw: bytes | None, shape: list, name: str) -> np.ndarray:
    count = int(np.prod(shape))
    if raw is not None:
        if len(raw) != 4 * count:
            raise V2RequestError(f"input {name!r}: shape {shape} is {4 * count} bytes of FP32, binary data has "
                                 f"{len(raw)}")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
    values = _flat(data)
    if len(values) != count:
        raise V2RequestError(f"input {name!r}: shape {shape} has {count} elements, `data` has {len(values)}")
    try:
        array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        raise V2RequestError(f"input {name!r}: `data` must hold numbers") from None
    if not np.isfinite(array).all():
        raise V2RequestError(f"input {name!r}: `data` holds a NaN or an infinity")
    return array.reshape(shape)


def parse_request(json_part: bytes, binary: bytes, card: ModelCard, max_batch: int) -> InferRequest:
    """The inference request in a body, checked against the model card; V2RequestError for anything wrong."""
    request = _json_object(json_part)
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise V2RequestError("`id` must be a string")
    params = _parameters(request, "the request")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        names = " or ".join(f"{t.name!r}" for t in card.inputs)
        raise V2RequestError(f"`inputs` must be a list of exactly one input, {names}")
    given = inputs[0]
    name, spec = given.get("name"), card.input(str(given.get("name")))
    if spec is None:
        raise V2RequestError(f"unknown input {name!r}; {card.name} takes "
                             + " or ".join(f"{t.name!r} ({t.datatype} {list(t.shape)})" for t in card.inputs))
    if given.get("datatype") != spec.datatype:
        raise V2RequestError(f"input {name!r} has datatype {given.get('datatype')!r}; it takes {spec.datatype}")
    batch = _shape(spec.shape, given.get("shape"), name, max_batch)
    in_params = _parameters(given, "input", name)
    size = in_params.get("binary_data_size")
    raw = None
    if size is not None:
        if not isinstance(size, int) or size < 0:
            raise V2RequestError(f"input {name!r}: binary_data_size must be a byte count")
        if size != len(binary):
            raise V2RequestError(f"input {name!r}: binary_data_size is {size} but {len(binary)} bytes follow the JSON")
        raw = binary
    elif binary:
        raise V2RequestError(f"{len(binary)} bytes follow the JSON but no input has binary_data_size")
    elif "data" not in given:
        raise V2RequestError(f"input {name!r} has no `data` (and no binary_data_size)")
    parsed = InferRequest(request_id, name, batch, timeout_us=_timeout(params))
    if spec.datatype == "BYTES":
        parsed.images = (_bytes_elements(raw, batch, name) if raw is not None
                         else _base64_elements(given.get("data"), batch, name))
    else:
        parsed.tensor = _fp32(given.get("data"), raw, given["shape"], name)
    parsed.outputs = _outputs(request.get("outputs"), bool(params.get("binary_data_output", False)), card)
    return parsed


def _timeout(params: dict) -> int | None:
    timeout = params.get("timeout")
    if timeout is None:
        return None
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
        raise V2RequestError(f"parameter `timeout` must be a positive number of microseconds, got {timeout!r}")
    return timeout


def _outputs(outputs, binary_default: bool, card: ModelCard) -> list[RequestedOutput]:
    if outputs is None:
        return [RequestedOutput(t.name, binary_default) for t in card.outputs]
    if not isinstance(outputs, list) or not outputs:
        raise V2RequestError("`outputs` must be a non-empty list (or left out, for every output)")
    out = []
    for requested in outputs:
        if not isinstance(requested, dict) or card.output(str(requested.get("name"))) is None:
            name = requested.get("name") if isinstance(requested, dict) else requested
            raise V2RequestError(f"unknown output {name!r}; {card.name} gives "
                                 + " and ".join(f"{t.name!r}" for t in card.outputs))
        params = _parameters(requested, "output", requested["name"])
        classes = params.get("classification", 0)  # absent: the tensor itself; given, it must be a count
        if "classification" in params and (not isinstance(classes, int) or isinstance(classes, bool)
                                           or not 1 <= classes <= card.classes):
            raise V2RequestError(f"output {requested['name']!r}: classification must be a count from 1 to "
                                 f"{card.classes}, got {classes!r}")
        out.append(RequestedOutput(requested["name"], bool(params.get("binary_data", binary_default)), classes))
    return out


def classifications(rows, k: int) -> list[list[bytes]]:
    """BYTES [N, k] as N lists of k strings "score:index:label", the k highest scores of each row first. `rows` is
    an (N, classes) array or a list of N rows."""
    labels = _label_bytes()
    out = []
    for row in rows:
        top = top_k_row(row, k).tolist()
        out.append([b"%g:%d:%s" % (p, i, labels[i]) for i, p in zip(top, row[top].tolist())])
    return out


@lru_cache(maxsize=1)
def _label_bytes() -> tuple[bytes, ...]:
    return tuple(label.encode() for label in imagenet_labels())


def encode_bytes(rows: list[list[bytes]]) -> bytes:
    """The binary extension's BYTES encoding of rows of bytes: a 4-byte little-endian length before each element."""
    return b"".join(len(e).to_bytes(4, "little") + e for row in rows for e in row)


_JSON = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(..., separators=) builds an encoder per call


def encode_response(model: str, version: str, request_id: str | None, tensors: list[tuple[RequestedOutput, object]]
                    ) -> tuple[bytes, int | None]:
    """(the response body, the JSON part's length when binary data follows it, else None). Each tensor is an FP32
    array, or rows of bytes (`classifications`): BYTES [N, k]. The JSON is written piece by piece, as
    json.dumps(separators=(",", ":")) writes the same object, without building it first."""
    head = ['{"model_name":', _string(model), ',"model_version":', _string(version)]
    if request_id is not None:
        head += [',"id":', _string(request_id)]
    head.append(',"outputs":[')
    binary = []
    for n, (requested, array) in enumerate(tensors):
        strings = isinstance(array, list)
        shape = [len(array), len(array[0])] if strings else list(array.shape)
        head += ["," if n else "", '{"name":', _string(requested.name), ',"datatype":',
                 '"BYTES"' if strings else '"FP32"', ',"shape":[', ",".join(map(str, shape)), "]"]
        if requested.binary:
            data = encode_bytes(array) if strings else np.ascontiguousarray(array, "<f4").tobytes()
            head.append(',"parameters":{"binary_data_size":%d}}' % len(data))
            binary.append(data)
        elif strings:
            head += [',"data":[', ",".join([_string(e.decode()) for row in array for e in row]), "]}"]
        else:
            head += [',"data":', _JSON(array.reshape(-1).tolist()), "}"]
    head.append("]}")
    text = "".join(head).encode()
    if not binary:
        return text, None
    return text + b"".join(binary), len(text)
