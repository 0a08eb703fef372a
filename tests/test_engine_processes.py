"""`vggserve serve --engine-processes per-device` (issue 24): with several devices and HTTP front ends, one engine
process per device, and every front end sending each image to the ready engine with the fewest of its images
outstanding.

In-process: two engines behind one EngineRouter (both get images, --max-queue covers them together, a device
that fails mid-load has its images computed by the other), the settings and the flag, the model factory that
cannot travel. Real processes, with SlowModels stand-in devices: both engine processes serve
under load; one device failing mid-load or one engine process killed loses no request, readiness stays 200 and the
log names the device; every engine out exits 3; SIGTERM leaves no process behind; `--engine-processes 1` keeps one
engine process for every device.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import psutil
import pytest

from test_http_frontends import crop, front_end_pids, no_process_left, running
from test_http_process import HTTP, classify, samples, wait_until
from vggserve.modelinput import ModelInput
from vggserve.serving.metrics import Metrics
from vggserve.serving.processes.engine_host import EngineHost
from vggserve.serving.processes.engine_process import portable
from vggserve.serving.processes.frontends import engine_factory
from vggserve.serving.processes.routing import EngineRouter
from vggserve.serving.scheduling.batcher import Outcome
from vggserve.serving.scheduling.errors import QueueFull
from vggserve.serving.processes.admission import AdmissionBlock
from vggserve.serving.service import Service
from vggserve.serving.settings import Settings, SettingsError
from vggserve.testing.models import SlowModels
from vggserve.testing.servers import ServerProcess, python_env

TWO = ("cpu:0", "cpu:1")


@contextmanager
def two_engines(factory: SlowModels, capacity: int = 64):
    """Two engines (a Service of one device each behind an EngineHost) and a front end's EngineRouter to both,
    admitting from a shared block (front end 0 of 2, the other idle)."""
    settings = Settings(devices=TWO, http_workers=2, max_batch_size=4, max_wait_ms=10, max_queue=128, max_files=4)
    workdir = tempfile.mkdtemp(prefix="vggserve-test-")
    services, hosts = [], []
    for index in range(2):
        services.append(Service(settings.for_engine(index), factory))
        hosts.append(EngineHost(services[-1], os.path.join(workdir, f"engine{index}.sock"), b"k" * 32))
        hosts[-1].start()
        services[-1].start()
    block = AdmissionBlock(2)
    router = EngineRouter([h.address for h in hosts], b"k" * 32, capacity, Metrics(), 0, block.count(0, capacity),
                          TWO)
    try:
        router.connect()
        wait_until(lambda: router.state and all(c.state["ready"][0] for c in router.clients), 20, "both engines")
        yield services, router
    finally:
        router.close()
        for host, service in zip(hosts, services):
            host.close()
            service.stop()
        for index in range(2):
            if os.path.exists(os.path.join(workdir, f"engine{index}.sock")):
                os.unlink(os.path.join(workdir, f"engine{index}.sock"))
        os.rmdir(workdir)


def submit(router: EngineRouter, n: int, admitted: bool = False) -> list[Future]:
    if not admitted:
        router.queue.admit(n)
    return [router.queue.submit(ModelInput.crop(crop((i, 0, 0))), time.monotonic() + 60).future for i in range(n)]


def test_a_front_end_spreads_images_over_both_engines_within_one_queue():
    with two_engines(SlowModels(0.05, 4), capacity=24) as (services, router):
        router.queue.admit(24)
        with pytest.raises(QueueFull, match="--max-queue 24"):  # the room covers both engines together
            router.queue.admit(1)
        futures = submit(router, 24, admitted=True)
        outcomes = [f.result(30) for f in futures]
        assert {o.device for o in outcomes} == set(TWO)
        assert all(s.backend.workers[0].batches > 1 for s in services)
        assert router.queue.admitted == 0 and len(router.queue) == 0 and router.queue._shared.total() == 0
        assert router.state["ready"] == (True, "ready", "2 of 2 engine processes ready")


def test_images_of_a_device_that_fails_mid_load_are_computed_by_the_other_engine(tmp_path):
    fail = tmp_path / "fail-cpu1"
    with two_engines(SlowModels(0.05, 4, {"cpu:1": str(fail)})) as (services, router):
        futures = submit(router, 32)  # about 16 queued in each engine
        wait_until(lambda: services[1].backend.workers[0].batches >= 1, 20, "engine 1 computing")
        fail.touch()
        outcomes = [f.result(60) for f in futures]  # none lost: those engine 1 gave back, engine 0 computed
        assert all(isinstance(o, Outcome) for o in outcomes)
        assert {o.device for o in outcomes} == set(TWO) and services[1].backend.workers[0].state == "failed"
        wait_until(lambda: router.queue.usable == [True, False], 10, "engine 1 left out")
        ready, code, detail = router.state["ready"]
        assert ready and code == "ready" and "1 of 2 engine processes ready" in detail and "cpu:1" in detail
        assert all(f.result(30).device == "cpu:0" for f in submit(router, 8))  # new images go to engine 0 only
        assert router.queue.admitted == 0


def test_engine_processes_setting_and_flag_with_one_line_errors():
    assert Settings(devices=TWO, http_workers=2).engine_count == 2  # auto: several devices and front ends
    assert Settings(devices=TWO, http_workers=2, engine_processes="1").engine_count == 1
    assert Settings(devices=TWO).engine_count == 1  # one process: no front ends to spread images
    assert Settings(devices=("cpu",), http_workers=2, engine_processes="per-device").engine_count == 1
    assert Settings(devices=TWO, http_workers=2).for_engine(1).devices == ("cpu:1",)
    for bad, words in [({"engine_processes": "2"}, "--engine-processes must be one of auto, 1, per-device"),
                       ({"engine_processes": "per-device", "devices": TWO}, "needs HTTP front-end processes")]:
        with pytest.raises(SettingsError, match=words) as error:
            Settings(**bad)
        assert "\n" not in str(error.value)

    import argparse

    from vggserve.cli import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = ["serve", "--device", "cpu:0,cpu:1", "--http-workers", "2"]
    assert serve._settings(parser.parse_args(args)).engine_count == 2
    assert serve._settings(parser.parse_args([*args, "--engine-processes", "1"])).engine_count == 1
    with pytest.raises(SettingsError, match="--engine-processes"):
        serve._settings(parser.parse_args([*args, "--engine-processes", "3"]))


def test_a_bad_engine_processes_value_is_one_line_on_the_command_line(tiny_weights_path):
    done = subprocess.run([sys.executable, "-m", "vggserve", "serve", "--weights", str(tiny_weights_path),
                           "--engine-processes", "many"], env=python_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "vggserve: error: --engine-processes must be one of auto, 1, per-device, got 'many'; pass e.g. "
        "--engine-processes per-device"]


def closure_factory(device):  # module-level: picklable
    return SlowModels()(device)


def test_a_model_factory_that_cannot_reach_an_engine_process():
    settings = Settings(devices=TWO, http_workers=2)
    assert engine_factory(settings, SlowModels())[1] == portable(SlowModels())
    assert engine_factory(settings, closure_factory)[0].engine_count == 2
    served, data = engine_factory(settings, lambda device: None)  # auto: one engine process, with a warning
    assert served.engine_count == 1 and data is None
    with pytest.raises(SettingsError, match="per-device: the model factory .* cannot be pickled"):
        engine_factory(Settings(devices=TWO, http_workers=2, engine_processes="per-device"), lambda device: None)


# --- real processes -------------------------------------------------------------------------------------------

PER_DEVICE_SERVER = """
import sys
from vggserve.testing.models import SlowModels
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings
settings = Settings(port=PORT, devices=DEVICES, http_workers=2, max_batch_size=4, max_wait_ms=20, max_queue=64,
                    max_files=4, preprocess_threads=2, drain_timeout_s=10, engine_processes=ENGINES)
sys.exit(run_server(settings, SlowModels(0.05, 4, FAILS), log_level="info"))
"""


def server_code(devices=TWO, engines="per-device", fails=None) -> str:
    return (PER_DEVICE_SERVER.replace("DEVICES", repr(devices)).replace("ENGINES", repr(engines))
            .replace("FAILS", repr(fails or {})))


def engine_pids(server: ServerProcess) -> set[int]:
    return {p.pid for p in psutil.Process(server.proc.pid).children()} - front_end_pids_only(server)


def front_end_pids_only(server: ServerProcess) -> set[int]:
    return {p.pid for p in psutil.Process(server.proc.pid).children()
            if "processes.frontend import" in " ".join(p.cmdline())}


def devices_batches(url: str) -> dict[str, tuple[str, int]]:
    return {d["spec"]: (d["state"], d["batches"]) for d in HTTP.get(url + "/metadata", timeout=10).json()["devices"]}


def load(url: str, clients: int, each: int, during=None) -> list:
    """`clients` threads sending `each` images one after another; `during()` runs once they have started."""
    with ThreadPoolExecutor(clients + 1) as pool:
        jobs = [pool.submit(lambda: [classify(url, timeout=60) for _ in range(each)]) for _ in range(clients)]
        if during is not None:
            during()
        return [r for job in jobs for r in job.result()]


def answered_or_503(responses) -> None:
    """No request lost: each one 200, or a documented 503 with the error body."""
    for r in responses:
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert r.json()["error"]["code"] in ("no_workers", "inference_failed", "shutting_down"), r.text


@pytest.fixture(scope="module")
def per_device_server(tmp_path_factory):
    fail = tmp_path_factory.mktemp("fail") / "cpu1"
    devices = ("cpu:0", "cpu:1", "cpu:2")
    with running(ServerProcess.python_code(server_code(devices, fails={"cpu:1": str(fail)}))) as server:
        server.wait_ready(120)
        server.fail_file = fail
        yield server


def test_one_engine_process_per_device_and_every_engine_computes_under_load(per_device_server):
    server = per_device_server
    assert len(front_end_pids_only(server)) == 2 and len(engine_pids(server)) == 2  # engines 1 and 2; 0 is main
    responses = load(server.url, 8, 12)
    assert [r.status_code for r in responses] == [200] * 96
    batches = devices_batches(server.url)
    assert set(batches) == {"cpu:0", "cpu:1", "cpu:2"} and all(b > 1 for _, b in batches.values()), batches
    ready = HTTP.get(server.url + "/health/ready", timeout=5).json()
    assert ready == {"status": "ready", "detail": "3 of 3 engine processes ready"}
    meta = HTTP.get(server.url + "/metadata", timeout=10).json()
    assert meta["engine_processes"] == 3
    up = samples(server.url)
    assert all(up[("vggserve_device_up", ("device", d))] == 1 for d in batches)


def test_a_device_failing_mid_load_loses_no_request_and_readiness_stays_200(per_device_server):
    server = per_device_server
    readiness = []

    def fail_the_device():
        time.sleep(0.5)
        server.fail_file.touch()
        end = time.monotonic() + 3
        while time.monotonic() < end:
            readiness.append(HTTP.get(server.url + "/health/ready", timeout=5).status_code)
            time.sleep(0.05)

    responses = load(server.url, 8, 12, fail_the_device)
    answered_or_503(responses)
    assert sum(r.status_code == 200 for r in responses) >= 90  # images of the lost device went to the others
    assert set(readiness) == {200}
    wait_until(lambda: "engine 1 (device cpu:1) is out" in server.output(), 10, "the log line")
    assert len(re.findall(r"engine 1 \(device cpu:1\) is out", server.output())) == 1
    assert devices_batches(server.url)["cpu:1"][0] == "failed"
    assert samples(server.url)[("vggserve_device_up", ("device", "cpu:1"))] == 0
    assert [classify(server.url).status_code for _ in range(6)] == [200] * 6


def test_a_killed_engine_process_loses_no_request_and_the_others_serve_on(per_device_server):
    server = per_device_server
    victim = int(re.search(r"engine 2 \(device cpu:2\) started, pid (\d+)", server.output()).group(1))
    assert victim in engine_pids(server)
    responses = load(server.url, 8, 10, lambda: (time.sleep(0.5), os.kill(victim, signal.SIGKILL)))
    answered_or_503(responses)
    assert sum(r.status_code == 200 for r in responses) >= 75
    wait_until(lambda: "engine 2 (device cpu:2) is out: its process" in server.output(), 10, "the log line")
    assert HTTP.get(server.url + "/health/ready", timeout=5).status_code == 200
    wait_until(lambda: samples(server.url).get(("vggserve_device_up", ("device", "cpu:2"))) == 0, 10, "device_up 0")
    assert [classify(server.url).status_code for _ in range(6)] == [200] * 6


def test_sigterm_stops_every_engine_and_front_end_process(per_device_server):
    server = per_device_server
    pids = {p.pid for p in psutil.Process(server.proc.pid).children()}
    before = len(server.output())
    server.signal(signal.SIGTERM)
    assert server.wait(60) == 0, server.output()[-3000:]
    wait_until(lambda: no_process_left(server), 10, "every process gone")
    assert len(pids) == 3 and not any(psutil.pid_exists(p) for p in pids)  # 2 front ends, engine 1 (2 was killed)
    after = server.output()[before:]
    assert "Traceback" not in after and "Fatal Python error" not in after, after


def test_every_engine_out_exits_3_naming_each_device(tmp_path):
    dead = tmp_path / "dead"
    dead.touch()  # both devices fail their warm-up batch
    code = server_code(fails={"cpu:0": str(dead), "cpu:1": str(dead)})
    with running(ServerProcess.python_code(code)) as server:
        assert server.wait(90) == 3, server.output()[-3000:]
        out = server.output()
        assert "vggserve: error: no device worker is alive (cpu:0: " in out and "; cpu:1: " in out
        wait_until(lambda: no_process_left(server), 10, "every process gone")


def test_engine_processes_1_keeps_one_engine_for_every_device():
    with running(ServerProcess.python_code(server_code(engines="1"))) as server:
        server.wait_ready(120)
        assert engine_pids(server) == set() and len(front_end_pids(server)) == 2
        responses = load(server.url, 4, 6)
        assert [r.status_code for r in responses] == [200] * 24
        assert set(devices_batches(server.url)) == set(TWO)
        assert HTTP.get(server.url + "/metadata", timeout=10).json()["engine_processes"] == 1
        assert "engine processes ready" not in HTTP.get(server.url + "/health/ready", timeout=5).text
