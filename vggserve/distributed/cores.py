"""How many cores a rank may count as its own, and what the batch job sizes from them.

    cores = rank_cores(comm)                     # collective over the ranks of every node
    share = HostShare(cores, host_cores=16, local_ranks=4)
    share.decode_procs, share.decode_threads, share.copy_threads   # the job's defaults for this rank
    share.choose("auto", 2)                      # what the rank uses: defaults, or the numbers the user gave

A rank may run on the cores of its CPU affinity: the cores a launcher bound it to (`mpirun --bind-to core`), or
the cgroup cpuset of a Slurm allocation (`srun --cpu-bind=none`: every task of the node may run on every core of
the allocation), or the whole machine. Each of those cores is shared by the ranks of the node that may run on it
too, so a core counts 1/n for each of n such ranks: four ranks in a 16-core cpuset count 4 cores each, and four
ranks bound to 4 cores apiece count their own 4. Counting the os.cpu_count() of the machine, or the whole cpuset
for every rank, gave each rank several times more decode processes than there are cores.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

COPY_THREADS = 4  # the most threads a rank copies into its engine's staging memory with (runtime/hostcopy.py)


def allowed_cpus() -> set[int]:
    """The cores this process may run on (its affinity, which a cgroup cpuset limits as well)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def cpu_share(mine: set[int], everyone: list) -> float:
    """This rank's share of its cores: each core of `mine` divided by the number of sets in `everyone` (the affinity
    of every rank of the node, this one's included) that contain it."""
    counts = Counter(cpu for cpus in everyone for cpu in set(cpus))
    return sum(1.0 / max(1, counts[cpu]) for cpu in mine)


def rank_cores(comm) -> float:
    """This rank's share of the cores it may run on (see the module docstring). Collective over `comm`; a one-rank
    world asks no MPI."""
    mine = allowed_cpus()
    if comm.Get_size() == 1:
        return float(len(mine))
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        everyone = node.allgather(sorted(mine))
    finally:
        node.Free()
    return cpu_share(mine, everyone)


@dataclass(frozen=True)
class HostShare:
    """A rank's share of its host: `cores` (rank_cores: the cores of its affinity, each divided among the ranks of
    the host that may run on it; cores on the host / ranks on the host when every rank may run everywhere),
    `host_cores` (the cores of its affinity) and `local_ranks` (ranks on the host, MPI's local count).
    Each of the rank's host-side workers is sized from `cores`, so that the ranks of a host together start about
    as many busy threads and processes as it has cores."""

    cores: float
    host_cores: int
    local_ranks: int

    @property
    def whole_cores(self) -> int:
        """`cores` as a whole number, at least 1 (a sum of 1/n shares may fall just short of a whole core)."""
        return max(1, int(round(self.cores, 6)))

    @property
    def decode_procs(self) -> int:
        """Decode processes (`--decode-procs auto`): one per core of the share, less one for the rank; at least 1."""
        return max(1, self.whole_cores - 1)

    @property
    def decode_threads(self) -> int:
        """Decode threads with `--decode-procs 0` (`--decode-threads auto`): as many as decode processes would be."""
        return self.decode_procs

    @property
    def copy_threads(self) -> int:
        """Threads copying a batch into the engine's staging memory: one per core of the share, 1..COPY_THREADS."""
        return min(COPY_THREADS, self.whole_cores)

    def choose(self, decode_procs: int | str, decode_threads: int | str) -> dict:
        """What the rank uses: "auto" for either setting takes this share's default, a number is kept. The dict is
        the job summary's `host_share` for the rank."""
        procs = self.decode_procs if decode_procs == "auto" else int(decode_procs)
        threads = self.decode_threads if decode_threads == "auto" else int(decode_threads)
        return {"cores": round(self.cores, 3), "host_cores": self.host_cores, "local_ranks": self.local_ranks,
                "decode_processes": procs, "decode_threads": 0 if procs else threads,
                "copy_threads": self.copy_threads}


def describe_share(chosen: dict) -> str:
    """"4 of 16 cores (4 ranks on the host): 3 decode processes, 4 copy threads" from HostShare.choose's dict."""
    from ..wording import count

    cores = chosen["cores"]
    cores_text = f"{cores:g}" if cores == int(cores) else f"{cores:.2f}"
    decoders = (count(chosen["decode_processes"], "decode process", "decode processes") if chosen["decode_processes"]
                else count(chosen["decode_threads"], "decode thread"))
    return (f"{cores_text} of {count(chosen['host_cores'], 'core')} ({count(chosen['local_ranks'], 'rank')} on the "
            f"host): {decoders}, {count(chosen['copy_threads'], 'copy thread')}")
