"""The batch job's ChunkRunner keeps its device fed: once a chunk's rows are in, the next decoded chunk goes into
the staging slot they freed before the chunk's result lines are formatted. On a stand-in device with the engine's
two staging slots (testing.models.InstantModel) and a decoder the test controls (which chunk is decoded when), so
the order of submits, results and result lines is exact on any machine."""

import json
import threading

import numpy as np
import pytest

from vggserve.decoding.stages import StageClock
from vggserve.distributed import pipeline
from vggserve.distributed.pipeline import ChunkRunner, RankStats
from vggserve.modelinput import TENSOR_SHAPE, ModelInput
from vggserve.testing.models import InstantModel

PIXELS = np.zeros((8, 8, 3), np.uint8)


class Decoding:
    """One chunk's decoding: answers when `ready` is set; `result()` waits for it at most 30 s (a runner that
    waited for a decoding it should not wait for then fails the test instead of hanging it)."""

    def __init__(self, paths, ready: bool, fail: BaseException | None, answer):
        self.paths, self.fail, self.answer = paths, fail, answer
        self.ready = threading.Event()
        if ready:
            self.ready.set()

    def result(self):
        if not self.ready.wait(30):
            raise TimeoutError("the runner waited for a decoding that was held back")
        if self.fail is not None:
            raise self.fail
        return [(None, ("cannot identify image file", "ImageError")) if "bad" in p else (self.answer, None)
                for p in self.paths]

    def done(self):
        return self.ready.is_set()


class Decoder:
    """The runner's decoder interface (start, release, clock, close): every readable path decodes to `answer`
    (a raw image's pixels by default); chunks listed in `held` start undecoded, those in `fail` raise that error."""

    def __init__(self, log: list, held=(), fail: dict | None = None, answer=PIXELS):
        self.log, self.held, self.fail, self.answer = log, set(held), fail or {}, answer
        self.clock = StageClock()
        self.decodings: list[Decoding] = []
        self.released: list[int] = []

    def start(self, paths):
        k = len(self.decodings)
        self.decodings.append(Decoding(paths, k not in self.held, self.fail.get(k), self.answer))
        return self.decodings[-1]

    def release(self, decoding):
        k = self.decodings.index(decoding)
        self.released.append(k)
        self.log.append(("release", k))

    def close(self):
        pass


def runner_on(model, decoder) -> ChunkRunner:
    runner = ChunkRunner(model, top_k=2, decode_threads=1, on_device=True)
    runner.decoder.close()
    runner.decoder, runner.clock = decoder, decoder.clock
    return runner


@pytest.fixture
def log(monkeypatch):
    """The model's submits and results, the decoder's releases and the runner's result lines, in order:
    ("lines", first path) when a chunk's lines are formatted."""
    events: list = []
    real = pipeline.result_lines

    def logged(paths, rows, k):
        events.append(("lines", paths[0]))
        return real(paths, rows, k)

    monkeypatch.setattr(pipeline, "result_lines", logged)
    return events


def chunks_of(count: int, size: int = 2) -> list[list[str]]:
    return [[f"c{c}/{i}.jpg" for i in range(size)] for c in range(count)]


def before(log: list, first, second) -> bool:
    return log.index(first) < log.index(second)


def in_flight_at_most(log: list) -> int:
    """The most batches submitted and not yet collected at once."""
    most = now = 0
    for event in log:
        now += {"submit": 1, "result": -1}.get(event[0], 0)
        most = max(most, now)
    return most


def test_the_next_chunk_goes_on_the_device_before_the_previous_chunks_lines(log):
    chunks = chunks_of(5)
    model = InstantModel(max_batch_size=2, log=log)
    runner = runner_on(model, Decoder(log))
    for chunk in chunks:
        runner.submit(chunk)
    outcomes = [runner.run_next() for _ in chunks]
    runner.close()
    for k in range(len(chunks)):
        assert before(log, ("submit", k), ("result", k)) and before(log, ("result", k), ("lines", f"c{k}/0.jpg"))
        if k + 2 < len(chunks):  # chunk k's slot is refilled with chunk k + 2 before chunk k's lines are made
            assert before(log, ("result", k), ("submit", k + 2))
            assert before(log, ("submit", k + 2), ("lines", f"c{k}/0.jpg"))
        if k + 1 < len(chunks):  # and chunk k + 1 was on the device before chunk k's rows were waited for
            assert before(log, ("submit", k + 1), ("result", k))
    assert in_flight_at_most(log) == 2  # never more than the engine's two staging slots
    assert [[json.loads(line)["image"] for line in o.results] for o in outcomes] == chunks
    assert all(not o.errors for o in outcomes) and runner.pending == 0


def test_decoded_pixels_are_released_once_copied_and_every_chunk_once(log):
    model = InstantModel(max_batch_size=2, log=log)
    decoder = Decoder(log)
    runner = runner_on(model, decoder)
    for chunk in chunks_of(4):
        runner.submit(chunk)
    for _ in range(4):
        runner.run_next()
    assert decoder.released == [0, 1, 2, 3]
    assert all(before(log, ("submit", k), ("release", k)) for k in range(4))


def test_a_chunk_still_decoding_does_not_hold_back_the_previous_chunks_results(log):
    model = InstantModel(max_batch_size=2, log=log)
    decoder = Decoder(log, held={2})
    runner = runner_on(model, decoder)
    chunks = chunks_of(3)
    for chunk in chunks:
        runner.submit(chunk)
    first = runner.run_next()  # chunk 2 is not decoded: chunk 0's lines come without waiting for it
    assert [json.loads(line)["image"] for line in first.results] == chunks[0]
    assert ("submit", 2) not in log and decoder.released == [0, 1]
    decoder.decodings[2].ready.set()
    second = runner.run_next()  # chunk 2 goes on the device before chunk 1's rows are waited for
    assert before(log, ("submit", 2), ("result", 1))
    third = runner.run_next()
    assert [[json.loads(line)["image"] for line in o.results] for o in (second, third)] == chunks[1:]
    assert runner.waits.seconds["decode"] >= 0.0 and decoder.released == [0, 1, 2]


def test_bad_images_are_error_lines_and_a_chunk_of_only_bad_images_puts_nothing_on_the_device(log):
    model = InstantModel(max_batch_size=2, log=log)
    runner = runner_on(model, Decoder(log))
    chunks = [["a.jpg", "bad1.jpg", "b.jpg"], ["bad2.jpg"], ["c.jpg"], ["bad3.jpg", "d.jpg"]]
    for chunk in chunks:
        runner.submit(chunk)
    outcomes = [runner.run_next() for _ in chunks]
    assert [[json.loads(line)["image"] for line in o.results] for o in outcomes] == [["a.jpg", "b.jpg"], [],
                                                                                      ["c.jpg"], ["d.jpg"]]
    assert [[json.loads(line)["image"] for line in o.errors] for o in outcomes] == [["bad1.jpg"], ["bad2.jpg"], [],
                                                                                     ["bad3.jpg"]]
    assert model.batches == 3 and in_flight_at_most(log) <= 2


def test_chunks_larger_than_a_batch_go_in_several_batches_in_order(log):
    model = InstantModel(max_batch_size=2, log=log)
    runner = runner_on(model, Decoder(log))
    chunks = chunks_of(4, size=5)  # three batches per chunk: 2 + 2 + 1
    for chunk in chunks:
        runner.submit(chunk)
    outcomes = [runner.run_next() for _ in chunks]
    assert [[json.loads(line)["image"] for line in o.results] for o in outcomes] == chunks
    assert model.batches == 12  # the stand-in's third submit waits for the first batch, as the engine's does


def test_a_failure_starting_a_chunk_is_raised_at_its_turn_after_the_chunks_before_it(log):
    model = InstantModel(max_batch_size=2, log=log)
    real_submit = model.submit

    def submit(inputs, *args, **kwargs):
        if model.batches == 2:
            raise RuntimeError("device lost at batch 2")
        return real_submit(inputs, *args, **kwargs)

    model.submit = submit
    decoder = Decoder(log)
    runner = runner_on(model, decoder)
    chunks = chunks_of(4)
    for chunk in chunks:
        runner.submit(chunk)
    answered = [runner.run_next(), runner.run_next()]  # chunk 2's start failed while chunk 0 was answered
    assert [[json.loads(line)["image"] for line in o.results] for o in answered] == chunks[:2]
    with pytest.raises(RuntimeError, match="device lost at batch 2"):
        runner.run_next()
    assert decoder.released == [0, 1, 2]  # chunk 2's pixels are given back; chunk 3 was never started
    with pytest.raises(RuntimeError, match="device lost at batch 2"):  # nor is it answered as if empty
        runner.run_next()
    assert ("submit", 3) not in log and model.batches == 2


def test_a_broken_decoder_is_raised_at_that_chunks_turn(log):
    from vggserve.decoding.pool import DecodePoolError

    model = InstantModel(max_batch_size=2, log=log)
    runner = runner_on(model, Decoder(log, fail={1: DecodePoolError("the decode processes broke")}))
    for chunk in chunks_of(3):
        runner.submit(chunk)
    assert [json.loads(line)["image"] for line in runner.run_next().results] == chunks_of(1)[0]
    with pytest.raises(DecodePoolError, match="broke"):
        runner.run_next()
    assert model.batches == 1


def test_the_rank_reports_its_wall_time_waiting_for_the_device_and_for_decodes(log):
    """The waits are wall time: measured here on a clock that moves only when the device is waited for."""
    now = [0.0]
    model = InstantModel(max_batch_size=2, log=log)
    real_submit = model.submit

    class Slow:
        def __init__(self, pending):
            self.pending = pending

        def result(self):
            now[0] += 1.0  # each batch's rows take one 'second' to come
            return self.pending.result()

    model.submit = lambda *a, **k: Slow(real_submit(*a, **k))
    decoder = Decoder(log)
    runner = runner_on(model, decoder)
    runner.waits = StageClock(lambda: now[0])
    stats = RankStats(0, "cpu", clock=runner.clock, waits=runner.waits)
    for chunk in chunks_of(4):
        runner.submit(chunk)
    for _ in range(4):
        runner.run_timed(stats)
    assert runner.waits.seconds == {"device": 4.0, "decode": 0.0}
    summary = stats.as_dict()
    assert summary["wait_ms_per_image"] == {"device": 500.0, "decode": 0.0, "chunks": 0.0}  # 4 s over 8 images
    assert {"stage", "result", "rank_process"} <= set(summary["cpu_ms_per_image"])


def test_the_off_device_path_answers_in_order_and_counts_its_model_time_as_device_wait(log):
    class HostModel:
        preprocessing = "torchvision"
        max_batch_size = 4

        def probabilities(self, x):
            rows = np.full((len(x), 1000), 1e-4, np.float32)
            rows[:, 7] = 1.0
            return rows

    decoder = Decoder(log, answer=ModelInput.tensor(np.zeros(TENSOR_SHAPE, np.float32)))
    runner = ChunkRunner(HostModel(), top_k=1, decode_threads=1)
    assert not runner.on_device
    runner.decoder.close()
    runner.decoder, runner.clock = decoder, decoder.clock
    chunks = [["a.jpg", "bad.jpg", "b.jpg"], ["c.jpg"]]
    for chunk in chunks:
        runner.submit(chunk)
    outcomes = [runner.run_next(), runner.run_next()]
    assert [[json.loads(line)["image"] for line in o.results] for o in outcomes] == [["a.jpg", "b.jpg"], ["c.jpg"]]
    assert [len(o.errors) for o in outcomes] == [1, 0]
    assert all(json.loads(line)["predictions"][0]["index"] == 7 for o in outcomes for line in o.results)
    assert set(runner.waits.seconds) == {"device", "decode"} and decoder.released == [0, 1]


def test_the_summary_carries_each_ranks_waits_beside_its_cpu_stages():
    from vggserve.distributed.summary import format_summary, summarize

    ranks = [{"rank": r, "device": "gpu", "device_name": "GPU"} for r in range(2)]
    stats = {0: {"images": 64, "errors": 0, "active_seconds": 1.0, "images_per_second": 64.0,
                 "cpu_ms_per_image": {"stage": 0.1, "rank_process": 0.4},
                 "wait_ms_per_image": {"device": 0.02, "decode": 0.5}}}
    summary = summarize(stats, ranks, wall=1.0, setup=0.5, skipped=0, output="r.jsonl", errors_file="e.jsonl")
    assert summary["ranks"][0]["wait_ms_per_image"] == {"device": 0.02, "decode": 0.5}
    assert summary["ranks"][0]["cpu_ms_per_image"] == {"stage": 0.1, "rank_process": 0.4}
    assert summary["ranks"][1]["wait_ms_per_image"] == {}  # a rank that got no work
    text = format_summary(summary)
    assert "rank 0 waited ms per image: device 0.02, decode 0.50" in text and "rank 1 waited" not in text


def test_a_chunk_of_several_batches_counts_the_waits_for_its_staging_slots_as_device_waits(log):
    """A chunk larger than max_batch_size goes on the device in several submits, and a submit waits for the batch
    that used its staging slot two submits back (the engine's _collect): that is waiting for the device too. On a
    clock that moves only when a batch's rows are first waited for, one 'second' each, every batch is counted."""
    now = [0.0]
    model = InstantModel(max_batch_size=2, log=log)
    real_submit = model.submit
    submitted = []

    class Slow:
        def __init__(self, pending):
            self.pending, self.waited = pending, False

        def result(self):
            if not self.waited:
                now[0] += 1.0
                self.waited = True
            return self.pending.result()

    def submit(*args, **kwargs):
        if len(submitted) >= 2:  # as the engine: its slot's previous batch is collected first
            submitted[-2].result()
        submitted.append(Slow(real_submit(*args, **kwargs)))
        return submitted[-1]

    model.submit = submit
    runner = runner_on(model, Decoder(log))
    runner.waits = StageClock(lambda: now[0])
    chunks = chunks_of(4, size=4)  # two batches per chunk
    for chunk in chunks:
        runner.submit(chunk)
    outcomes = [runner.run_next() for _ in chunks]
    assert [[json.loads(line)["image"] for line in o.results] for o in outcomes] == chunks
    assert model.batches == 8 and runner.waits.seconds["device"] == 8.0


def test_the_off_device_path_gives_the_decoded_pixels_back_when_the_model_fails(log):
    class FailingModel:
        preprocessing = "torchvision"
        max_batch_size = 4

        def probabilities(self, x):
            raise RuntimeError("out of memory")

    decoder = Decoder(log, answer=ModelInput.tensor(np.zeros(TENSOR_SHAPE, np.float32)))
    runner = ChunkRunner(FailingModel(), top_k=1, decode_threads=1)
    assert not runner.on_device
    runner.decoder.close()
    runner.decoder, runner.clock = decoder, decoder.clock
    runner.submit(["a.jpg"])
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.run_next()
    assert decoder.released == [0]  # as the device path does (ChunkRunner._start): shared memory is not held


def test_while_the_device_computes_the_runner_calls_idle_until_it_has_no_work_left(log):
    """A worker rank's reports move through MPI only while it calls into MPI: `idle` is called while the runner
    waits for a batch that is not done, until idle says it has nothing left; the results are those without it."""
    def lines_of(idle):
        model = InstantModel(max_batch_size=2, seconds_per_batch=0.02)
        runner = runner_on(model, Decoder([]))
        runner.idle = idle
        for chunk in chunks_of(3):
            runner.submit(chunk)
        return [runner.run_next().results for _ in range(3)]

    calls = []

    def idle():
        calls.append(threading.current_thread().name)
        return len(calls) < 4  # work for three more calls, then none

    assert lines_of(idle) == lines_of(None)
    assert len(calls) >= 4  # called again while it had work (each batch takes 20 ms; the polls are 0.5 ms apart)
    assert set(calls) == {threading.current_thread().name}  # on the runner's own thread (MPI is called from there)


def test_an_idle_with_nothing_to_do_is_asked_once_per_wait_and_the_wait_blocks():
    asked = []
    runner = runner_on(InstantModel(max_batch_size=2, seconds_per_batch=0.05), Decoder([]))
    runner.idle = lambda: asked.append(1) or False
    for chunk in chunks_of(2):
        runner.submit(chunk)
    runner.run_next()
    runner.run_next()
    assert 1 <= len(asked) <= 4  # one per wait on a batch still computing (two batches, two chunks): no polling
