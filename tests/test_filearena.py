"""FileArena: a call's files read back to back into one reused buffer, with read_source's bytes and errors."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from vggserve.errors import ImageError
from vggserve.filearena import FileArena
from vggserve.images import read_source


def answer(source):
    try:
        return read_source(source)[0]
    except ImageError as exc:
        return exc


def same(got, want, name):
    if isinstance(want, ImageError):
        assert isinstance(got, ImageError), name
        assert (type(got), str(got), got.code) == (type(want), str(want), want.code), name
    else:
        assert bytes(got) == want, name


def test_files_of_every_size_read_as_read_source_reads_them_through_a_growing_arena(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [1, 7, 65536, 65537, 3000, 1 << 20, 5, (3 << 20) + 11, 2]
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        paths.append(str(path))
    arena = FileArena(first_bytes=1 << 16)  # outgrown several times within one call
    got = arena.read(paths)
    assert arena.nbytes >= 3 << 20
    for path, g in zip(paths, got):
        assert isinstance(g, np.ndarray) and g.dtype == np.uint8
        same(g, read_source(path)[0], path)
    grown = arena.nbytes
    again = arena.read(paths[:4])  # the next call reuses the grown buffer from its start
    assert arena.nbytes == grown
    for path, g in zip(paths, again):
        same(g, read_source(path)[0], path)
    assert np.shares_memory(again[0], arena._buf)


def test_other_sources_and_unreadable_paths_get_read_sources_bytes_or_error(tmp_path):
    good = tmp_path / "good.jpg"
    good.write_bytes(b"\xff\xd8 not really a jpeg")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    folder = tmp_path / "folder"
    folder.mkdir()
    sources = [str(good), str(tmp_path / "missing.jpg"), str(empty), str(folder), b"raw bytes",
               io.BytesIO(b"a stream"), good]
    got = FileArena().read(sources)
    assert len(got) == len(sources)
    for source, g in zip(sources, got):
        if isinstance(source, io.BytesIO):
            source.seek(0)
        same(g, answer(source), repr(source))
    assert isinstance(got[1], ImageError) and isinstance(got[2], ImageError) and isinstance(got[3], ImageError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_is_read_by_read_source_as_before(tmp_path):
    import threading

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"piped bytes"))
    writer.start()
    got = FileArena().read([str(fifo)])
    writer.join(5)
    same(got[0], b"piped bytes", "pipe")


def test_a_file_larger_than_the_kept_buffer_is_read_into_one_of_its_own(tmp_path, monkeypatch):
    import vggserve.filearena as filearena

    monkeypatch.setattr(filearena, "KEEP_BYTES", 1 << 16)
    small, huge = tmp_path / "small.bin", tmp_path / "huge.bin"
    small.write_bytes(b"s" * 3000)
    huge.write_bytes(bytes(range(256)) * 1024)  # 256 KB: four times what is kept
    arena = FileArena(first_bytes=1 << 12)
    got = arena.read([str(small), str(huge), str(small)])
    assert [bytes(g) for g in got] == [small.read_bytes(), huge.read_bytes(), small.read_bytes()]
    assert arena.nbytes <= 1 << 16  # the huge file's buffer is not kept for the next call
    assert [bytes(g) for g in arena.read([str(small)])] == [small.read_bytes()]


def test_kept_buffers_come_from_the_callers_allocator_and_a_read_waits_for_what_reads_the_arena(tmp_path,
                                                                                              monkeypatch):
    import vggserve.filearena as filearena

    monkeypatch.setattr(filearena, "KEEP_BYTES", 1 << 16)
    made, order = [], []

    def allocate(nbytes):
        made.append(nbytes)
        return np.zeros(nbytes, np.uint8)

    class Pending:  # a command still reading the arena: the next read waits for it first
        def wait(self):
            order.append("waited")

    small, large, huge = tmp_path / "s.bin", tmp_path / "l.bin", tmp_path / "h.bin"
    small.write_bytes(b"s" * 100)
    large.write_bytes(b"l" * 5000)
    huge.write_bytes(b"h" * (1 << 17))  # past KEEP_BYTES: a plain buffer of its own, not the allocator's
    arena = FileArena(first_bytes=1 << 10, allocate=allocate)
    assert arena.nbytes == 0 and arena.buffer is None and made == []  # nothing made before the first read
    got = arena.read([str(small), str(large), str(huge)])
    assert [bytes(g) for g in got] == [p.read_bytes() for p in (small, large, huge)]
    assert made == [1 << 10, 5001]  # the first buffer, then one that fits the large file and one byte more
    assert np.shares_memory(got[1], arena.buffer) and not np.shares_memory(got[2], arena.buffer)
    arena.reads.append(Pending())
    real = filearena.os.readv

    def readv(fd, bufs):
        order.append("read")
        return real(fd, bufs)

    monkeypatch.setattr(filearena.os, "readv", readv)
    assert bytes(arena.read([str(small)])[0]) == small.read_bytes()
    assert order == ["waited", "read"] and arena.reads == []
