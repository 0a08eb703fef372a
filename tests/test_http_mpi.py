"""`mpiexec -n 2 vggserve serve` on loopback with the CPU engine and the tiny weights: rank 0 serves HTTP and each
batch is sharded over both ranks; results equal the single-process engine's; SIGTERM drains and every rank exits."""

import shutil
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from image_corpus import build_corpus

from vggserve.testing.servers import ServerProcess

pytestmark = pytest.mark.mpi


def test_two_ranks_serve_sharded_batches_and_drain_on_sigterm(tiny_weights_path, tmp_path):
    from vggserve.model.vgg16 import VGG16

    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found: install the `mpich` package (pip install mpich)"
    files = build_corpus(tmp_path)
    names = ["rgba.png", "palette.png", "cmyk.jpg", "photo.webp"]
    with VGG16.load(tiny_weights_path, device="cpu", max_batch_size=2) as model:
        expected = model.classify([files[n] for n in names], top_k=3)
        x = np.random.default_rng(2).standard_normal((3, 3, 224, 224)).astype(np.float32)
        want_logits = model.logits(x)

    # the CPU on every rank: two ranks would need two GPUs ("gpu" means GPU number <local rank>)
    args = ["--weights", str(tiny_weights_path), "--device", "cpu", "--max-batch-size", "2", "--max-wait-ms", "300",
            "--log-level", "warning"]
    with ServerProcess.serve_cli(args, launcher=[mpiexec, "-n", "2"]) as server, httpx.Client(timeout=120) as http:
        server.wait_ready(180)
        meta = http.get(server.url + "/metadata").json()
        assert meta["mpi"] is True
        assert meta["max_batch_size"] == 4  # 2 per rank x 2 ranks
        assert meta["devices"][0]["name"].startswith("2 ranks:")

        def post(name):
            with open(files[name], "rb") as f:
                return http.post(server.url + "/classify?top_k=3", files={"file": (name, f.read())})

        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(post, names))
        for name, r, want in zip(names, responses, expected):
            assert r.status_code == 200, r.text
            got = r.json()["predictions"]
            assert [p["index"] for p in got] == [p["index"] for p in want], name
            assert [p["probability"] for p in got] == pytest.approx([p["probability"] for p in want], rel=1e-5,
                                                                    abs=1e-7)
        metrics = http.get(server.url + "/metrics").text
        assert "vggserve_batch_size_count" in metrics

        # the Open Inference Protocol on the same sharded batches: an FP32 tensor's logits, with tritonclient
        client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120.0)
        given = triton.InferInput("input", [3, 3, 224, 224], "FP32")
        given.set_data_from_numpy(x)
        result = client.infer("vgg16", [given], outputs=[triton.InferRequestedOutput("logits")])
        np.testing.assert_allclose(result.as_numpy("logits"), want_logits, rtol=1e-4, atol=1e-5)

        server.signal(signal.SIGTERM)  # to mpiexec, which forwards it to both ranks
        assert server.wait(60) == 0, server.output()[-3000:]
        assert "Traceback" not in server.output()
