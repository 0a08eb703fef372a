"""The device decoder's host work on PoCL, as the calling thread's CPU (best of 5 x 10): `start_decode` alone and
`start_decode` + `items`, for batches of N distinct 500x375 photos, in the checkout TREE (default: this one).

    python docs/benchmarks/session31/decode_cpu.py [TREE] [N,N,...]      # default: this checkout, 1,8,64,128,256
"""
import io
import sys
import threading
import time
from pathlib import Path

tree = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[3])
sizes = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,8,64,128,256").split(",")]
sys.path.insert(0, tree)
sys.path.insert(0, tree + "/benchmarks")
import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402
from PIL import Image  # noqa: E402

import serve_saturation  # noqa: E402
import vggserve  # noqa: E402
from vggserve.decoding.device import JpegDecoder  # noqa: E402
from vggserve.decoding.device.onmodel import start_decode  # noqa: E402
from vggserve.runtime import devices as devs  # noqa: E402

assert vggserve.__file__.startswith(tree), vggserve.__file__
dev = devs.cl_device(devs.resolve("cpu"))
ctx = cl.Context([dev])
queue = cl.CommandQueue(ctx)


class Model:  # what start_decode asks of a model: its decoder, queue and lock
    def __init__(self):
        self._jpeg = (JpegDecoder(ctx, dev), queue, threading.Lock())

    def jpeg_decoder(self):
        return self._jpeg


model = Model()
base = np.asarray(Image.open(io.BytesIO(serve_saturation.synthetic_jpeg(500, 375))))
photos = []
for i in range(max(sizes)):
    out = io.BytesIO()
    Image.fromarray(np.roll(base, i * 7, axis=1)).save(out, "JPEG", quality=90)
    photos.append(out.getvalue())
for n in sizes:
    datas = photos[:n]
    for _ in range(2):
        start_decode(model, datas).items()
    start_best = both_best = 1e9
    for _ in range(5):
        start_s = both_s = 0.0
        for _ in range(10):
            t0 = time.thread_time()
            started = start_decode(model, datas)
            t1 = time.thread_time()
            started.items()
            start_s += t1 - t0
            both_s += time.thread_time() - t0
        start_best, both_best = min(start_best, start_s / 10), min(both_best, both_s / 10)
    print(f"{n:4d} photos: start_decode {start_best * 1e3:.3f} ms ({start_best * 1e6 / n:.1f} us per photo), "
          f"start_decode + items {both_best * 1e3:.3f} ms thread CPU", flush=True)
