"""`vggserve serve --decode gpu|auto` (serving/scheduling/devicedecode.py): JPEGs the device decoder takes go to the
engine compressed and are decoded on its device; every other file is decoded on the CPU as under --decode exact.

With the real engine (tiny weights, on the test device: PoCL in CI), in one process and with --http-workers 2:
logits and probabilities identical to --decode exact for a small corpus (4:2:0, 4:4:4, 4:2:2 at an odd size, grey,
restart markers, EXIF-rotated, progressive, PNG, a corrupt stream Pillow still decodes), and the same status and JSON
body for a JPEG whose header parses but whose stream is cut short, and for one over --max-pixels; with --decode
auto on the test device said to be a GPU, the same answers, the JPEGs decoded on the device. Without it: the
settings and defaults, where each file is routed and why, and stand-in models, which never see an encoded input."""

import asyncio
import base64
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

import jpeg_corpus as corpus
from conftest import TEST_DEVICE
from test_device_jpeg import with_exif_orientation
from test_http_process import wait_until
from vggserve.decoding.device import parse
from vggserve.errors import ImageError
from vggserve.modelinput import ModelInput
from vggserve.serving import Settings, create_app
from vggserve.serving.metrics import Metrics
from vggserve.serving.scheduling.batcher import Item
from vggserve.serving.scheduling.devicedecode import ON_DEVICE, DeviceDecoding, route
from vggserve.serving.scheduling.imaging import decode_and_crop
from vggserve.serving.settings import SettingsError

MAX_PIXELS = 100_000  # the corpus's images are within it; OVER is not
DECODED = "vggserve_decoded_images_total"


def jpeg(w, h, seed=0, **options) -> bytes:
    return corpus.pillow_jpeg(corpus.picture(w, h, seed), quality=90, **options)


def service_corpus() -> dict[str, bytes]:
    """name -> file: what the tests send (`good`: answered 200 by both decoders; `errors`: 4xx by both)."""
    s420 = jpeg(300, 200, 1, subsampling=2)
    png = io.BytesIO()
    Image.fromarray(corpus.picture(120, 90, 4)).save(png, "PNG")
    start = parse(s420).scan_start
    return {
        "s420.jpg": s420,
        "s444_crop.jpg": jpeg(256, 300, 2, subsampling=0),  # Resize(256) keeps it: the device writes its crop
        "s422_odd.jpg": jpeg(333, 251, 3, subsampling=1),
        "grey.jpg": corpus.pillow_jpeg(corpus.picture(240, 250, 5, gray=True), quality=85),
        "restart.jpg": jpeg(260, 230, 6, subsampling=2, restart_marker_blocks=3),
        "exif6.jpg": with_exif_orientation(s420, 6),
        "progressive.jpg": jpeg(200, 150, 7, progressive=True),
        "palette.png": png.getvalue(),
        "zeros_for_data.jpg": s420[:start] + b"\x00" * 5000 + b"\xff\xd9",  # Pillow decodes it, grey garbage
    }


ERRORS = {"truncated.jpg": lambda s420: s420[:len(s420) // 2],  # its header parses: the device takes it, and flags it
          "over_limit.jpg": lambda s420: jpeg(400, 300, 8)}  # 120,000 pixels > MAX_PIXELS


def error_files() -> dict[str, bytes]:
    s420 = service_corpus()["s420.jpg"]
    return {name: make(s420) for name, make in ERRORS.items()}


def infer(client, data: bytes, path_prefix: str = "") -> tuple[int, dict]:
    """v2 inference of one file asking for logits and probabilities (the probabilities are then the softmax of the
    logits, on the CPU, whatever else the batch holds)."""
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                        "data": [base64.b64encode(data).decode()]}],
            "outputs": [{"name": "logits"}, {"name": "probabilities"}]}
    r = client.post(path_prefix + "/v2/models/vgg16/infer", json=body)
    return r.status_code, r.json()


def answers(client, prefix: str = "") -> dict:
    """Every answer the tests compare between decoders: v2 logits and probabilities of each file (sent at once, so
    batches mix files of both paths), /classify's status and body for the error files, and one /classify/batch."""
    wait_until(lambda: client.get(prefix + "/health/ready").status_code == 200, 240, "the service to be ready")
    files = {**service_corpus(), **error_files()}
    with ThreadPoolExecutor(4) as pool:
        v2 = dict(zip(files, pool.map(lambda d: infer(client, d, prefix), files.values())))
    singles = {}
    for name, data in error_files().items():
        r = client.post(prefix + "/classify", content=data, headers={"content-type": "image/jpeg"})
        singles[name] = (r.status_code, r.json())
    names = ["s420.jpg", "truncated.jpg", "palette.png", "over_limit.jpg"]
    r = client.post(prefix + "/classify/batch",
                    files=[("files", (n, files[n], "image/png" if n.endswith(".png") else "image/jpeg"))
                           for n in names])
    batch = [{k: v for k, v in entry.items() if k != "timing_ms"} for entry in r.json()["results"]]
    return {"v2": v2, "classify": singles, "batch": (r.status_code, batch)}


def decoded_counts(metrics_text: str) -> dict:
    """{(path, reason): count} of vggserve_decoded_images_total."""
    return {(s.labels["path"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(metrics_text) for s in family.samples
            if s.name == DECODED}


def check_same_answers(got: dict, want: dict) -> None:
    for name, (status, body) in want["v2"].items():
        assert got["v2"][name][0] == status, (name, got["v2"][name])
        if status == 200:
            outputs = {o["name"]: o["data"] for o in body["outputs"]}
            got_outputs = {o["name"]: o["data"] for o in got["v2"][name][1]["outputs"]}
            assert got_outputs["logits"] == outputs["logits"], f"{name}: logits differ"
            assert got_outputs["probabilities"] == outputs["probabilities"], f"{name}: probabilities differ"
        else:
            assert got["v2"][name][1] == body, name
    assert got["classify"] == want["classify"]
    assert got["batch"] == want["batch"]


def one_process_app(tiny_tensors, decode: str, procs: int = 0):
    from vggserve.model.vgg16 import VGG16

    settings = Settings(decode=decode, max_batch_size=4, max_wait_ms=200, max_pixels=MAX_PIXELS, max_files=4,
                        preprocess_procs=procs, preprocess_threads=2)
    return create_app(settings, model_factory=lambda device: VGG16(tiny_tensors, device=TEST_DEVICE,
                                                                   max_batch_size=4))


@pytest.fixture(scope="module")
def exact_answers(tiny_tensors):
    with TestClient(one_process_app(tiny_tensors, "exact")) as client:
        out = answers(client)
    # the test means something only if the corpus is what it says: the good files are 200, the others 4xx
    assert [s for s, _ in out["v2"].values()] == [200] * len(service_corpus()) + [400, 400]
    assert {n: s for n, (s, _) in out["classify"].items()} == {"truncated.jpg": 400, "over_limit.jpg": 413}
    return out


# ---- the real engine ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("procs", [0, 1], ids=["decoding threads", "a decoding process"])
def test_one_process_with_decode_gpu_answers_as_decode_exact(tiny_tensors, exact_answers, procs):
    with TestClient(one_process_app(tiny_tensors, "gpu", procs)) as client:
        got = answers(client)
        meta = client.get("/metadata").json()
        assert (meta["decode"], meta["decodes_on_device"]) == ("gpu", True)
        counts = decoded_counts(client.get("/metrics").text)
    check_same_answers(got, exact_answers)
    # s420, s444, s422, grey, restart, exif6 (v2) and s420 (batch) on the device; truncated (v2, /classify, batch)
    # flagged there and refused on the CPU; zeros_for_data flagged and decoded on the CPU
    assert counts[("device", ON_DEVICE)] == 7
    assert counts[("cpu", "stream")] == 4
    assert counts[("cpu", "other_format")] == 2 and counts[("cpu", "jpeg_kind")] == 1
    assert counts[("cpu", "header")] == 3  # over_limit: v2, /classify, batch


def test_http_workers_with_decode_gpu_answer_as_decode_exact(tiny_weights_path, exact_answers):
    import httpx

    from test_http_frontends import running
    from vggserve.testing.servers import ServerProcess

    args = ["--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--max-batch-size", "4",
            "--max-wait-ms", "200", "--max-pixels", str(MAX_PIXELS), "--max-files", "4", "--preprocess-threads", "2",
            "--http-workers", "2", "--decode", "gpu", "--log-level", "warning"]
    with running(ServerProcess.serve_cli(args)) as server:
        server.wait_ready(240)
        with httpx.Client(base_url=server.url, timeout=300) as client:
            got = answers(client)
            counts = decoded_counts(client.get("/metrics").text)
    check_same_answers(got, exact_answers)
    assert counts[("device", ON_DEVICE)] == 7 and counts[("cpu", "stream")] == 4  # counted in the engine
    assert counts[("cpu", "header")] == 3  # counted in the front ends, summed in one scrape


# ---- without it ----------------------------------------------------------------------------------------------------

def test_serve_takes_decode_gpu_and_auto_and_the_cpu_path_then_decodes_exactly():
    from vggserve.cli import build_parser, serve

    parser = build_parser()
    for mode in ("gpu", "auto"):
        settings = serve._settings(parser.parse_args(["serve", "--decode", mode]))
        assert settings.decode == mode and settings.cpu_decode == "exact"
    assert serve._settings(parser.parse_args(["serve"])).decode == "auto"  # as classify and batch
    for command in ("classify", "batch"):
        args = ["x.jpg"] if command == "classify" else ["--input", "in", "--output", "out.jsonl"]
        assert parser.parse_args([command, *args]).decode == "auto"
    assert Settings(decode="fast").cpu_decode == "fast"
    with pytest.raises(SettingsError, match="--decode must be one of exact, fast, gpu, auto"):
        Settings(decode="nvjpeg")


def test_serve_and_classify_help_say_auto_is_the_default_and_how_it_chooses(capsys):
    from vggserve.cli import build_parser

    helped = {}
    for command in ("serve", "classify"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        helped[command] = " ".join(capsys.readouterr().out.split())
    for command in ("serve", "classify"):
        assert "auto (default): gpu where the device is a GPU, else exact" in helped[command]
        assert "exact: every pixel decoded, torchvision's preprocessing bit for bit;" in helped[command]


def test_gpu_sends_a_jpeg_the_device_takes_from_the_event_loop_and_leaves_the_others_to_the_threads():
    """Under gpu (and auto) the front end decides on its event loop (a parse of the markers): a photo the device
    decodes goes without the hop to a decoding thread and back; a file it refuses still goes to a thread, which
    decodes it or raises the CPU path's error, and counts why."""
    from vggserve.serving.processes.inline import decodes_inline

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (250, 390, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)  # < MAX_PIXELS
    photo = buf.getvalue()
    assert not decodes_inline(photo)  # too large to decode on the loop: the threads' before

    class Refusing(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            raise AssertionError("a decoding thread was asked")

    gpu = remote_backend("gpu")
    threads, gpu.pool = gpu.pool, Refusing(1)
    try:
        got, seconds = asyncio.run(gpu.prepare(photo))
        assert got.form == "encoded" and seconds >= 0 and cpu_counts(gpu) == {}
        gpu.pool = threads
        assert prepared(gpu, service_corpus()["progressive.jpg"]).form == "image"
        with pytest.raises(ImageError):
            prepared(gpu, error_files()["over_limit.jpg"])
        assert cpu_counts(gpu) == {("cpu", "jpeg_kind"): 1, ("cpu", "header"): 1}
    finally:
        threads.shutdown()


def test_only_files_the_device_decodes_are_routed_to_it_and_the_others_say_why():
    s420 = service_corpus()["s420.jpg"]
    assert route(s420, MAX_PIXELS) == ON_DEVICE
    assert route(error_files()["truncated.jpg"], MAX_PIXELS) == ON_DEVICE  # the device flags its stream later
    assert route(service_corpus()["palette.png"], MAX_PIXELS) == "other_format"
    assert route(service_corpus()["progressive.jpg"], MAX_PIXELS) == "jpeg_kind"
    assert route(error_files()["over_limit.jpg"], MAX_PIXELS) == "header"
    assert route(s420, MAX_PIXELS, formats=("PNG",)) == "header"


def test_a_stand_in_model_is_never_sent_encoded_inputs():
    from vggserve.testing.models import PipelinedModel

    models = []

    def factory(device):
        models.append(PipelinedModel(device, seconds_per_batch=0.0))
        return models[-1]

    with TestClient(create_app(Settings(decode="gpu", warmup=False, preprocess_procs=0), model_factory=factory)) as c:
        r = c.post("/classify", content=service_corpus()["s420.jpg"], headers={"content-type": "image/jpeg"})
        assert r.status_code == 200, r.text
        assert c.get("/metadata").json()["decodes_on_device"] is False
        counts = decoded_counts(c.get("/metrics").text)
    assert [x.dtype for x in models[0].submitted] == [np.float32]  # a tensor, decoded on the CPU
    assert counts == {("cpu", "no_device"): 1.0}


def test_auto_decodes_on_the_device_only_on_a_gpu_and_only_with_the_engine():
    from types import SimpleNamespace

    from vggserve.serving.scheduling.devicedecode import decodes_on_device

    class Engine:  # what decodes_on_device asks of the engine
        resizes_on_device = True

        def __init__(self, kind):
            self.device_info, self.built = SimpleNamespace(kind=kind), 0

        def submit(self, x, want="logits"):
            raise AssertionError("not computed here")

        def resize_matches_pillow(self):
            return True

        def jpeg_decoder(self):
            self.built += 1

    gpu, cpu = Engine("gpu"), Engine("cpu")
    assert decodes_on_device(gpu, "auto") and gpu.built == 1  # its kernels built before the worker is ready
    assert not decodes_on_device(cpu, "auto") and decodes_on_device(cpu, "gpu")
    assert not decodes_on_device(gpu, "exact") and not decodes_on_device(gpu, "fast")
    from vggserve.testing.models import PipelinedModel

    assert not decodes_on_device(PipelinedModel(), "gpu")  # a stand-in: no jpeg_decoder


def test_batches_whose_every_image_fails_to_decode_leave_the_worker_serving():
    """A batch left empty by its decoding errors is not submitted, and gives its in-flight slot back: three in a
    row (more than the runner's two slots), then an image that decodes is still computed."""
    from vggserve.serving.service import Service
    from vggserve.testing.models import PipelinedModel

    models = []

    def factory(device):
        models.append(PipelinedModel(device, seconds_per_batch=0.0))
        return models[-1]

    service = Service(Settings(decode="gpu", warmup=False, max_batch_size=1, max_wait_ms=0), factory)
    service.start()
    try:
        wait_until(lambda: service.readiness()[0], 30, "the stand-in to be ready")
        queue = service.backend.queue
        for _ in range(3):
            queue.admit(1)
            item = queue.submit(ModelInput.encoded(error_files()["truncated.jpg"]), float("inf"))
            assert isinstance(item.future.exception(timeout=30), ImageError)
        queue.admit(1)
        good = queue.submit(ModelInput.encoded(service_corpus()["s420.jpg"]), float("inf"))
        assert good.future.result(timeout=30).probabilities.shape == (1000,)
        assert service.backend.workers[0].state == "ready"
    finally:
        service.stop()
    assert len(models[0].submitted) == 1


def test_encoded_inputs_reaching_a_worker_without_device_decoding_are_decoded_on_the_cpu():
    """Several device workers, only some of which decode on their device: the front end may send one of the others
    a JPEG as it is; that worker decodes it on the CPU, as --decode exact, and answers a bad one with its error."""
    metrics = Metrics()
    decoding = DeviceDecoding(metrics, "gpu", MAX_PIXELS)
    good, bad = service_corpus()["s420.jpg"], error_files()["truncated.jpg"]
    tensor = ModelInput.tensor(np.zeros((3, 224, 224), np.float32))
    batch = [Item(ModelInput.encoded(good), 0.0), Item(ModelInput.encoded(bad), 0.0), Item(tensor, 0.0)]
    kept, inputs = decoding.decode(model=None, batch=batch, on_device=False, preprocessing="torchvision")
    assert kept == [batch[0], batch[2]] and inputs[1] is tensor
    assert inputs[0].form == "crop"
    np.testing.assert_array_equal(inputs[0].array, decode_and_crop(good, "torchvision", MAX_PIXELS)[0].array)
    with pytest.raises(ImageError) as cpu_error:
        decode_and_crop(bad, "torchvision", MAX_PIXELS)
    error = batch[1].future.exception()
    assert (type(error), str(error)) == (type(cpu_error.value), str(cpu_error.value))
    assert metrics.decoded.labels(path="cpu", reason="no_device")._value.get() == 2


def test_a_batch_with_tensors_or_a_failing_device_decoder_decodes_its_jpegs_on_the_cpu(caplog):
    """A batch that also holds v2 tensors runs as tensors: its JPEGs are decoded on the CPU (tensor_batch); a device
    decoder that fails on a batch is logged and the batch decoded on the CPU (device_error), the worker serving on."""

    class Broken:
        def jpeg_decoder(self):
            raise RuntimeError("out of device memory")

    metrics = Metrics()
    decoding = DeviceDecoding(metrics, "gpu", MAX_PIXELS)
    good = service_corpus()["s420.jpg"]
    want = decode_and_crop(good, "torchvision", MAX_PIXELS)[0].array
    tensor = ModelInput.tensor(np.zeros((3, 224, 224), np.float32))
    for model, batch in ((None, [ModelInput.encoded(good), tensor]), (Broken(), [ModelInput.encoded(good)])):
        kept, inputs = decoding.decode(model, [Item(x, 0.0) for x in batch], on_device=True,
                                       preprocessing="torchvision")
        assert len(kept) == len(batch) and inputs[0].form == "crop"
        np.testing.assert_array_equal(inputs[0].array, want)
    assert metrics.decoded.labels(path="cpu", reason="tensor_batch")._value.get() == 1
    assert metrics.decoded.labels(path="cpu", reason="device_error")._value.get() == 1
    assert "the device JPEG decoder failed on a batch of 1 image;" in caplog.text


def test_an_image_error_crosses_the_engine_link_as_itself():
    """engine_host answers every failure that is not the scheduler's as a 500 internal_error; an ImageError of a
    file the device passed to the CPU path must reach the front end as itself (the 4xx the CPU path gives)."""
    from vggserve.images import ImageDecodeError
    from vggserve.serving.processes.engine_host import Answer, FrontEndPeer

    sent = []
    peer = FrontEndPeer.__new__(FrontEndPeer)
    peer._items, peer._lock, peer.index = {}, threading.Lock(), 0
    peer.link = type("Link", (), {"send": lambda self, message: sent.append(message)})()
    Answer(peer, 7).set_exception(ImageDecodeError("input is truncated: its image data ends early"))
    Answer(peer, 8).set_exception(ValueError("a bug"))
    assert sent[0][:2] == ("error", 7) and isinstance(sent[0][2], ImageDecodeError)
    assert sent[1][:2] == ("error", 8) and sent[1][2].code == "internal_error" and "ValueError" in str(sent[1][2])


# ---- --decode auto on a GPU: every JPEG the device takes goes to it, as under gpu ----------------------------------

def remote_backend(decode: str, decodes_on_device: bool = True, threads: int = 2):
    """A front-end process's backend as it prepares uploads, its engine's state set by hand (no engine)."""
    from vggserve.serving.processes.remote import RemoteBackend

    settings = Settings(decode=decode, max_pixels=MAX_PIXELS, preprocess_threads=threads, http_workers=2)
    backend = RemoteBackend(settings, Metrics(), "unused", b"unused", 0)
    backend.engine.state = {"info": {"decodes_on_device": decodes_on_device, "resizes_on_device": True,
                                     "preprocessing": "torchvision"}}
    backend.pool = ThreadPoolExecutor(threads)
    return backend


def prepared(backend, data: bytes) -> ModelInput:
    return asyncio.run(backend.prepare(data))[0]


def cpu_counts(backend) -> dict:
    return {k: v for k, v in decoded_counts(backend.metrics.render()[0].decode()).items() if v}


def test_auto_sends_every_jpeg_the_device_takes_compressed_and_decodes_the_others_on_the_cpu():
    """auto once decoded a JPEG in the front end while a decoding thread was idle: it lost to gpu on an H100 and an
    H200 (BENCHMARKS.md, twelfth and twenty-eighth sessions), so under auto a front end idle or busy sends it."""
    for mode in ("auto", "gpu"):
        backend = remote_backend(mode, threads=2)
        corpus_, errors = service_corpus(), error_files()
        try:
            assert prepared(backend, corpus_["s420.jpg"]).form == "encoded"  # on the event loop, no thread
            assert prepared(backend, corpus_["palette.png"]).form == "image"  # not a JPEG: the CPU
            assert cpu_counts(backend) == {("cpu", "other_format"): 1}
            with pytest.raises(ImageError):
                prepared(backend, errors["over_limit.jpg"])  # the CPU path's error, as under exact
            assert cpu_counts(backend) == {("cpu", "other_format"): 1, ("cpu", "header"): 1}
        finally:
            backend.pool.shutdown()


def test_auto_and_gpu_decode_on_the_cpu_when_the_engine_does_not_decode_on_its_device():
    s420 = service_corpus()["s420.jpg"]
    for mode in ("auto", "gpu"):
        off = remote_backend(mode, decodes_on_device=False)
        try:
            assert prepared(off, s420).form == "image"
            assert prepared(off, s420).form == "image"
            assert cpu_counts(off) == {("cpu", "no_device"): 2}
        finally:
            off.pool.shutdown()


def test_auto_with_decoding_processes_sends_a_jpeg_the_device_takes_compressed():
    """One process, --preprocess-procs: a JPEG the device takes never goes to a decoding process."""
    from types import SimpleNamespace

    from vggserve.serving.scheduling.local import LocalBackend

    class Procs:
        async def run(self, data, mode, max_pixels):
            return decode_and_crop(data, mode, max_pixels)

    settings = Settings(decode="auto", max_pixels=MAX_PIXELS, preprocess_procs=1, preprocess_threads=2)
    backend = LocalBackend(settings, Metrics())
    backend.workers = [SimpleNamespace(info={"decodes_on_device": True, "preprocessing": "torchvision"})]
    backend.pool, backend.procs = ThreadPoolExecutor(2), Procs()
    corpus_ = service_corpus()
    try:
        assert prepared(backend, corpus_["s420.jpg"]).form == "encoded"
        assert prepared(backend, corpus_["palette.png"]).form == "crop"  # a process decodes it
        assert cpu_counts(backend) == {("cpu", "other_format"): 1}
    finally:
        backend.pool.shutdown()


def test_one_process_with_decode_auto_on_a_gpu_decodes_on_the_device_under_load_and_answers_as_decode_exact(
        tiny_tensors, exact_answers):
    import dataclasses

    from vggserve.model.vgg16 import VGG16

    def on_a_gpu(device):  # the test device (PoCL) said to be a GPU: what --decode auto asks of it
        model = VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=4)
        model.device_info = dataclasses.replace(model.device_info, kind="gpu")
        return model

    settings = Settings(decode="auto", max_batch_size=4, max_wait_ms=200, max_pixels=MAX_PIXELS, max_files=4,
                        preprocess_procs=0, preprocess_threads=2)
    app = create_app(settings, model_factory=on_a_gpu)
    with TestClient(app) as client:
        got = answers(client)
        load = {**service_corpus(), **error_files()}
        with ThreadPoolExecutor(6) as pool:
            again = list(pool.map(lambda d: infer(client, d), list(load.values()) * 2))
        meta = client.get("/metadata").json()
        counts = decoded_counts(client.get("/metrics").text)
    check_same_answers(got, exact_answers)
    for round_ in (again[:len(load)], again[len(load):]):
        check_same_answers({**got, "v2": dict(zip(load, round_))}, exact_answers)
    assert (meta["decode"], meta["decodes_on_device"]) == ("auto", True)
    assert counts[("device", ON_DEVICE)] > 0 and ("cpu", "spare_cpu") not in counts


# ---- decode groups: several batches' JPEGs in one device decode (--decode-group) ------------------------------------

class OnTestDevice:
    """What DeviceDecoding asks of a model: the device JPEG decoder, its queue and lock, on the test device."""

    def __init__(self):
        import pyopencl as cl

        from vggserve.decoding.device import JpegDecoder
        from vggserve.runtime import devices

        device = devices.cl_device(devices.resolve(TEST_DEVICE))
        context = cl.Context([device])
        self.queue = cl.CommandQueue(context)
        self._jpeg = (JpegDecoder(context, device), self.queue, threading.Lock())

    def jpeg_decoder(self):
        return self._jpeg


def group_batches() -> list[list[bytes]]:
    """Three batches of files of several sizes: JPEGs the device decodes, a PNG (the CPU path, as its fallback), a
    stream it flags but Pillow decodes, and a corrupt one (an ImageError)."""
    files, bad = service_corpus(), error_files()
    return [[files["s420.jpg"], files["s444_crop.jpg"], files["palette.png"]],
            [bad["truncated.jpg"], files["s422_odd.jpg"], files["zeros_for_data.jpg"], jpeg(97, 61, 11)],
            [files["grey.jpg"], files["exif6.jpg"], jpeg(310, 300, 12, subsampling=2)]]


def as_items(datas: list[bytes]) -> list[Item]:
    return [Item(ModelInput.encoded(data), float("inf")) for data in datas]


def answered(model, batch: list[Item], kept: list[Item], inputs: list) -> list:
    """Per item of `batch`, what the decode gave it, comparable: ("device", kind, pixels), (form, array) or the
    error's (type, text)."""
    import pyopencl as cl

    from vggserve.decoding.device.onmodel import DeviceImage

    given = dict(zip(map(id, kept), inputs))
    out = []
    for item in batch:
        x = given.get(id(item))
        if x is None:
            error = item.future.exception(timeout=0)
            out.append((type(error).__name__, str(error)))
        elif isinstance(x, DeviceImage):
            host = np.empty(x.width * x.height * 3, np.uint8)
            cl.enqueue_copy(model.queue, host, x.buffer, src_offset=x.offset)
            out.append(("device", x.kind, host.reshape(x.height, x.width, 3)))
        else:
            out.append((x.form, x.array))
    return out


def device_decodes(metrics: Metrics) -> tuple[float, float]:
    """(batches, device decodes) of vggserve_device_decode_batches."""
    value = metrics.registry.get_sample_value
    return value("vggserve_device_decode_batches_sum"), value("vggserve_device_decode_batches_count")


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(
        np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(x, y)) for x, y in zip(a, b))


@pytest.mark.parametrize("group_bytes", [None, 0], ids=["one decode", "one decode per batch by GROUP_BYTES"])
def test_decode_group_answers_each_batch_as_decoding_it_alone(group_bytes):
    from vggserve.decoding.groups import GROUP_BYTES

    model = OnTestDevice()
    batches = group_batches()
    alone, grouped = Metrics(), Metrics()
    single = DeviceDecoding(alone, "gpu", MAX_PIXELS)
    want = []
    for datas in batches:
        batch = as_items(datas)
        want.append(answered(model, batch, *single.decode(model, batch, True, "torchvision")))
    decoding = DeviceDecoding(grouped, "gpu", MAX_PIXELS, group_bytes=GROUP_BYTES if group_bytes is None else 0)
    items = [as_items(datas) for datas in batches]
    got = [answered(model, batch, *answer) for batch, answer in
           zip(items, decoding.decode_group(model, items, True, "torchvision"))]
    for k, (g, w) in enumerate(zip(got, want)):
        assert same(g, w), k
    kinds = [[x[0] for x in batch] for batch in got]
    assert kinds == [["device", "device", "image"], ["ImageDecodeError", "device", "image", "device"],
                     ["device", "device", "device"]]  # the corpus is what it says: each path taken
    assert not any(item.future.done() for batch in items for item in batch if item is not items[1][0])
    assert device_decodes(grouped) == ((3, 1) if group_bytes is None else (3, 3))  # (batches, decodes)
    assert device_decodes(alone) == (3, 3)
    assert decoded_counts(grouped.render()[0].decode()) == decoded_counts(alone.render()[0].decode())


def test_decode_group_answers_a_claimed_images_error_only_where_settle_says_and_maps_errors_to_their_items():
    model = OnTestDevice()
    bad = error_files()["truncated.jpg"]
    good = service_corpus()["s420.jpg"]
    batches = [as_items([good, bad]), as_items([bad, good, bad])]
    asked = []

    def settle(k, items):
        asked.append((k, items))
        return items if k == 0 else items[:1]  # batch 1's last image was answered meanwhile (withdrawn, say)

    answers = DeviceDecoding(Metrics(), "gpu", MAX_PIXELS).decode_group(model, batches, True, "torchvision", settle)
    assert [k for k, _ in asked] == [0, 1] and asked[1][1] == [batches[1][0], batches[1][2]]
    assert answers[0][0] == [batches[0][0]] and answers[1][0] == [batches[1][1]]
    assert isinstance(batches[0][1].future.exception(timeout=0), ImageError)
    assert isinstance(batches[1][0].future.exception(timeout=0), ImageError)
    assert not batches[1][2].future.done() and not batches[0][0].future.done() and not batches[1][1].future.done()


def test_a_failing_device_decoder_decodes_the_whole_group_on_the_cpu(caplog):
    class Broken:
        def jpeg_decoder(self):
            raise RuntimeError("out of device memory")

    metrics = Metrics()
    good = service_corpus()["s420.jpg"]
    batches = [as_items([good]), as_items([good, good])]
    answers = DeviceDecoding(metrics, "gpu", MAX_PIXELS).decode_group(Broken(), batches, True, "torchvision")
    assert [len(kept) for kept, _ in answers] == [1, 2] and all(x.form == "crop" for _, xs in answers for x in xs)
    assert metrics.decoded.labels(path="cpu", reason="device_error")._value.get() == 3
    assert "the device JPEG decoder failed on a group of 2 batches of 3 images;" in caplog.text


def test_one_process_with_decode_gpu_forms_decode_groups_from_waiting_batches_and_answers_each_request_right(
        tiny_tensors, exact_answers):
    """The engine's first batch held on its device until three more batches wait: the worker then decodes the next
    ones as a group (vggserve_device_decode_batches shows a decode of more than one batch), and every concurrent
    request gets the answer --decode exact gives it."""
    from vggserve.model.vgg16 import VGG16

    apps = []

    def held(device):
        model = VGG16(tiny_tensors, device=TEST_DEVICE, max_batch_size=4)
        submit, first = model.submit, threading.Event()

        def held_submit(x, *args, **kwargs):
            if isinstance(x, list) and not first.is_set():  # the first batch decoded on the device (no warm-up)
                first.set()
                wait_until(lambda: len(apps[0].state.service.backend.queue) >= 12, 120, "three batches waiting")
            return submit(x, *args, **kwargs)

        model.submit = held_submit
        return model

    settings = Settings(decode="gpu", decode_group=4, max_batch_size=4, max_wait_ms=200, max_pixels=MAX_PIXELS,
                        max_files=4, preprocess_procs=0, preprocess_threads=2, warmup=False)
    apps.append(create_app(settings, model_factory=held))
    files = service_corpus()
    names = list(files) * 2
    with TestClient(apps[0]) as client:
        wait_until(lambda: client.get("/health/ready").status_code == 200, 240, "the service to be ready")
        with ThreadPoolExecutor(len(names)) as pool:
            got = list(pool.map(lambda name: infer(client, files[name]), names))
        meta = client.get("/metadata").json()
        text = client.get("/metrics").text
    for name, (status, body) in zip(names, got):
        want_status, want = exact_answers["v2"][name]
        assert status == want_status == 200, (name, body)
        assert {o["name"]: o["data"] for o in body["outputs"]} == {o["name"]: o["data"] for o in want["outputs"]}, name
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name.startswith("vggserve_device_decode_batches")}
    decodes, batches = samples["vggserve_device_decode_batches_count"], samples["vggserve_device_decode_batches_sum"]
    assert batches > decodes >= 1, samples  # a decode of several batches
    assert meta["decode_group"] == 4


def test_the_hold_is_none_unless_the_environment_asks_for_one_to_measure_it(monkeypatch, caplog):
    from vggserve.serving.scheduling.devicedecode import HOLD_ENV

    monkeypatch.delenv(HOLD_ENV, raising=False)
    assert DeviceDecoding(Metrics(), "gpu").hold_s == 0.0
    monkeypatch.setenv(HOLD_ENV, "2.5")
    assert DeviceDecoding(Metrics(), "gpu").hold_s == 0.0025
    monkeypatch.setenv(HOLD_ENV, "soon")
    assert DeviceDecoding(Metrics(), "gpu").hold_s == 0.0 and "is not a number of milliseconds" in caplog.text
    with pytest.raises(ValueError, match="a decode group is 1 batch or more"):
        DeviceDecoding(Metrics(), "gpu", group=0)
