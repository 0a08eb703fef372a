"""What every server process of the service shares: the uvicorn configuration, logging, and the exit statuses.

Imported by the one-process server (`server`), the engine process (`processes.frontends`) and each HTTP front-end
process (`processes.frontend`), so that none of them imports another.
"""

import logging

import uvicorn

# after the drain, how long uvicorn waits for idle connections to close before it stops
CLOSE_CONNECTIONS_S = 5
NO_WORKERS_EXIT = 3  # every device worker died (as DeviceError): a supervisor should restart the service
FRONTENDS_FAILED_EXIT = 4  # the HTTP front-end processes kept dying


def uvicorn_config(app, log_level: str, access_log: bool, **where) -> uvicorn.Config:
    """uvicorn's configuration for our app; `where` is host and port (or nothing, to serve given sockets)."""
    return uvicorn.Config(app, log_level=log_level, access_log=access_log,
                          timeout_graceful_shutdown=CLOSE_CONNECTIONS_S, lifespan="on", server_header=False, **where)


def configure_logging(log_level: str) -> None:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
