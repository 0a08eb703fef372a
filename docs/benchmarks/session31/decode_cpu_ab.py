"""start_decode + items of 64 distinct 500x375 photos on PoCL, thread CPU per batch (best of 5 x 20), for a tree:
    python docs/benchmarks/session31/decode_cpu_ab.py TREE     (TREE: a checkout, e.g. from git archive)"""
import sys, time, threading, io
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import numpy as np, pyopencl as cl
import serve_saturation
from PIL import Image
import vggserve; assert vggserve.__file__.startswith(tree), vggserve.__file__
from vggserve.decoding.device import JpegDecoder
from vggserve.decoding.device.onmodel import start_decode
from vggserve.runtime import devices as devs
dev = devs.cl_device(devs.resolve("cpu")); ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
class M:
    def __init__(self): self._j = (JpegDecoder(ctx, dev), q, threading.Lock())
    def jpeg_decoder(self): return self._j
m = M()
base = np.asarray(Image.open(io.BytesIO(serve_saturation.synthetic_jpeg(500, 375))))
datas = []
for i in range(64):
    b = io.BytesIO(); Image.fromarray(np.roll(base, i * 7, axis=1)).save(b, "JPEG", quality=90); datas.append(b.getvalue())
for _ in range(3): start_decode(m, datas).items()
best = 1e9
for rep in range(5):
    tot = 0.0
    for _ in range(20):
        t = time.thread_time(); s = start_decode(m, datas); s.items(); tot += time.thread_time() - t
    best = min(best, tot / 20)
print(f"{tree:16s} start_decode + items, 64 photos: {best*1e3:.3f} ms thread CPU per batch (best of 5 x 20)")
