"""Stopping the batch job on a signal: SIGTERM (`kill`, a scheduler's time limit, mpiexec passing its own on) ends
it like Ctrl-C's KeyboardInterrupt, as an exception on the main thread, so that every `finally` runs: the decode
processes are stopped, the output files synced and closed, the shared memory released.

    with stop_signals():
        ...                      # SIGTERM raises Stopped(SIGTERM) on the main thread; SIGINT KeyboardInterrupt
    except STOPS as exc:
        code = stop_exit_code(exc)   # 143 for SIGTERM, 130 for Ctrl-C, as a shell reports a process it killed

Where MPI is loaded, the handler first unlinks the MPICH segments this rank maps (ipc/orphans.py): the job ends
without MPI_Finalize, which is where MPICH would have unlinked them, and the launcher may kill the rank before its
`finally` blocks have run. A second SIGTERM is not caught: it ends the process at once.

The handler must be in place before OpenCL starts (`catch_stop_signals`, which `vggserve batch` calls before its
device discovery): PoCL's LLVM, while it compiles kernels on any thread, puts its own handlers in and later back
the ones it found; a handler installed between those two moments is replaced by the one LLVM found (the default,
which ends the process without a word). Installed first, it is the one LLVM saves and puts back, and LLVM's own
handler, after removing its temporary files, passes the signal on to it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Stopped(BaseException):
    """A stop signal arrived (a BaseException, as KeyboardInterrupt: `except Exception` lets it through)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum = signum


STOPS = (Stopped, KeyboardInterrupt)


def signal_name(signum: int) -> str:
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_signal(exc: BaseException) -> int:
    """The signal behind a Stopped or KeyboardInterrupt."""
    return exc.signum if isinstance(exc, Stopped) else signal.SIGINT


def stop_exit_code(exc: BaseException) -> int:
    return 128 + stop_signal(exc)


def release_mpi_memory() -> None:
    """Unlink the MPICH segments this process maps, where MPI is loaded (a rank that ends without MPI_Finalize)."""
    if "mpi4py.MPI" in sys.modules:
        from ..ipc.orphans import release_own_mpi_segments

        release_own_mpi_segments()


def _on_stop(signum, _frame) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    release_mpi_memory()
    raise Stopped(signum)


def catch_stop_signals() -> bool:
    """From now on SIGTERM raises Stopped on the main thread; False (nothing changed) when called elsewhere than on
    the main thread, or where SIGTERM is ignored (nohup-like launchers mean it)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_IGN, _on_stop):
        return signal.getsignal(signal.SIGTERM) is _on_stop
    signal.signal(signal.SIGTERM, _on_stop)
    return True


@contextlib.contextmanager
def stop_signals():
    """`catch_stop_signals` while the block runs; the handler found before is put back after it (nothing is put
    back where it was ours already: the command line installed it before OpenCL started)."""
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    installed = previous is not _on_stop and catch_stop_signals()
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
