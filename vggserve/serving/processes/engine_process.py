"""An engine process of its own (`--engine-processes per-device`): the device worker of one device, its queue and
an EngineHost on its own Unix socket, which every front end links to. Engine 0 runs in the supervising process
(`frontends`); engines 1.. run here, each a fresh interpreter started by `engines.EngineGroup`.

Its EngineSpec comes on standard input (length, then the pickle), and the pipe stays open: its end (the supervisor
closed it, or died) stops the engine, as SIGTERM does. SIGINT is left to the supervisor, which stops the engines
after the front ends have drained. A device that dies leaves the process running, its state "not ready" for the
front ends and the supervisor, until it is stopped.
"""

import logging
import os
import pickle
import signal
import sys
import threading
from dataclasses import dataclass

from ..hosting import configure_logging
from ..service import Service
from ..settings import Settings
from .engine_host import EngineHost

log = logging.getLogger("vggserve.serving")

LENGTH_BYTES = 8


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process is told at start."""

    settings: Settings  # the engine's own: one device
    address: str  # its Unix socket
    authkey: bytes
    index: int
    factory: bytes | None = None  # the model factory, pickled (`portable`); None: load settings.weights
    log_level: str = "info"


def portable(factory) -> bytes:
    """`factory` pickled for an engine process; ValueError naming the fix when it cannot travel (a lambda, a
    closure, or anything defined in the script that was run, which a fresh interpreter does not have)."""
    try:
        data = pickle.dumps(factory)
    except Exception as exc:  # noqa: BLE001 - pickling fails in many ways (PicklingError, AttributeError, TypeError)
        raise ValueError(f"the model factory {factory!r} cannot be pickled ({exc})") from None
    if b"__main__" in data:
        raise ValueError(f"the model factory {factory!r} is defined in the script that runs the server, which an "
                         "engine process cannot import")
    return data


def framed(spec: EngineSpec) -> bytes:
    """The spec as the engine process reads it from standard input."""
    data = pickle.dumps(spec)
    return len(data).to_bytes(LENGTH_BYTES, "big") + data


def _read(fd: int, size: int) -> bytes:
    """`size` bytes of `fd` (fewer at its end). Unbuffered: a thread still reading a buffered stdin at exit makes
    the interpreter abort."""
    chunks = []
    while size > 0 and (chunk := os.read(fd, min(size, 1 << 20))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_spec(fd: int) -> EngineSpec:
    return pickle.loads(_read(fd, int.from_bytes(_read(fd, LENGTH_BYTES), "big")))


def _until_closed(fd: int, stop: threading.Event) -> None:
    while os.read(fd, 4096):
        pass
    stop.set()


def serve(spec: EngineSpec, fd: int) -> int:
    """Serve the front ends until SIGTERM or the end of `fd` (the supervisor's pipe); 0."""
    configure_logging(spec.log_level)
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda sig, frame: stop.set())
    threading.Thread(target=_until_closed, args=(fd, stop), name="vggserve-engine-parent", daemon=True).start()
    factory = pickle.loads(spec.factory) if spec.factory else None
    service = Service(spec.settings, factory, multiprocess=True)
    host = EngineHost(service, spec.address, spec.authkey)
    host.start()
    service.start()
    log.info("engine %d (device %s) started, pid %d", spec.index, ", ".join(spec.settings.devices), os.getpid())
    try:
        while not stop.wait(0.5):  # woken for SIGTERM at least every half second
            pass
    finally:
        host.close()
        service.stop(spec.settings.drain_timeout_s)
    return 0


def main() -> int:
    fd = sys.stdin.fileno()
    return serve(read_spec(fd), fd)


if __name__ == "__main__":
    sys.exit(main())
