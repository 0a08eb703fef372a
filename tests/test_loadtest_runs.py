"""The harness against a stand-in service on 127.0.0.1 (vggserve.loadtest.standin), a few seconds per test:
counts add up, percentiles are ordered, errors are counted by status, open-loop latency includes the
schedule lag, Ctrl-C still writes results, and every output file parses."""

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vggserve.errors import VggserveError
from vggserve.loadtest import LoadTestConfig, run_loadtest
from vggserve.loadtest.client import ClientPool
from vggserve.loadtest.images import ImageSet
from vggserve.loadtest.loops import LevelPlan, LevelRun, run_closed
from vggserve.loadtest.standin import StandinConfig, StandinServer

REPO = Path(__file__).resolve().parents[1]
PCT_KEYS = ("latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    """Six real images of different sizes and formats."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(32, 24), (224, 224), (300, 200), (64, 96), (500, 375), (120, 90)]):
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.{'png' if i % 3 == 1 else 'jpg'}")
    return folder


def config_for(server, image_dir, out, **overrides):
    settings = dict(url=server.url, images=image_dir, output=out, warmup_s=0.5, duration_s=1.5,
                    timeout_s=10.0, progress=False)
    settings.update(overrides)
    return LoadTestConfig(**settings)


def assert_percentiles_ordered(row):
    values = [row[k] for k in PCT_KEYS]
    assert all(v is not None for v in values), row
    assert values == sorted(values), values


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_closed_loop_counts_match_the_server_and_outputs_parse(image_dir, tmp_path):
    out = tmp_path / "out"
    with StandinServer(StandinConfig(delay_s=0.02, max_batch=8)) as server:
        config = config_for(server, image_dir, out, mode="closed", levels=[1.0, 4.0])
        result = run_loadtest(config)
        received = server.standin.received
    assert not result.interrupted
    assert sum(len(run.records) for run in result.runs) == received  # every request sent was counted once
    c1, c4 = result.rows
    for row in result.rows:
        assert row["window_s"] == pytest.approx(1.5, abs=0.01)
        assert row["requests"] == row["sent"] == row["ok"] > 0 and row["errors"] == 0
        assert_percentiles_ordered(row)
        # the server's own count of /classify requests in the window: the measured ones, give or take the
        # requests in flight at the window's start
        assert abs(row["server_requests"] - row["requests"]) <= row["level"]
        assert row["server_inference_ms"] >= 20.0
    # closed loop, Little's law: clients = throughput x mean latency
    for row in result.rows:
        assert row["throughput_ips"] * row["latency_mean_ms"] / 1000 == pytest.approx(row["level"], rel=0.3)
    assert c1["server_batch_size"] == pytest.approx(1.0) and c4["server_batch_size"] > 1.2

    files = {p.name for p in out.iterdir()}
    assert {"requests_c1.csv", "requests_c4.csv", "summary.csv", "summary.json", "timeline.csv",
            "throughput.png", "latency.png", "timeline.png", "server_split.png"} <= files
    for run in result.runs:
        rows = read_csv(out / f"requests_{run.plan.label}.csv")
        assert len(rows) == len(run.records)
        measured = [r for r in rows if r["phase"] == "measure"]
        assert len(measured) == result.rows[result.runs.index(run)]["requests"]
        assert all(r["status"] == "200" and float(r["latency_ms"]) > 0 for r in measured)
    summary = read_csv(out / "summary.csv")
    assert [r["label"] for r in summary] == ["c1", "c4"]
    assert int(summary[1]["requests"]) == c4["requests"]
    document = json.loads((out / "summary.json").read_text())
    assert document["config"]["mode"] == "closed" and len(document["levels"]) == 2
    assert document["levels"][0]["errors_by_key"] == {}
    assert sum(b["ok"] for b in document["timeline"]) == sum(len(run.records) for run in result.runs)
    for name in ("throughput.png", "latency.png", "timeline.png", "server_split.png"):
        with Image.open(out / name) as png:
            assert png.format == "PNG" and png.width > 400 and png.height > 300


def test_open_loop_sends_on_its_schedule(image_dir, tmp_path):
    with StandinServer(StandinConfig(delay_s=0.005, max_batch=8)) as server:
        config = config_for(server, image_dir, tmp_path, mode="open", levels=[40.0], multipart=True)
        result = run_loadtest(config)
        received = server.standin.received
    (row,), (run,) = result.rows, result.runs
    assert row["requests"] == 60 and row["warmup_requests"] == 20  # 40/s x 1.5 s, 40/s x 0.5 s
    assert received == 80 and row["ok"] == 60 and row["dropped"] == 0  # multipart accepted too
    due = sorted(r.scheduled_s for r in run.records)
    assert np.allclose(np.diff(due), 1 / 40)
    assert all(r.sent_s >= r.scheduled_s for r in run.records)
    assert row["window_s"] == pytest.approx(1.5, abs=0.01)  # the schedule's span, not when answers stopped
    assert row["send_rate"] == pytest.approx(40, rel=0.05)
    assert row["throughput_ips"] == pytest.approx(40, rel=0.25)
    assert_percentiles_ordered(row)


def test_open_loop_latency_includes_schedule_lag_when_the_server_is_slower(image_dir, tmp_path):
    # one request at a time, 100 ms each (10/s) against 20/s offered: request k cannot go out before the
    # k-th answer, about 100k ms after start, though it was due at 50k ms
    with StandinServer(StandinConfig(delay_s=0.1, max_batch=1)) as server:
        config = config_for(server, image_dir, tmp_path, mode="open", levels=[20.0], warmup_s=0.0,
                            duration_s=1.0, max_inflight=1, lag_threshold_ms=20.0, scrape_metrics=False)
        result = run_loadtest(config)
    (row,), (run,) = result.rows, result.runs
    assert row["requests"] == row["ok"] == 20
    records = sorted(run.records, key=lambda r: r.index)
    for k, r in enumerate(records):
        assert r.latency_ms == pytest.approx(r.service_ms + (r.sent_s - r.scheduled_s) * 1000)
        assert r.latency_ms >= (100 * (k + 1) - 50 * k) * 0.95  # queueing behind the schedule is counted
    assert row["latency_max_ms"] > 900 and row["service_p95_ms"] < 400
    assert row["late"] >= 15  # requests that went out late are reported
    assert_percentiles_ordered(row)


def test_open_loop_drop_mode_counts_requests_it_could_not_send(image_dir, tmp_path):
    with StandinServer(StandinConfig(delay_s=0.2, max_batch=1)) as server:
        config = config_for(server, image_dir, tmp_path, mode="open", levels=[20.0], warmup_s=0.0,
                            duration_s=1.0, max_inflight=2, overflow="drop", scrape_metrics=False)
        result = run_loadtest(config)
        received = server.standin.received
    (row,) = result.rows
    assert row["requests"] == 20 and row["dropped"] > 5
    assert row["sent"] + row["dropped"] == row["requests"] and row["sent"] == received
    assert row["ok"] + row["errors"] == row["requests"] and row["errors_by_key"]["dropped"] == row["dropped"]


def test_429_answers_are_counted_as_errors_by_status(image_dir, tmp_path):
    with StandinServer(StandinConfig(delay_s=0.01, reject=True)) as server:
        config = config_for(server, image_dir, tmp_path, mode="closed", levels=[2.0], duration_s=1.0)
        result = run_loadtest(config)
        received = server.standin.received
    (row,), (run,) = result.rows, result.runs
    assert received == len(run.records)
    assert row["ok"] == 0 and row["errors_429"] == row["errors"] == row["requests"] > 0
    assert row["errors_by_key"] == {"429": row["requests"]}
    assert row["latency_p50_ms"] is None and row["throughput_ips"] == 0
    assert abs(row["server_rejected"] - row["requests"]) <= 2
    assert json.loads((tmp_path / "summary.json").read_text())["levels"][0]["errors_429"] == row["requests"]


def test_too_large_and_deadline_answers_are_counted_as_413_and_504(image_dir, tmp_path):
    images = ImageSet.from_folder(image_dir)
    limit = sorted(len(i.data) for i in images.images)[3]  # two of six images are too large
    with StandinServer(StandinConfig(delay_s=0.3, max_batch=1, max_bytes=limit, deadline_s=0.1)) as server:
        config = config_for(server, image_dir, tmp_path, mode="closed", levels=[3.0], duration_s=1.0,
                            warmup_s=0.0)
        result = run_loadtest(config)
    (row,), (run,) = result.rows, result.runs
    too_large = [r for r in run.measured() if r.bytes > limit]
    assert row["errors_413"] == len(too_large) > 0
    assert all(r.status == 413 for r in too_large)
    assert row["errors_504"] > 0 and row["errors_504"] + row["errors_413"] + row["ok"] == row["requests"]


def test_connection_errors_and_timeouts_are_counted(image_dir):
    images = ImageSet.from_folder(image_dir)

    async def one_level(url, timeout_s):
        plan = LevelPlan(mode="closed", level=2, label="c2", url=url, warmup_s=0.0, duration_s=0.6,
                         max_requests=50, drain_s=timeout_s + 1)
        async with ClientPool(2, timeout_s) as pool:
            run = LevelRun(plan, time.perf_counter())
            return await run_closed(pool, images, run, asyncio.Event())

    with StandinServer(StandinConfig(delay_s=1.0)) as server:
        slow = asyncio.run(one_level(server.url + "/classify", timeout_s=0.2))
        port_url = server.url
    refused = asyncio.run(one_level(port_url + "/classify", timeout_s=0.2))  # server gone: nothing listens
    assert slow.measured() and all(r.outcome == "timeout" for r in slow.measured())
    assert refused.measured() and all(r.outcome == "conn_error" for r in refused.measured())
    assert len(refused.measured()) <= 50  # the request cap holds even when every request fails at once


def test_request_cap_ends_a_level_before_its_duration(image_dir, tmp_path):
    with StandinServer(StandinConfig(delay_s=0.005)) as server:
        config = config_for(server, image_dir, tmp_path, mode="closed", levels=[2.0], duration_s=30.0,
                            warmup_s=0.0, max_requests=15)
        started = time.monotonic()
        result = run_loadtest(config)
    assert time.monotonic() - started < 10
    (row,) = result.rows
    assert row["requests"] == 15 and row["ok"] == 15 and row["window_s"] < 10


def test_unreachable_service_is_a_one_line_error(image_dir, tmp_path):
    with StandinServer() as server:
        url = server.url
    with pytest.raises(VggserveError, match="cannot reach"):
        run_loadtest(config_for(type("S", (), {"url": url}), image_dir, tmp_path, levels=[1.0]))


def test_ctrl_c_stops_the_run_and_still_writes_what_was_measured(image_dir, tmp_path):
    out = tmp_path / "out"
    with StandinServer(StandinConfig(delay_s=0.02)) as server:
        command = [sys.executable, "-m", "vggserve", "loadtest", "--url", server.url, "--images", str(image_dir),
                   "--concurrency", "2,4", "--duration", "60", "--warmup", "0.2", "--output", str(out)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 30
            while server.standin.received < 20 and time.monotonic() < deadline:
                time.sleep(0.1)
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, stderr
    document = json.loads((out / "summary.json").read_text())
    assert document["interrupted"] is True and len(document["levels"]) == 1
    level = document["levels"][0]
    assert level["label"] == "c2" and level["ok"] > 0 and level["window_s"] < 30
    assert len(read_csv(out / "requests_c2.csv")) >= level["requests"]
    assert (out / "throughput.png").exists() and "c2" in stdout  # the table is printed too
    assert "Traceback" not in stderr


def test_a_stalled_server_cannot_hold_a_level_past_its_drain_limit(image_dir, tmp_path):
    # every answer takes 3 s, the client gives up after 0.3 s, one request at a time: most due requests wait
    # for a slot, and those still waiting at schedule end + drain limit (timeout + 1 s) are cancelled
    with StandinServer(StandinConfig(delay_s=3.0, max_batch=1, deadline_s=0.5)) as server:
        config = config_for(server, image_dir, tmp_path, mode="open", levels=[10.0], warmup_s=0.0,
                            duration_s=1.0, max_inflight=1, timeout_s=0.3, scrape_metrics=False)
        result = run_loadtest(config)
    (row,), (run,) = result.rows, result.runs
    assert run.end_s - run.window_end_s < 1.3 + 0.3  # ended within the drain limit after the schedule
    assert row["requests"] == 10 and row["errors_timeout"] + row["cancelled"] == 10
    assert row["cancelled"] > 0 and row["ok"] == 0 and not row["interrupted"]


def test_the_standin_says_where_it_listens_and_then_answers(tmp_path):
    """`python -m vggserve.loadtest.standin` printed nothing: whoever started it could not tell when it was ready."""
    import httpx

    process = subprocess.Popen([sys.executable, "-m", "vggserve.loadtest.standin", "--port", "0"],
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        import select

        assert select.select([process.stderr], [], [], 60)[0], "nothing said within 60 s"
        line = process.stderr.readline()
        assert line.startswith("vggserve stand-in: listening on http://127.0.0.1:"), line
        url = line.split()[4]
        assert httpx.get(f"{url}/health/ready", timeout=30).json() == {"ready": True}
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_standin_on_a_taken_port_is_a_one_line_error():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "vggserve.loadtest.standin", "--port", str(port)],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use: choose another --port" in done.stderr
