"""Shared memory that a killed process leaves behind (vggserve/ipc/orphans.py): which segments are released, which
are never touched; and that the decode processes' ring leaves no name behind at all. The segments here are files
in a folder of the test's own (a stand-in for /dev/shm), so nothing of another process is ever looked at."""

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vggserve.ipc import orphans
from vggserve.ipc.orphans import describe_released, release_orphans, release_own_mpi_segments
from vggserve.ipc.ring import RegionWriter, Ring
from vggserve.ipc.shm import Arena


def dead_pid() -> int:
    """The number of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def segment(folder, name, nbytes=4096):
    path = folder / name
    path.write_bytes(b"\0" * nbytes)
    return path


def test_segments_of_dead_processes_and_unmapped_mpich_ones_are_released_and_nothing_else(tmp_path):
    dead = dead_pid()
    gone = segment(tmp_path, f"vggserve_{dead}_0123abcd", 8192)
    live = segment(tmp_path, f"vggserve_{os.getpid()}_89abcdef")
    mpich_orphan = segment(tmp_path, "mpich_shm_17e7a746_0", 2048)
    mpich_mapped = segment(tmp_path, "mpich_shm_ffefbcae_0")
    mpich_open = segment(tmp_path, "mpich_vci_ffefbcae_0")
    python_own = segment(tmp_path, "psm_5a409a95")  # any Python program's: its owner cannot be told
    other = segment(tmp_path, "something_else")
    with open(mpich_mapped, "r+b") as handle, open(mpich_open, "rb"):
        mapping = mmap.mmap(handle.fileno(), 0)  # a live rank maps it (and the other one is open, not yet mapped)
        try:
            released = release_orphans(tmp_path)
        finally:
            mapping.close()
    assert sorted((r.name, r.nbytes, r.owner) for r in released) == [
        ("mpich_shm_17e7a746_0", 2048, "MPICH"), (gone.name, 8192, f"pid {dead}")]
    assert not gone.exists() and not mpich_orphan.exists()
    assert all(p.exists() for p in (live, mpich_mapped, mpich_open, python_own, other))
    line = describe_released(released, tmp_path)
    assert line.startswith(f"released 2 shared-memory segments (0.0 MB) that killed runs left in {tmp_path}: ")
    assert "mpich_shm_17e7a746_0" in line and gone.name in line


def test_a_segment_of_a_zombie_is_an_orphan(tmp_path):
    """A process that has ended but whose parent has not collected it yet has no memory any more."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        left = segment(tmp_path, f"vggserve_{zombie.pid}_0badc0de")
        assert [r.name for r in release_orphans(tmp_path)] == [left.name]
    finally:
        zombie.wait()


def test_mpich_segments_stay_while_a_rank_that_cannot_be_inspected_may_hold_them(tmp_path, monkeypatch):
    segment(tmp_path, "mpich_shm_1_0")
    monkeypatch.setattr(orphans, "_held_paths", lambda folder: orphans._UNKNOWN)
    assert release_orphans(tmp_path) == []
    assert (tmp_path / "mpich_shm_1_0").exists()


def test_a_rank_on_its_way_out_unlinks_the_mpich_segments_it_maps(tmp_path, monkeypatch):
    mapped = segment(tmp_path, "mpich_shm_2_0")
    unrelated = segment(tmp_path, "vggserve_1_00000000")
    with open(mapped, "r+b") as handle, open(unrelated, "r+b") as other:
        maps = [mmap.mmap(handle.fileno(), 0), mmap.mmap(other.fileno(), 0)]
        try:
            assert release_own_mpi_segments(tmp_path) == ["mpich_shm_2_0"]
        finally:
            for mapping in maps:
                mapping.close()
    assert not mapped.exists() and unrelated.exists()


def test_the_decode_ring_has_no_name_in_dev_shm_and_writers_reach_it_by_descriptor():
    """The ring used to be a named POSIX segment (psm_*): a kill -9 of a rank left its 86 MB in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    ring = Ring(2, 4096)
    try:
        assert os.readlink(f"/proc/self/fd/{ring.fd}").startswith("/memfd:")
        assert not {name for name in set(os.listdir("/dev/shm")) - before if str(os.getpid()) in name}
        writer = RegionWriter(ring.writer_spec(1))
        block, array = writer.allocate((100,), np.uint8)
        array[:] = 7
        assert (ring.take(block, (100,), np.uint8) == 7).all()
        writer.close()
    finally:
        ring.close()
    assert ring.fd == -1


def test_named_segments_say_which_process_made_them():
    arena = Arena(4096)
    try:
        assert arena.name.startswith(f"vggserve_{os.getpid()}_")
        assert os.path.exists(f"/dev/shm/{arena.name}")
    finally:
        arena.close()


def test_a_process_under_an_mpi_launcher_is_told_from_one_that_is_not(tmp_path):
    """Whose maps cannot be read may be a rank only under a launcher (ssh-agent and a container's init are not)."""
    launcher = tmp_path / "hydra_pmi_proxy"  # a stand-in: the kernel names a script's process after the script
    launcher.write_text("#!/bin/sh\nsleep 30 &\necho $!\nwait\n")
    launcher.chmod(0o755)
    proxy = subprocess.Popen([str(launcher)], stdout=subprocess.PIPE, text=True)
    rank = int(proxy.stdout.readline())  # its child
    try:
        assert orphans._under_launcher(rank)
        assert not orphans._under_launcher(os.getpid())
    finally:
        os.kill(rank, 9)
        proxy.wait(timeout=30)
