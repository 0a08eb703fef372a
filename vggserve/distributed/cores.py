"""How many cores a rank may count as its own, for sizing its decode processes (`--decode-procs auto`).

    cores = rank_cores(comm)      # collective over the ranks of every node

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
