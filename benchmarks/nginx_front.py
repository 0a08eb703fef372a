"""nginx in front of `vggserve serve` instances on this host, as deploy/nginx-upstream.conf sets it up, for benchmarks.

    with nginx_in_front([8000, 8001], workdir) as url:      # http://127.0.0.1:<free port>
        ...

deploy/nginx-upstream.conf is used as it is, with only the addresses changed: the public server block listens on
127.0.0.1, the upstream lists the given ports on 127.0.0.1, the inner block's socket lies in `workdir`. nginx runs
in the foreground with a prefix in `workdir` (pid, logs, temp files there: no root needed), after `nginx -t`. Its
main config is what the file asks of nginx.conf (worker_rlimit_nofile, events { worker_connections }: nginx's
defaults reset connections past about 128 requests in flight per worker) with `worker_processes auto`, as the
distributions' nginx.conf; its error log keeps `warn` lines (where nginx says it ran out of connections).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from vggserve.testing.servers import free_port, wait_listening

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "deploy" / "nginx-upstream.conf"
SERVER_LINES = re.compile(r"(\n    server 127\.0\.0\.1:\d+ (max_fails=\d+ fail_timeout=\w+);)+")
MAIN_LINES = re.compile(r"^#\s+(worker_rlimit_nofile \d+;|events \{ worker_connections \d+; \})\s*$", re.M)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def upstream_config(port: int, instances: list[int], socket_path: Path, text: str | None = None) -> str:
    """deploy/nginx-upstream.conf (or `text`) listening on 127.0.0.1:`port`, in front of 127.0.0.1:`instances`."""
    text = CONFIG.read_text() if text is None else text
    found = SERVER_LINES.search(text)
    if found is None:
        raise ValueError(f"{CONFIG}: no `server 127.0.0.1:PORT max_fails=N fail_timeout=T;` lines in its upstream")
    listed = "".join(f"\n    server 127.0.0.1:{p} {found.group(2)};" for p in instances)
    text = text[:found.start()] + listed + text[found.end():]
    return text.replace("listen 80;", f"listen 127.0.0.1:{port};").replace("/run/nginx-vggserve.sock",
                                                                          str(socket_path))


def main_settings(text: str | None = None) -> str:
    """What deploy/nginx-upstream.conf (or `text`) asks for in nginx.conf's main context, as one line."""
    text = CONFIG.read_text() if text is None else text
    found = MAIN_LINES.findall(text)
    if len(found) != 2:
        raise ValueError(f"{CONFIG}: its comment should name `worker_rlimit_nofile N;` and `events {{ "
                         f"worker_connections N; }}` for nginx.conf, once each; found {found}")
    return " ".join(found)


def main_config(prefix: Path, snippet: str) -> Path:
    """A main nginx.conf in `prefix` including `snippet` in its http {} block, as the deploy files are included,
    with the main settings `snippet` asks for."""
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "vggserve.conf").write_text(snippet)
    user = "user root;" if os.geteuid() == 0 else ""
    temp = " ".join(f"{kind}_temp_path {prefix}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                       "scgi"))
    path = prefix / "nginx.conf"
    path.write_text(f"{user} worker_processes auto; pid {prefix}/nginx.pid; error_log {prefix}/error.log warn;\n"
                    f"{main_settings(snippet)}\n"
                    f"http {{ access_log off; {temp} include {prefix}/vggserve.conf; }}\n")
    return path


def log_summary(path: Path, top: int = 5) -> str:
    """nginx's most frequent error-log messages (request details left out), for an error raised while it ran."""
    counts: dict[str, int] = {}
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        message = re.sub(r"^\S+ \S+ (\[\w+\]) \d+#\d+: (\*\d+ )?", r"\1 ", line).split(", client:")[0]
        counts[message] = counts.get(message, 0) + 1
    common = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return f"nginx's error log ({path}): " + ("; ".join(f"{n} x {m}" for m, n in common) or "empty")


@contextlib.contextmanager
def nginx_in_front(instances: list[int], workdir: Path):
    """nginx's URL while it runs in front of the instances on 127.0.0.1:`instances`."""
    nginx = nginx_binary()
    if nginx is None:
        raise RuntimeError("nginx is not installed: apt-get install nginx-light (deploy/install.sh does)")
    port = free_port()
    config = main_config(workdir, upstream_config(port, instances, workdir / "balancer.sock"))
    args = ["-p", str(workdir), "-c", str(config)]
    checked = subprocess.run([nginx, "-t", *args], capture_output=True, text=True, timeout=30)
    if checked.returncode != 0:
        raise RuntimeError(f"nginx -t refused {config}: {checked.stderr.strip()}")
    process = subprocess.Popen([nginx, *args, "-g", "daemon off;"], stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, 10.0)
        yield f"http://127.0.0.1:{port}"
    except Exception as exc:
        exc.add_note(log_summary(workdir / "error.log"))
        raise
    finally:
        process.terminate()
        process.wait(timeout=10)
