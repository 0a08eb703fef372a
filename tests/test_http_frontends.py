"""`vggserve serve --http-workers N`: HTTP front-end processes feeding one engine process.

In-process: the engine link answers like the BatchQueue (results, 429 beyond --max-queue, withdraws, a front end
that goes away), the device worker's uint8 path, the restart budget, the settings. Real processes: results
identical to `vggserve classify --json`, batching across front ends with metrics aggregated over processes, both
front ends serving, 4xx, a killed front end restarted; with a sleeping stand-in model: readiness, 429, 504, clients
that go away, and SIGTERM draining with no process left behind.
"""

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import TEST_DEVICE
from image_corpus import build_corpus
from PIL import Image

from test_http_api import PNG
from test_http_connections import exchange, request
from test_http_process import (HTTP, IMAGE, MEDIA, check_a_gone_client_is_withdrawn,
                               check_deadline_in_the_queue_is_504_and_not_computed,
                               check_full_queue_answers_429_at_once, check_sigterm_lets_the_requests_in_flight_finish,
                               classify, concurrently, live, metric, samples, wait_metric, wait_until)
from vggserve.modelinput import ModelInput
from vggserve.serving.protocols.errors import scheduling_status
from vggserve.serving.scheduling.batcher import BatchQueue, Outcome
from vggserve.serving.scheduling.errors import ClientGone, DeadlineExceeded
from vggserve.serving.processes.engine_host import EngineHost
from vggserve.serving.processes.engine_link import EngineClient
from vggserve.testing.models import SlowModel
from vggserve.serving.web.frontend_header import HEADER
from vggserve.serving.processes.frontends import FrontEnds, bind
from vggserve.serving.scheduling.imaging import decode_and_crop, prepare_image
from vggserve.serving.metrics import Metrics
from vggserve.testing.servers import ServerProcess, python_env
from vggserve.serving.service import Service
from vggserve.serving.settings import Settings, SettingsError, auto_http_workers, parse_http_workers
from vggserve.serving.scheduling.worker import DeviceWorker


def crop(color) -> np.ndarray:
    buffer = io.BytesIO()
    Image.new("RGB", (300, 260), color).save(buffer, "PNG")
    return decode_and_crop(buffer.getvalue(), "torchvision", 10**8)[0].array


@contextmanager
def engine_and_client(settings: Settings, models: list, seconds: float, capacity: int = 64):
    """A started Service with SlowModels (appended to `models`) behind an EngineHost, and a connected client."""
    with engine_and_clients(settings, models, seconds, 1, capacity) as (service, host, clients):
        yield service, clients[0]


@contextmanager
def engine_and_clients(settings: Settings, models: list, seconds: float, n: int, capacity: int = 64, block=None):
    """engine_and_client with `n` connected clients (front ends), and the EngineHost; each client's `received`
    lists the messages the engine sent it. `block`: an AdmissionBlock the clients admit from (front end i, slot i)."""
    def load(device):
        models.append(SlowModel(device, seconds, settings.max_batch_size))
        return models[-1]

    service = Service(settings, load)
    workdir = tempfile.mkdtemp(prefix="vggserve-test-")
    host = EngineHost(service, os.path.join(workdir, "engine.sock"), os.urandom(32))
    host.start()
    service.start()
    clients = [EngineClient(host.address, host.authkey, capacity, Metrics(), i,
                            shared=block and block.count(i, capacity)) for i in range(n)]
    try:
        for client in clients:
            client.received = []
            client._received_all = recording(client._received_all, client.received)
            client.connect()
            wait_until(lambda: client.state and client.state["ready"][0], 10, "the engine's ready state")
        yield service, host, clients
    finally:
        for client in clients:
            client.close()
        host.close()
        service.stop()
        os.rmdir(workdir)


def recording(handle, into: list):
    def handle_and_record(messages):
        into.extend(messages)
        handle(messages)

    return handle_and_record


def send(client: EngineClient, pixels: np.ndarray, timeout_s: float = 30.0):
    client.queue.admit(1)
    image = pixels if isinstance(pixels, ModelInput) else ModelInput.crop(pixels)
    return client.queue.submit(image, time.monotonic() + timeout_s)


def test_link_answers_with_the_models_probabilities_and_refuses_beyond_max_queue():
    from vggserve.preprocess import normalize_pixels

    settings = Settings(http_workers=2, max_queue=2, max_files=1, max_batch_size=1, max_wait_ms=0, warmup=False)
    models: list = []
    pixels = [crop((40 * i, 200 - 30 * i, 90)) for i in range(4)]
    with engine_and_client(settings, models, seconds=0.3) as (service, client):
        items = [send(client, p) for p in pixels]  # 1 on the device + 2 waiting fit; the 4th does not
        answers = [(item.future.exception(timeout=10) or item.future.result()) for item in items]
    refused = [a for a in answers if not isinstance(a, Outcome)]
    assert refused and all(scheduling_status(a) == 429 and a.code == "queue_full" for a in refused), answers
    reference = SlowModel(seconds_per_batch=0)
    for p, answer in zip(pixels, answers):
        if isinstance(answer, Outcome):
            want = reference.probabilities(normalize_pixels(p, "torchvision")[None])[0]
            assert np.array_equal(answer.probabilities, want) and answer.batch_size == 1
    assert sum(models[0].batch_sizes) == len(pixels) - len(refused)
    assert client.queue.admitted == 0


def test_link_withdraws_waiting_images_and_drops_a_front_end_that_goes_away():
    settings = Settings(http_workers=2, max_queue=8, max_files=1, max_batch_size=1, max_wait_ms=0, warmup=False)
    models: list = []
    with engine_and_client(settings, models, seconds=0.6) as (service, client):
        busy = send(client, crop((1, 2, 3)))
        wait_until(lambda: models[0].batch_sizes == [1], 5, "the first image on the device")
        late, gone = send(client, crop((4, 5, 6))), send(client, crop((7, 8, 9)))
        wait_until(lambda: len(service.backend.queue) == 2, 5, "two images waiting in the engine")
        client.queue.withdraw(late, DeadlineExceeded(0.1))
        error = late.future.exception(timeout=5)
        assert isinstance(error, DeadlineExceeded) and scheduling_status(error) == 504
        assert not busy.future.done()  # answered without waiting for the device
        client.link.close()  # the front end goes away: its waiting image is not computed
        count = service.metrics.registry.get_sample_value
        wait_until(lambda: count("vggserve_abandoned_total") == 1, 5, "the image withdrawn")
        assert scheduling_status(gone.future.exception(timeout=5)) == 503  # the front end's side: the link is gone
        assert len(service.backend.queue) == 0 and count("vggserve_timeouts_total") == 1
        wait_until(lambda: service.backend.workers[0].batches == 1, 5, "the busy image computed")
    assert models[0].batch_sizes == [1]


def reference(pixels: np.ndarray, want: str = "probabilities") -> np.ndarray:
    from vggserve.preprocess import normalize_pixels

    return getattr(SlowModel(seconds_per_batch=0), want)(normalize_pixels(pixels, "torchvision")[None])[0]


def results_messages(client) -> list[list[int]]:
    """The image ids of each "results" message the engine sent the client."""
    return [message[1] for message in client.received if message[0] == "results"]


def test_a_batch_split_over_two_front_ends_is_answered_with_one_results_message_to_each():
    settings = Settings(http_workers=2, max_queue=16, max_files=1, max_batch_size=4, max_wait_ms=5000, warmup=False)
    models: list = []
    pixels = [crop((50 * i, 30, 200 - 40 * i)) for i in range(4)]
    with engine_and_clients(settings, models, 0.0, 2) as (service, host, (a, b)):
        a.queue.admit(2)
        b.queue.admit(2)
        items = [a.queue.submit(ModelInput.crop(pixels[0]), time.monotonic() + 30, want_logits=True),
                 b.queue.submit(ModelInput.crop(pixels[1]), time.monotonic() + 30),
                 a.queue.submit(ModelInput.crop(pixels[2]), time.monotonic() + 30),
                 b.queue.submit(ModelInput.crop(pixels[3]), time.monotonic() + 30)]
        outcomes = [item.future.result(timeout=30) for item in items]
        assert models[0].batch_sizes == [4]  # one batch of both front ends' images
        assert results_messages(a) == [[items[0].id, items[2].id]]
        assert results_messages(b) == [[items[1].id, items[3].id]]
        assert a.queue.admitted == b.queue.admitted == 0 and all(not peer._items for peer in host._peers)
    for outcome, p in zip(outcomes, pixels):
        assert outcome.batch_size == 4 and outcome.device == "auto" and outcome.queue_s >= 0  # the default device
        np.testing.assert_allclose(outcome.probabilities, reference(p), rtol=1e-6)
    np.testing.assert_allclose(outcomes[0].logits, reference(pixels[0], "logits"), rtol=1e-6)
    assert [o.logits is None for o in outcomes] == [False, True, True, True]  # only the image that asked


def test_an_image_withdrawn_from_a_batch_gets_its_error_and_its_batch_mates_their_results():
    settings = Settings(http_workers=2, max_queue=16, max_files=1, max_batch_size=3, max_wait_ms=5000, warmup=False)
    models: list = []
    with engine_and_clients(settings, models, 0.5, 2) as (service, host, (a, b)):
        first, withdrawn = send(a, crop((1, 2, 3))), send(a, crop((4, 5, 6)))
        wait_until(lambda: len(service.backend.queue) == 2, 5, "two images waiting in the engine")
        a.queue.withdraw(withdrawn, DeadlineExceeded(0.1))
        assert isinstance(withdrawn.future.exception(timeout=5), DeadlineExceeded)
        second, third = send(a, crop((7, 8, 9))), send(b, crop((10, 11, 12)))  # the batch fills without it
        wait_until(lambda: models[0].batch_sizes == [3], 5, "the batch on the device")
        a.queue.withdraw(first, ClientGone())  # too late: on the device, it is computed and answered
        answers = [item.future.result(timeout=30) for item in (first, second, third)]
        assert all(outcome.batch_size == 3 for outcome in answers)
        assert results_messages(a) == [[first.id, second.id]] and results_messages(b) == [[third.id]]
        assert [m[1] for m in a.received if m[0] == "error"] == [withdrawn.id]  # one answer each
        assert a.queue.admitted == b.queue.admitted == 0 and all(not peer._items for peer in host._peers)
        count = service.metrics.registry.get_sample_value
        assert count("vggserve_timeouts_total") == 1 and count("vggserve_abandoned_total") == 0


def test_an_image_of_a_batch_that_fails_gets_its_error_and_the_others_their_results():
    from vggserve.errors import ImageError

    settings = Settings(http_workers=2, max_queue=16, max_files=1, max_batch_size=3, max_wait_ms=5000, warmup=False)
    models: list = []
    pixels = [crop((9, 99, 199)), crop((199, 99, 9))]
    with engine_and_clients(settings, models, 0.0, 1) as (service, host, (a,)):
        items = [send(a, ModelInput.crop(pixels[0])), send(a, ModelInput.encoded(b"not an image at all")),
                 send(a, ModelInput.crop(pixels[1]))]
        error = items[1].future.exception(timeout=30)
        assert isinstance(error, ImageError) and "not a recognised image" in str(error)  # itself, as the CPU path says
        answers = [items[0].future.result(timeout=30), items[2].future.result(timeout=30)]
        assert models[0].batch_sizes == [2] and [o.batch_size for o in answers] == [2, 2]
        for outcome, p in zip(answers, pixels):
            np.testing.assert_allclose(outcome.probabilities, reference(p), rtol=1e-6)
        assert results_messages(a) == [[items[0].id, items[2].id]]
        assert [m[1] for m in a.received if m[0] == "error"] == [items[1].id]
        assert a.queue.admitted == 0 and all(not peer._items for peer in host._peers)


class PixelModel(SlowModel):
    def probabilities_from_pixels(self, pixels):
        self.pixels = pixels
        return self.probabilities(pixels.astype(np.float32))


@pytest.mark.parametrize("model_class", [SlowModel, PixelModel])
def test_worker_computes_uint8_crops_on_the_device_or_normalises_them_exactly(model_class):
    image = io.BytesIO()
    Image.new("RGB", (320, 240), (10, 120, 240)).save(image, "PNG")
    data = image.getvalue()
    models: list = []
    metrics = Metrics()
    queue = BatchQueue(4, metrics)
    worker = DeviceWorker("cpu", lambda d: models.append(model_class(d, 0.0, 2)) or models[-1], queue, metrics,
                          max_batch_size=2, max_wait_s=0.05, warmup=True, on_change=lambda: None, pixels=True)
    worker.start()
    crop = decode_and_crop(data, "torchvision", 10**8)[0]
    pixels = crop.array
    queue.admit(2)
    items = [queue.submit(crop, time.monotonic() + 10), queue.submit(crop, time.monotonic() + 10)]
    outcomes = [item.future.result(timeout=10) for item in items]
    queue.close(ClientGone())
    worker.join(5)
    if model_class is PixelModel:
        assert models[0].pixels.dtype == np.uint8 and models[0].pixels.shape == (2, 224, 224, 3)
        want = SlowModel(seconds_per_batch=0).probabilities(pixels.astype(np.float32)[None])[0]
    else:  # the same float32 input as the single-process path's prepare_image, bit for bit
        want = SlowModel(seconds_per_batch=0).probabilities(prepare_image(data, "torchvision", 10**8)[0].array[None])[0]
    assert all(np.array_equal(o.probabilities, want) and o.batch_size == 2 for o in outcomes)


def test_front_ends_are_restarted_until_they_die_too_often():
    launched = []

    def launch(index):
        launched.append(index)
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])

    events = []  # each exit is reported (its admission slot cleared) before that front end is started again
    frontends = FrontEnds(2, lambda index: events.append(("launch", index)) or launch(index),
                          on_exit=lambda index: events.append(("exit", index)))
    frontends.start()
    reason = None
    end = time.monotonic() + 30
    while reason is None and time.monotonic() < end:
        reason = frontends.check()
        time.sleep(0.02)
    assert reason and "keep dying" in reason and "status 7" in reason, reason
    assert 5 <= len(launched) <= 7 and set(launched) == {0, 1}
    for index in (0, 1):
        theirs = [what for what, i in events if i == index]
        assert theirs == ["launch", "exit"] * (len(theirs) // 2) + ["launch"] * (len(theirs) % 2), events
    assert sum(what == "exit" for what, _ in events) == len(launched) - 1  # the last death is not restarted
    frontends.kill()


def test_http_workers_setting_and_flag():
    assert Settings().http_workers == 1
    assert [auto_http_workers(n) for n in (1, 2, 4, 16, 64)] == [1, 1, 2, 8, 32]
    assert [auto_http_workers(32, d) for d in (1, 2, 4)] == [16, 15, 13]
    # front ends that leave the decode to the devices: 8 for the first device, 4 for each other, within the above
    assert [auto_http_workers(64, d, "gpu") for d in (1, 2, 4, 8)] == [8, 12, 20, 25]  # 8 GPUs: 32 - 7 is less
    assert auto_http_workers(128, 8, "gpu") == 36
    assert [auto_http_workers(n, 1, "auto") for n in (4, 16, 64)] == [2, 8, 8]
    assert auto_http_workers(64, 4, "exact") == 29 and auto_http_workers(64, 4, "fast") == 29
    # the front ends admit from one --max-queue together: any number of them takes a full /classify/batch
    assert Settings(http_workers=4, max_queue=16, max_files=16).http_workers == 4
    assert parse_http_workers("auto") == auto_http_workers() and parse_http_workers("3") == 3
    for bad, words in [(0, "--http-workers"), (65, "--http-workers"),
                       ({"http_workers": 2, "preprocess_procs": 2}, "--preprocess-procs"),
                       ({"http_workers": 2, "mpi": True}, "mpirun")]:
        with pytest.raises(SettingsError, match=words):
            Settings(**bad) if isinstance(bad, dict) else Settings(http_workers=bad)
    with pytest.raises(SettingsError, match="auto"):
        parse_http_workers("many")

    import argparse

    from vggserve.cli import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    assert serve._settings(parser.parse_args(["serve", "--http-workers", "3"])).http_workers == 3
    assert serve._settings(parser.parse_args(["serve"])).http_workers == 1


# --- real processes -------------------------------------------------------------------------------------------

def front_end_pids(server: ServerProcess) -> set[int]:
    return {p.pid for p in psutil.Process(server.proc.pid).children()}


def no_process_left(server: ServerProcess) -> bool:
    try:
        os.killpg(server.proc.pid, 0)
    except ProcessLookupError:
        return True
    return False


@contextmanager
def running(server: ServerProcess):
    """The server, and on the way out, whatever is left of its process group killed (even if a test failed)."""
    try:
        with server:
            yield server
    finally:
        if not no_process_left(server):
            os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def frontends_server(tiny_weights_path):
    args = ["--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--max-batch-size", "4",
            "--max-wait-ms", "300", "--max-body-bytes", "65536", "--preprocess-threads", "2", "--http-workers", "2",
            "--log-level", "warning"]
    with running(ServerProcess.serve_cli(args)) as server:
        server.wait_ready(180)
        yield server


def test_results_identical_to_vggserve_classify_json(frontends_server, tiny_weights_path, tmp_path):
    """The front ends send the engine decoded images and its device resizes and crops them: the results must be
    those of `vggserve classify`, which crops on the CPU."""
    resized_before = metric(frontends_server.url, "vggserve_device_resized_images_total")
    assert HTTP.get(frontends_server.url + "/metadata", timeout=10).json()["resize_on_device"] is True
    files = build_corpus(tmp_path)
    names = ["palette.png", "animated.gif", "exif_orientation_8.jpg", "cmyk.jpg"]
    command = [sys.executable, "-m", "vggserve", "classify", "--json", "--weights", str(tiny_weights_path),
               "--device", TEST_DEVICE, "--top-k", "5", *(str(files[n]) for n in names)]
    done = subprocess.run(command, env=python_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    cli = {Path(line["image"]).name: line["predictions"] for line in map(json.loads, done.stdout.splitlines())}
    url = frontends_server.url
    with ThreadPoolExecutor(4) as pool:
        singles = list(pool.map(lambda n: HTTP.post(url + "/classify", content=files[n].read_bytes(),
                                                    headers={"content-type": MEDIA[files[n].suffix]}, timeout=60),
                                names))
    batch = HTTP.post(url + "/classify/batch", timeout=60,
                      files=[("files", (n, files[n].read_bytes(), MEDIA[files[n].suffix])) for n in names])
    assert batch.status_code == 200, batch.text
    for name, single, entry in zip(names, singles, batch.json()["results"]):
        assert single.status_code == 200, single.text
        want = cli[name]
        for got in (single.json()["predictions"], entry["predictions"]):
            assert [(p["index"], p["label"]) for p in got] == [(p["index"], p["label"]) for p in want], name
            assert [p["probability"] for p in got] == pytest.approx([p["probability"] for p in want],
                                                                   rel=1e-5, abs=1e-7)
    # every image of the corpus used here needs a resize: all 8 went through the device's resize
    assert metric(frontends_server.url, "vggserve_device_resized_images_total") - resized_before == 2 * len(names)


def test_images_from_both_front_ends_are_batched_together_and_metrics_cover_every_process(frontends_server):
    url = frontends_server.url
    before = samples(url)
    seen: set[str] = set()
    sent = 0
    for _ in range(6):  # new connections each time, until both front ends have answered (bounded)
        responses = concurrently(16, lambda: classify(url, timeout=120))
        assert [r.status_code for r in responses] == [200] * 16
        seen |= {r.headers[HEADER] for r in responses}
        sent += 16
        if len(seen) == 2:
            break
    assert {int(pid) for pid in seen} == front_end_pids(frontends_server)
    after = samples(url)
    images = after[("vggserve_batch_size_sum",)] - before[("vggserve_batch_size_sum",)]
    batches = after[("vggserve_batch_size_count",)] - before[("vggserve_batch_size_count",)]
    assert images == sent and images / batches > 1, (images, batches)
    key = ("vggserve_requests_total", ("endpoint", "/classify"), ("status", "200"))
    assert after[key] - before.get(key, 0) == sent  # counted in both front ends, summed in one scrape
    assert after[("vggserve_ready",)] == 1 and after[("vggserve_workers_ready",)] == 1
    meta = HTTP.get(url + "/metadata", timeout=10)
    assert meta.json()["http_workers"] == 2 and meta.json()["frontend"]["pid"] == int(meta.headers[HEADER])
    assert meta.json()["devices"][0]["state"] == "ready" and meta.json()["devices"][0]["batches"] >= batches


@pytest.mark.parametrize("kwargs, status, code", [
    ({"content": b"just text", "headers": {"content-type": "image/jpeg"}}, 400, "invalid_image"),
    ({"content": b"", "headers": {"content-type": "image/png"}}, 400, "empty_body"),
    ({"content": PNG, "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type"),
    ({"content": b"\x89PNG" + b"0" * 100_000, "headers": IMAGE}, 413, "payload_too_large"),
    ({"content": PNG, "headers": IMAGE, "params": {"top_k": 0}}, 422, "invalid_request"),
])
def test_bad_input_is_a_4xx_in_the_error_shape(frontends_server, kwargs, status, code):
    r = HTTP.post(frontends_server.url + "/classify", timeout=30, **kwargs)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and r.json()["error"]["code"] == code and r.json()["error"]["message"]


def test_a_killed_front_end_is_restarted_and_the_server_keeps_answering(frontends_server):
    url = frontends_server.url
    key = ("vggserve_requests_total", ("endpoint", "/classify"), ("status", "200"))
    answered = samples(url)[key]
    old = front_end_pids(frontends_server)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    codes = []
    end = time.monotonic() + 60
    while time.monotonic() < end:  # answering all along, until a new front end has replaced the killed one
        codes.append(classify(url, timeout=60).status_code)
        pids = front_end_pids(frontends_server)
        if len(pids) == 2 and victim not in pids:
            break
    assert codes and set(codes) == {200}, codes
    assert len(pids) == 2 and victim not in pids
    new = (pids - old).pop()
    wait_until(lambda: any(classify(url, timeout=60).headers[HEADER] == str(new) for _ in range(8)), 60,
               "the new front end answering")
    assert samples(url)[key] >= answered + len(codes)  # the dead process's counts are kept


def test_new_connections_are_spread_over_the_front_ends(frontends_server):
    import httpx

    answered: dict[str, int] = {}
    for _ in range(60):  # a new connection each time: the kernel hashes each to one front end's socket
        r = httpx.get(frontends_server.url + "/health/live", timeout=10)
        assert r.status_code == 200
        answered[r.headers[HEADER]] = answered.get(r.headers[HEADER], 0) + 1
    assert len(answered) == 2 and min(answered.values()) >= 10, answered  # one shared socket gave 60/0 splits


def test_sigterm_drains_and_leaves_no_process_behind(frontends_server):
    assert len(front_end_pids(frontends_server)) == 2
    frontends_server.signal(signal.SIGTERM)
    assert frontends_server.wait(60) == 0, frontends_server.output()[-3000:]
    wait_until(lambda: no_process_left(frontends_server), 10, "every front end gone")
    assert "Traceback" not in frontends_server.output()


SLOW_SERVER = """
import os, sys, time
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings

def load(device):
    while not os.path.exists(GATE):  # the test opens the gate once it has seen readiness answer 503
        time.sleep(0.02)
    return SlowModel(device, 0.5, 2)

settings = Settings(port=PORT, http_workers=2, max_batch_size=2, max_wait_ms=50, max_queue=8, max_files=4,
                    drain_timeout_s=10, preprocess_threads=2)
sys.exit(run_server(settings, load, log_level="warning"))
"""


def test_slow_model_readiness_429_504_gone_clients_and_drain(tmp_path):
    gate = tmp_path / "gate"
    with running(ServerProcess.python_code(SLOW_SERVER.replace("GATE", repr(str(gate))))) as server:
        url = server.url
        # readiness: the front ends are live while the engine still loads, ready once it has warmed up
        wait_until(lambda: live(url), 60, "liveness")
        r = HTTP.get(url + "/health/ready", timeout=5)
        assert r.status_code == 503 and r.json()["status"] == "not_ready", r.text
        assert classify(url).json()["error"]["code"] == "not_ready"
        gate.touch()
        server.wait_ready(30)

        # the front ends admit 8 images together (--max-queue 8) until answered: 12 at once, 4 or more refused
        check_full_queue_answers_429_at_once(url)

        # a deadline that passes while the image waits in the engine: 504 at once, never computed
        after = check_deadline_in_the_queue_is_504_and_not_computed(url)

        # a client that goes away while its image waits in the engine: withdrawn, so never computed
        images = after[("vggserve_batch_size_sum",)]
        check_a_gone_client_is_withdrawn(url, server.port, images)
        assert metric(url, "vggserve_batch_size_sum") == images + 2 and metric(url, "vggserve_queue_length") == 0

        # SIGTERM with requests in flight: readiness 503, new requests refused, in-flight ones finish, exit 0
        pids = front_end_pids(server)
        check_sigterm_lets_the_requests_in_flight_finish(server)
        wait_until(lambda: no_process_left(server), 10, "every front end gone")
        assert len(pids) == 2 and not any(psutil.pid_exists(p) for p in pids)
        assert "Traceback" not in server.output()


SLOW_CLIENTS_SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, http_workers=2, max_batch_size=2, max_queue=8, max_files=4, read_timeout_s=1,
                    preprocess_threads=2)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.01, 2), log_level="warning"))
"""


def test_every_front_end_answers_slow_clients_408_and_closes_their_connections():
    """Issue 22, item 3, with front ends: each of them applies --read-timeout, to headers and bodies alike."""
    stalled = request("/classify", "Content-Type: image/png", "Content-Length: 1000", body=b"abc")
    with running(ServerProcess.python_code(SLOW_CLIENTS_SERVER)) as server:
        server.wait_ready(60)
        with ThreadPoolExecutor(16) as pool:  # 16 connections: the kernel spreads them over both front ends
            answers = list(pool.map(lambda _: exchange(server.port, stalled), range(16)))
        assert {(status, closed) for status, _, _, closed in answers} == {(408, True)}, answers
        assert all(json.loads(body)["error"]["code"] == "request_timeout" for _, _, body, _ in answers)
        assert len({headers[HEADER.lower()] for _, headers, _, _ in answers}) == 2
        status, _, body, closed = exchange(server.port, b"POST /classify HTTP/1.1\r\nHost: 127.0.0.1\r\nConte")
        assert (status, closed) == (408, True) and json.loads(body)["error"]["code"] == "request_timeout"
        assert classify(server.url).status_code == 200


def test_a_front_ends_429_names_the_configured_queue_as_the_servers():
    """Issue 22, item 22, then issue 24: with --http-workers 2 --max-queue 3 a front end's 429 gives --max-queue as
    the whole server's room (the front ends admit from it together), with the single-process body."""
    from vggserve.serving.processes.admission import AdmissionBlock
    from vggserve.serving.processes.remote import RemoteBackend
    from vggserve.serving.scheduling.errors import QueueFull

    settings = Settings(http_workers=2, max_queue=3, max_files=1)
    block = AdmissionBlock(2)
    first, second = (RemoteBackend(settings, Metrics(), "unused", b"key", i, block.count(i, 3)) for i in range(2))
    first.queue.admit(3)
    with pytest.raises(QueueFull) as full:
        second.queue.admit(1)
    assert full.value.message == ("the server's queue is full (3 images waiting or being decoded, --max-queue 3); "
                                  "retry after 1 s")


def test_every_device_worker_dead_exits_3_and_stops_the_front_ends():
    code = """
import sys
from vggserve.errors import DeviceError
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
def no_device(device):
    raise DeviceError("no gpu device number 7 (usable devices: cpu)")
sys.exit(run_server(Settings(port=PORT, devices=("gpu:7",), http_workers=2), no_device, log_level="warning"))
"""
    with running(ServerProcess.python_code(code)) as server:
        assert server.wait(60) == 3, server.output()[-3000:]
        assert "no device worker is alive (gpu:7: DeviceError: no gpu device number 7" in server.output()
        wait_until(lambda: no_process_left(server), 10, "every front end gone")


def test_default_front_ends_follow_the_device_kind(monkeypatch):
    from types import SimpleNamespace

    from vggserve.runtime import devices as devs
    from vggserve.serving.settings import default_http_workers

    kinds = {"gpu:0": "gpu", "gpu:1": "gpu", "cpu": "cpu"}
    monkeypatch.setattr(devs, "resolve", lambda spec: SimpleNamespace(kind=kinds[spec]))
    assert default_http_workers(("gpu:0",), cpus=16) == 8
    assert default_http_workers(("gpu:0",), cpus=64, decode="gpu") == 8  # the JPEGs decoded on the device
    assert default_http_workers(("gpu:0",), cpus=64) == 32
    assert default_http_workers(("gpu:0", "gpu:1"), cpus=8) == 3
    assert default_http_workers(("cpu",), cpus=16) == 1
    assert default_http_workers(("gpu:0", "cpu"), cpus=16) == 1
    assert default_http_workers(("tpu",), cpus=16) == 1  # unresolvable: the worker will say why
    assert default_http_workers(("cpu",)) == 1


def test_auto_front_ends_follow_the_cores_and_devices_without_a_cap(monkeypatch, tmp_path):
    """`auto` is half the cores less one per device past the first, counts the cores of the affinity within the
    cgroup's CPU quota, and has no cap below the setting's bound (issue 24, item B)."""
    from vggserve.distributed import cores
    from vggserve.serving import settings as settings_module
    from vggserve.serving.settings import cgroup_cpu_limit, host_cores

    monkeypatch.setattr(cores, "allowed_cpus", lambda: set(range(16)))
    monkeypatch.setattr(settings_module, "cgroup_cpu_limit", lambda: None)
    assert host_cores() == 16
    assert parse_http_workers("auto", ("gpu:0",)) == 8
    assert parse_http_workers("auto", ("gpu:0", "gpu:1", "gpu:2", "gpu:3")) == 5
    monkeypatch.setattr(settings_module, "cgroup_cpu_limit", lambda: 5.5)  # docker run --cpus 5.5
    assert host_cores() == 6 and parse_http_workers("auto", ("gpu:0",)) == 3
    monkeypatch.setattr(cores, "allowed_cpus", lambda: {0, 1, 2})  # taskset -c 0-2, within the quota
    assert parse_http_workers("auto", ("gpu:0",)) == 1  # nothing left for front ends: one process
    monkeypatch.setattr(cores, "allowed_cpus", lambda: set(range(128)))
    monkeypatch.setattr(settings_module, "cgroup_cpu_limit", lambda: None)
    # no fixed cap below the setting's bound, 64, whatever the queue (the front ends admit from one --max-queue)
    assert parse_http_workers("auto", ("gpu:0",)) == 64
    assert Settings(http_workers=parse_http_workers("auto", ("gpu:0",))).http_workers == 64  # valid as it is

    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) == 4.0
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) == 1.5
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None


def test_each_front_end_listens_on_its_own_socket_of_one_port():
    socks = bind(Settings(host="127.0.0.1", port=0, http_workers=3), 3)
    try:
        assert len({s.fileno() for s in socks}) == 3
        assert len({s.getsockname()[1] for s in socks}) == 1 and socks[0].getsockname()[1] > 0
    finally:
        for sock in socks:
            sock.close()



HELD_SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, http_workers=3, max_batch_size=2, max_wait_ms=0, max_queue=6, max_files=2,
                    preprocess_threads=1)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.0, 2, hold_file=HOLD), log_level="warning"))
"""


def pinned(port: int, target: int | None, want: int, others_wanted: int = 2,
           tries: int = 200) -> tuple[int, list, dict]:
    """Keep-alive connections and the front end each landed on: (target's pid, `want` connections to it, {pid: a
    connection} of `others_wanted` other front ends). `target` None: the first connection's front end."""
    import http.client

    mine, others = [], {}
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health/live")
        answer = conn.getresponse()
        answer.read()
        pid = int(answer.getheader(HEADER))
        target = pid if target is None else target
        if pid == target and len(mine) < want:
            mine.append(conn)
        elif pid != target and pid not in others:
            others[pid] = conn
        else:
            conn.close()
        if len(mine) == want and len(others) >= others_wanted:
            return target, mine, others
    raise AssertionError(f"front end {target} took {len(mine)} of {tries} connections, others {list(others)}")


def post_on(conn) -> tuple[int, dict]:
    """POST /classify of the PNG on a pinned connection: (status, JSON); (0, {}) when the connection broke."""
    try:
        conn.request("POST", "/classify", body=PNG, headers={"Content-Type": "image/png"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    except OSError:
        return 0, {}


def test_front_ends_admit_from_one_max_queue_whichever_takes_the_load(tmp_path):
    """Issue 24: --max-queue is the whole server's. With 3 front ends and --max-queue 6 (a share of 2 each until
    now), 6 images held on the device through one front end are all admitted while the others stay idle; the 7th
    is refused at once, on that front end and on the idle ones alike, with the single-process body. The count is
    back at zero once they are answered; a front end killed while it holds images gives them back."""
    hold = tmp_path / "hold"
    with running(ServerProcess.python_code(HELD_SERVER.replace("HOLD", repr(str(hold))))) as server:
        server.wait_ready(60)
        url, port = server.url, server.port
        assert metric(url, "vggserve_admitted_images") == 0
        computed = metric(url, "vggserve_batch_size_sum")
        target, busy, idle = pinned(port, None, 7)
        hold.touch()
        with ThreadPoolExecutor(6) as pool:
            held = [pool.submit(post_on, conn) for conn in busy[:6]]
            wait_metric(url, "vggserve_admitted_images", lambda v: v == 6, "6 images admitted through one front end")
            for conn in (busy[6], *idle.values()):
                status, body = post_on(conn)
                assert status == 429 and body["error"]["code"] == "queue_full", (status, body)
                assert "(6 images waiting or being decoded, --max-queue 6)" in body["error"]["message"], body
            assert not any(f.done() for f in held)
            hold.unlink()
            assert [f.result()[0] for f in held] == [200] * 6
        wait_metric(url, "vggserve_admitted_images", lambda v: v == 0, "the count back at zero")
        assert metric(url, "vggserve_batch_size_sum") == computed + 6

        # a front end killed while it holds 4 images: its slot is cleared when it is reaped, not leaked
        _, busy, idle = pinned(port, target, 4)
        hold.touch()
        with ThreadPoolExecutor(10) as pool:
            lost = [pool.submit(post_on, conn) for conn in busy]
            wait_metric(url, "vggserve_admitted_images", lambda v: v == 4, "4 images admitted on the doomed one")
            os.kill(target, signal.SIGKILL)
            assert {f.result()[0] for f in lost} == {0}
            wait_metric(url, "vggserve_admitted_images", lambda v: v == 0, "the killed front end's images given back")
            _, others, _ = pinned(port, next(iter(idle)), 6, others_wanted=0)
            after = [pool.submit(post_on, conn) for conn in others]
            wait_metric(url, "vggserve_admitted_images", lambda v: v == 6, "a full queue admitted after the kill")
            hold.unlink()
            assert [f.result()[0] for f in after] == [200] * 6
        wait_metric(url, "vggserve_admitted_images", lambda v: v == 0, "the count back at zero")
        assert "exited with status -9; starting a new one" in server.output()
        assert "Traceback" not in server.output()
