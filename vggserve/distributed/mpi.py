"""MPI plumbing shared by the batch job and batch sharding.

- `world()`: MPI.COMM_WORLD (a one-rank world when the program was not started by mpirun/mpiexec).
- `node_layout(comm)`: (local_rank, local_size), this rank's index among the ranks of its node.
- `several_ranks()`: whether a launcher started several ranks, from its environment alone.
- `wait(request)`, `wait_for_message(...)`, `barrier(comm)`, `sleep_until(done)`: waits that sleep between
  polls. MPI's blocking calls spin a core while they wait; ranks that share cores (several ranks per node,
  oversubscribed CI machines, decode threads) would lose that core to a rank that is only waiting.
- `Outbox(comm)`: non-blocking sends, so that a large message does not stall its sender.
- `helper_threads_allowed()`: whether the MPI thread level lets this thread make MPI calls while helper threads
  (which make none) run beside it.
- `abort_all(comm, who, exc)`: print the failing rank's message on stderr, then MPI_Abort every rank.

mpi4py is imported inside the functions: importing this module does not start MPI.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from ..errors import VggserveError, describe

# launcher variables holding the node-local rank: Open MPI, MPICH (Hydra), Slurm's srun
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")

# launcher variables holding the number of ranks: MPICH (Hydra), Open MPI, PMIx, Intel MPI, Slurm
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")

_FIRST_SLEEP = 0.0002
_LONGEST_SLEEP = 0.005  # the latency a sleeping wait adds at most
ABORT_GRACE_S = 0.5  # between the error line and MPI_Abort (abort_all)


def several_ranks() -> bool:
    """Whether a launcher started this process as one of several ranks, read from its variables (before MPI
    is initialised, and without it)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 1:
            return True
    return False


def world():
    """MPI.COMM_WORLD; importing mpi4py initialises MPI (as one rank when no launcher started us)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def node_layout(comm) -> tuple[int, int]:
    """(local_rank, local_size) of this rank on its node. Collective over `comm`.

    The launcher's variable is used when it gives distinct ranks on the node (an inherited SLURM_LOCALID, for
    example when mpiexec runs inside one srun task, does not); otherwise the rank's index in the node's
    shared-memory communicator (MPI_COMM_TYPE_SHARED).
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        fallback, local_size = node.Get_rank(), node.Get_size()
        from_env = _local_rank_from_environment()
        claimed = node.allgather(from_env)
    finally:
        node.Free()
    if from_env is not None and None not in claimed and sorted(claimed) == list(range(local_size)):
        return from_env, local_size
    return fallback, local_size


def _local_rank_from_environment() -> int | None:
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def sleep_until(done) -> None:
    """Return once `done()` is true, polling it with sleeps growing from 0.2 ms to 5 ms."""
    delay = _FIRST_SLEEP
    while not done():
        time.sleep(delay)
        delay = min(delay * 2, _LONGEST_SLEEP)


def wait(request) -> None:
    """Complete an MPI request (Isend, Ibcast, Ibarrier, ...), sleeping between tests."""
    sleep_until(request.Test)


def wait_for_message(comm, source: int, tag: int, status=None) -> None:
    """Return once a message from `source` (may be MPI.ANY_SOURCE) with `tag` can be received."""
    sleep_until(lambda: comm.Iprobe(source=source, tag=tag, status=status))


class Outbox:
    """Non-blocking sends: a large message (a report with many top-k lines) must not stall its sender until
    the receiver gets round to it."""

    def __init__(self, comm):
        self.comm = comm
        self._requests: list = []

    def send(self, message, dest: int, tag: int) -> None:
        self._requests = [request for request in self._requests if not request.Test()]
        self._requests.append(self.comm.isend(message, dest=dest, tag=tag))

    def flush(self) -> None:
        """Wait until every message has been delivered."""
        for request in self._requests:
            wait(request)
        self._requests.clear()


def helper_threads_allowed() -> bool:
    """True when this thread may go on making MPI calls while helper threads that make none run beside it:
    MPI was initialised at MPI_THREAD_SERIALIZED or above, or at MPI_THREAD_FUNNELED on the main thread.

    mpi4py asks for MPI_THREAD_MULTIPLE unless told otherwise (mpi4py.rc.thread_level, or the environment
    variable MPI4PY_RC_THREAD_LEVEL); MPICH grants it, Open MPI supports it (robustly since 3.0). At
    MPI_THREAD_SINGLE the process should not run other threads at all.
    """
    from mpi4py import MPI

    level = MPI.Query_thread()
    return level >= MPI.THREAD_SERIALIZED or (level == MPI.THREAD_FUNNELED and MPI.Is_thread_main())


def barrier(comm) -> None:
    """A barrier that sleeps while it waits for the slower ranks."""
    wait(comm.Ibarrier())


def abort_all(comm, who: str, exc: BaseException, program: str = "vggserve") -> None:
    """Print why `who` (e.g. "rank 1 (gpu:1)") failed, then abort every rank of `comm` with exit status 1.

    Unexpected exceptions get their traceback first; our own errors are one line. Does not return.
    """
    if not isinstance(exc, (VggserveError, KeyboardInterrupt)):
        traceback.print_exception(exc, file=sys.stderr)
    print(f"{program}: error: {who}: {describe(exc)} (aborting all ranks)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # the launcher forwards a rank's output through its own pipes, and an abort kills every rank at once: without
    # a moment's grace the error line can be lost on the way (seen about 1 run in 15 with MPICH's hydra)
    time.sleep(ABORT_GRACE_S)
    comm.Abort(1)
