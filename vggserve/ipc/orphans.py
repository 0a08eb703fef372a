"""Shared-memory segments in /dev/shm that a killed process left behind, found and released.

    released = release_orphans()          # [Released(name, nbytes, owner)], each one unlinked
    print(describe_released(released))    # "released 2 shared-memory segments (88.1 MB) left by ..."
    release_own_mpi_segments()            # on the way out of an aborted MPI job: MPICH's segments this process maps

A process killed with SIGKILL cannot unlink what it made, and nothing else does: a kill-and-rerun of an MPI batch
job left 86 MB per rank each time. Two kinds are recognised, and a segment of a live process is never touched:

- ours (shm.create_segment): `vggserve_<pid>_<hex>`. An orphan when no process `pid` runs (or it is a zombie).
  Where another process has taken the number meanwhile, the segment stays until that one ends: it is never
  guessed from clocks whether the process that runs is the one that made it.
- MPICH's (`mpich_shm_<world>_<node>`, `mpich_vci_...`): the name says nothing of its owner. MPICH unlinks them in
  MPI_Finalize, which a killed or aborted rank never reaches. An orphan when no process maps it or holds it open
  (/proc/<pid>/maps and /proc/<pid>/fd of every process). Only segments of this user are looked at. A process of
  this user whose maps cannot be read (it is not dumpable: ssh-agent, a container's init) could be a rank only if
  it runs under an MPI launcher (hydra_pmi_proxy, mpirun, srun, ...: its ancestors, from the readable
  /proc/<pid>/stat); where one does, no MPICH segment is released at all.

Python's own `psm_*` names (SharedMemory's default, and older vggserve versions') are left alone: any Python
program may make one and keep it, unmapped, on purpose.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .shm import SEGMENT_PREFIX

SHM_FOLDER = Path("/dev/shm")
PROC = Path("/proc")
MPI_PREFIXES = ("mpich_shm_", "mpich_vci_")
# process names (/proc/<pid>/comm, 15 characters at most) of MPI launchers and process managers: their descendants
# may be MPI ranks
LAUNCHERS = frozenset({"hydra_pmi_proxy", "mpiexec", "mpiexec.hydra", "mpirun", "orted", "prted", "prterun", "srun",
                       "slurmstepd"})
_OURS = re.compile(re.escape(SEGMENT_PREFIX) + r"(\d+)_[0-9a-f]+")


@dataclass(frozen=True)
class Released:
    name: str
    nbytes: int
    owner: str  # "pid 1234" or "MPICH"


def release_orphans(folder: Path = SHM_FOLDER) -> list[Released]:
    """Unlink every orphaned segment of ours or MPICH's in `folder`; what was released (nothing where `folder`
    does not exist: not Linux)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return []
    released = []
    users = None  # paths that live processes hold, read once and only when an MPI segment is found
    for entry in entries:
        try:
            stat = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.st_uid != os.getuid():
            continue
        ours = _OURS.fullmatch(entry.name)
        if ours:
            pid = int(ours.group(1))
            if _running(pid):
                continue
            owner = f"pid {pid}"
        elif entry.name.startswith(MPI_PREFIXES):
            if users is None:
                users = _held_paths(folder)
            if users is _UNKNOWN or entry.path in users:
                continue
            owner = "MPICH"
        else:
            continue
        if _unlink(entry.path):
            released.append(Released(entry.name, stat.st_size, owner))
    return released


def describe_released(released: list[Released], folder: Path = SHM_FOLDER, shown: int = 4) -> str:
    """One line: how many segments, how much memory, and their names (the first `shown`)."""
    total = sum(item.nbytes for item in released)
    names = ", ".join(item.name for item in released[:shown])
    more = f" and {len(released) - shown} more" if len(released) > shown else ""
    plural = "s" if len(released) != 1 else ""
    return (f"released {len(released)} shared-memory segment{plural} ({total / 1e6:.1f} MB) that killed runs left "
            f"in {folder}: {names}{more}")


def release_own_mpi_segments(folder: Path = SHM_FOLDER) -> list[str]:
    """Unlink the MPICH segments this process maps, for a rank that is about to end without MPI_Finalize (an abort,
    a stop signal): every rank of the job ends with it, and the memory goes when the last one unmaps it. Returns
    the names."""
    names = []
    for path in sorted(_mapped_paths(PROC / "self", folder)):
        name = os.path.basename(path)
        if name.startswith(MPI_PREFIXES) and _unlink(path):
            names.append(name)
    return names


# ---- processes --------------------------------------------------------------------------------------------------
_UNKNOWN = frozenset({"<some process could not be inspected>"})


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (one whose parent has not collected it: its memory is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _held_paths(folder: Path) -> frozenset[str]:
    """Paths under `folder` that any process maps or holds open; _UNKNOWN when a process of this user that could be
    an MPI rank could not be inspected (it might hold any of them)."""
    held: set[str] = set()
    me = os.getuid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            held |= _mapped_paths(entry, folder, strict=True)
            held |= _open_paths(entry, folder)
        except FileNotFoundError:
            continue  # it ended meanwhile
        except PermissionError:
            try:
                mine = entry.stat().st_uid == me
            except OSError:
                continue
            if mine and _under_launcher(int(entry.name)):
                return _UNKNOWN
    return frozenset(held)


def _under_launcher(pid: int) -> bool:
    """Whether an ancestor of process `pid` is an MPI launcher or process manager (LAUNCHERS)."""
    for _ in range(64):
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            return False
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent <= 1:
            return False
        try:
            if (PROC / str(parent) / "comm").read_text().strip() in LAUNCHERS:
                return True
        except OSError:
            return False
        pid = parent
    return False


def _mapped_paths(process: Path, folder: Path, strict: bool = False) -> set[str]:
    """Files under `folder` in `process`'s memory map."""
    prefix = str(folder).rstrip("/") + "/"
    try:
        lines = (process / "maps").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        if strict:
            raise
        return set()
    except OSError:
        return set()
    paths = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith(prefix):
            paths.add(parts[5].removesuffix(" (deleted)"))
    return paths


def _open_paths(process: Path, folder: Path) -> set[str]:
    """Files under `folder` that `process` holds open (a segment made and not yet mapped)."""
    prefix = str(folder).rstrip("/") + "/"
    paths = set()
    for fd in os.scandir(process / "fd"):
        try:
            target = os.readlink(fd.path)
        except OSError:
            continue
        if target.startswith(prefix):
            paths.add(target.removesuffix(" (deleted)"))
    return paths


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:  # another rank of this machine released it first
        return False
    except OSError:
        return False
    return True
