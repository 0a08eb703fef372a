"""deploy/: what can be checked without root, systemd or GPUs. batch.sh's choices with stand-in commands on PATH
(nvidia-smi, mpirun) and --dry-run; install.sh's and quickstart.sh's with a stand-in system Python, apt-get and
pip (a .venv, what each installs); the systemd unit's contents; nginx's configs with the real nginx (the tests fail
without it): error pages in the service's JSON shape, the deadline header capped below proxy_read_timeout, and
nginx-upstream.conf in front of two `vggserve serve` instances (requests spread, a stopped or not-ready instance
passed over, a POST an instance may have computed never sent to another); the Docker build context, entrypoint and
healthcheck."""

import asyncio
import contextlib
import http.server
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vggserve.testing.servers import wait_listening

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def fake_bin(folder: Path, **scripts: str) -> Path:
    """A folder of executable sh scripts named after the keyword arguments."""
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name.replace("_", "-")
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return folder


def batch_sh(tmp_path, *args, **scripts) -> subprocess.CompletedProcess:
    """deploy/batch.sh --dry-run with only the stand-ins and the system's own /usr/bin:/bin on PATH."""
    scripts.setdefault("mpirun", 'echo "HYDRA build details:"')
    folder = fake_bin(tmp_path / "bin", **scripts)
    env = {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(DEPLOY / "batch.sh"), "--dry-run", *args], capture_output=True, text=True,
                          env=env, timeout=30)


def launched(result) -> list[str]:
    line = [x for x in result.stderr.splitlines() if x.startswith("batch.sh: ") and " -m vggserve " in x]
    assert len(line) == 1, result.stderr
    return line[0].removeprefix("batch.sh: ").split()


TWO_GPUS = 'echo "GPU 0: NVIDIA H100 (UUID: GPU-1)"; echo "GPU 1: NVIDIA H100 (UUID: GPU-2)"'


def test_batch_sh_without_a_gpu_does_not_ask_for_one(tmp_path):
    """It used to add --device gpu whatever it found: on a machine without GPU every job failed to set up."""
    done = batch_sh(tmp_path, "--weights", "w", "--input", "in", "--output", "o.jsonl")
    assert done.returncode == 0, done.stderr
    command = launched(done)
    assert command[:3] == ["mpirun", "-n", "1"] and command[-2:] == ["--device", "auto"]
    assert "found no GPU" in done.stderr


def test_batch_sh_with_a_broken_nvidia_driver_does_not_ask_for_a_gpu(tmp_path):
    done = batch_sh(tmp_path, "--input", "in", "--output", "o.jsonl",
                    nvidia_smi='echo "NVIDIA-SMI has failed because it could not communicate with the driver"; exit 9')
    assert launched(done)[-2:] == ["--device", "auto"]


def test_batch_sh_runs_one_rank_per_gpu_found(tmp_path):
    command = launched(batch_sh(tmp_path, "--input", "in", "--output", "o.jsonl", nvidia_smi=TWO_GPUS))
    assert command[:3] == ["mpirun", "-n", "2"] and command[-2:] == ["--device", "gpu"]


def test_batch_sh_keeps_the_device_it_is_given(tmp_path):
    for device in (["--device", "cpu"], ["--device=gpu:1"]):
        command = launched(batch_sh(tmp_path, "--input", "in", "--output", "o", *device, nvidia_smi=TWO_GPUS))
        assert command.count("--device") + sum(a.startswith("--device=") for a in command) == 1
        assert command[-len(device):] == device


def test_batch_sh_with_a_hostfile_asks_each_rank_for_its_gpu(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two machines\nnode1:4\nnode2:4\n")
    command = launched(batch_sh(tmp_path, "--hostfile", str(hosts), "--input", "in", "--output", "o"))
    assert command[:3] == ["mpirun", "-n", "8"] and command[-2:] == ["--device", "gpu"]


@pytest.mark.parametrize("args", [["-n"], ["--ranks"], ["--input", "in", "--hostfile"], ["--dry-run", "-n"]])
def test_batch_sh_option_without_its_value_is_a_one_line_usage_error(tmp_path, args):
    """`deploy/batch.sh -n` ended with bash's `$2: unbound variable`."""
    done = batch_sh(tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unbound" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"batch.sh: {args[-1]} needs a value (") and "usage: deploy/batch.sh" in done.stderr


HOSTFILE = DEPLOY / "hostfile.example"


def test_hostfile_example_is_read_by_mpich_and_places_four_ranks_on_each_machine(tmp_path):
    """It was written in Open MPI's syntax (`slots=4`), which MPICH, the MPI the project installs, refuses
    (`token slots not supported`). Hydra's ssh launcher is pointed at a stand-in that runs each machine's proxy
    here, so the file goes through MPICH's own parser and placement."""
    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found: install the `mpich` package (pip install mpich)"
    log = tmp_path / "hosts.log"
    # the stand-in ssh: skip its options, note the machine, run the proxy command here
    fake_bin(tmp_path / "bin", ssh=f'while [ "${{1#-}}" != "$1" ]; do shift; done; echo "$1" >> {log}; shift; '
                                   'exec sh -c "$*"')
    ranks = subprocess.run([mpiexec, "-f", str(HOSTFILE), "-launcher", "ssh", "-launcher-exec",
                            str(tmp_path / "bin" / "ssh"), "-n", "8", "sh", "-c",
                            'echo "$PMI_RANK $MPI_LOCALRANKID"'], capture_output=True, text=True, timeout=120)
    assert ranks.returncode == 0, ranks.stderr
    placed = sorted(tuple(map(int, line.split())) for line in ranks.stdout.splitlines())
    assert placed == [(rank, rank % 4) for rank in range(8)]  # ranks 0-3 on the first machine, 4-7 on the second
    assert sorted(log.read_text().split()) == ["gpu-node01", "gpu-node02"]
    command = launched(batch_sh(tmp_path, "--hostfile", str(HOSTFILE), "--input", "in", "--output", "o"))
    assert command[:3] == ["mpirun", "-n", "8"]  # what batch.sh counts agrees


def test_hostfile_example_comments_name_paths_that_exist_or_that_they_say_to_create():
    """Its comments named deploy/hostfile, which does not exist."""
    comments = "\n".join(line for line in HOSTFILE.read_text().splitlines() if line.startswith("#"))
    named = set(re.findall(r"deploy/[\w.]+", comments))
    assert named and all((ROOT / path).exists() for path in named), named
    copy = re.search(r"cp deploy/hostfile.example (\S+)", comments).group(1)
    assert f"--hostfile {copy} " in comments and "slots=4" in comments  # the copy is what is passed; Open MPI's form


def test_sbatch_passes_no_option_that_does_nothing(tmp_path):
    """It passed --decode-threads, which only --decode-procs 0 reads: decoding runs in processes by default."""
    log = tmp_path / "srun.args"
    folder = fake_bin(tmp_path / "bin", srun=f'printf "%s\\n" "$@" > {log}')
    done = subprocess.run(["bash", str(DEPLOY / "batch.sbatch"), "--input", "in", "--output", "o.jsonl"],
                          env={"PATH": f"{folder}:/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "4"}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args = log.read_text().split("\n")
    assert args[args.index("-m"):] == ["-m", "vggserve", "batch", "--device", "gpu", "--input", "in", "--output",
                                       "o.jsonl", ""]
    assert not any(a.startswith("--decode-threads") for a in args)


# ---- install.sh and quickstart.sh ---------------------------------------------------------------------------------
# Run on a copy of the scripts, with only stand-ins and a few real tools on PATH: no apt-get, pip or sudo runs.
REAL_TOOLS = ("bash", "sh", "id", "env", "grep", "ls", "dirname")


def debian_python3(log: Path, has_venv: Path) -> str:
    """A stand-in for Debian 12's /usr/bin/python3: externally managed (`-m pip` refuses, as PEP 668 has it), and
    without ensurepip until `has_venv` exists (apt-get installing python3.11-venv makes it). `-m venv DIR` makes a
    DIR/bin/python that logs what it is asked and succeeds."""
    venv_python = f'#!/bin/sh\necho "venv-python $*" >> {log}'
    return f"""echo "python3 $*" >> {log}
case "$1 $2" in
  "-m pip") echo "error: externally-managed-environment" >&2; exit 1 ;;
  "-m venv") [ -e {has_venv} ] || {{ echo "ensurepip is not available" >&2; exit 1; }}
             for dir; do :; done; /bin/mkdir -p "$dir/bin"
             printf '%s\\n' '{venv_python}' > "$dir/bin/python"; /bin/chmod +x "$dir/bin/python" ;;
  "-c "*ensurepip*) [ -e {has_venv} ] ;;
  "-c "*version_info*) echo 3.11 ;;
esac"""


def install_standins(tmp_path, apt=True, venv_package=False, **more) -> tuple[dict, Path]:
    """({PATH: a folder of stand-ins and real tools}, the log the stand-ins write); `venv_package`: python3 can
    make virtual environments from the start."""
    log, has_venv = tmp_path / "calls.log", tmp_path / "python3-venv-installed"
    if venv_package:
        has_venv.touch()
    scripts = {"python3": debian_python3(log, has_venv), "sudo": 'exec "$@"',
               "mkdir": f'echo "mkdir $*" >> {log}', "tee": f'echo "tee $*" >> {log}', **more}
    if apt:
        scripts["apt_get"] = f'echo "apt-get $*" >> {log}; case "$*" in *python3.11-venv*) /bin/touch {has_venv};; esac'
    folder = fake_bin(tmp_path / "bin", **scripts)
    for tool in REAL_TOOLS:
        (folder / tool).symlink_to(shutil.which(tool))
    return {"PATH": str(folder), "HOME": str(tmp_path)}, log


def run_script(tmp_path, env, script: str, *args) -> subprocess.CompletedProcess:
    """deploy/<script> run from a copy of deploy/ in tmp_path/repo (so .venv is made there)."""
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(DEPLOY, repo / "deploy")
    return subprocess.run(["bash", str(repo / "deploy" / script), *args], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)


def calls(log: Path, prefix: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith(prefix)] if log.exists() else []


def test_install_on_a_system_python_that_refuses_pip_installs_into_a_venv(tmp_path):
    """`python3 -m pip install --upgrade pip` stopped install.sh on Debian 12 and Ubuntu (PEP 668)."""
    env, log = install_standins(tmp_path)
    done = run_script(tmp_path, env, "install.sh")
    assert done.returncode == 0, done.stderr
    assert "apt-get install -y -qq python3.11-venv" in calls(log, "apt-get")
    assert calls(log, "python3 -m") == ["python3 -m venv --clear .venv"]  # never its pip
    assert calls(log, "venv-python -m") == ["venv-python -m pip install -q --upgrade pip",
                                            "venv-python -m pip install -q -e .[dev]",
                                            "venv-python -m pip uninstall -y -q pocl-binary-distribution",
                                            "venv-python -m vggserve devices"]
    assert "source .venv/bin/activate" in done.stderr.splitlines()[-1]
    again = run_script(tmp_path, env, "install.sh")  # a working .venv is kept
    assert again.returncode == 0 and calls(log, "python3 -m") == ["python3 -m venv --clear .venv"], again.stderr


def test_install_where_python3_makes_venvs_installs_nothing_for_it(tmp_path):
    env, log = install_standins(tmp_path, venv_package=True)
    done = run_script(tmp_path, env, "install.sh")
    assert done.returncode == 0, done.stderr
    assert not [line for line in calls(log, "apt-get") if "venv" in line]
    assert calls(log, "python3 -m") == ["python3 -m venv --clear .venv"]


def test_install_without_apt_or_ensurepip_says_what_to_install_in_one_line(tmp_path):
    env, log = install_standins(tmp_path, apt=False)
    done = run_script(tmp_path, env, "install.sh")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot make a virtual environment" in done.stderr and "python3.11-venv package" in done.stderr
    assert not (tmp_path / "repo" / ".venv").exists() and calls(log, "python3 -m") == []


def test_quickstart_installs_what_classifying_needs_and_not_the_test_tools(tmp_path):
    """The quickstart installed Chromium and nginx (the test extras) with apt, just to classify three images."""
    env, log = install_standins(tmp_path, venv_package=True)
    done = run_script(tmp_path, env, "quickstart.sh")
    assert done.returncode == 0, done.stderr
    assert not [line for line in calls(log, "apt-get") if "chromium" in line or "nginx" in line]
    pip = [line for line in calls(log, "venv-python -m pip install") if " -e " in line]
    assert pip == ["venv-python -m pip install -q -e ."]
    assert [line.split()[3] for line in calls(log, "venv-python -m vggserve")] == ["devices", "weights", "classify"]
    tests = run_script(tmp_path, env, "install.sh")  # the README's test command: the test extras and their tools
    assert tests.returncode == 0, tests.stderr
    assert "apt-get install -y -qq chromium nginx-light libjpeg-turbo-progs" in calls(log, "apt-get")
    assert "venv-python -m pip install -q -e .[dev]" in calls(log, "venv-python")


def test_readme_test_command_is_what_ci_runs_and_uses_the_venv_install_makes():
    readme = (ROOT / "README.md").read_text()
    (command,) = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert command.startswith("bash deploy/install.sh && source .venv/bin/activate && ") and command in readme


# ---- systemd ------------------------------------------------------------------------------------------------------
UNIT = (DEPLOY / "vggserve.service").read_text()
INSTALL_STEPS = [line.removeprefix("#   ") for line in UNIT.splitlines() if line.startswith("#   ")]


def unit_settings(name: str) -> list[str]:
    """The values of `name=` lines (not comments) in the unit, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", UNIT)
    return [line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith(f"{name}=")]


def test_unit_names_no_group_a_host_may_lack():
    """`SupplementaryGroups=video render` stops the unit on hosts without a render group (status 216/GROUP)."""
    assert unit_settings("SupplementaryGroups") == []
    step = [line for line in INSTALL_STEPS if line.startswith("for group in")]
    assert len(step) == 1 and "getent group" in step[0] and "usermod -aG" in step[0]


def test_unit_install_step_adds_the_user_only_to_groups_that_exist(tmp_path):
    """Runs the documented `for group in video render ...` step with stand-in getent and usermod."""
    step = next(line for line in INSTALL_STEPS if line.startswith("for group in"))
    log = tmp_path / "usermod.log"
    folder = fake_bin(tmp_path / "bin", getent='[ "$2" = video ]', usermod=f'echo "$*" >> {log}')
    done = subprocess.run(["bash", "-c", step], env={"PATH": f"{folder}:/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=30)
    assert log.read_text() == "-aG video vggserve\n", done.stderr


def test_unit_documentation_is_a_file_the_install_steps_create():
    """`Documentation=file:///opt/vggserve/docs/serving.md` named a file that pip never creates."""
    (documentation,) = unit_settings("Documentation")
    target = documentation.removeprefix("file://")
    installs = [line.split() for line in INSTALL_STEPS if line.startswith("install ") and line.split()[-1] == target]
    assert len(installs) == 1, documentation
    assert (ROOT / installs[0][-2]).is_file()


def test_unit_install_steps_cover_the_opencl_driver_and_the_weights():
    steps = "\n".join(INSTALL_STEPS)
    assert "pocl-opencl-icd" in steps and "nvidia" in steps.lower()
    weights = next(v for v in unit_settings("Environment") if v.startswith("VGGSERVE_WEIGHTS="))
    path = weights.split("=", 1)[1]
    placing = [line for line in INSTALL_STEPS if line.startswith("install ") and line.endswith(" " + path)]
    assert len(placing) == 1 and "-o vggserve" in placing[0], "the weights are placed and readable by the user"
    assert "vggserve devices" in steps and f"weights info {path}" in steps  # checked as the service user
    assert "--create-home" in next(line for line in INSTALL_STEPS if line.startswith("useradd "))


def test_unit_stops_after_the_drain():
    (exec_start,) = unit_settings("ExecStart")
    drain = int(re.search(r"--drain-timeout (\d+)", exec_start).group(1))
    assert int(unit_settings("TimeoutStopSec")[0]) > drain


# ---- nginx --------------------------------------------------------------------------------------------------------
NGINX = (DEPLOY / "nginx.conf").read_text()


def nginx_returns() -> dict[int, dict]:
    """status -> the JSON body of each `return <status> '<body>'` in a named location that an error_page uses."""
    pages = dict(re.findall(r"error_page (\d+) = (@\w+);", NGINX))
    bodies = {}
    for status, location in pages.items():
        block = re.search(rf"location {location} \{{(.*?)\}}\n", NGINX, re.S).group(1)
        assert "default_type application/json;" in block, location
        returned, body = re.search(r"return (\d+) '(.*?)';", block).groups()
        assert returned == status, location
        bodies[int(status)] = json.loads(body)
    return bodies


def test_nginx_answers_its_own_errors_in_the_service_shape():
    bodies = nginx_returns()
    assert set(bodies) == {413, 502, 504}
    for body in bodies.values():
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert "proxy_intercept_errors on" not in NGINX  # the service's own errors pass through


def deadline_cap() -> tuple[re.Pattern, re.Pattern, int]:
    passed, capped, cap = re.search(r'"~(\^0\*\(.*?\)\$)"\s+\$http_x_request_timeout_ms;.*?\n\s+"~(.*?)"\s+(\d+);',
                                    NGINX, re.S).groups()
    return re.compile(passed), re.compile(capped), int(cap)


def test_nginx_caps_the_deadline_header_below_its_read_timeout():
    """`proxy_read_timeout 65s` was shorter than the 600 s a client may ask for with X-Request-Timeout-Ms."""
    from vggserve.serving.settings import MAX_TIMEOUT_MS

    passed, capped, cap = deadline_cap()
    read_timeout_s = int(re.search(r"proxy_read_timeout (\d+)s;", NGINX).group(1))
    assert cap < read_timeout_s * 1000 and cap <= MAX_TIMEOUT_MS
    assert "proxy_set_header X-Request-Timeout-Ms $vggserve_request_timeout_ms;" in NGINX

    def forwarded(value: str) -> str:  # nginx tries a map's regular expressions in order; the first match wins
        return value if passed.match(value) else str(cap) if capped.match(value) else value

    for value in ("1", "999", "30000", "059999", "60000"):
        assert forwarded(value) == value
    for value in ("60001", "99999", "600000", "10000000000"):
        assert forwarded(value) == "60000"
    for value in ("0", "-5", "abc", "1.5"):  # left for the service to refuse with its own 422
        assert forwarded(value) == value
    (exec_start,) = unit_settings("ExecStart")
    assert int(re.search(r"--request-timeout-ms (\d+)", exec_start).group(1)) <= cap  # the default deadline too


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Stands in for the service behind nginx: /echo reports the deadline header it got, /slow answers late,
    /own504 is the service's own deadline error."""

    def do_GET(self):
        if self.path == "/slow":
            time.sleep(3)
        if self.path == "/own504":
            self._send(504, {"error": {"code": "deadline_exceeded", "message": "waited too long"}})
        else:
            self._send(200, {"timeout": self.headers.get("X-Request-Timeout-Ms")})

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_binary() -> str:
    """The nginx executable; the test fails (not skips) without one: deploy/install.sh installs it for the tests."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        pytest.fail("nginx is not installed: `apt-get install nginx-light` (deploy/install.sh does, with the dev "
                    "extras); the tests of deploy/nginx*.conf run the real nginx")
    return nginx


def documented_main_settings(snippet: str) -> str:
    """The main-context lines a deploy file's comment asks nginx.conf for (worker_rlimit_nofile, events
    {worker_connections}: an included file cannot set them), as one line."""
    found = re.findall(r"^#\s+(worker_rlimit_nofile \d+;|events \{ worker_connections \d+; \})\s*$", snippet, re.M)
    assert [line.split()[0] for line in found] == ["worker_rlimit_nofile", "events"], found
    return " ".join(found)


def nginx_prefix(tmp_path, snippet: str) -> list[str]:
    """nginx's arguments for a main config under `tmp_path` (pid, logs, temp files there: no root needed) that
    includes `snippet` in its http {} block, as the deploy files are meant to be included, with the main settings
    its comment asks for. The error log keeps `warn` lines."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "vggserve.conf").write_text(snippet)
    user = "user root;" if os.geteuid() == 0 else ""
    temp = " ".join(f"{kind}_temp_path {tmp_path}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                         "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"{user} pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log warn; {documented_main_settings(snippet)}\n"
        f"http {{ access_log off; {temp} include {tmp_path}/vggserve.conf; }}\n")
    return ["-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]


def nginx_test(tmp_path, snippet: str) -> subprocess.CompletedProcess:
    """What `nginx -t` says of `snippet` included as documented."""
    return subprocess.run([nginx_binary(), "-t", *nginx_prefix(tmp_path, snippet)], capture_output=True, text=True,
                          timeout=30)


@contextlib.contextmanager
def nginx_running(tmp_path, snippet: str, port: int):
    """nginx in the foreground with `snippet` (which listens on 127.0.0.1:`port`), after `nginx -t` passed; its
    URL."""
    checked = nginx_test(tmp_path, snippet)
    assert checked.returncode == 0 and "syntax is ok" in checked.stderr, checked.stderr
    process = subprocess.Popen([nginx_binary(), *nginx_prefix(tmp_path, snippet), "-g", "daemon off;"],
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, 5.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def nginx_in_front(tmp_path):
    """(nginx URL, upstream server) with deploy/nginx.conf included as documented; only the addresses and
    proxy_read_timeout (1 s instead of 65 s, for the 504) are changed."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = free_port()
    snippet = (NGINX.replace("listen 80;", f"listen 127.0.0.1:{port};")
               .replace("server 127.0.0.1:8000;", f"server 127.0.0.1:{upstream.server_address[1]};")
               .replace("proxy_read_timeout 65s;", "proxy_read_timeout 1s;"))
    try:
        with nginx_running(tmp_path, snippet, port) as url:
            yield url, upstream
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_nginx_in_front_caps_the_deadline_and_answers_its_errors_in_json(nginx_in_front):
    import httpx

    url, upstream = nginx_in_front
    for sent, received in (("1500", "1500"), ("600000", "60000"), ("abc", "abc"), (None, None)):
        headers = {} if sent is None else {"X-Request-Timeout-Ms": sent}
        r = httpx.get(f"{url}/echo", headers=headers, timeout=10)
        assert r.status_code == 200 and r.json() == {"timeout": received}, sent
    r = httpx.get(f"{url}/own504", timeout=10)  # the service's own error passes through as it is
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    r = httpx.get(f"{url}/slow", timeout=10)
    assert r.status_code == 504 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "gateway_timeout"
    r = httpx.post(f"{url}/classify", content=b"\0" * (21 << 20), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    upstream.shutdown()
    upstream.server_close()
    r = httpx.get(f"{url}/echo", timeout=10)
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "bad_gateway" and r.headers["retry-after"] == "5"


# ---- nginx in front of several instances (deploy/nginx-upstream.conf) ---------------------------------------------
UPSTREAM_CONF = (DEPLOY / "nginx-upstream.conf").read_text()


def upstream_snippet(tmp_path, port: int, instances: list[int]) -> str:
    """deploy/nginx-upstream.conf with only the addresses changed: the public block on 127.0.0.1:`port`, the inner
    one's socket in `tmp_path`, the upstream's two servers replaced by `instances` (ports on 127.0.0.1)."""
    servers = re.findall(r"\n    server 127\.0\.0\.1:\d+ (max_fails=\d+ fail_timeout=\w+);", UPSTREAM_CONF)
    assert len(servers) == 2 and len(set(servers)) == 1, servers
    listed = "".join(f"\n    server 127.0.0.1:{p} {servers[0]};" for p in instances)
    snippet = re.sub(r"(\n    server 127\.0\.0\.1:\d+ max_fails=\d+ fail_timeout=\w+;)+", lambda _: listed,
                     UPSTREAM_CONF, count=1)
    return (snippet.replace("listen 80;", f"listen 127.0.0.1:{port};")
            .replace("/run/nginx-vggserve.sock", str(tmp_path / "balancer.sock")))


def test_nginx_upstream_config_passes_nginx_t_and_never_retries_a_sent_post(tmp_path):
    """`nginx -t` accepts it as documented; no proxy_next_upstream has non_idempotent (which would pass on a POST that
    an instance may be computing); only 503 (and nginx's own 502) is intercepted where requests are passed on; the
    public block keeps nginx.conf's JSON error pages and deadline cap."""
    checked = nginx_test(tmp_path, upstream_snippet(tmp_path, free_port(), [8000, 8001]))
    assert checked.returncode == 0 and "test is successful" in checked.stderr, checked.stderr
    directives = re.findall(r"^\s*proxy_next_upstream\s+([^;]*);", UPSTREAM_CONF, re.M)
    assert directives and not [d for d in directives if "non_idempotent" in d], directives
    intercepting = re.search(r"proxy_intercept_errors on;.*?\n    \}", UPSTREAM_CONF, re.S).group(0)
    assert sorted(re.findall(r"error_page (\d+)", intercepting)) == ["502", "503"]
    assert UPSTREAM_CONF.count("proxy_intercept_errors on;") == 1
    for line in ('"~^0*[1-9][0-9]{4,}$"                         60000;', "proxy_read_timeout 65s;",
                 "client_max_body_size 20m;", "error_page 413 = @payload_too_large;", "error_page 504 = @gateway_timeout;",
                 '"code": "bad_gateway"', '"code": "gateway_timeout"', '"code": "payload_too_large"'):
        assert line in UPSTREAM_CONF and line in NGINX, line


class _Instance(http.server.BaseHTTPRequestHandler):
    """Stands in for one instance: counts what reaches it and answers as `self.server.answer` says: "ok" (200 with
    its port), "503" (not ready), "504" (its own deadline error), "429" (queue full), "drop" (reads the request,
    then closes the connection without an answer, as a process that dies while computing)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.command)
        answer = self.server.answer
        if answer == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        codes = {"ok": (200, "ok"), "503": (503, "not_ready"), "504": (504, "deadline_exceeded"),
                 "429": (429, "queue_full")}
        status, code = codes[answer]
        body = {"port": self.server.server_address[1]} if status == 200 else {"error": {"code": code, "message": "x"}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def stand_in_instances(*answers: str):
    servers = []
    try:
        for answer in answers:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Instance)
            server.answer, server.seen = answer, []
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            servers.append(server)
        yield servers
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("answer, status, code", [("drop", 502, "bad_gateway"), ("504", 504, "deadline_exceeded"),
                                                  ("429", 429, "queue_full")])
def test_nginx_upstream_does_not_pass_on_a_post_an_instance_may_have_computed(tmp_path, answer, status, code):
    """A POST whose connection broke after it was sent, or that got the instance's own 504 or 429, is answered as it
    is: the other instance never sees it."""
    import httpx

    port = free_port()
    with stand_in_instances(answer, "ok") as (first, second):
        with nginx_running(tmp_path, upstream_snippet(tmp_path, port, [first.server_address[1],
                                                                       second.server_address[1]]), port) as url:
            answers = []
            while not first.seen and len(answers) < 4:  # round robin: `first` has its turn within two requests
                answers.append(httpx.post(f"{url}/classify", content=b"jpeg", timeout=30))
            *passed, refused = answers
            assert refused.status_code == status and refused.json()["error"]["code"] == code, refused.text
            assert refused.headers["content-type"] == "application/json"
            assert [r.status_code for r in passed] == [200] * len(passed)
            assert len(first.seen) == 1 and len(second.seen) == len(passed)  # the refused one was not passed on


def test_nginx_upstream_passes_a_503_on_to_the_other_instance(tmp_path):
    """An instance that is not ready (or draining) answers 503 before it takes the request: the POST is sent to the
    other instance, once, and the client sees only 200s. When every instance answers 503, the last 503 is the answer."""
    import httpx

    port = free_port()
    with stand_in_instances("503", "ok") as (refusing, taking):
        with nginx_running(tmp_path, upstream_snippet(tmp_path, port, [refusing.server_address[1],
                                                                       taking.server_address[1]]), port) as url:
            answers = [httpx.post(f"{url}/classify", content=b"jpeg", timeout=30) for _ in range(6)]
            assert [r.status_code for r in answers] == [200] * 6
            assert {r.json()["port"] for r in answers} == {taking.server_address[1]}
            assert refusing.seen and len(taking.seen) == 6
            taking.answer = "503"
            r = httpx.post(f"{url}/classify", content=b"jpeg", timeout=30)
            assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"


class _HeldInstance:
    """Stands in for one instance under load, on its own event loop: answers a GET at once, and holds every POST
    (counted in `posts`) until release(), then answers each with 200 and its JSON."""

    def __init__(self):
        self.posts, self.loop = 0, asyncio.new_event_loop()
        self.released = asyncio.Event()
        self.server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0, backlog=4096))
        self.port = self.server.sockets[0].getsockname()[1]
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                if head.startswith(b"POST"):
                    self.posts += 1
                    await self.released.wait()
                body = b'{"predictions": [{"index": 0, "label": "x", "probability": 1.0}]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def release(self):
        self.loop.call_soon_threadsafe(self.released.set)

    def close(self):
        async def stop():
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def nginx_log(tmp_path) -> str:
    path = tmp_path / "error.log"
    return path.read_text() if path.exists() else ""


def test_nginx_upstream_takes_600_requests_in_flight_at_once_without_resets(tmp_path):
    """600 POSTs held in flight at once (the lead's benchmark had 512 through nginx), one nginx worker, and a new
    connection's GET meanwhile (the benchmark's /metrics polling): every one is answered 200 by the instance. With
    nginx's default 512 worker_connections (4 per request here) nginx closed idle and just-accepted connections
    (resets, 502s), and with the inner socket's default backlog (511) a burst of new requests got 502."""
    import resource

    from vggserve.loadtest.rawhttp import RawConnection

    n = 600
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process holds 2 x n sockets, nginx 4 x n
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    instance, port = _HeldInstance(), free_port()
    try:
        with nginx_running(tmp_path, upstream_snippet(tmp_path, port, [instance.port]), port):
            async def load():
                async def post():
                    conn = RawConnection("127.0.0.1", port, timeout_s=60)
                    try:
                        status, _, body = await conn.request("POST", "/classify", b"\xff\xd8" + bytes(30000),
                                                             {"content-type": "image/jpeg"})
                        return status if b'"predictions"' in body else f"{status} {body[:80]!r}"
                    except Exception as exc:  # a reset, or the connection closed without an answer
                        return type(exc).__name__
                    finally:
                        await conn.close()

                posts = [asyncio.create_task(post()) for _ in range(n)]
                deadline = time.monotonic() + 30
                while instance.posts < n and not all(p.done() for p in posts) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                held = instance.posts
                probe = RawConnection("127.0.0.1", port, timeout_s=30)
                try:
                    polled = (await probe.request("GET", "/metrics"))[0]
                except Exception as exc:
                    polled = type(exc).__name__
                await probe.close()
                instance.release()
                return held, polled, await asyncio.gather(*posts)

            held, polled, statuses = asyncio.run(load())
        counted = {status: statuses.count(status) for status in set(statuses)}
        log = nginx_log(tmp_path)
        assert counted == {200: n} and held == n and polled == 200, (counted, held, polled, log[-1500:])
        assert "worker_connections are not enough" not in log, log[-1500:]
    finally:
        instance.close()


def test_nginx_upstream_keeps_request_bodies_in_memory_in_both_server_blocks(tmp_path):
    """The inner block buffered each upload again with nginx's default 16 KiB client_body_buffer_size: every image
    over 16 KiB was written to a temporary file (a `warn` line each) on its way to an instance."""
    import httpx

    port = free_port()
    with stand_in_instances("ok") as (instance,):
        with nginx_running(tmp_path, upstream_snippet(tmp_path, port, [instance.server_address[1]]), port) as url:
            r = httpx.post(f"{url}/classify", content=b"\xff\xd8" + bytes(500_000), timeout=30)
            assert r.status_code == 200, r.text
    assert "buffered to a temporary file" not in nginx_log(tmp_path), nginx_log(tmp_path)


NOT_READY_SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, max_batch_size=2, max_wait_ms=5, drain_timeout_s=5)
sys.exit(run_server(settings, lambda device: SlowModel(device, 0.01, 2, load_seconds=600), log_level="warning"))
"""


def classified_here(url: str, status: str = "200") -> float:
    """POST /classify answers with `status` this instance has counted (its own /metrics)."""
    import httpx

    from vggserve.loadtest.metrics import Snapshot

    metrics = Snapshot.parse(httpx.get(url + "/metrics", timeout=10).text)
    return metrics.total("vggserve_requests_total", endpoint="/classify", status=status) or 0.0


def test_nginx_upstream_spreads_requests_over_two_services_and_goes_on_when_one_stops(tmp_path, tiny_weights_path):
    """Two real `vggserve serve` instances behind deploy/nginx-upstream.conf: requests are spread over both (each
    one's /metrics); after one is stopped (SIGTERM: drained, then gone) every request still succeeds, through the
    other. Then an instance still loading its model (503 not_ready) beside a ready one: it is tried, refuses, and
    every request is answered by the ready one."""
    import httpx
    from PIL import Image

    from vggserve.testing.servers import ServerProcess

    body = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 120, 40)).save(body, "JPEG")
    args = ["--weights", str(tiny_weights_path), "--device", "cpu", "--max-batch-size", "2", "--max-wait-ms", "5",
            "--log-level", "warning"]
    port = free_port()
    with ServerProcess.serve_cli(args) as one, ServerProcess.serve_cli(args) as two, \
            ServerProcess.python_code(NOT_READY_SERVER) as loading, httpx.Client(timeout=60) as client:
        def classify(url):
            r = client.post(f"{url}/classify", content=body.getvalue(), headers={"content-type": "image/jpeg"})
            assert r.status_code == 200 and r.json()["predictions"], r.text
            return r

        one.wait_ready(180)
        two.wait_ready(180)
        with nginx_running(tmp_path / "two", upstream_snippet(tmp_path / "two", port, [one.port, two.port]),
                           port) as url:
            for _ in range(8):
                classify(url)
            assert classified_here(one.url) > 0 and classified_here(two.url) > 0
            assert classified_here(one.url) + classified_here(two.url) == 8
            two.signal(signal.SIGTERM)
            assert two.wait(60) == 0, two.output()[-2000:]
            before = classified_here(one.url)
            for _ in range(6):
                classify(url)
            assert classified_here(one.url) == before + 6

        loading.wait_ready(60, path="/health/live")
        with nginx_running(tmp_path / "loading", upstream_snippet(tmp_path / "loading", port, [loading.port, one.port]),
                           port) as url:
            before = classified_here(one.url)
            for _ in range(6):
                classify(url)
            assert classified_here(one.url) == before + 6
            assert classified_here(loading.url, "503") > 0  # tried, refused before taking it, passed on


# ---- Docker -------------------------------------------------------------------------------------------------------
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def entrypoint(tmp_path, *args, **env) -> list[str]:
    """What deploy/docker-entrypoint.sh runs for `docker run [-e NAME=VALUE...] IMAGE args...` (stand-ins print
    their arguments)."""
    folder = fake_bin(tmp_path / "bin", vggserve='echo vggserve "$@"', mpiexec='echo mpiexec "$@"')
    done = subprocess.run(["sh", str(DEPLOY / "docker-entrypoint.sh"), *args], capture_output=True, text=True,
                          env={"PATH": f"{folder}:/usr/bin:/bin", **env}, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_docker_image_runs_the_service_by_default_and_any_command_on_request(tmp_path):
    serve = ["vggserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert entrypoint(tmp_path) == serve
    options = ["--weights", "/w", "--device", "auto"]
    assert entrypoint(tmp_path, *options) == [*serve, *options]
    assert entrypoint(tmp_path, "serve", "--port", "9000") == [*serve, "--port", "9000"]
    assert entrypoint(tmp_path, "batch", "--input", "/in") == ["vggserve", "batch", "--input", "/in"]
    launch = ["mpiexec", "-n", "2", "vggserve", "batch"]
    assert entrypoint(tmp_path, *launch) == launch


def healthcheck(cmdline: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    """deploy/docker-healthcheck.py with `cmdline` standing in for the container's first process's."""
    (tmp_path / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in cmdline) + b"\0")
    return subprocess.run([sys.executable, str(DEPLOY / "docker-healthcheck.py"), str(tmp_path / "cmdline")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=30)


@pytest.fixture
def ready_service():
    """The port of a stand-in answering 200 on /health/ready, on 127.0.0.1."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_docker_healthcheck_asks_the_port_the_service_was_started_on(tmp_path, ready_service):
    """HEALTHCHECK asked 127.0.0.1:8000 whatever --port the entrypoint was given: a service on 9000 was unhealthy."""
    port, closed = str(ready_service), str(free_port())
    assert entrypoint(tmp_path, VGGSERVE_PORT=port)[:6] == ["vggserve", "serve", "--host", "0.0.0.0", "--port", port]
    started = {  # the container's first process: the service the entrypoint exec'd, or docker-init before it
        "-e VGGSERVE_PORT": entrypoint(tmp_path, "--weights", "/w", VGGSERVE_PORT=port),
        "--port": entrypoint(tmp_path, "--weights", "/w", "--port", port),
        "serve --port=": entrypoint(tmp_path, "serve", f"--port={port}"),
        "--init": ["/sbin/docker-init", "--", "vggserve-entrypoint", "--port", port],
    }
    for how, cmdline in started.items():
        assert healthcheck(cmdline, tmp_path).returncode == 0, how
    assert healthcheck(["/sbin/docker-init", "--", "vggserve-entrypoint"], tmp_path,
                       VGGSERVE_PORT=port).returncode == 0
    unhealthy = healthcheck(entrypoint(tmp_path, "--port", closed), tmp_path, VGGSERVE_PORT=port)
    assert unhealthy.returncode == 1 and f"127.0.0.1:{closed}/health/ready" in unhealthy.stderr
    assert unhealthy.stderr.count("\n") == 1


def test_docker_image_healthcheck_is_the_script_that_follows_the_port():
    (check,) = re.findall(r"^HEALTHCHECK .*$", re.sub(r"\\\n\s*", " ", DOCKERFILE), re.M)  # continuations joined
    assert check.endswith('CMD ["vggserve-healthcheck"]') and "8000" not in check
    assert "install -m 0755 /src/deploy/docker-healthcheck.py /usr/local/bin/vggserve-healthcheck" in DOCKERFILE
    assert dockerignore_keeps("deploy/docker-healthcheck.py")


def test_docker_entrypoint_knows_every_vggserve_command():
    from vggserve.cli import SUBCOMMANDS

    script = (DEPLOY / "docker-entrypoint.sh").read_text()
    named = set(re.search(r"^\s+(batch\|[\w|-]+)\)$", script, re.M).group(1).split("|")) | {"serve"}
    assert set(SUBCOMMANDS) <= named


def test_docker_image_has_mpi_for_batch_jobs_and_a_home_for_its_user():
    assert re.search(r'pip install "/src\[mpich\]"', DOCKERFILE)
    assert "--create-home --home-dir /var/lib/vggserve" in DOCKERFILE
    assert 'ENTRYPOINT ["vggserve-entrypoint"]' in DOCKERFILE


def dockerignore_keeps(path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern that matches the path or one of its parent folders decides;
    `*` stays within a path element, `**` crosses them, `!` takes a path back in."""
    kept = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            kept = negated
    return kept


def test_docker_build_context_holds_the_package_and_not_weights_git_or_outputs():
    """Without a .dockerignore, `COPY .` took weights/ (over 1 GB after the quickstart), .git and run outputs."""
    for path in ("pyproject.toml", "README.md", "vggserve/__init__.py", "vggserve/data/imagenet_classes.txt",
                 "vggserve/cli/batch.py", "kernels/conv_gemm.cl", "deploy/docker-entrypoint.sh"):
        assert dockerignore_keeps(path), path
        assert (ROOT / path).exists(), path
    for path in ("weights/vgg16-random-seed0.safetensors", ".git/HEAD", ".venv/bin/python", "loadtest-out/summary.csv",
                 "results.jsonl", "vggserve/__pycache__/cli.cpython-311.pyc", "tests/test_cli.py", "benchmarks/x.py"):
        assert not dockerignore_keeps(path), path
    copied = re.findall(r"^COPY (\S+) ", DOCKERFILE, re.M)
    assert copied == ["."], "the context rules above assume one COPY of the whole context"
