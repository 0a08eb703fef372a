"""MPI plumbing shared by the batch job and batch sharding.

- `world()`: MPI.COMM_WORLD when a launcher (mpirun, mpiexec, srun) started this process; otherwise
  `SingleProcess()`, a one-rank stand-in, and MPI is never loaded. So a plain install with no MPI library runs
  the batch job as one process, and a launcher with no loadable MPI gets one line saying so (`MpiUnavailable`).
- `mpi_world()`: MPI.COMM_WORLD in any case (MPI initialised as one rank without a launcher); for code that
  needs more of MPI than the stand-in offers (batch sharding's Scatterv/Gatherv).
- `node_layout(comm)`: (local_rank, local_size), this rank's index among the ranks of its node.
- `launched()`, `several_ranks()`: whether a launcher started this process, or several ranks, read from its
  environment alone.
- `wait(request)`, `wait_for_message(...)`, `barrier(comm)`, `sleep_until(done)`: waits that sleep between
  polls. MPI's blocking calls spin a core while they wait; ranks that share cores (several ranks per node,
  oversubscribed CI machines, decode threads) would lose that core to a rank that is only waiting.
- `Outbox(comm)`: non-blocking sends, so that a large message does not stall its sender.
- `helper_threads_allowed()`: whether the MPI thread level lets this thread make MPI calls while helper threads
  (which make none) run beside it.
- `abort_all(comm, who, exc)`: print the failing rank's message on stderr, then MPI_Abort every rank;
  `end_all(comm, code)`: MPI_Abort without a message. Both first unlink the MPICH shared memory this rank maps
  (MPI_Finalize, which would have, is never reached).

mpi4py is imported inside the functions: importing this module does not start MPI.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from ..errors import VggserveError, describe


class MpiUnavailable(VggserveError):
    """A launcher started this process, but no MPI library can be loaded."""


# launcher variables holding the node-local rank: Open MPI, MPICH (Hydra), Slurm's srun
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")

# launcher variables holding the number of ranks: MPICH (Hydra), Open MPI, PMIx, Intel MPI, Slurm
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")

# variables a launcher sets in every process it starts, even one alone: MPICH's Hydra and Intel MPI (PMI_*,
# MPI_LOCAL*), PMI-2/PMIx under srun, Open MPI, MVAPICH2, HPE Cray PALS and ALPS
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "MPI_LOCALRANKID", "PMIX_RANK", "PMIX_NAMESPACE",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "PALS_RANKID",
                      "ALPS_APP_PE")
FORCE_VARIABLE = "VGGSERVE_MPI"  # "1": load MPI even where no launcher variable says so (a launcher unknown here)

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


def launcher_variable() -> str | None:
    """`NAME=value` of the first variable showing that a launcher started this process (or VGGSERVE_MPI=1)."""
    if os.environ.get(FORCE_VARIABLE, "").strip() == "1":
        return f"{FORCE_VARIABLE}=1"
    for name in LAUNCHER_VARIABLES:
        if name in os.environ:
            return f"{name}={os.environ[name]}"
    for name in SIZE_VARIABLES:  # SLURM_NTASKS and the like: only where they count several ranks
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 1:
            return f"{name}={value}"
    return None


def launched() -> bool:
    """Whether an MPI launcher started this process (as one rank or several), from its environment alone."""
    return launcher_variable() is not None


def world():
    """MPI.COMM_WORLD when a launcher started this process, else a `SingleProcess` (MPI is not loaded)."""
    return mpi_world() if launched() else SingleProcess()


def mpi_world():
    """MPI.COMM_WORLD; importing mpi4py initialises MPI (as one rank when no launcher started us). Raises
    MpiUnavailable, one line, when no MPI library can be loaded."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # mpi4py missing, or its dlopen of libmpi failed
        reason = _load_failure(exc)
        started = launcher_variable()
        raise MpiUnavailable(
            f"{'started by an MPI launcher (' + started + ')' if started else 'MPI was asked for'}, but MPI cannot "
            f"be loaded ({reason}); install an MPI that matches the launcher (pip install 'vggserve[mpich]' and "
            f"its mpiexec, or the system's Open MPI/MPICH library), or run the command without mpirun, as one "
            f"process") from None
    return MPI.COMM_WORLD


def _load_failure(exc: BaseException) -> str:
    """mpi4py's failure in one line: 'cannot load MPI library' and then one line per place it tried, as
    '<place>: <dlerror>', become 'cannot load MPI library; tried <place>, <place>, ...'."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    tried = [line.split(":", 1)[0] for line in lines[1:]]
    return lines[0] + (f"; tried {', '.join(tried)}" if tried else "")


class _Done:
    """A request that is already complete."""

    def Test(self) -> bool:
        return True

    def Wait(self) -> None:
        pass


class SingleProcess:
    """The world of a process that no launcher started: one rank, answered without MPI. It has what the batch job
    asks of a communicator (ranks, bcast, allgather, Ibarrier, Iprobe, Abort); with one rank nothing is sent."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def bcast(self, obj, root: int = 0):
        return obj

    def allgather(self, obj) -> list:
        return [obj]

    def Ibarrier(self) -> _Done:
        return _Done()

    def Iprobe(self, source=None, tag=None, status=None) -> bool:
        return False

    def Abort(self, errorcode: int = 1) -> None:
        os._exit(errorcode)


def node_layout(comm) -> tuple[int, int]:
    """(local_rank, local_size) of this rank on its node. Collective over `comm`.

    The launcher's variable is used when it gives distinct ranks on the node (an inherited SLURM_LOCALID, for
    example when mpiexec runs inside one srun task, does not); otherwise the rank's index in the node's
    shared-memory communicator (MPI_COMM_TYPE_SHARED). A one-rank world is (0, 1) without asking MPI.
    """
    if comm.Get_size() == 1:
        return 0, 1
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        fallback, local_size = node.Get_rank(), node.Get_size()
        from_env = local_rank_from_environment()
        claimed = node.allgather(from_env)
    finally:
        node.Free()
    if from_env is not None and None not in claimed and sorted(claimed) == list(range(local_size)):
        return from_env, local_size
    return fallback, local_size


def local_rank_from_environment() -> int | None:
    """This rank's index on its node from the launcher's variables; None where none is set."""
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def sleep_until(done, wake=None) -> None:
    """Return once `done()` is true, polling it with sleeps growing from 0.2 ms to 5 ms. `wake`: a threading.Event
    that cuts a sleep short (set by a thread of this process when it makes `done()` true: no wait for the poll)."""
    delay = _FIRST_SLEEP
    while not done():
        if wake is None:
            time.sleep(delay)
        else:
            wake.wait(delay)
            wake.clear()
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
        self.progress()
        self._requests.append(self.comm.isend(message, dest=dest, tag=tag))

    def progress(self) -> bool:
        """Let MPI move the messages sent (a large one moves only while its sender calls into MPI); True while
        some are not yet delivered."""
        self._requests = [request for request in self._requests if not request.Test()]
        return bool(self._requests)

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
    MPI_THREAD_SINGLE the process should not run other threads at all. Where MPI was not loaded (a
    SingleProcess world) no thread level applies.
    """
    if "mpi4py.MPI" not in sys.modules:
        return True
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
    end_all(comm, 1)


def end_all(comm, code: int) -> None:
    """MPI_Abort every rank of `comm` with exit status `code`, after unlinking the MPICH shared memory this rank
    maps and a moment's grace for the output already printed. Does not return: a further Ctrl-C or SIGTERM (the
    launcher passes them on) is ignored meanwhile."""
    from ..ipc.orphans import release_own_mpi_segments

    _ignore_stop_signals()
    release_own_mpi_segments()
    sys.stdout.flush()
    sys.stderr.flush()
    # the launcher forwards a rank's output through its own pipes, and an abort kills every rank at once: without
    # a moment's grace the last lines can be lost on the way (seen about 1 run in 15 with MPICH's hydra)
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)
    os._exit(code)  # MPI_Abort does not return; should it, this process ends all the same


def _ignore_stop_signals() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
