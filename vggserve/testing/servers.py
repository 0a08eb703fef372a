"""Starting a service process and waiting for it, for tests and benchmarks: bounded waits, loopback only.

    with ServerProcess.serve_cli(["--weights", w, "--device", "cpu"]) as server:
        httpx.post(server.url + "/classify", ...)
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout_s: float = 10.0, host: str = "127.0.0.1") -> bool:
    """Wait until something accepts connections on host:port (True), or `timeout_s` has passed (False)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)


def python_env(extra: dict | None = None) -> dict:
    """The environment with this checkout importable, so `python -m vggserve` works without installing."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


class ServerProcess:
    """A server started as a child process on 127.0.0.1:port; output goes to a temporary log file."""

    def __init__(self, command: list[str], port: int, env: dict | None = None, host: str = "127.0.0.1"):
        self.command = command
        self.port = port
        self.url = f"http://{host}:{port}"
        self.env = python_env(env)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vggserve-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @classmethod
    def serve_cli(cls, args: list[str], env: dict | None = None, launcher: list[str] | None = None,
                  port: int | None = None) -> "ServerProcess":
        """`[launcher...] python -m vggserve serve ARGS --host 127.0.0.1 --port PORT`."""
        port = port or free_port()
        command = [*(launcher or []), sys.executable, "-m", "vggserve", "serve", *args,
                   "--host", "127.0.0.1", "--port", str(port)]
        return cls(command, port, env)

    @classmethod
    def python_code(cls, code: str, env: dict | None = None) -> "ServerProcess":
        """`python -c CODE`, where CODE may use the name PORT (substituted) to serve on."""
        port = free_port()
        return cls([sys.executable, "-c", code.replace("PORT", str(port))], port, env)

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen(self.command, env=self.env, cwd=str(REPO_ROOT), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0, path: str = "/health/ready") -> None:
        """Poll `path` until it answers 200; RuntimeError with the server's output if it exits or times out."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s:\n{self.output()[-4000:]}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; the whole process group is killed if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=10)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)
