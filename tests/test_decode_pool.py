"""Decode processes (vggserve.decoding.pool) and their shared-memory ring (vggserve.ipc.ring): the same answers as
decoding in this process, in the chunk's order, nothing lost when a process crashes or hangs (whichever image of
its parcel it was on), memory given back."""

import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from image_corpus import EXPECTED, Bad, build_corpus
from PIL import Image

from vggserve.decoding import DecodeJob, decode_input, make_decoder
from vggserve.decoding import pool as pool_module
from vggserve.decoding import worker as worker_module
from vggserve.decoding.pool import DecodePool, DecodePoolError
from vggserve.ipc.frames import FrameReader, frame
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
        decoding = pool.start(corpus.values())
        answers = dict(zip(corpus, decoding.result(timeout=120)))
        for name, path in corpus.items():
            assert_same_answer(answers[name], decode_input(path, "torchvision", on_device=on_device), name)
        bad = {name for name, e in EXPECTED.items() if isinstance(e, Bad)} | {"missing.jpg"}
        assert {name for name, (_, problem) in answers.items() if problem} == bad
        assert pool.ring.live_blocks() == len(corpus) - len(bad) and pool.inline == 0
        pool.release(decoding)
        assert pool.ring.live_blocks() == 0
        assert {"read", "decode", "link"} <= set(pool.clock.seconds)
    finally:
        pool.close()


def test_jpegs_are_decoded_straight_into_shared_memory(corpus):
    """A 500x375 JPEG's image input is the decoded array itself: nothing is copied in the process."""
    pool = make_decoder(DecodeJob("torchvision", True), procs=1)
    try:
        answers = pool.start([corpus[f"photo{i}.jpg"] for i in range(3)]).result(timeout=120)
        assert all(x.form == "image" for x, _ in answers)
        assert pool.clock.seconds.get("copy", 0.0) == 0.0
    finally:
        pool.close()


@pytest.fixture(params=["shared memory", "no shared memory"])
def ring_mode(request, monkeypatch):
    """With the ring, a process gets parcels of several images and says in the ring's header which one it is on;
    without it (no /dev/shm), parcels are of one image. The image a process dies or hangs on is found either way."""
    if request.param == "no shared memory":
        monkeypatch.setattr(pool_module, "_make_ring", lambda procs, nbytes: None)
    return request.param


@pytest.mark.parametrize("position", [0, 1, 2, 4])
def test_a_crashing_process_is_replaced_and_only_its_image_is_an_error(corpus, faults, tmp_path, ring_mode,
                                                                      position):
    crash = tmp_path / "crash.jpg"
    crash.write_bytes(Path(corpus["photo0.jpg"]).read_bytes())
    sources = [corpus["photo1.jpg"], corpus["photo2.jpg"], corpus["photo3.jpg"], corpus["notes.txt"]]
    sources.insert(position, str(crash))  # first, inside or last of a parcel, or in the second parcel
    pool = DecodePool(1, DecodeJob("torchvision", True))  # one process: the images after the crash were queued on it
    try:
        answers = pool.start(sources).result(timeout=120)
        assert pool.restarts == 1
        if ring_mode == "shared memory":
            pool.release(pool.start([]))
    finally:
        pool.close()
    assert answers[position][0] is None and answers[position][1][1] == "DecodeProcessDied"
    assert f"file '{crash}'" in answers[position][1][0] and "killed by signal 9" in answers[position][1][0]
    for source, answer in zip(sources, answers):
        if source != str(crash):
            assert_same_answer(answer, decode_input(source, "torchvision", on_device=True), source)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_a_hanging_process_is_killed_after_the_timeout_and_the_rest_goes_on(corpus, faults, tmp_path, ring_mode,
                                                                           position):
    hang = tmp_path / "hang.png"
    hang.write_bytes(Path(corpus["gray.png"]).read_bytes())
    sources = [corpus["photo0.jpg"], corpus["photo4.jpg"]]
    sources.insert(position, str(hang))
    pool = DecodePool(1, DecodeJob("torchvision", True), timeout_s=1.0)
    try:
        answers = pool.start(sources).result(timeout=120)
        assert pool.restarts == 1
    finally:
        pool.close()
    assert answers[position][1][1] == "DecodeTimeout" and "longer than 1 s" in answers[position][1][0]
    assert [problem is None for _, problem in answers] == [i != position for i in range(3)]


def test_a_process_that_dies_between_images_is_replaced_without_losing_any(corpus, monkeypatch):
    """Killed while it waits for work (the OOM killer, an operator): nothing is an error, later chunks go on."""
    pool = DecodePool(2, DecodeJob("torchvision", True))
    try:
        first = pool.start([corpus[f"photo{i}.jpg"] for i in range(5)])
        first.result(timeout=120)
        pool._procs[0].popen.kill()
        later = pool.start([corpus[f"photo{i}.jpg"] for i in range(5)] * 2)
        answers = later.result(timeout=120)
        assert all(problem is None for _, problem in answers) and pool.restarts == 1
        for index, answer in enumerate(answers):
            assert_same_answer(answer, first.result()[index % 5], f"photo{index % 5}.jpg")
    finally:
        pool.close()


def test_chunks_in_flight_together_each_get_their_own_answers_in_order(corpus):
    names = [name for name in corpus if name.endswith((".jpg", ".png"))]
    rng = np.random.default_rng(3)
    chunks = [list(rng.choice(names, size=int(rng.integers(0, 12)))) for _ in range(8)]
    pool = DecodePool(3, DecodeJob("torchvision", True))
    try:
        decodings = [pool.start(corpus[name] for name in chunk) for chunk in chunks]
        want = {name: decode_input(corpus[name], "torchvision", on_device=True) for name in names}
        for chunk, decoding in zip(chunks, decodings):
            answers = decoding.result(timeout=120)
            assert len(answers) == len(chunk)
            for name, answer in zip(chunk, answers):
                assert_same_answer(answer, want[name], name)
            pool.release(decoding)
        assert pool.ring.live_blocks() == 0
        assert pool.start([]).done()
    finally:
        pool.close()


def test_closing_the_pool_fails_the_chunks_still_waiting(corpus, faults, tmp_path):
    hang = tmp_path / "hang.png"
    hang.write_bytes(Path(corpus["gray.png"]).read_bytes())
    pool = DecodePool(1, DecodeJob("torchvision", True))
    waiting = pool.start([str(hang), corpus["photo0.jpg"]])
    pool.close()
    with pytest.raises(DecodePoolError, match="closed"):
        waiting.result(timeout=30)


def test_processes_that_cannot_start_fail_the_pool_instead_of_every_image(corpus, monkeypatch):
    monkeypatch.setattr(worker_module, "DEFAULT_TASK", "no_such_module_here:task")
    pool = DecodePool(1, DecodeJob("torchvision", True))
    try:
        with pytest.raises(DecodePoolError, match="before they are ready"):
            pool.start([corpus["photo0.jpg"]]).result(timeout=120)
        with pytest.raises(DecodePoolError):
            pool.start([corpus["photo1.jpg"]]).result(timeout=5)
    finally:
        pool.close()


def test_the_processes_outlive_the_thread_that_made_the_pool(corpus):
    """A decode process is killed when the thread that started it ends (PR_SET_PDEATHSIG). The pool's constructor
    started them, so a pool made on a thread that then ended (a server's start-up thread) lost every process:
    each was replaced, and an image one of them was decoding became an error."""
    made = {}

    def make():
        pool = DecodePool(2, DecodeJob("torchvision", True))
        for _ in range(12000):  # ready: each process has asked for its death signal, while this thread lives
            if all(proc.ready for proc in pool._procs):
                break
            time.sleep(0.01)
        made["pool"], made["thread"] = pool, threading.get_native_id()

    maker = threading.Thread(target=make)
    maker.start()
    maker.join()
    pool = made["pool"]
    try:
        gone = Path(f"/proc/self/task/{made['thread']}")
        for _ in range(3000):  # the thread's exit (and any death signal it sends) is over once its entry goes
            if not gone.exists():
                break
            time.sleep(0.01)
        assert not gone.exists()
        answers = pool.start([corpus[f"photo{i}.jpg"] for i in range(5)] * 2).result(timeout=120)
        assert all(problem is None for _, problem in answers)
        assert pool.restarts == 0 and all(proc.popen.poll() is None for proc in pool._procs)
    finally:
        pool.close()


def test_a_process_that_cannot_be_started_leaves_nothing_behind(monkeypatch):
    started = []
    real_popen = pool_module.subprocess.Popen

    def popen(*args, **kwargs):
        if started:
            raise OSError(24, "Too many open files")
        started.append(real_popen(*args, **kwargs))
        return started[0]

    monkeypatch.setattr(pool_module.subprocess, "Popen", popen)
    segments = set(os.listdir("/dev/shm"))
    with pytest.raises(DecodePoolError, match="cannot start a decode process: .*Too many open files"):
        DecodePool(2, DecodeJob("torchvision", True))
    assert started[0].wait(timeout=30) is not None  # the first one is stopped, not left waiting for work
    assert set(os.listdir("/dev/shm")) <= segments  # and the shared memory is unlinked


def test_a_full_ring_sends_pixels_inline_and_the_answers_stay_right(corpus):
    """Held blocks fill the region (8 MB): later images come pickled, equal all the same."""
    pool = DecodePool(1, DecodeJob("torchvision", True), in_flight=1)
    try:
        decoding = pool.start([corpus["photo0.jpg"]] * 20)  # 20 x 562 KB > 8 MB
        want = decode_input(corpus["photo0.jpg"], "torchvision", on_device=True)
        for answer in decoding.result(timeout=120):
            assert_same_answer(answer, want, "photo0.jpg")
        assert 0 < pool.inline < 20
        pool.release(decoding)
        assert pool.ring.live_blocks() == 0
        inline = pool.inline
        later = pool.start([corpus["photo0.jpg"]])
        assert_same_answer(later.result(timeout=120)[0], want, "after release")
        assert pool.inline == inline and pool.ring.live_blocks() == 1  # room again: shared
    finally:
        pool.close()


# ---- the ring alone ---------------------------------------------------------------------------------------------
@pytest.fixture
def ring_writer():
    """A ring of 2 regions of 4096 bytes and a writer on region 1, both closed after the test."""
    ring = Ring(2, 4096)
    writer = RegionWriter(ring.writer_spec(1))
    yield ring, writer
    writer.close()
    ring.close()


def test_ring_blocks_wrap_around_and_are_reused_only_once_released(ring_writer):
    ring, writer = ring_writer
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


def test_a_writer_says_how_many_images_it_has_begun_and_since_when(ring_writer):
    ring, writer = ring_writer
    assert ring.progress(1)[0] == 0
    before = time.monotonic()
    writer.begin()
    writer.begin()
    begun, since = ring.progress(1)
    assert begun == 2 and before <= since <= time.monotonic() and ring.progress(0)[0] == 0
    assert RegionWriter(ring.writer_spec(1)).begin is not None and ring.progress(1)[0] == 0  # a new writer: 0


def test_frames_are_read_whole_however_the_bytes_arrive():
    """Several messages in one read, one message over several reads, and those sent before the end of file."""
    from multiprocessing.connection import Connection

    ours, theirs = socket.socketpair()
    reader, sender = FrameReader(ours), Connection(theirs.detach())
    try:
        assert reader.read() == ([], False)
        messages = [("ready", 1), [("error", ("bad", "ImageError"), {})], list(range(5))]
        for message in messages:
            sender.send(message)
        assert reader.read() == (messages, False)
        data = frame(np.arange(100_000))  # 800 KB: more than one read's worth, sent in two parts
        with socket.socket(fileno=os.dup(sender.fileno())) as raw:
            raw.sendall(data[:1000])
            assert reader.read() == ([], False)
            rest = threading.Thread(target=raw.sendall, args=(data[1000:],))  # more than the socket holds
            rest.start()
            got = []
            while not got:
                got = reader.read()[0]
            rest.join()
        assert len(got) == 1 and np.array_equal(got[0], np.arange(100_000))
        sender.send("last")
        sender.close()
        assert reader.read()[0] == ["last"]
        assert reader.read() == ([], True)  # the end of file: the socket stays readable until it is read
    finally:
        ours.close()


@pytest.mark.parametrize("cores, want", [
    (16, 15),  # one rank with 16 cores: all but its own
    (4, 3),  # four ranks sharing 16, or a rank bound to 4
    (3.9999999, 3),  # a sum of 1/n shares just short of a whole core
    (1, 1), (0.5, 1),  # one core, or half of one: still one process
])
def test_decode_processes_by_default_are_the_cores_a_process_counts_less_one(cores, want):
    from vggserve.decoding import pool

    assert pool.default_procs(cores) == want


def test_without_a_share_a_process_counts_the_cores_it_may_run_on_not_the_machines(monkeypatch):
    """A cgroup cpuset of 4 cores on a 64-core machine: 3 decode processes, not 63."""
    from vggserve.decoding import pool

    monkeypatch.setattr(pool.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(8, 12)))
    assert pool.default_procs() == 3


@pytest.mark.parametrize("value, message", [("-1", "expected a positive integer"), ("many", "expected a positive")])
def test_batch_refuses_a_bad_number_of_decode_processes(value, message):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "vggserve", "batch", "--input", "x", "--output", "y.jsonl",
                           "--decode-procs", value], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"argument --decode-procs: {message}" in done.stderr
