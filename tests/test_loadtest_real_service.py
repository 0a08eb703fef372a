"""The harness against a real `vggserve serve` process (tiny generated weights, CPU, 127.0.0.1): both loops
for a few seconds each; the harness's counts must agree with the service's own /metrics, and 429s from a
full queue must be counted as such."""

import httpx
import numpy as np
import pytest
from PIL import Image

from vggserve.loadtest import LoadTestConfig, run_loadtest
from vggserve.loadtest.metrics import Snapshot
from vggserve.testing.servers import ServerProcess

PCT_KEYS = ("latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for i, (w, h) in enumerate([(48, 32), (256, 256), (320, 180), (100, 150)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"p{i}.jpg")
    return folder


def serve(weights, *extra):
    return ServerProcess.serve_cli(["--weights", str(weights), "--device", "cpu", "--max-wait-ms", "20",
                                    "--log-level", "warning", *extra])


def classify_total(url) -> float:
    snapshot = Snapshot.parse(httpx.get(url + "/metrics", timeout=10).text)
    return snapshot.total("vggserve_requests_total", endpoint="/classify") or 0.0


def config(url, image_dir, out, **overrides):
    settings = dict(url=url, images=image_dir, output=out, warmup_s=0.5, duration_s=2.5, timeout_s=30.0,
                    progress=False)
    settings.update(overrides)
    return LoadTestConfig(**settings)


def test_both_loops_against_the_real_service_agree_with_its_metrics(tiny_weights_path, image_dir, tmp_path):
    with serve(tiny_weights_path, "--max-batch-size", "4") as server:
        server.wait_ready(timeout_s=120)
        before = classify_total(server.url)
        closed = run_loadtest(config(server.url, image_dir, tmp_path / "closed", mode="closed", levels=[2.0]))
        opened = run_loadtest(config(server.url, image_dir, tmp_path / "open", mode="open", levels=[3.0],
                                     warmup_s=0.0, duration_s=2.0))
        after = classify_total(server.url)
    sent = sum(len(run.records) for result in (closed, opened) for run in result.runs)
    assert after - before == sent  # every request the harness sent, the service counted, and no more
    (c2,), (r3,) = closed.rows, opened.rows
    assert c2["requests"] == c2["ok"] > 0 and c2["errors"] == 0
    assert r3["requests"] == 6 and r3["ok"] + r3["errors"] == 6  # 3/s for 2 s, each accounted for
    for row in (c2, r3):
        values = [row[k] for k in PCT_KEYS]
        assert values == sorted(values) and values[0] > 0
        assert row["server_inference_ms"] > 0 and row["server_batch_size"] >= 1
        assert row["server_queue_ms"] is not None and row["server_preprocess_ms"] is not None
    assert (tmp_path / "open" / "requests_r3.csv").exists() and (tmp_path / "closed" / "latency.png").exists()


def test_full_queue_answers_are_counted_as_429(tiny_weights_path, image_dir, tmp_path):
    with serve(tiny_weights_path, "--max-batch-size", "1", "--max-queue", "1", "--max-files", "1") as server:
        server.wait_ready(timeout_s=120)
        result = run_loadtest(config(server.url, image_dir, tmp_path, mode="closed", levels=[6.0],
                                     warmup_s=0.0, duration_s=2.0))
    (row,) = result.rows
    assert row["errors_429"] > 0 and row["ok"] > 0
    assert row["ok"] + row["errors"] == row["requests"]
    assert row["errors_by_key"].get("429") == row["errors_429"]
    assert row["server_rejected"] == pytest.approx(row["errors_429"], abs=6)


def test_protocol_v2_drives_the_v2_infer_endpoint(tiny_weights_path, image_dir, tmp_path):
    """`vggserve loadtest --protocol v2`: binary tensor data to /v2/models/vgg16/infer, every answer a 200."""
    with serve(tiny_weights_path, "--max-batch-size", "4") as server:
        server.wait_ready(timeout_s=120)
        result = run_loadtest(config(server.url, image_dir, tmp_path, mode="closed", levels=[2.0], protocol="v2"))
        snapshot = Snapshot.parse(httpx.get(server.url + "/metrics", timeout=10).text)
    (row,) = result.rows
    assert row["requests"] == row["ok"] > 0 and row["errors"] == 0
    counted = snapshot.total("vggserve_requests_total", endpoint="/v2/models/vgg16/infer", status="200")
    assert counted == sum(len(run.records) for run in result.runs)
    assert row["server_inference_ms"] > 0


def test_protocol_flag_reaches_the_config():
    from vggserve.cli import build_parser
    from vggserve.cli.loadtest import build_config
    from vggserve.errors import VggserveError

    args = build_parser().parse_args(["loadtest", "--url", "http://127.0.0.1:1", "--images", ".", "--protocol", "v2"])
    config_v2 = build_config(args)
    assert config_v2.protocol == "v2" and config_v2.classify_url.endswith("/v2/models/vgg16/infer")
    with pytest.raises(VggserveError, match="--multipart"):
        build_config(build_parser().parse_args(["loadtest", "--url", "http://127.0.0.1:1", "--images", ".",
                                                "--protocol", "v2", "--multipart"]))
