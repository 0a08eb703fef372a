"""The engine's host CPU per device-decoded batch of 64: `start_decode(...).items()` on 64 copies of one 500x375 JPEG
(one header, parsed once: parse.py's cache), on PoCL, whose kernels run in its own threads, so this thread's CPU
is the host's part. Then a cProfile of the same calls. Run from the repository root:
    python docs/benchmarks/session29/engine_host.py
"""
import cProfile
import pstats
import sys
import time

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
from safetensors.numpy import save_file
from vggserve.weights.init import init_weights
from vggserve import VGG16
from vggserve.decoding.device.onmodel import start_decode
import serve_saturation
import tempfile
from pathlib import Path

TINY = Path(tempfile.mkdtemp()) / "tiny.safetensors"  # VGG16 at width 1/8: the decode's cost does not depend on it
save_file(init_weights(seed=0, width=0.125), str(TINY))
jpegs = [serve_saturation.synthetic_jpeg(500, 375)] * 64
with VGG16.load(str(TINY), device="cpu", max_batch_size=64) as model:
    model.jpeg_decoder()
    for _ in range(2):
        items = start_decode(model, jpegs).items()
    n = 5
    t = time.thread_time()
    for _ in range(n):
        items = start_decode(model, jpegs).items()
    per = (time.thread_time() - t) / n
    print(f"start_decode+items: {per*1000:.2f} ms thread CPU per batch of 64 = {per/64*1e6:.1f} us/image")
    pr = cProfile.Profile(timer=time.thread_time)
    pr.enable()
    for _ in range(n):
        items = start_decode(model, jpegs).items()
    pr.disable()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(40)
