"""The device decoder's host work per batch: `JpegDecoder.enqueue` of 64 copies of one 500x375 JPEG on PoCL, as the
calling thread's CPU (PoCL runs the kernels in its own threads), best of 5 x N. Run against a tree:
    python docs/benchmarks/session30/enqueue_cpu.py TREE [N]
"""
import sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import numpy as np, pyopencl as cl
import serve_saturation
from vggserve.decoding.device import JpegDecoder
from vggserve.decoding.device.decoder import prepare
from vggserve.decoding.device.onmodel import window_for
from vggserve.runtime import devices as devs
import vggserve; assert vggserve.__file__.startswith(sys.argv[1]), vggserve.__file__
dev = devs.cl_device(devs.resolve("cpu")); ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
dec = JpegDecoder(ctx, dev)
jpeg = serve_saturation.synthetic_jpeg(500, 375)
files = [prepare(jpeg) for _ in range(64)]
wins = [window_for(f, i * 500 * 375 * 3)[0] for i, f in enumerate(files)]
out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64 * 500 * 375 * 3)
for _ in range(3): dec.enqueue(q, files, wins, out); q.finish()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40; best = 1e9
for rep in range(5):
    spent = 0.0
    for _ in range(n):
        t = time.thread_time(); dec.enqueue(q, files, wins, out); spent += time.thread_time() - t; q.finish()
    best = min(best, spent / n)
print(f"{sys.argv[1]:20s} enqueue: {best*1e3:.3f} ms thread CPU per batch of 64 (best of 5 x {n})")
