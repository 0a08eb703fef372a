"""Preprocessing in worker processes (`preprocess_procs`): the same model inputs bit for bit as the thread path, the
same errors (class, status, message) for bad images, a worker that dies costs its request a 500 and the pool is
replaced, and a real `vggserve serve --preprocess-procs 2` classifies like the engine and drains on SIGTERM."""

import asyncio
import hashlib
import io
import os
import pickle
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import psutil
import pytest
from conftest import TEST_DEVICE
from fastapi.testclient import TestClient
from image_corpus import BAD, EXPECTED, GOOD, build_corpus
from PIL import Image

from vggserve.errors import ImageError
from vggserve.images import ImageDecodeError, ImageTooLarge, UnsupportedImageFormat
from vggserve.predictions import softmax
from vggserve.preprocess import center_crop, normalize_pixels, preprocess
from vggserve.serving import Settings, SettingsError, create_app
from vggserve.serving.scheduling.errors import PreprocessFailed, QueueFull, Unavailable
from vggserve.testing.models import CRASH_MARKER, crash_on_marker
from vggserve.serving.scheduling.imaging import normalize, prepare_image
from vggserve.serving.scheduling.procpool import ProcessPool
from vggserve.testing.servers import ServerProcess
from vggserve.serving.settings import default_preprocess_procs
from vggserve.weights.spec import NUM_CLASSES
from test_http_api import PNG, assert_error, wait_ready
from test_http_images import MEDIA
from test_http_process import metric, wait_metric

MAX_PIXELS = 40_000_000


def _encoded(pixels: np.ndarray, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, bytes]:
    """The awkward-image corpus plus photo-sized inputs that exercise the resize, crop and aspect-ratio bound."""
    files = {name: path.read_bytes() for name, path in build_corpus(tmp_path_factory.mktemp("corpus")).items()}
    rng = np.random.default_rng(7)
    files["noise_500x375.jpg"] = _encoded(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8), "JPEG", quality=90)
    files["noise_333x640.png"] = _encoded(rng.integers(0, 256, (640, 333, 3), dtype=np.uint8), "PNG")
    files["strip_3000x20.png"] = _encoded(rng.integers(0, 256, (20, 3000, 3), dtype=np.uint8), "PNG")
    return files


def media(name: str) -> str:
    return MEDIA[name.rsplit(".", 1)[1]]


class HashModel:
    """Scores each image from the SHA-256 of its float32 input: any difference in any bit changes the predictions."""

    def __init__(self, preprocessing: str):
        self.preprocessing = preprocessing
        self.device_name = f"hash stand-in ({preprocessing})"
        self.weights_info = {"path": None, "format": "memory", "sha256": None}

    def logits(self, x: np.ndarray) -> np.ndarray:
        rows = []
        for image in np.ascontiguousarray(x, dtype=np.float32):
            seed = int.from_bytes(hashlib.sha256(image.tobytes()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).standard_normal(NUM_CLASSES).astype(np.float32) * 4)
        return np.stack(rows)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return softmax(self.logits(x))

    def close(self) -> None:
        pass


def hash_app(procs: int, mode: str = "torchvision", **settings):
    s = Settings(preprocess_procs=procs, preprocess_threads=2, max_batch_size=4, max_wait_ms=2, max_files=32,
                 max_pixels=MAX_PIXELS, **settings)
    return create_app(s, model_factory=lambda device: HashModel(mode))


# settings ------------------------------------------------------------------------------------------------------
def test_default_is_threads_only_whatever_the_cores(monkeypatch):
    for cpus in (1, 2, 4, 16, 64, None):  # measured: threads win even on 16 cores (BENCHMARKS.md)
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        assert default_preprocess_procs() == 0, cpus
        assert Settings().preprocess_procs == 0, cpus
    monkeypatch.undo()
    assert Settings(preprocess_procs=0).preprocess_procs == 0
    for bad in (-1, 257, 2.0, "4", True):
        with pytest.raises(SettingsError) as info:
            Settings(preprocess_procs=bad)
        assert "--preprocess-procs" in str(info.value) and "pass e.g." in str(info.value)


def test_cli_flag_reaches_the_settings():
    import argparse

    from vggserve.cli import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    assert serve._settings(parser.parse_args(["serve", "--preprocess-procs", "3"])).preprocess_procs == 3
    assert serve._settings(parser.parse_args(["serve", "--preprocess-procs", "0"])).preprocess_procs == 0
    assert serve._settings(parser.parse_args(["serve"])).preprocess_procs == default_preprocess_procs()
    with pytest.raises(SettingsError, match="--preprocess-procs"):
        serve._settings(parser.parse_args(["serve", "--preprocess-procs", "-2"]))


# errors cross the process boundary whole ------------------------------------------------------------------------
@pytest.mark.parametrize("error", [ImageError("base"), ImageDecodeError("image data is truncated"),
                                   UnsupportedImageFormat("format 'SVG' of input is not accepted"),
                                   ImageTooLarge("Input is too large"),
                                   PreprocessFailed("the worker died"), QueueFull(8), Unavailable("draining", "drain")])
def test_errors_pickle_with_class_status_code_and_message(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    if not isinstance(error, ImageError):
        assert (back.code, back.message, back.retry_after_s) == (error.code, error.message, error.retry_after_s)
    else:
        assert (back.http_status, back.code) == (error.http_status, error.code)


# the worker's crop + the main process's arithmetic == the thread path, bit for bit -------------------------------
def test_shared_helpers_compose_to_preprocess(corpus):
    image = Image.open(io.BytesIO(corpus["noise_500x375.jpg"]))
    for mode in ("torchvision", "caffe"):
        assert preprocess(image, mode).tobytes() == normalize_pixels(center_crop(image), mode).tobytes()


@pytest.mark.parametrize("mode", ["torchvision", "caffe"])
def test_worker_processes_give_the_thread_paths_inputs_and_errors(corpus, mode):
    pool = ProcessPool(2)
    pool.start()

    async def through_workers():
        return await asyncio.gather(*(pool.run(data, mode, MAX_PIXELS) for data in corpus.values()),
                                    return_exceptions=True)

    try:
        outcomes = dict(zip(corpus, asyncio.run(through_workers())))
    finally:
        pool.close()
    for name, data in corpus.items():
        got = outcomes[name]
        try:
            want, _ = prepare_image(data, mode, MAX_PIXELS)
        except Exception as exc:  # noqa: BLE001 - the thread path's error is what the worker must raise
            assert type(got) is type(exc), (name, got)
            assert str(got) == str(exc) and getattr(got, "code", None) == getattr(exc, "code", None), name
            assert getattr(got, "http_status", None) == getattr(exc, "http_status", None), name
            continue
        assert not isinstance(got, BaseException), (name, got)
        crop, seconds = got
        pixels = crop.array
        assert crop.form == "crop" and pixels.dtype == np.uint8 and pixels.shape == (224, 224, 3), name
        assert pixels.flags.c_contiguous and seconds >= 0
        tensor = normalize(crop, mode)[0].array
        assert tensor.dtype == np.float32 and tensor.shape == (3, 224, 224) and tensor.flags.c_contiguous
        assert tensor.tobytes() == want.array.tobytes(), name
    assert sum(not isinstance(o, BaseException) for o in outcomes.values()) == len(GOOD) + 3


# the HTTP service with processes answers exactly as with threads ---------------------------------------------------
def _answers(app, corpus: dict[str, bytes]) -> tuple[dict, list]:
    """{name: (status, body without timings/ids)} from /classify, and the /classify/batch entries, likewise."""
    def strip(body: dict) -> dict:
        return {k: v for k, v in body.items() if k not in ("timing_ms", "request_id")}

    with TestClient(app) as client:
        wait_ready(client, timeout_s=20)
        with ThreadPoolExecutor(4) as threads:  # concurrent, so images share batches as under load
            responses = list(threads.map(lambda n: client.post("/classify?top_k=5", content=corpus[n],
                                                               headers={"content-type": media(n)}), corpus))
        single = {name: (r.status_code, strip(r.json())) for name, r in zip(corpus, responses)}
        r = client.post("/classify/batch?top_k=3", files=[("files", (n, d, media(n))) for n, d in corpus.items()])
        assert r.status_code == 200, r.text
        batch = [strip(entry) for entry in r.json()["results"]]
    return single, batch


@pytest.mark.parametrize("mode", ["torchvision", "caffe"])
def test_http_answers_with_processes_are_identical_to_threads(corpus, mode):
    threads_single, threads_batch = _answers(hash_app(0, mode), corpus)
    procs_single, procs_batch = _answers(hash_app(2, mode), corpus)
    assert procs_single == threads_single
    assert procs_batch == threads_batch
    for name in GOOD:
        assert procs_single[name][0] == 200 and len(procs_single[name][1]["predictions"]) == 5, name
    for name in BAD:
        status, body = procs_single[name]
        expect = EXPECTED[name]
        assert status == expect.http_status, name
        assert body["error"]["code"] == (expect.code if name != "empty.jpg" else "empty_body"), name
        if name != "empty.jpg":
            assert expect.message in body["error"]["message"], name


def test_a_dying_worker_costs_its_request_a_500_and_the_pool_is_replaced():
    app = hash_app(2)
    service = app.state.service
    service.backend.preprocess_task = crash_on_marker
    with TestClient(app) as client:
        wait_ready(client, timeout_s=20)
        before = client.post("/classify", content=PNG, headers={"content-type": "image/png"})
        assert before.status_code == 200
        r = client.post("/classify", content=CRASH_MARKER, headers={"content-type": "image/png"})
        assert_error(r, 500, "preprocess_failed", "restarted")
        assert service.backend.procs.restarts == 1
        after = client.post("/classify", content=PNG, headers={"content-type": "image/png"})
        assert after.status_code == 200 and after.json()["predictions"] == before.json()["predictions"]
        files = [("files", ("a.png", PNG, "image/png")), ("files", ("boom.png", CRASH_MARKER, "image/png"))]
        entries = client.post("/classify/batch", files=files).json()["results"]
        assert entries[1]["error"]["code"] == "preprocess_failed"
        assert entries[0].get("predictions") == before.json()["predictions"] or \
            entries[0]["error"]["code"] == "preprocess_failed"  # it may have been in the dying worker's queue
        assert client.get("/health/ready").status_code == 200
        assert client.post("/classify", content=PNG, headers={"content-type": "image/png"}).status_code == 200
        assert client.get("/metadata").json()["preprocess_procs"] == 2


# a real server process --------------------------------------------------------------------------------------------
def _descendants(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_real_server_with_worker_processes_classifies_like_the_engine_and_drains(tiny_weights_path, corpus):
    from vggserve.model.vgg16 import VGG16

    names = ["noise_500x375.jpg", "cmyk.jpg", "exif_orientation_6.jpg", "animated.gif"]
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as engine:
        tensors = np.stack([prepare_image(corpus[n], engine.preprocessing, MAX_PIXELS)[0].array for n in names])
        expected = engine.probabilities(tensors)
    http = httpx.Client(timeout=60)
    with ServerProcess.serve_cli(["--weights", str(tiny_weights_path), "--device", TEST_DEVICE,
                                  "--preprocess-procs", "2", "--preprocess-threads", "2", "--max-batch-size", "4",
                                  "--no-warmup", "--drain-timeout", "20", "--log-level", "warning"]) as server:
        server.wait_ready(60)
        assert http.get(server.url + "/metadata").json()["preprocess_procs"] == 2
        workers = _descendants(server.proc.pid)
        assert len(workers) >= 3, workers  # the fork server and two workers
        for name, probabilities in zip(names, expected):
            r = http.post(server.url + "/classify?top_k=3", content=corpus[name],
                          headers={"content-type": media(name)})
            assert r.status_code == 200, (name, r.text)
            got = r.json()["predictions"]
            assert [p["index"] for p in got] == list(np.argsort(-probabilities, kind="stable")[:3]), name
            for p in got:
                assert p["probability"] == pytest.approx(float(probabilities[p["index"]]), rel=1e-5, abs=1e-7)
        bad = http.post(server.url + "/classify", content=corpus["drawing.svg"], headers={"content-type": "image/png"})
        assert bad.status_code == 415 and bad.json()["error"]["code"] == "unsupported_media_type"

        decoded = metric(server.url, "vggserve_preprocess_seconds_count")
        with ThreadPoolExecutor(6) as threads:  # SIGTERM with requests in flight: they finish, then it exits 0
            files = [("files", (f"{i}.jpg", corpus["noise_500x375.jpg"], "image/jpeg")) for i in range(4)]
            in_flight = [threads.submit(http.post, server.url + "/classify/batch", files=files) for _ in range(6)]
            # the signal goes once all six are admitted, read whole and their 24 images decoded and queued (a fixed
            # sleep raced the uploads on a busy machine: a request that had not arrived was refused, or cut off
            # mid-upload, or found the server gone)
            wait_metric(server.url, "vggserve_preprocess_seconds_count", lambda v: v == decoded + 24,
                        "the six requests' 24 images decoded", timeout_s=60)
            server.signal(signal.SIGTERM)
            answers = [f.result() for f in in_flight]
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        for a in answers:
            assert all("predictions" in entry for entry in a.json()["results"]), a.text
        assert server.wait(30) == 0, server.output()[-3000:]
        end = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in workers), "worker processes outlived the server"
        assert "Traceback" not in server.output(), server.output()[-3000:]
