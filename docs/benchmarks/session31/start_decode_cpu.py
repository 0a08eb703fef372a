"""start_decode's thread CPU on PoCL for 1 to 256 distinct 500x375 photos (best of 5 x 10), as in BENCHMARKS.md, thirty-first
session: python docs/benchmarks/session31/start_decode_cpu.py (from the repository root)."""
import sys, time, threading, io
sys.path.insert(0, "benchmarks")
import numpy as np, pyopencl as cl
import serve_saturation
from PIL import Image
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
for i in range(256):
    b = io.BytesIO(); Image.fromarray(np.roll(base, i * 7, axis=1)).save(b, "JPEG", quality=90); datas.append(b.getvalue())
for n in (1, 8, 64, 128, 256):
    d = datas[:n]
    for _ in range(2): start_decode(m, d).items()
    best = 1e9
    for rep in range(5):
        tot = 0.0
        for _ in range(10):
            t = time.thread_time(); s = start_decode(m, d); tot += time.thread_time() - t; s.items()
        best = min(best, tot / 10)
    print(f"{n:4d} files: start_decode {best*1e3:.3f} ms thread CPU, {best*1e6/n:.1f} us per file", flush=True)
