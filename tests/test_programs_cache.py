"""The on-disk program cache: a damaged binary is rebuilt, never handed to the driver; a failed write leaves nothing;
where the driver caches programs itself (PoCL), the cache keeps a note of the build, not the binary."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyopencl as cl
import pytest

from vggserve.runtime import devices as devs, programs
from vggserve.runtime.programs import BUILT, MAGIC, ProgramCache, driver_caches_programs

from conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def device():
    return devs.cl_device(devs.resolve(TEST_DEVICE))


def build_in_child(folder: Path, binaries: bool) -> subprocess.CompletedProcess:
    """Build softmax.cl through a ProgramCache on `folder` in a fresh process (a driver that crashes on a bad binary
    takes only that process down); it prints "hits compiles"."""
    code = textwrap.dedent(f"""
        import pyopencl as cl
        from vggserve.runtime import devices as devs
        from vggserve.runtime.programs import ProgramCache
        device = devs.cl_device(devs.resolve({TEST_DEVICE!r}))
        cache = ProgramCache(cl.Context([device]), device, folder={str(folder)!r}, binaries={binaries!r})
        cache.build("softmax.cl", {{}})
        print(cache.hits, cache.compiles)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("binaries", [True, False], ids=["binary", "note"])
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_cached_binary_is_rebuilt_instead_of_crashing_the_process(tmp_path, damage, binaries):
    """PoCL segfaults when it is given a truncated or altered binary of its own format: the cache must notice (and
    a damaged note of a build is not taken for one)."""
    first = build_in_child(tmp_path, binaries)
    assert first.returncode == 0 and first.stdout.split() == ["0", "1"], first.stderr
    (path,) = tmp_path.glob("*.bin")
    data = path.read_bytes()
    assert data.startswith(MAGIC if binaries else BUILT)
    path.write_bytes(data[:len(data) // 2] if damage == "truncated"
                     else data[:-64] + bytes(b ^ 0x55 for b in data[-64:]))
    second = build_in_child(tmp_path, binaries)
    assert second.returncode == 0, f"exit {second.returncode}: {second.stderr[-500:]}"
    assert second.stdout.split() == ["0", "1"]  # compiled again, from source
    third = build_in_child(tmp_path, binaries)
    assert third.returncode == 0 and third.stdout.split() == ["1", "0"], third.stderr  # the rewritten binary serves


@pytest.mark.parametrize("binaries", [True, False], ids=["binary", "note"])
def test_an_intact_cached_binary_is_used(tmp_path, device, binaries):
    ctx = cl.Context([device])
    ProgramCache(ctx, device, folder=tmp_path, binaries=binaries).build("softmax.cl", {})
    again = ProgramCache(ctx, device, folder=tmp_path, binaries=binaries)
    program = again.build("softmax.cl", {})
    assert (again.hits, again.compiles) == (1, 0)
    assert program.kernel_names  # built, from the binary or (a note) from source through the driver's cache


def test_where_the_driver_caches_programs_the_cache_notes_builds_and_asks_for_no_binary(tmp_path, device,
                                                                                       monkeypatch):
    """PoCL compiles every kernel of a program again, for any work-group size, when its binary is asked for: where
    its own cache holds the program, the binary costs a compile and saves none."""
    asked = []
    monkeypatch.setattr(programs, "program_binary", lambda program: asked.append(program) or b"binary")
    cache = ProgramCache(cl.Context([device]), device, folder=tmp_path)
    cache.build("softmax.cl", {})
    (path,) = tmp_path.glob("*.bin")
    pocl = "Portable Computing Language" in device.platform.name
    assert driver_caches_programs(device) == pocl and cache.binaries == (not pocl)
    assert path.read_bytes().startswith(BUILT if pocl else MAGIC)
    assert len(asked) == (0 if pocl else 1)
    if pocl:
        monkeypatch.setenv("POCL_KERNEL_CACHE", "0")  # its cache off: the binary is kept again
        assert not driver_caches_programs(device)
        assert ProgramCache(cl.Context([device]), device, folder=tmp_path / "off").binaries


@pytest.mark.parametrize("binaries", [True, False], ids=["binary", "note"])
def test_a_failed_write_leaves_no_temporary_file(tmp_path, device, monkeypatch, binaries):
    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(programs.os, "replace", fail)
    cache = ProgramCache(cl.Context([device]), device, folder=tmp_path, binaries=binaries)
    cache.build("softmax.cl", {})  # the program is built all the same
    assert cache.compiles == 1
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_folder_only_costs_a_compile(tmp_path, device):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = ProgramCache(cl.Context([device]), device, folder=blocker / "programs")
    cache.build("softmax.cl", {})
    assert cache.compiles == 1


def test_the_binary_is_read_through_the_loader_not_pyopencls_get_info(tmp_path, device, monkeypatch):
    """PoCL makes the machine code when the binary is asked for (minutes for a pruned network's generated programs);
    pyopencl's get_info holds the GIL meanwhile, so the build progress could not tick: the cache asks through
    ctypes, which lets the GIL go, and stores the same bytes."""
    from vggserve.runtime.binaries import program_binary

    program = cl.Program(cl.Context([device]), "__kernel void k(__global float *a) { a[0] = 1.0f; }").build()
    want = program.get_info(cl.program_info.BINARIES)[0]

    def refuse(self, what):
        raise AssertionError("get_info was asked for the binary")

    monkeypatch.setattr(cl.Program, "get_info", refuse)
    assert program_binary(program) == want
    cache = ProgramCache(cl.Context([device]), device, folder=tmp_path, binaries=True)
    cache.build("softmax.cl", {})
    assert len(list(tmp_path.glob("*.bin"))) == 1
