"""resize A/B on one device: resize.cl as built (order 0's pass 1 through local memory where a tile fits) against
RS_SPAN=1 (every tile takes the global path, as before): device ms per call of 64 500x375 images, and the bytes."""
import sys, numpy as np, pyopencl as cl
from vggserve.ops.resize import DeviceResize
from vggserve.runtime import devices as devs
from vggserve.runtime.programs import ProgramCache
dev = devs.cl_device(devs.resolve(sys.argv[1] if len(sys.argv) > 1 else 'gpu'))
ctx = cl.Context([dev]); q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
cache = ProgramCache(ctx, dev)
rng = np.random.default_rng(0)
sizes = [(500, 375)] * 64
imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]
raw = np.concatenate([i.reshape(-1) for i in imgs]); offs = np.cumsum([0] + [i.size for i in imgs])[:-1]
rbuf = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=raw)
out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64 * 224 * 224 * 3)
placed = [(int(o), w, h, i) for i, (o, (w, h)) in enumerate(zip(offs, sizes))]
ops = {"local": DeviceResize(ctx, cache.build("resize.cl", {})),
       "global": DeviceResize(ctx, cache.build("resize.cl", {"RS_SPAN": 1}), {})}
res, outs = {k: [] for k in ops}, {}
for rep in range(30):
    for name, op in ops.items():
        ev = op.enqueue(q, rbuf, placed, out); ev.wait()
        up = op.last_upload
        if rep >= 3: res[name].append((ev.profile.end - up.profile.start) * 1e-6)
        h = np.empty(64 * 224 * 224 * 3, np.uint8); cl.enqueue_copy(q, h, out); outs[name] = h
for name, t in res.items():
    print(f"resize {name}: median {np.median(t):.4f} ms per call of 64 (min {min(t):.4f})")
print("same bytes:", np.array_equal(outs["local"], outs["global"]))
