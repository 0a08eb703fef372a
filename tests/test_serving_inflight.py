"""The device worker with two batches in flight (`serving.inflight`), on the gated `PipelinedModel` stand-in and on
the real engine (tiny network, PoCL): results to the right requests in submission order, failures at submit or
result time fail everything in flight, and shutdown answers what is in flight before the model is closed."""

import threading
import time

import numpy as np
import pytest

from vggserve.serving.scheduling.batcher import BatchQueue, Outcome
from vggserve.modelinput import ModelInput
from vggserve.serving.scheduling.errors import shutting_down
from vggserve.testing.models import PipelinedModel, SlowModel
from vggserve.serving.metrics import Metrics
from vggserve.serving.scheduling.worker import DeviceWorker

from conftest import TEST_DEVICE

TIMEOUT = 20.0  # generous: nothing here should take more than a fraction of it


def wait_until(predicate, what: str, timeout_s: float = TIMEOUT):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def inputs(n: int) -> list[np.ndarray]:
    """n float32 model inputs whose SlowModel classes all differ (up to 125: 150528 * (i + 1) mod 1000)."""
    return [np.full((3, 224, 224), i + 1, np.float32) for i in range(n)]


def queue_of(capacity: int) -> tuple[Metrics, BatchQueue]:
    metrics = Metrics()
    return metrics, BatchQueue(capacity, metrics)


def start_worker(device: str, model, queue: BatchQueue, metrics: Metrics, max_batch_size: int, *,
                 warmup: bool = False) -> DeviceWorker:
    worker = DeviceWorker(device, lambda d: model, queue, metrics, max_batch_size=max_batch_size, max_wait_s=0.01,
                          warmup=warmup, on_change=lambda: None)
    worker.start()
    return worker


def fill(queue: BatchQueue, tensors: list[np.ndarray]) -> list:
    queue.admit(len(tensors))
    as_input = lambda t: ModelInput.crop(t) if t.dtype == np.uint8 else ModelInput.tensor(t)  # noqa: E731
    return [queue.submit(as_input(t), time.monotonic() + 60) for t in tensors]


def expected_row(x: np.ndarray) -> np.ndarray:
    return SlowModel(seconds_per_batch=0).probabilities(x[None])[0]


def completer_threads(device: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"vggserve-inflight-{device}"]


def assert_inference_failed(item, words: str):
    error = item.future.exception(timeout=TIMEOUT)
    assert error is not None and error.code == "inference_failed", error
    assert words in str(error)


def test_two_batches_in_flight_results_to_their_requests_in_submission_order():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-order", seconds_per_batch=0.01, max_batch_size=4, gated=True)
    tensors = inputs(24)
    items = fill(queue, tensors)  # the queue is full before the worker starts: every batch has 4 images
    answered: list[int] = []
    for i, item in enumerate(items):
        item.future.add_done_callback(lambda _, i=i: answered.append(i))
    worker = start_worker("fake-order", model, queue, metrics, 4)
    wait_until(lambda: len(model.submitted) == 2, "two batches submitted")
    assert model.in_flight == 2 and not any(item.future.done() for item in items)
    model.release(*range(6))
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert not worker._thread.is_alive() and worker.state == "stopped" and worker.batches == 6
    assert model.max_in_flight == 2  # two at once, never three
    assert answered == list(range(24))  # batches and images answered in the order they were taken
    for k, batch in enumerate(model.submitted):  # batch k is images 4k..4k+3, as they were queued
        np.testing.assert_array_equal(batch, np.stack(tensors[4 * k:4 * k + 4]))
    for tensor, outcome in zip(tensors, outcomes):
        assert isinstance(outcome, Outcome) and outcome.batch_size == 4 and outcome.device == "fake-order"
        np.testing.assert_array_equal(outcome.probabilities, expected_row(tensor))
        assert outcome.queue_s >= 0 and outcome.inference_s > 0
    assert len({int(o.probabilities.argmax()) for o in outcomes}) == 24  # the rows tell the images apart
    assert metrics.registry.get_sample_value("vggserve_batch_size_count") == 6
    assert not completer_threads("fake-order")


def test_uint8_crops_are_submitted_as_they_are_and_mixed_batches_as_float32():
    metrics, queue = queue_of(16)
    model = PipelinedModel("fake-pixels", seconds_per_batch=0.0, max_batch_size=2)
    crops = [np.full((224, 224, 3), v, np.uint8) for v in (3, 7)]
    items = fill(queue, crops)
    worker = start_worker("fake-pixels", model, queue, metrics, 2)
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    mixed = fill(queue, [crops[0], inputs(1)[0]])
    [item.future.result(timeout=TIMEOUT) for item in mixed]
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert model.submitted[0].dtype == np.uint8 and model.submitted[0].shape == (2, 224, 224, 3)
    for crop, outcome in zip(crops, outcomes):
        np.testing.assert_array_equal(outcome.probabilities, expected_row(crop))
    assert model.submitted[1].dtype == np.float32 and model.submitted[1].shape == (2, 3, 224, 224)


def test_a_failure_at_result_time_fails_its_batch_and_the_one_in_flight_after_it():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-result", seconds_per_batch=0.0, max_batch_size=2, gated=True,
                           fail_at=(1, "result"))
    items = fill(queue, inputs(8))
    worker = start_worker("fake-result", model, queue, metrics, 2)
    wait_until(lambda: len(model.submitted) == 2, "batches 0 and 1 submitted")
    model.release(0)
    wait_until(lambda: len(model.submitted) == 3, "batch 2 submitted once batch 0 is answered")
    model.release(1)  # batch 1 fails; batch 2 is in flight behind it
    worker.join(TIMEOUT)
    assert not worker._thread.is_alive(), "the worker stops taking batches after a failure"
    assert worker.state == "failed" and "simulated device failure in batch 1" in worker.error
    assert not worker.alive and not worker.ready
    for item in items[:2]:
        assert item.future.result(timeout=0).batch_size == 2
    for item in items[2:6]:
        assert_inference_failed(item, "simulated device failure in batch 1")
    assert len(queue) == 2 and not any(item.future.done() for item in items[6:])  # never taken
    assert ("close",) in model.log and worker.batches == 1
    queue.close(shutting_down())
    assert all(item.future.done() for item in items)
    assert not completer_threads("fake-result")


def test_a_failure_at_submit_fails_its_batch_and_the_one_in_flight_before_it():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-submit", seconds_per_batch=0.0, max_batch_size=2, gated=True,
                           fail_at=(2, "submit"))
    items = fill(queue, inputs(8))
    worker = start_worker("fake-submit", model, queue, metrics, 2)
    wait_until(lambda: len(model.submitted) == 2, "batches 0 and 1 submitted")
    model.release(0)  # batch 2 is taken and its submit fails while batch 1 is still on the device
    wait_until(lambda: worker.state == "failed", "the worker failed")
    for item in items[4:6]:
        assert_inference_failed(item, "simulated device failure at submit of batch 2")
    assert not any(item.future.done() for item in items[2:4])  # batch 1 is still in flight
    model.release(1)
    for item in items[2:4]:
        assert_inference_failed(item, "simulated device failure at submit of batch 2")
    worker.join(TIMEOUT)
    assert not worker._thread.is_alive() and worker.state == "failed" and "at submit of batch 2" in worker.error
    assert items[0].future.result(timeout=0).batch_size == 2 and worker.batches == 1
    assert len(queue) == 2 and model.log[-1] == ("close",)
    queue.close(shutting_down())
    assert all(item.future.done() for item in items)
    assert not completer_threads("fake-submit")


def test_closing_the_queue_answers_the_batches_in_flight_before_the_model_is_closed():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-close", seconds_per_batch=0.0, max_batch_size=2, gated=True)
    tensors = inputs(4)
    items = fill(queue, tensors)
    worker = start_worker("fake-close", model, queue, metrics, 2, warmup=True)
    wait_until(lambda: len(model.submitted) == 2, "two batches in flight")
    queue.close(shutting_down())
    time.sleep(0.2)  # the feeder has seen the queue closed: nothing may be closed or answered yet
    assert worker.state == "ready" and worker._thread.is_alive() and ("close",) not in model.log
    assert not any(item.future.done() for item in items)
    model.release(0, 1)
    worker.join(TIMEOUT)
    assert not worker._thread.is_alive() and worker.state == "stopped" and worker.batches == 2
    for tensor, item in zip(tensors, items):
        np.testing.assert_array_equal(item.future.result(timeout=0).probabilities, expected_row(tensor))
    assert model.log == [("submit", 0), ("submit", 1), ("result", 0), ("result", 1), ("close",)]
    assert model.batch_sizes == [2, 2, 2]  # the warm-up batch, then the two
    assert not completer_threads("fake-close")


def test_a_serial_model_still_runs_one_batch_at_a_time():
    metrics, queue = queue_of(16)
    model = SlowModel("cpu", seconds_per_batch=0.01, max_batch_size=2)
    assert not hasattr(model, "submit")
    tensors = inputs(4)
    items = fill(queue, tensors)
    worker = start_worker("fake-serial", model, queue, metrics, 2)
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert worker.state == "stopped" and worker.batches == 2 and model.batch_sizes == [2, 2]
    for tensor, outcome in zip(tensors, outcomes):
        np.testing.assert_array_equal(outcome.probabilities, expected_row(tensor))
    assert not completer_threads("fake-serial")


def test_the_http_service_answers_through_the_pipelined_worker():
    import io

    from fastapi.testclient import TestClient
    from PIL import Image

    from vggserve.serving import Settings, create_app

    models: list = []
    settings = Settings(max_batch_size=4, max_wait_ms=5)
    app = create_app(settings, model_factory=lambda d: models.append(PipelinedModel(d, 0.01, 4)) or models[-1])
    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(png, "PNG")
    with TestClient(app) as client:
        wait_until(lambda: client.get("/health/ready").status_code == 200, "ready")
        responses = [client.post("/classify", content=png.getvalue(), headers={"content-type": "image/png"})
                     for _ in range(3)]
    assert all(r.status_code == 200 for r in responses), responses[0].text
    assert len(models[0].submitted) == 3 and models[0].log[-1] == ("close",)


@pytest.mark.parametrize("kind", ["uint8 crops", "float32 inputs"])
def test_the_real_engine_in_flight_gives_each_image_its_own_row(tiny_weights_path, kind):
    from vggserve.model.vgg16 import VGG16

    rng = np.random.default_rng(5)
    if kind == "uint8 crops":
        tensors = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(10)]
    else:
        tensors = [rng.standard_normal((3, 224, 224)).astype(np.float32) for _ in range(10)]
    model = VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4)
    if kind == "uint8 crops":
        want = [model.probabilities_from_pixels(t[None])[0] for t in tensors]
    else:
        want = [model.probabilities(t[None])[0] for t in tensors]
    metrics, queue = queue_of(16)
    items = fill(queue, tensors)
    worker = start_worker("engine", model, queue, metrics, 4)
    outcomes = [item.future.result(timeout=120) for item in items]
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert worker.state == "stopped" and worker.batches == 3  # 4 + 4 + 2: the queue was full from the start
    assert [o.batch_size for o in outcomes] == [4] * 8 + [2] * 2
    assert model.slots == []  # the worker closed the model
    for got, expected in zip(outcomes, want):
        np.testing.assert_allclose(got.probabilities, expected, rtol=1e-5, atol=1e-9)
    for i in range(len(want)):  # the comparison can tell the images apart: a mixed-up row would fail it
        assert not any(np.allclose(want[i], want[j], rtol=1e-5, atol=1e-9) for j in range(len(want)) if j != i)


def test_the_batch_of_a_worker_that_fails_goes_back_to_the_queue_for_the_other_workers(tmp_path):
    metrics, queue = queue_of(16)
    hold = tmp_path / "hold"
    hold.touch()
    healthy = SlowModel("healthy", seconds_per_batch=0.0, max_batch_size=2, hold_file=str(hold))
    healthy_worker = start_worker("fake-healthy", healthy, queue, metrics, 2)
    wait_until(lambda: healthy_worker.ready, "the healthy worker ready")
    (busy,) = fill(queue, inputs(1))
    wait_until(lambda: healthy.batch_sizes == [1], "the healthy worker holding its device")
    failing = PipelinedModel("failing", seconds_per_batch=0.0, max_batch_size=2, gated=True, fail_at=(0, "result"))
    failing_worker = start_worker("fake-failing", failing, queue, metrics, 2)
    (doomed,) = fill(queue, inputs(1))  # only the failing worker waits for a batch
    wait_until(lambda: len(failing.submitted) == 1, "the failing worker's batch on its device")
    wait_until(lambda: len(queue._cond._waiters) == 1, "its feeder waiting in take_batch for the next batch")
    failing.release(0)
    failing_worker.join(TIMEOUT)
    assert not failing_worker._thread.is_alive(), "the failed worker's feeder stops waiting for a batch"
    assert failing_worker.state == "failed" and "simulated device failure in batch 0" in failing_worker.error
    assert not doomed.future.done() and len(queue) == 1, "handed back, not failed"
    (later,) = fill(queue, inputs(1))
    assert len(failing.submitted) == 1 and len(queue) == 2
    assert metrics.device_up.labels(device="fake-failing")._value.get() == 0
    assert metrics.device_failures.labels(device="fake-failing")._value.get() == 1
    assert metrics.device_up.labels(device="fake-healthy")._value.get() == 1
    hold.unlink()
    for item in (busy, doomed, later):
        assert item.future.result(timeout=TIMEOUT).device == "fake-healthy"
    queue.close(shutting_down())
    healthy_worker.join(TIMEOUT)
    assert healthy_worker.state == "stopped" and queue.admitted == 0


def test_a_failed_serial_workers_batch_goes_to_the_other_worker_and_fails_only_with_the_last_one():
    """Two serial workers that each fail on their first batch: the batch goes back to the queue from the first that
    fails, the other takes it, and, being the last worker left, answers it with InferenceFailed."""
    metrics, queue = queue_of(8)
    workers = [start_worker(f"fake-{name}", SlowModel(name, seconds_per_batch=0.0, max_batch_size=2, fail_after=0),
                            queue, metrics, 2) for name in ("first", "second")]
    wait_until(lambda: all(w.ready for w in workers), "both workers ready")
    items = fill(queue, inputs(2))
    for worker in workers:
        worker.join(TIMEOUT)
        assert worker.state == "failed" and metrics.device_failures.labels(device=worker.device)._value.get() == 1
    for item in items:
        assert_inference_failed(item, "simulated device failure")
    assert queue.admitted == 0 and len(queue) == 0
    queue.close(shutting_down())


class ShortSlowModel(SlowModel):
    """A broken device that returns one row fewer than the batch has images."""

    def probabilities(self, x):
        return super().probabilities(x)[:-1]


class ShortPipelinedModel(PipelinedModel):
    def submit(self, x, want="logits", pinned=True):
        pending = super().submit(x, want, pinned)
        pending._rows = pending._rows[:-1]
        return pending


@pytest.mark.parametrize("model_class", [ShortSlowModel, ShortPipelinedModel])
def test_a_model_answering_fewer_rows_than_images_fails_the_batch_instead_of_leaving_one_unanswered(model_class):
    metrics, queue = queue_of(8)
    model = model_class("short", seconds_per_batch=0.0, max_batch_size=2)
    items = fill(queue, inputs(2))
    worker = start_worker("fake-short", model, queue, metrics, 2)
    for item in items:
        assert_inference_failed(item, "1 row for a batch of 2 images")
    worker.join(TIMEOUT)
    assert worker.state == "failed" and "1 row for a batch of 2" in worker.error
    queue.close(shutting_down())


def test_a_batch_in_flight_behind_another_is_timed_from_when_the_device_finished_the_one_before(monkeypatch):
    import types

    from vggserve.serving.scheduling import inflight

    clock = [0.0]  # the runner's perf_counter, moved by the test only
    monkeypatch.setattr(inflight, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    metrics, queue = queue_of(8)
    model = PipelinedModel("fake-timing", seconds_per_batch=0.0, max_batch_size=2, gated=True)
    items = fill(queue, inputs(4))
    worker = start_worker("fake-timing", model, queue, metrics, 2)
    wait_until(lambda: len(model.submitted) == 2, "both batches submitted at clock 0")
    clock[0] = 10.0  # batch 0 took the device for 10 s; batch 1 waited behind it all that time
    model.release(0)
    wait_until(lambda: all(item.future.done() for item in items[:2]), "batch 0 answered")
    clock[0] = 12.0
    model.release(1)
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    assert [o.inference_s for o in outcomes] == [10.0, 10.0, 2.0, 2.0]
    assert metrics.inference_seconds._sum.get() == 12.0
    queue.close(shutting_down())
    worker.join(TIMEOUT)


# ---- decode groups (--decode gpu): the feeder decodes several waiting batches at once, then starts them one by one --

class DecodingModel(PipelinedModel):
    """The pipelined stand-in said to decode JPEGs on its device (what `decodes_on_device` asks of the engine)."""

    resizes_on_device = True

    def resize_matches_pillow(self) -> bool:
        return True

    def jpeg_decoder(self):
        return None


@pytest.fixture
def crops_for_device_decodes(monkeypatch):
    """`decode_for_model` answering each file with its CPU crop (no device here); records the files of each call."""
    from vggserve.decoding.device import onmodel
    from vggserve.serving.scheduling.imaging import decode_and_crop

    calls: list[int] = []

    def decode(model, datas, **limits):
        calls.append(len(datas))
        return [decode_and_crop(bytes(d), "torchvision", 1 << 30)[0] for d in datas]

    monkeypatch.setattr(onmodel, "decode_for_model", decode)
    return calls


def jpegs(n: int) -> list[bytes]:
    """n small JPEGs of different colours (their SlowModel classes differ)."""
    import io

    from PIL import Image

    out = []
    for i in range(n):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), (20 * i % 256, 255 - 9 * i % 256, 90)).save(buffer, "JPEG", quality=95)
        out.append(buffer.getvalue())
    return out


def start_decoding_worker(label: str, model, queue, metrics, group: int):
    from vggserve.serving.scheduling.devicedecode import DeviceDecoding

    worker = DeviceWorker(label, lambda d: model, queue, metrics, max_batch_size=model.max_batch_size,
                          max_wait_s=0.01, warmup=False, on_change=lambda: None,
                          decoding=DeviceDecoding(metrics, "gpu", group=group))
    worker.start()
    return worker


def submit_encoded(queue: BatchQueue, datas: list[bytes]) -> list:
    queue.admit(len(datas))
    return [queue.submit(ModelInput.encoded(d), time.monotonic() + 60) for d in datas]


def decodes(metrics: Metrics) -> tuple[float, float]:
    """(device decodes, batches they decoded) of vggserve_device_decode_batches."""
    return (metrics.registry.get_sample_value("vggserve_device_decode_batches_count"),
            metrics.registry.get_sample_value("vggserve_device_decode_batches_sum"))


@pytest.mark.parametrize("group, calls", [(4, [8, 2]), (1, [2] * 5)], ids=["decode-group 4", "decode-group 1"])
def test_waiting_batches_are_decoded_as_a_group_and_each_answered_as_its_own_batch(crops_for_device_decodes, group,
                                                                                    calls):
    from vggserve.serving.scheduling.imaging import decode_and_crop

    metrics, queue = queue_of(64)
    model = DecodingModel("fake-groups", seconds_per_batch=0.0, max_batch_size=2, gated=True)
    datas = jpegs(10)
    items = submit_encoded(queue, datas)  # five full batches wait before the worker starts
    worker = start_decoding_worker("fake-groups", model, queue, metrics, group)
    wait_until(lambda: len(model.submitted) == 2, "two batches submitted")
    # group 4: batches 0-3 decoded as one group, 2 and 3 claimed, waiting; group 1: batch 2 taken and decoded early,
    # waiting for a slot
    assert len(queue) == (2 if group == 4 else 4)
    model.release(0, 1)
    wait_until(lambda: len(model.submitted) == 4, "batches 2 and 3 submitted")
    # after a batch or group decoded on the device, batch 4 is taken and decoded with two batches still in flight
    wait_until(lambda: crops_for_device_decodes == calls, "batch 4 decoded early")
    assert len(queue) == 0
    assert model.in_flight == 2 and len(model.submitted) == 4
    model.release(*range(2, 5))
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert worker.state == "stopped" and worker.batches == 5 and model.batch_sizes == [2] * 5
    assert crops_for_device_decodes == calls  # --decode-group 1: a decode per batch, as before groups
    assert decodes(metrics) == (len(calls), 5.0)
    assert metrics.registry.get_sample_value("vggserve_batch_size_count") == 5
    crops = [decode_and_crop(d, "torchvision", 1 << 30)[0].array for d in datas]
    for k, batch in enumerate(model.submitted):  # batch k is images 2k, 2k+1, as they were queued
        np.testing.assert_array_equal(batch, np.stack(crops[2 * k:2 * k + 2]))
    for crop, outcome in zip(crops, outcomes):
        np.testing.assert_array_equal(outcome.probabilities, expected_row(crop))
        assert outcome.batch_size == 2
    assert len({int(o.probabilities.argmax()) for o in outcomes}) == 10
    assert not queue._claimed and queue.admitted == 0


def test_an_image_of_a_claimed_batch_whose_client_goes_away_is_not_computed(crops_for_device_decodes):
    from vggserve.serving.scheduling.errors import ClientGone

    metrics, queue = queue_of(64)
    model = DecodingModel("fake-gone", seconds_per_batch=0.0, max_batch_size=2, gated=True)
    items = submit_encoded(queue, jpegs(6))
    worker = start_decoding_worker("fake-gone", model, queue, metrics, 4)
    wait_until(lambda: len(model.submitted) == 2, "two batches submitted, the third claimed")
    assert crops_for_device_decodes == [6] and len(queue) == 0
    assert queue.withdraw(items[4], ClientGone())  # still waiting as far as its request goes
    assert not queue.withdraw(items[2], ClientGone())  # batch 1 is on the device
    model.release(0, 1, 2)
    for i in (0, 1, 2, 3, 5):
        assert items[i].future.result(timeout=TIMEOUT).batch_size == (1 if i == 5 else 2)
    assert isinstance(items[4].future.exception(timeout=0), ClientGone)
    queue.close(shutting_down())
    worker.join(TIMEOUT)
    assert model.batch_sizes == [2, 2, 1] and metrics.abandoned._value.get() == 1


def test_a_failure_while_a_group_waits_hands_its_claimed_batches_back_or_fails_them(crops_for_device_decodes):
    metrics, queue = queue_of(64)
    model = DecodingModel("fake-group-fail", seconds_per_batch=0.0, max_batch_size=2, gated=True,
                          fail_at=(1, "submit"))
    items = submit_encoded(queue, jpegs(10))
    worker = start_decoding_worker("fake-group-fail", model, queue, metrics, 4)
    wait_until(lambda: worker.state == "failed", "the worker failed at batch 1's submit")
    assert crops_for_device_decodes == [8]  # batches 0-3 decoded together; 2 and 3 were claimed, never started
    model.release(0)
    for item in items[:8]:  # no other worker: the batch in flight, the failed one and the claimed ones fail
        assert_inference_failed(item, "simulated device failure at submit of batch 1")
    worker.join(TIMEOUT)
    assert not any(item.future.done() for item in items[8:]) and len(queue) == 2  # never taken
    assert not queue._claimed and model.batch_sizes == [2]
    queue.close(shutting_down())


def test_with_two_lanes_a_batch_is_timed_from_when_its_own_lane_finished_the_one_before(monkeypatch):
    """Lanes run at once: batches 0 and 2 share lane 0 and batches 1 and 3 lane 1 (the engine gives batches to its
    lanes in turn), so batch 1's device time runs from its submit, not from batch 0's end."""
    import types

    from vggserve.serving.scheduling import inflight

    clock = [0.0]
    monkeypatch.setattr(inflight, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    metrics, queue = queue_of(8)
    model = PipelinedModel("fake-lane-timing", seconds_per_batch=0.0, max_batch_size=2, gated=True, lanes=2)
    items = fill(queue, inputs(8))
    worker = start_worker("fake-lane-timing", model, queue, metrics, 2)
    wait_until(lambda: len(model.submitted) == 4, "four batches submitted at clock 0, two per lane")
    for i, at in enumerate((10.0, 11.0, 15.0, 17.0)):
        clock[0] = at
        model.release(i)
        wait_until(lambda: all(item.future.done() for item in items[:2 * i + 2]), f"batch {i} answered")
    outcomes = [item.future.result(timeout=TIMEOUT) for item in items]
    assert [o.inference_s for o in outcomes] == [10.0, 10.0, 11.0, 11.0, 5.0, 5.0, 6.0, 6.0]
    queue.close(shutting_down())
    worker.join(TIMEOUT)


def test_a_batch_taken_early_after_a_group_is_failed_with_the_worker_while_it_waits_for_a_slot(
        crops_for_device_decodes):
    metrics, queue = queue_of(64)
    model = DecodingModel("fake-early-fail", seconds_per_batch=0.0, max_batch_size=2, gated=True,
                          fail_at=(2, "result"))
    items = submit_encoded(queue, jpegs(10))
    worker = start_decoding_worker("fake-early-fail", model, queue, metrics, 4)
    wait_until(lambda: len(model.submitted) == 2, "batches 0 and 1 submitted")
    model.release(0, 1)
    wait_until(lambda: crops_for_device_decodes == [8, 2], "batch 4 taken and decoded early, waiting for a slot")
    model.release(2)  # batch 2 fails: batch 3 in flight and batch 4, decoded and waiting, fail with it
    for item in items[4:]:
        assert_inference_failed(item, "simulated device failure in batch 2")
    worker.join(TIMEOUT)
    assert worker.state == "failed" and len(model.submitted) == 4
    assert [item.future.result(timeout=0).batch_size for item in items[:4]] == [2] * 4
    assert queue.admitted == 0 and len(queue) == 0 and not queue._claimed
    queue.close(shutting_down())


def test_with_two_lanes_four_batches_are_in_flight_and_a_partial_batch_starts_while_one_lane_is_free():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-lanes", seconds_per_batch=0.01, max_batch_size=4, gated=True, lanes=2)
    items = fill(queue, inputs(16))  # four full batches waiting
    worker = start_worker("fake-lanes", model, queue, metrics, 4)
    wait_until(lambda: len(model.submitted) == 4, "four batches submitted (two per lane)")
    time.sleep(0.1)
    assert model.in_flight == 4 and model.batch_sizes == [4, 4, 4, 4]
    model.release(0, 1, 2, 3)
    for item, x in zip(items, inputs(16)):
        np.testing.assert_allclose(item.future.result(timeout=TIMEOUT).probabilities, expected_row(x), rtol=1e-6)
    one = fill(queue, inputs(1))  # a lone image: both lanes idle, it goes at once
    wait_until(lambda: len(model.submitted) == 5, "the lone image submitted")
    two = fill(queue, inputs(2))  # one lane busy (batch 4 gated): a partial batch still starts, on the other lane
    wait_until(lambda: len(model.submitted) == 6, "a partial batch submitted while one lane is busy")
    assert model.batch_sizes[4:] == [1, 2] and model.in_flight == 2
    three = fill(queue, inputs(3))  # both lanes busy: the partial batch waits for a lane (or to fill)
    time.sleep(0.2)
    assert len(model.submitted) == 6
    model.release(4, 5, 6)
    for item in one + two + three:
        item.future.result(timeout=TIMEOUT)
    queue.close(shutting_down())
    worker.join(TIMEOUT)


def test_one_lane_keeps_two_batches_in_flight_and_holds_a_partial_batch_while_one_is_on_the_device():
    metrics, queue = queue_of(64)
    model = PipelinedModel("fake-one-lane", seconds_per_batch=0.01, max_batch_size=4, gated=True)
    worker = start_worker("fake-one-lane", model, queue, metrics, 4)
    first = fill(queue, inputs(1))
    wait_until(lambda: len(model.submitted) == 1, "the lone image submitted")
    second = fill(queue, inputs(2))
    time.sleep(0.2)
    assert len(model.submitted) == 1  # busy: a partial batch waits while the device has one
    model.release(0, 1)
    for item in first + second:
        item.future.result(timeout=TIMEOUT)
    queue.close(shutting_down())
    worker.join(TIMEOUT)
