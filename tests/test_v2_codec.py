"""The v2 codec's response writer and classification strings against what json.dumps and a full sort give."""

import json

import numpy as np
import pytest

from vggserve.labels import imagenet_labels
from vggserve.serving.protocols.v2 import _headers
from vggserve.serving.protocols.v2_codec import RequestedOutput, classifications, encode_response


def _reference(model, version, request_id, tensors) -> tuple[bytes, int | None]:
    """The response as the v2 codec always wrote it: one dict through json.dumps, binary parts after it."""
    outputs, binary = [], []
    for requested, array in tensors:
        strings = isinstance(array, list)
        entry = {"name": requested.name, "datatype": "BYTES" if strings else "FP32",
                 "shape": [len(array), len(array[0])] if strings else list(array.shape)}
        if requested.binary:
            data = (b"".join(len(e).to_bytes(4, "little") + e for row in array for e in row) if strings
                    else np.ascontiguousarray(array, "<f4").tobytes())
            entry["parameters"] = {"binary_data_size": len(data)}
            binary.append(data)
        else:
            entry["data"] = [e.decode() for row in array for e in row] if strings else array.reshape(-1).tolist()
        outputs.append(entry)
    response = {"model_name": model, "model_version": version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = outputs
    head = json.dumps(response, separators=(",", ":")).encode()
    return (head, None) if not binary else (head + b"".join(binary), len(head))


@pytest.mark.parametrize("seed", range(40))
def test_the_response_is_what_json_dumps_writes(seed):
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(1, 4))
    rows = {"probabilities": rng.random((batch, 1000)).astype(np.float32),
            "logits": (rng.standard_normal((batch, 1000)) * 30).astype(np.float32)}
    rows["logits"][0, int(rng.integers(0, 1000))] = np.nan if seed % 5 == 0 else 1e-7
    tensors = []
    for name in rng.permutation(["logits", "probabilities"])[:int(rng.integers(1, 3))]:
        k = int(rng.choice([0, 1, 5, 1000]))
        array = rows[str(name)]
        tensors.append((RequestedOutput(str(name), bool(rng.integers(0, 2)), k),
                        classifications(array, k) if k else array))
    request_id = [None, "", "abc", 'a "quoted" \\ id\n', "ünïcødé ✓"][seed % 5]
    got = encode_response("vgg16", "1", request_id, tensors)
    assert got == _reference("vgg16", "1", request_id, tensors)
    json.loads(got[0][:got[1]] if got[1] is not None else got[0])  # and it is JSON


def test_classifications_are_the_top_k_of_a_stable_sort_as_score_index_label():
    labels = imagenet_labels()
    rows = np.random.default_rng(3).random((3, 1000)).astype(np.float32)
    rows[1, [10, 20, 30]] = rows[1].max() + 1  # ties: the lower index first
    for k in (1, 5, 17, 1000):
        got = classifications(rows, k)
        assert got == classifications(list(rows), k)  # rows as an array or as a list of rows
        for row, strings in zip(rows, got):
            order = np.argsort(-row, kind="stable")[:k]
            assert strings == [f"{row[i]:g}:{i}:{labels[i]}".encode() for i in order.tolist()]


def test_the_two_headers_are_read_in_one_pass_first_of_each_as_starlette_gives_them():
    from starlette.requests import Request

    headers = [(b"x-request-timeout-ms", b"250"), (b"inference-header-content-length", b"12"),
               (b"x-request-timeout-ms", b"9"), (b"inference-header-content-length", b"\xe9")]
    scope = {"type": "http", "headers": headers}
    request = Request(scope)
    assert _headers(scope) == (request.headers.get("Inference-Header-Content-Length"),
                               request.headers.get("x-request-timeout-ms")) == ("12", "250")
    assert _headers({"headers": headers[3:]}) == ("\xe9", None)
    assert _headers({"headers": []}) == (None, None)
