"""Awkward and bad images through the HTTP API with the real engine (tiny weights): every good one is classified
exactly as the engine classifies the same file, every bad one gets its 4xx and message, and the server keeps
answering."""

import pytest
from fastapi.testclient import TestClient
from conftest import TEST_DEVICE
from image_corpus import BAD, EXPECTED, GOOD, build_corpus

from vggserve.model.vgg16 import VGG16
from vggserve.serving import Settings, create_app
from test_http_api import PNG, assert_error, wait_ready

MEDIA = {"png": "image/png", "jpg": "image/jpeg", "gif": "image/gif", "webp": "image/webp", "bmp": "image/bmp",
         "tiff": "image/tiff", "svg": "image/svg+xml", "pdf": "image/pdf", "eps": "image/eps", "ico": "image/x-icon",
         "txt": "image/png"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def engine(tiny_weights_path):
    model = VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4)
    yield model
    model.close()


@pytest.fixture(scope="module")
def client(tiny_weights_path):
    settings = Settings(weights=str(tiny_weights_path), devices=(TEST_DEVICE,), max_batch_size=4, max_wait_ms=2,
                        max_pixels=40_000_000, preprocess_threads=2)
    with TestClient(create_app(settings)) as c:
        wait_ready(c, timeout_s=120)
        yield c


def post(client, path, top_k=5):
    media = MEDIA[path.suffix.lstrip(".")]
    return client.post(f"/classify?top_k={top_k}", content=path.read_bytes(), headers={"content-type": media})


def test_unusual_but_valid_images_match_the_engine(client, engine, corpus):
    expected = engine.classify([corpus[name] for name in GOOD], top_k=5)
    for name, want in zip(GOOD, expected):
        r = post(client, corpus[name])
        assert r.status_code == 200, (name, r.text)
        got = r.json()["predictions"]
        assert [p["index"] for p in got] == [p["index"] for p in want], name
        assert [p["label"] for p in got] == [p["label"] for p in want], name
        for g, w in zip(got, want):
            assert g["probability"] == pytest.approx(w["probability"], rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize("name", BAD)
def test_bad_images_get_their_status_and_message_and_the_server_stays_up(client, corpus, name):
    expect = EXPECTED[name]
    r = post(client, corpus[name])
    assert_error(r, expect.http_status, expect.code if name != "empty.jpg" else "empty_body")
    if name != "empty.jpg":
        assert expect.message in r.json()["error"]["message"]
    assert client.post("/classify", content=PNG, headers={"content-type": "image/png"}).status_code == 200


def test_batch_endpoint_mixes_results_and_errors_in_order(client, engine, corpus):
    names = ["rgba.png", "drawing.svg", "cmyk.jpg", "bomb_10000x10000.png", "animated.gif"]
    files = [("files", (n, corpus[n].read_bytes(), MEDIA[corpus[n].suffix.lstrip(".")])) for n in names]
    r = client.post("/classify/batch?top_k=3", files=files)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["filename"] for x in results] == names
    assert results[1]["error"]["code"] == EXPECTED["drawing.svg"].code
    assert results[3]["error"]["code"] == EXPECTED["bomb_10000x10000.png"].code
    want = engine.classify([corpus[n] for n in ("rgba.png", "cmyk.jpg", "animated.gif")], top_k=3)
    for result, w in zip((results[0], results[2], results[4]), want):
        assert [p["index"] for p in result["predictions"]] == [p["index"] for p in w]


def test_metadata_reports_the_weights_file_and_checksum(client, tiny_weights_path):
    from vggserve.weights import sha256_file

    meta = client.get("/metadata").json()
    assert meta["weights"]["path"] == str(tiny_weights_path)
    assert meta["weights"]["sha256"] == sha256_file(tiny_weights_path)
    assert meta["devices"][0]["name"]
