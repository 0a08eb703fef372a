"""Several device workers on one queue: batches formed only for a device that can run them (full under load, never
split between devices), and a device that fails leaves the others serving its images."""

import random
import threading
import time

import numpy as np

from vggserve.modelinput import CROP_SHAPE, ModelInput
from vggserve.serving.metrics import Metrics
from vggserve.serving.scheduling.batcher import BatchQueue
from vggserve.serving.scheduling.errors import shutting_down
from vggserve.serving.scheduling.worker import DeviceWorker
from vggserve.testing.models import InstantModel, PipelinedModel

TIMEOUT = 20.0
CROP = ModelInput.crop(np.zeros(CROP_SHAPE, np.uint8))


def wait_until(predicate, what: str, timeout_s: float = TIMEOUT):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def start_workers(queue: BatchQueue, metrics: Metrics, models: dict, batch: int, max_wait_s: float):
    workers = [DeviceWorker(device, lambda d: models[d], queue, metrics, max_batch_size=batch, max_wait_s=max_wait_s,
                            warmup=False, on_change=lambda: None) for device in models]
    for worker in workers:
        worker.start()
    wait_until(lambda: all(w.ready for w in workers), "the workers ready")
    return workers


def submit(queue: BatchQueue, n: int) -> list:
    queue.admit(n)
    return [queue.submit(CROP, time.monotonic() + 60) for _ in range(n)]


def closed_loop(devices: int, *, batch: int = 8, device_s: float = 0.03, batches: int = 40) -> dict:
    """Clients keep 6 x batch x devices images in the system (more than the devices hold: a sustained load), each
    answered image coming back after 0 to 2 device times (its way through a front end), until `batches` batches per
    device are answered; the batch sizes each device computed."""
    metrics = Metrics()
    queue = BatchQueue(10_000, metrics)
    models = {f"dev{i}": InstantModel(f"dev{i}", batch, device_s) for i in range(devices)}
    workers = start_workers(queue, metrics, models, batch, max_wait_s=device_s / 3)
    sizes: dict[str, list[int]] = {device: [] for device in models}
    rng = random.Random(0)
    lock, enough = threading.Lock(), threading.Event()

    def answered(future):
        if future.exception() is not None:  # answered by the close, once enough were computed
            return
        outcome = future.result()
        with lock:
            seen = sizes[outcome.device]
            seen.append(outcome.batch_size)
            if sum(len(s) for s in sizes.values()) >= batches * devices * batch:  # one entry per image
                enough.set()
        if not enough.is_set():
            threading.Timer(rng.uniform(0, 2 * device_s), send).start()

    def send():
        if not enough.is_set():
            submit(queue, 1)[0].future.add_done_callback(answered)

    for _ in range(6 * batch * devices):
        send()
    assert enough.wait(120), "the closed loop did not finish"
    queue.close(shutting_down())
    for worker in workers:
        worker.join(TIMEOUT)
    # each image saw its batch's size: a batch of n appears n times, and counts 1/n each time
    counts = {d: sum(1 / n for n in s) for d, s in sizes.items()}
    full = sum(1 / n for s in sizes.values() for n in s if n == batch)
    images = sum(len(s) for s in sizes.values())
    return {"batches": counts, "full_share": full / sum(counts.values()), "images": images,
            # what the devices' time allows: the busiest device computed this many batches of device_s each
            "images_per_device_time": images / (max(counts.values()) * device_s)}


def test_two_devices_under_sustained_load_each_compute_full_batches_at_twice_the_throughput_of_one():
    one = closed_loop(1)
    two = closed_loop(2)
    assert one["full_share"] >= 0.9, one
    assert two["full_share"] >= 0.9, two
    assert min(two["batches"].values()) >= 0.4 * sum(two["batches"].values()), two  # both devices used
    assert two["images_per_device_time"] >= 1.8 * one["images_per_device_time"], (one, two)


def test_a_worker_whose_device_is_busy_takes_only_full_batches_and_leaves_partial_ones_for_an_idle_device():
    metrics = Metrics()
    queue = BatchQueue(64, metrics)
    models = {name: PipelinedModel(name, seconds_per_batch=0.0, max_batch_size=4, gated=True) for name in "ab"}
    start_workers(queue, metrics, models, 4, max_wait_s=0.01)
    first = submit(queue, 4)
    wait_until(lambda: sum(len(m.submitted) for m in models.values()) == 1, "a full batch on one device")
    busy = next(m for m in models.values() if m.submitted)
    idle = next(m for m in models.values() if m is not busy)
    partial = submit(queue, 2)
    wait_until(lambda: len(idle.submitted) == 1, "the partial batch on the idle device")
    assert [len(x) for x in idle.submitted] == [2] and len(busy.submitted) == 1
    more = submit(queue, 3)  # both devices busy now: nobody takes these 3 early, however long they wait
    time.sleep(0.3)  # 30 x max_wait
    assert len(queue) == 3 and len(busy.submitted) == 1 and len(idle.submitted) == 1
    full = submit(queue, 1)  # a full batch is taken at once by a busy device's worker, to upload it early
    wait_until(lambda: len(queue) == 0, "the full batch taken")
    assert sorted(len(x) for m in models.values() for x in m.submitted) == [2, 4, 4]
    last = submit(queue, 1)
    time.sleep(0.3)
    assert len(queue) == 1, "both devices still busy (one with two batches): the lone image waits"
    single = next(m for m in models.values() if len(m.submitted) == 1)
    single.release(0)  # its one batch answered, that device is idle: it takes the lone image (after max_wait)
    wait_until(lambda: len(queue) == 0, "the lone image taken by the device that became idle")
    assert [len(x) for x in single.submitted] == [len(single.submitted[0]), 1]
    for model in models.values():
        model.release(*range(4))
    for item in first + partial + more + full + last:
        assert item.future.result(timeout=TIMEOUT).probabilities.shape == (1000,)
    queue.close(shutting_down())


def test_a_device_failing_under_load_leaves_the_other_serving_every_request_and_the_service_ready():
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from vggserve.serving.app import create_app
    from vggserve.serving.settings import Settings
    from vggserve.testing.models import SlowModel

    from test_http_api import PNG, wait_ready

    def factory(device):  # cpu:0 fails on its first batch after the warm-up one
        return SlowModel(device, 0.02, 4, fail_after=1 if device == "cpu:0" else None)

    app = create_app(Settings(devices=("cpu:0", "cpu:1"), max_batch_size=4, max_wait_ms=10), model_factory=factory)
    post = lambda _: c.post("/classify", content=PNG, headers={"content-type": "image/png"})  # noqa: E731
    with TestClient(app) as c, ThreadPoolExecutor(8) as pool:
        wait_ready(c)
        statuses = []
        for _ in range(20):  # waves of requests until cpu:0 has failed under them, and one wave more
            statuses += [r.status_code for r in pool.map(post, range(8))]
            if c.get("/metadata").json()["devices"][0]["state"] == "failed" and len(statuses) > 8:
                break
        statuses += [r.status_code for r in pool.map(post, range(8))]
        assert statuses == [200] * len(statuses)
        failed, serving = c.get("/metadata").json()["devices"]
        assert failed["state"] == "failed" and "simulated device failure" in failed["error"]
        assert serving["state"] == "ready" and serving["batches"] > 0
        ready = c.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert "device worker cpu:0 is failed: RuntimeError: simulated device failure" in ready.json()["detail"]
        assert c.get("/health/live").status_code == 200
        metrics = c.get("/metrics").text
        assert 'vggserve_device_up{device="cpu:0"} 0.0' in metrics
        assert 'vggserve_device_up{device="cpu:1"} 1.0' in metrics
        assert 'vggserve_device_failures_total{device="cpu:0"} 1.0' in metrics
        assert 'vggserve_device_failures_total{device="cpu:1"} 0.0' in metrics
        assert "vggserve_ready 1.0" in metrics and "vggserve_workers_ready 1.0" in metrics


def test_two_workers_on_the_same_device_spec_have_their_own_series_and_names():
    """`--device cpu,cpu`: one worker failing shows as that worker, not as a device both share."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from vggserve.serving.app import create_app
    from vggserve.serving.settings import Settings
    from vggserve.testing.models import SlowModel

    from test_http_api import PNG, wait_ready

    made = []

    def factory(device):  # the first worker's model fails on its first batch after the warm-up one
        made.append(device)
        return SlowModel(device, 0.02, 4, fail_after=1 if len(made) == 1 else None)

    app = create_app(Settings(devices=("cpu", "cpu"), max_batch_size=4, max_wait_ms=10), model_factory=factory)
    post = lambda _: c.post("/classify", content=PNG, headers={"content-type": "image/png"})  # noqa: E731
    with TestClient(app) as c, ThreadPoolExecutor(8) as pool:
        wait_ready(c)
        for _ in range(20):
            assert {r.status_code for r in pool.map(post, range(8))} == {200}
            if any(d["state"] == "failed" for d in c.get("/metadata").json()["devices"]):
                break
        devices = c.get("/metadata").json()["devices"]
        assert [(d["spec"], d["label"]) for d in devices] == [("cpu", "cpu#1"), ("cpu", "cpu#2")]
        states = {d["label"]: d["state"] for d in devices}
        failed = next(label for label, state in states.items() if state == "failed")
        serving = next(label for label, state in states.items() if state == "ready")
        assert f"device worker {failed} is failed" in c.get("/health/ready").json()["detail"]
        metrics = c.get("/metrics").text
        assert f'vggserve_device_up{{device="{failed}"}} 0.0' in metrics
        assert f'vggserve_device_up{{device="{serving}"}} 1.0' in metrics
        assert f'vggserve_device_failures_total{{device="{failed}"}} 1.0' in metrics
        assert 'vggserve_device_up{device="cpu"}' not in metrics
