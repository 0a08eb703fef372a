"""`vggserve batch` in which one rank's model raises on its first chunk (the rank is argv[1]).

    mpiexec -n 3 python batch_with_failing_rank.py 1 --weights W --input DIR --output OUT --device cpu

Used by tests/test_batch_mpi.py to check that an exception on one rank aborts the whole job promptly.
"""

import sys

from mpi4py import MPI

from vggserve.cli import main
from vggserve.distributed.pipeline import ChunkRunner


def _fail(self):
    raise RuntimeError(f"injected failure on rank {MPI.COMM_WORLD.Get_rank()}")


if __name__ == "__main__":
    failing_rank = int(sys.argv[1])
    if MPI.COMM_WORLD.Get_rank() == failing_rank:
        ChunkRunner.run_next = _fail
    sys.exit(main(["batch", *sys.argv[2:]]))
