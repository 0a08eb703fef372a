"""Running the app under uvicorn, with graceful drain on SIGTERM."""

import logging
import sys

from .app import create_app
from .hosting import (CANNOT_LISTEN_EXIT, NO_WORKERS_EXIT, CannotListen, announce_when_ready, configure_logging,
                      listening_socket, uvicorn_config)
from .web.drain import DrainingServer
from .service import ModelFactory
from .settings import Settings

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def build_server(settings: Settings, model_factory: ModelFactory | None = None, log_level: str = "info",
                 access_log: bool = False) -> DrainingServer:
    """A uvicorn server for `create_app(settings, model_factory)`, to run on sockets the caller bound."""
    app = create_app(settings, model_factory)
    server = DrainingServer(uvicorn_config(app, log_level, access_log), app.state.service.drain)
    server.service = app.state.service
    app.state.service.on_all_workers_dead = server.fail  # exit (status 3) rather than serve 503s forever
    return server


def run_server(settings: Settings, model_factory: ModelFactory | None = None, log_level: str = "info",
               access_log: bool = False, banner: str = "") -> int:
    """Serve until SIGTERM/SIGINT (drained) and return the exit status: 0 after a clean drain, CANNOT_LISTEN_EXIT
    when the address cannot be bound (nothing else is started then). "vggserve: serving on URL BANNER" goes to
    stderr once the port is bound and every device worker is ready. With settings.http_workers above 1, this
    process runs the device workers and HTTP front-end processes serve."""
    configure_logging(log_level)
    if settings.host not in LOOPBACK and not settings.api_key:
        logging.getLogger("vggserve.serving").warning(
            "listening on %s without an API key: anyone who can reach it can use it (set VGGSERVE_API_KEY, or "
            "bind 127.0.0.1 behind nginx)", settings.host)
    if settings.http_workers > 1:
        from .processes.frontends import run_with_frontends

        return run_with_frontends(settings, model_factory, log_level, access_log, banner)
    try:
        sock = listening_socket(settings.host, settings.port)
    except CannotListen as exc:
        print(f"vggserve: error: {exc.strerror}", file=sys.stderr)
        return CANNOT_LISTEN_EXIT
    server = build_server(settings, model_factory, log_level, access_log)
    announce_when_ready(server.service, sock, settings.host, banner)
    server.run(sockets=[sock])
    if server.failure:
        print(f"vggserve: error: no device worker is alive ({server.failure})", file=sys.stderr)
        return NO_WORKERS_EXIT
    return 0 if server.started else 1
