#!/usr/bin/env python3
"""HEALTHCHECK of the image built from deploy/Dockerfile: exit 0 when the service answers 200 on /health/ready.

It asks the address the service was started with, read from the container's first process (the entrypoint execs
`vggserve serve`, so that is the service; under `docker run --init` it is the init, whose arguments are the
entrypoint's): the last --port there, as `vggserve serve` takes it (the entrypoint puts `--port $VGGSERVE_PORT`
first, so a --port given to `docker run` wins), else $VGGSERVE_PORT, else 8000; --host likewise, an address for
all interfaces meaning 127.0.0.1.

    vggserve-healthcheck [CMDLINE_FILE]     (default /proc/1/cmdline)
"""

import os
import sys
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def option(argv: list[str], name: str) -> str | None:
    """The value of the last `name VALUE` or `name=VALUE` in argv, as argparse keeps it."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def ready_url(argv: list[str], environ) -> str:
    port = option(argv, "--port") or environ.get("VGGSERVE_PORT") or "8000"
    host = option(argv, "--host") or ""
    host = "127.0.0.1" if host in WILDCARDS else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/health/ready"


def main(args: list[str]) -> int:
    try:
        with open(args[0] if args else "/proc/1/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    url = ready_url(argv, os.environ)
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:  # not ready (503), not listening, too slow: all unhealthy, said in one line
        print(f"vggserve-healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
