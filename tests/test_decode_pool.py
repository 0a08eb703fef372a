"""Decode processes (vggserve.decoding.pool) and their shared-memory ring (vggserve.ipc.ring): the same answers as
decoding in this process, nothing lost when a process crashes or hangs, memory given back."""

import os
from pathlib import Path

import numpy as np
import pytest
from image_corpus import EXPECTED, Bad, build_corpus
from PIL import Image

from vggserve.decoding import DecodeJob, decode_input, make_decoder
from vggserve.decoding import worker as worker_module
from vggserve.decoding.pool import DecodePool, DecodePoolError
from vggserve.ipc.ring import Block, RegionWriter, Ring
from vggserve.modelinput import ModelInput

TESTS = str(Path(__file__).resolve().parent)


def _array(x):
    return x.array if isinstance(x, ModelInput) else x


def assert_same_answer(got, want, name):
    (x, problem), (x_want, problem_want) = got, want
    assert problem == problem_want, name
    if problem is None:
        assert type(x) is type(x_want) and getattr(x, "form", None) == getattr(x_want, "form", None), name
        assert _array(x).dtype == _array(x_want).dtype and np.array_equal(_array(x), _array(x_want)), name


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pool_corpus")
    files = {name: str(path) for name, path in build_corpus(folder).items()}
    rng = np.random.default_rng(5)
    for i, (w, h) in enumerate([(500, 375), (375, 500), (900, 620), (224, 224), (250, 190)]):
        path = folder / f"photo{i}.jpg"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path, quality=90)
        files[path.name] = str(path)
    files["missing.jpg"] = str(folder / "missing.jpg")
    return files


@pytest.fixture
def faults(monkeypatch):
    """Decode processes run tests/decode_faults.py's crash_or_hang."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(worker_module, "DEFAULT_TASK", "decode_faults:crash_or_hang")


@pytest.mark.parametrize("on_device", [True, False])
def test_decode_processes_answer_as_decoding_here_and_give_every_block_back(corpus, on_device):
    pool = make_decoder(DecodeJob("torchvision", on_device), procs=2)
    try:
        futures = {name: pool.submit(path) for name, path in corpus.items()}
        answers = {name: future.result(timeout=120) for name, future in futures.items()}
        for name, path in corpus.items():
            assert_same_answer(answers[name], decode_input(path, "torchvision", on_device=on_device), name)
        bad = {name for name, e in EXPECTED.items() if isinstance(e, Bad)} | {"missing.jpg"}
        assert {name for name, (_, problem) in answers.items() if problem} == bad
        assert pool.ring.live_blocks() == len(corpus) - len(bad) and pool.inline == 0
        pool.release(futures.values())
        assert pool.ring.live_blocks() == 0
        assert {"read", "decode", "link"} <= set(pool.clock.seconds)
    finally:
        pool.close()


def test_jpegs_are_decoded_straight_into_shared_memory(corpus):
    """A 500x375 JPEG's image input is the decoded array itself: nothing is copied in the process."""
    pool = make_decoder(DecodeJob("torchvision", True), procs=1)
    try:
        futures = [pool.submit(corpus[f"photo{i}.jpg"]) for i in range(3)]
        assert all(f.result(timeout=120)[0].form == "image" for f in futures)
        assert pool.clock.seconds.get("copy", 0.0) == 0.0
    finally:
        pool.close()


def test_a_crashing_process_is_replaced_and_only_its_image_is_an_error(corpus, faults, tmp_path):
    crash = tmp_path / "crash.jpg"
    crash.write_bytes(Path(corpus["photo0.jpg"]).read_bytes())
    sources = [corpus["photo1.jpg"], str(crash), corpus["photo2.jpg"], corpus["photo3.jpg"], corpus["notes.txt"]]
    pool = DecodePool(1, DecodeJob("torchvision", True))  # one process: the images after the crash were queued on it
    try:
        answers = [f.result(timeout=120) for f in [pool.submit(s) for s in sources]]
        assert pool.restarts == 1
    finally:
        pool.close()
    assert answers[1][0] is None and answers[1][1][1] == "DecodeProcessDied"
    assert f"file '{crash}'" in answers[1][1][0] and "killed by signal 9" in answers[1][1][0]
    for source, answer in zip(sources, answers):
        if source != str(crash):
            assert_same_answer(answer, decode_input(source, "torchvision", on_device=True), source)


def test_a_hanging_process_is_killed_after_the_timeout_and_the_rest_goes_on(corpus, faults, tmp_path):
    hang = tmp_path / "hang.png"
    hang.write_bytes(Path(corpus["gray.png"]).read_bytes())
    sources = [str(hang), corpus["photo0.jpg"], corpus["photo4.jpg"]]
    pool = DecodePool(1, DecodeJob("torchvision", True), timeout_s=1.0)
    try:
        answers = [f.result(timeout=120) for f in [pool.submit(s) for s in sources]]
        assert pool.restarts == 1
    finally:
        pool.close()
    assert answers[0][1][1] == "DecodeTimeout" and "longer than 1 s" in answers[0][1][0]
    assert all(problem is None for _, problem in answers[1:])


def test_processes_that_cannot_start_fail_the_pool_instead_of_every_image(corpus, monkeypatch):
    monkeypatch.setattr(worker_module, "DEFAULT_TASK", "no_such_module_here:task")
    pool = DecodePool(1, DecodeJob("torchvision", True))
    try:
        with pytest.raises(DecodePoolError, match="before they are ready"):
            pool.submit(corpus["photo0.jpg"]).result(timeout=120)
        with pytest.raises(DecodePoolError):
            pool.submit(corpus["photo1.jpg"]).result(timeout=5)
    finally:
        pool.close()


def test_a_full_ring_sends_pixels_inline_and_the_answers_stay_right(corpus):
    """Held blocks fill the region (8 MB): later images come pickled, equal all the same."""
    pool = DecodePool(1, DecodeJob("torchvision", True), in_flight=1)
    try:
        futures = [pool.submit(corpus["photo0.jpg"]) for _ in range(20)]  # 20 x 562 KB > 8 MB
        answers = [f.result(timeout=120) for f in futures]
        want = decode_input(corpus["photo0.jpg"], "torchvision", on_device=True)
        for answer in answers:
            assert_same_answer(answer, want, "photo0.jpg")
        assert 0 < pool.inline < 20
        pool.release(futures)
        assert pool.ring.live_blocks() == 0
        inline = pool.inline
        later = pool.submit(corpus["photo0.jpg"])
        assert_same_answer(later.result(timeout=120), want, "after release")
        assert pool.inline == inline and pool.ring.live_blocks() == 1  # room again: shared
    finally:
        pool.close()


# ---- the ring alone ---------------------------------------------------------------------------------------------
def test_ring_blocks_wrap_around_and_are_reused_only_once_released():
    ring = Ring(2, 4096)
    writer = RegionWriter(ring.writer_spec(1))
    try:
        blocks = []
        for value in range(3):  # 3 x 1280 bytes (aligned) of 4096
            block, array = writer.allocate((1280,), np.uint8)
            array[:] = value
            blocks.append(ring.take(block, (1280,), np.uint8) is not None and block)
        assert writer.allocate((1280,), np.uint8) is None  # full
        ring.free(blocks[1])  # out of order: nothing is reusable until the oldest is free
        assert writer.allocate((1280,), np.uint8) is None
        ring.free(blocks[0])
        block, array = writer.allocate((1280,), np.uint8)  # wraps to the region's start
        assert block.start % ring.region_bytes == 0 and block.start == ring.region_bytes
        array[:] = 9
        view = ring.take(block, (1280,), np.uint8)
        assert (view == 9).all()
        third = np.ndarray((1280,), np.uint8, ring.mapping, ring.regions * 64 + ring.region_bytes + 2560)
        assert (third == 2).all()  # the live third block was not touched
    finally:
        writer.close()
        ring.close()


def test_a_new_writer_continues_after_the_blocks_its_predecessor_reported():
    ring = Ring(1, 4096)
    first = RegionWriter(ring.writer_spec(0))
    block, array = first.allocate((1000,), np.uint8)
    array[:] = 7
    held = ring.take(block, (1000,), np.uint8)
    first.allocate((1000,), np.uint8)  # allocated but never reported: the process died with it
    first.close()
    second = RegionWriter(ring.writer_spec(0))
    try:
        block2, array2 = second.allocate((1000,), np.uint8)
        assert block2.start == block.end
        array2[:] = 8
        assert (held == 7).all()
        undone = Block(0, block2.start, block2.end)
        second.undo(undone)
        assert second.head == block.end
    finally:
        second.close()
        ring.close()


@pytest.mark.parametrize("cpus, allowed, local_ranks, want", [
    (16, 16, 1, 15),  # one rank on a 16-core machine: all cores but its own
    (16, 16, 4, 3),  # four ranks share them
    (16, 4, 4, 3),  # the launcher bound the rank to 4 cores: those
    (16, 1, 4, 1),  # bound to one core: still one process
    (2, 2, 1, 1),
    (2, 2, 2, 1),
])
def test_decode_processes_by_default_are_the_ranks_share_of_the_cores_less_one(monkeypatch, cpus, allowed,
                                                                           local_ranks, want):
    from vggserve.decoding import pool

    monkeypatch.setattr(pool.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(allowed)))
    assert pool.default_procs(local_ranks) == want


@pytest.mark.parametrize("value, message", [("-1", "expected a positive integer"), ("many", "expected a positive")])
def test_batch_refuses_a_bad_number_of_decode_processes(value, message):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "vggserve", "batch", "--input", "x", "--output", "y.jsonl",
                           "--decode-procs", value], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"argument --decode-procs: {message}" in done.stderr
