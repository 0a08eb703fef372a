"""The service's threads named for the operating system (`top -H`, /proc/PID/task/TID/comm, py-spy), so that the
CPU of the engine process can be told apart by thread: Python leaves every thread named after the interpreter.

    name_this_thread()      # at the start of a thread's function: its Python name, shortened to what Linux keeps
"""

import threading

PR_SET_NAME = 15
LONGEST = 15  # bytes Linux keeps of a thread's name


def native_name(name: str) -> str:
    """The name the OS gets for a Python thread name: without the "vggserve-" prefix, its last 15 bytes (the end
    tells threads apart: "...link3-reader")."""
    short = name.removeprefix("vggserve-").encode("ascii", "replace")
    return short[-LONGEST:].decode("ascii")


def name_this_thread() -> None:
    """Name the calling thread for the OS after its Python name (Linux; elsewhere nothing happens)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, native_name(threading.current_thread().name).encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass
