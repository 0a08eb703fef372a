"""What every server process of the service shares: the uvicorn configuration, logging, and the exit statuses.

Imported by the one-process server (`server`), the engine process (`processes.frontends`) and each HTTP front-end
process (`processes.frontend`), so that none of them imports another.
"""

import errno
import logging
import socket
import sys

import uvicorn

from .web.connection import protocol_class

# after the drain, how long uvicorn waits for idle connections to close before it stops
CLOSE_CONNECTIONS_S = 5
NO_WORKERS_EXIT = 3  # every device worker died (as DeviceError): a supervisor should restart the service
FRONTENDS_FAILED_EXIT = 4  # the HTTP front-end processes kept dying
CANNOT_LISTEN_EXIT = 6  # the address is in use (or not ours to bind): nothing was started
BACKLOG = 2048


class CannotListen(OSError):
    """Binding the service's address failed; the message is the one line to show."""


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to host:port and listening; CannotListen with a one-line reason if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the address is already in use (another server on that port?); pass another --port, or --port 0"
        else:
            why = f"{exc.strerror or exc}; pass another --host or --port"
        raise CannotListen(exc.errno, f"cannot listen on {host}:{port}: {why}") from None
    return sock


def announce_when_ready(service, sock: socket.socket, host: str, banner: str) -> None:
    """Print "serving on URL BANNER" to stderr once: when the socket is bound and every device worker is ready."""
    service.when_ready(announcement(sock, host, banner))


def announcement(sock: socket.socket, host: str, banner: str):
    """A function printing "vggserve: serving on URL BANNER" to stderr."""
    port = sock.getsockname()[1]
    return lambda: print(f"vggserve: serving on http://{host}:{port} {banner}".rstrip(), file=sys.stderr, flush=True)


def uvicorn_config(app, log_level: str, access_log: bool, **where) -> uvicorn.Config:
    """uvicorn's configuration for our app (from `create_app`: its service's settings and metrics apply to the
    connections too); `where` is host and port (or nothing, to serve given sockets)."""
    service = app.state.service
    return uvicorn.Config(app, log_level=log_level, access_log=access_log,
                          http=protocol_class(service.settings.read_timeout_s, service.metrics),
                          timeout_graceful_shutdown=CLOSE_CONNECTIONS_S, lifespan="on", server_header=False, **where)


def configure_logging(log_level: str) -> None:
    """Log lines carry the id of the request they were written for (X-Request-ID), "-" outside requests."""
    from .web import request_id  # noqa: F401 - installs the record factory that sets %(request_id)s

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s")
