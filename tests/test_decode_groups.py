"""The batch job's device decoder forms groups on purpose (issue 23): a group is decoded when it is due, full (GROUP
chunks or GROUP_BYTES waiting), end (no more chunks coming), starve (fewer than STARVE_BELOW chunks decoded and not
yet computed, those being decoded included) or timeout (the oldest chunk waited HOLD_S), and the rank holds enough
chunks for groups to gather. The rules are tested with a decode function and a clock the test controls (no device,
no sleeps); then the runner and its Worker over a stand-in device, and a real batch job on the test device."""

import json
import subprocess
import sys
import threading
from concurrent.futures import CancelledError
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vggserve.decoding.device.chunks import HOLD_S, STARVE_BELOW, DeviceChunkDecoder
from vggserve.decoding.groups import GROUP
from vggserve.distributed import workqueue
from vggserve.distributed.pipeline import ChunkRunner, RankStats, decode_group
from vggserve.distributed.summary import format_summary, summarize
from vggserve.distributed.workqueue import SHARED_TOKENS, TOKENS, Worker, agreed_group, rank_tokens
from vggserve.testing.models import InstantModel

PIXELS = np.zeros((8, 8, 3), np.uint8)
REPO = Path(__file__).resolve().parents[1]
WAIT = 30  # seconds a result may take at most: a rule that failed to fire fails the test instead of hanging it


class Clock:
    """A clock that moves only when the test says."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Decode:
    """The group decode: answers (PIXELS, None) per source and records each call's sources; `gate`, when given,
    holds every call until it is set; `fail` is raised instead of answering."""

    def __init__(self, gate: threading.Event | None = None, fail: BaseException | None = None):
        self.calls: list[list] = []
        self.gate, self.fail = gate, fail

    def __call__(self, sources):
        self.calls.append(list(sources))
        if self.gate is not None:
            assert self.gate.wait(WAIT), "a decode held for too long"
        if self.fail is not None:
            raise self.fail
        return [(PIXELS, None) for _ in sources]


def decoder_for(decode=None, ahead=STARVE_BELOW, clock=None, **options) -> DeviceChunkDecoder:
    """A decoder whose device has `ahead` chunks decoded ahead (by default enough: nothing starves) and whose clock
    stands still unless the test moves it."""
    decoder = DeviceChunkDecoder(None, None, decode=decode or Decode(), clock=clock or Clock(), **options)
    decoder.ahead(ahead)
    return decoder


def chunk(name: str, files: int = 2) -> list[bytes]:
    return [f"{name}{i}".encode() for i in range(files)]  # bytes: their length is their size (groups.source_bytes)


def answers(decoding) -> list:
    return decoding.result(timeout=WAIT)


# ---- the rules -------------------------------------------------------------------------------------------------

def test_a_group_is_held_until_it_is_full_then_decoded_as_one():
    decode = Decode()
    decoder = decoder_for(decode)
    decodings = [decoder.start(chunk(f"c{k}")) for k in range(GROUP - 1)]
    assert decoder.due() is None and decoder.groups == [] and not any(d.done() for d in decodings)
    decodings.append(decoder.start(chunk("last")))
    assert all(answers(d) == [(PIXELS, None)] * 2 for d in decodings)
    assert decoder.groups == [GROUP] and decoder.due_counts == {"full": 1}
    assert decode.calls == [[s for k in range(GROUP - 1) for s in chunk(f"c{k}")] + chunk("last")]
    decoder.close()


def test_a_group_is_full_at_its_byte_limit():
    decoder = decoder_for(group_bytes=10)  # 2 files of 3 bytes per chunk: the second chunk makes 12
    first = decoder.start(chunk("c0"))
    assert decoder.due() is None
    second = decoder.start(chunk("c1"))
    assert len(answers(first)) == 2 and decoder.groups == [1]  # full, and 12 > 10: the first chunk alone
    assert decoder.due() is None and not second.done()  # 6 bytes: not full, held
    decoder.finish()
    assert len(answers(second)) == 2
    assert decoder.groups == [1, 1] and decoder.due_counts == {"full": 1, "end": 1}
    decoder.close()


def test_the_end_decodes_what_is_held_and_anything_started_after_it():
    decoder = decoder_for()
    held = [decoder.start(chunk(f"c{k}")) for k in range(2)]
    assert decoder.due() is None
    decoder.finish()
    assert all(len(answers(d)) == 2 for d in held)
    late = decoder.start(chunk("late", 3))
    assert len(answers(late)) == 3
    assert decoder.groups == [2, 1] and decoder.due_counts == {"end": 2}
    decoder.close()


def test_a_lone_last_chunk_is_decoded_at_the_end_without_waiting_for_its_timeout():
    """The clock stands still, so only the end rule can decode the chunk: it does, without HOLD_S going by."""
    clock = Clock()
    decoder = decoder_for(clock=clock)
    last = decoder.start(chunk("last"))
    assert decoder.due() is None
    decoder.finish()
    assert len(answers(last)) == 2 and clock.now == 0.0
    assert decoder.groups == [1] and decoder.due_counts == {"end": 1}
    decoder.close()


def test_a_decoder_told_nothing_decodes_each_chunk_at_once():
    """Nobody says how far ahead the device is: it may be dry, so nothing is held back (the job's first chunks)."""
    decoder = DeviceChunkDecoder(None, None, decode=Decode(), clock=Clock())
    first = decoder.start(chunk("c0"))
    assert len(answers(first)) == 2 and decoder.due_counts == {"starve": 1}
    decoder.close()


def test_the_device_about_to_starve_makes_the_held_chunks_due_counting_those_being_decoded():
    gate = threading.Event()
    decode = Decode(gate)
    decoder = decoder_for(decode, ahead=STARVE_BELOW - 1)
    first = decoder.start(chunk("c0"))  # one short of STARVE_BELOW ahead, none decoding: due at once, held
    while not decode.calls:  # taken by a thread (the starve rule)
        threading.Event().wait(0.001)
    second = decoder.start(chunk("c1"))
    assert decoder.due() is None  # one short ahead + 1 being decoded: the device has enough
    gate.set()
    answers(first)  # decoded: now STARVE_BELOW ahead, still enough
    assert decoder.due() is None and not second.done()
    decoder.ahead(STARVE_BELOW - 1)  # the device took one: one short ahead, nothing decoding
    assert len(answers(second)) == 2
    assert decoder.groups == [1, 1] and decoder.due_counts == {"starve": 2}
    decoder.close()


def test_a_chunk_held_for_hold_s_times_out():
    clock = Clock()
    decoder = decoder_for(clock=clock)
    held = [decoder.start(chunk("c0"))]
    clock.now = HOLD_S / 2
    held.append(decoder.start(chunk("c1")))
    decoder.wake()
    assert decoder.due() is None
    clock.now = HOLD_S  # the oldest has waited HOLD_S
    decoder.wake()
    assert all(len(answers(d)) == 2 for d in held)
    assert decoder.groups == [2] and decoder.due_counts == {"timeout": 1}
    decoder.close()


def test_a_failed_group_decode_reaches_every_chunk_of_the_group():
    failure = RuntimeError("device decode failed")
    decoder = decoder_for(Decode(fail=failure))
    decodings = [decoder.start(chunk(f"c{k}")) for k in range(3)]
    decoder.finish()
    for decoding in decodings:
        with pytest.raises(RuntimeError, match="device decode failed"):
            decoding.result(timeout=WAIT)
    assert decoder.groups == [3]
    decoder.close()


def test_close_cancels_the_waiting_chunks_and_any_started_after():
    decode = Decode()
    decoder = decoder_for(decode)
    held = [decoder.start(chunk(f"c{k}")) for k in range(2)]
    decoder.close()
    after = decoder.start(chunk("after"))
    for decoding in (*held, after):
        assert decoding.done()
        with pytest.raises(CancelledError):
            decoding.result(timeout=WAIT)
    assert decode.calls == [] and decoder.groups == []


def test_the_group_stats_count_decodes_chunks_and_reasons():
    decoder = decoder_for()
    for k in range(GROUP + 1):
        decoder.start(chunk(f"c{k}"))
    decoder.finish()
    decoder.start(chunk("x")).result(timeout=WAIT)  # the last chunk taken: every group is counted
    stats = decoder.group_stats()
    assert stats["decodes"] == len(decoder.groups) and sum(stats["due"].values()) == stats["decodes"]
    assert stats["chunks_per_decode"] == pytest.approx((GROUP + 2) / stats["decodes"], abs=1e-3)
    assert set(stats["due"]) == {"full", "end", "starve", "timeout"} and stats["due"]["full"] == 1
    decoder.close()


# ---- tokens --------------------------------------------------------------------------------------------------------

def test_rank_tokens_add_two_groups_where_groups_form(monkeypatch):
    monkeypatch.delenv("VGGSERVE_BATCH_TOKENS", raising=False)
    assert rank_tokens(1) == rank_tokens(1, 1) == TOKENS == 5  # CPU decoders: as before
    assert rank_tokens(3, 1) == SHARED_TOKENS == 12
    assert rank_tokens(1, GROUP) == 13  # on the device and decoded ahead, a group decoding, a group gathering
    assert rank_tokens(2, GROUP) == rank_tokens(8, GROUP) == 20
    assert rank_tokens(1, 2) == 9
    monkeypatch.setenv("VGGSERVE_BATCH_TOKENS", "6")
    assert rank_tokens(1, GROUP) == rank_tokens(4, GROUP) == 6  # the setting wins, for every rank alike


class Ranks:
    """A communicator of several ranks whose allgather answers the ranks' values."""

    def __init__(self, values):
        self.values = values

    def Get_size(self):
        return len(self.values)

    def allgather(self, value):
        assert value in self.values
        return list(self.values)


def test_every_rank_counts_its_tokens_by_the_largest_group():
    from vggserve.distributed.mpi import SingleProcess

    assert agreed_group(SingleProcess(), GROUP) == GROUP and agreed_group(SingleProcess(), 1) == 1
    assert agreed_group(Ranks([1, GROUP, 1]), 1) == GROUP
    assert agreed_group(Ranks([1, 1]), 1) == 1


def test_only_the_device_decoder_forms_groups():
    from types import SimpleNamespace

    def unbuilt():
        raise RuntimeError("clBuildProgram failed")

    gpu = SimpleNamespace(jpeg_decoder=lambda: None, device_info=SimpleNamespace(kind="gpu"))
    cpu = SimpleNamespace(jpeg_decoder=lambda: None, device_info=SimpleNamespace(kind="cpu"))
    broken = SimpleNamespace(jpeg_decoder=unbuilt, device_info=SimpleNamespace(kind="gpu"))
    assert decode_group(gpu, "gpu") == decode_group(gpu, "auto") == decode_group(cpu, "gpu") == GROUP
    assert decode_group(cpu, "auto") == decode_group(gpu, "exact") == decode_group(gpu, "fast") == 1
    assert decode_group(broken, "auto") == decode_group(broken, "gpu") == 1  # its decoder does not build: the CPU
    model = InstantModel(max_batch_size=2)
    assert decode_group(model, "exact") == decode_group(model, "gpu") == 1  # no device JPEG decoder on it
    runner = ChunkRunner(model, decode_threads=1, on_device=True)
    assert not hasattr(runner.decoder, "finish")
    runner.last_chunks()  # a no-op for decoders that hold nothing back
    runner.submit(["a.png"])
    assert len(runner.run_next().errors) == 1  # still decodes (the file is missing: an error line)
    runner.close()


# ---- the runner and its Worker ------------------------------------------------------------------------------------

class Link:
    """A rank's link to a coordinator that always has something for it: `chunks`, then None."""

    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.reports: list[dict] = []
        self.closed = False

    def chunk_waiting(self) -> bool:
        return True

    def receive(self):
        return self.chunks.pop(0) if self.chunks else None

    def report(self, report: dict) -> None:
        self.reports.append(report)

    def close(self) -> None:
        self.closed = True


def test_a_worker_with_a_group_more_tokens_forms_groups_and_flushes_the_last_chunks():
    """Chunks come as fast as the Worker takes them (rank 0's own link): the runner tells the decoder how far ahead
    its device is and the Worker says when the last chunk has come, so groups of more than one chunk form and every
    chunk is answered; with the clock standing still, no group waited for its timeout."""
    paths = [[f"c{c}/{i}.jpg" for i in range(2)] for c in range(23)]
    runner = ChunkRunner(InstantModel(max_batch_size=2), top_k=2, decode_threads=1, on_device=True)
    runner.decoder.close()
    decoder = DeviceChunkDecoder(None, None, decode=Decode(), clock=Clock())
    runner.decoder, runner.clock = decoder, decoder.clock
    events, start, finish = [], decoder.start, decoder.finish
    decoder.start = lambda sources: (events.append("start"), start(sources))[1]
    decoder.finish = lambda: (events.append("finish"), finish())[1]
    stats = RankStats(0, "cpu", clock=runner.clock, waits=runner.waits, decoder=decoder)
    link = Link(paths)
    worker = Worker(link, runner, stats, rank_tokens(1, GROUP))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive() and worker.finished and link.closed
    lines = [json.loads(line)["image"] for report in link.reports for line in report["results"]]
    assert lines == [p for chunk_paths in paths for p in chunk_paths]  # every image, once, in order
    assert sum(decoder.groups) == len(paths) and max(decoder.groups) > 1
    assert decoder.due_counts["timeout"] == 0
    # the Worker says so once rank 0 has no more (each None it receives), never before the last chunk came
    assert events[:len(paths)] == ["start"] * len(paths) and set(events[len(paths):]) == {"finish"}
    assert link.reports[-1]["stats"]["decode_groups"] == decoder.group_stats()
    runner.close()


def test_the_summary_prints_each_ranks_decode_groups():
    stats = {0: {"images": 8, "decode_groups": {"decodes": 3, "chunks_per_decode": 2.667,
                                                "due": {"full": 1, "end": 1, "starve": 1, "timeout": 0}}},
             1: {"images": 8}}
    ranks = [{"rank": 0, "device": "gpu:0", "device_name": "A"}, {"rank": 1, "device": "gpu:1", "device_name": "B"}]
    summary = summarize(stats, ranks, 1.0, 0.5, 0, "out.jsonl", "out.errors.jsonl")
    assert summary["ranks"][0]["decode_groups"]["decodes"] == 3 and summary["ranks"][1]["decode_groups"] == {}
    text = format_summary(summary)
    assert ("  rank 0 decode_groups: 3 decodes, 2.67 chunks per decode; due: full 1, end 1, starve 1, timeout 0"
            in text.splitlines())
    assert "rank 1 decode_groups" not in text


# ---- a real batch job ----------------------------------------------------------------------------------------------

def test_a_batch_job_decoding_on_the_device_writes_every_result_and_forms_groups(tiny_weights_path, tmp_path):
    """24 JPEGs in chunks of 2 on one rank: rank 0 deals its 9 chunks at once, so groups gather; every image gets
    its line, and the summary counts the groups and why each was due."""
    from conftest import TEST_DEVICE

    folder = tmp_path / "jpegs"
    folder.mkdir()
    rng = np.random.default_rng(23)
    for i in range(24):
        Image.fromarray(rng.integers(0, 256, (40 + i, 50 + 2 * i, 3), dtype=np.uint8)).save(folder / f"i{i:02d}.jpg")
    output, summary_path = tmp_path / "results.jsonl", tmp_path / "summary.json"
    from mpi_scripts.launch import subprocess_env

    env = {k: v for k, v in subprocess_env().items() if k != "VGGSERVE_BATCH_TOKENS"}  # one rank's 9 tokens
    done = subprocess.run([sys.executable, "-m", "vggserve", "batch", "--weights", str(tiny_weights_path), "--input",
                           str(folder), "--output", str(output), "--device", TEST_DEVICE, "--no-progress",
                           "--decode", "gpu", "--batch-size", "2", "--decode-procs", "0", "--summary",
                           str(summary_path)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    images = sorted(json.loads(line)["image"] for line in output.read_text().splitlines())
    assert images == sorted(str(p) for p in folder.iterdir())
    groups = json.loads(summary_path.read_text())["ranks"][0]["decode_groups"]
    assert groups["chunks_per_decode"] > 1 and sum(groups["due"].values()) == groups["decodes"], groups
    assert 12 / GROUP <= groups["decodes"] < 12
    assert "rank 0 decode_groups: " in done.stdout


@pytest.mark.mpi
def test_host_vs_engine_prints_the_batch_jobs_decode_groups(tiny_weights_path, tmp_path):
    """benchmarks/host_vs_engine.py with --batch-decode gpu: the batch run's groups in its JSON and under its table."""
    from conftest import TEST_DEVICE

    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "host_vs_engine.py"), "--weights",
                           str(tiny_weights_path), "--device", TEST_DEVICE, "--batch-size", "2", "--images", "16",
                           "--runs", "batch", "--engine-seconds", "1", "--batch-decode", "gpu", "--precision", "fp32",
                           "--workdir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    groups = json.loads(out.read_text())["batch"]["decode_groups"]
    assert groups["decodes"] >= 1 and sum(groups["due"].values()) == groups["decodes"], groups
    assert f"batch decode groups: {groups['decodes']} decode" in done.stdout
