"""One work-item's latency on the device for a loop shaped like the entropy decoder's symbol path (a 64-bit bit
buffer, a table lookup by its top 9 bits, the coefficient index): nanoseconds an iteration with each ingredient.

    python3 benchmarks/serial_latency.py gpu

k_alu: the arithmetic alone (the lookup replaced by a hash); k_ldg: a lookup in a 2 KB table in global memory;
k_lds: the same table in local memory; k_ldg_refill: the bit buffer topped up 4 bytes at a time, byte-wise, as
jpeg_entropy.cl does; k_prefetch: those 4 bytes loaded one top-up ahead; k_word: as one aligned 32-bit load. Each
figure is (time of 11,000 iterations - time of 1,000) / 10,000 from the kernel's profiling events, the median of 7.
"""
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vggserve.runtime import devices as devs  # noqa: E402
SRC = r"""
/* one symbol from table entry E: its bits (len) and the coefficient index k it moves to, as jpeg_entropy.cl */
#define SYMBOL(E)                                                                   \
    const int e = (E);                                                              \
    const int l = (e >> 8) & 7, sym = e & 255;                                      \
    const int run = sym >> 4, size = sym & 15, len = 2 + l + (size & 3);            \
    k = min(k + run, 63) + 1;                                                       \
    p += len;                                                                       \
    if (k >= 64) { k = 0; u = u + 1; }

/* a loop over a rotating 64-bit register (no data read), the lookup LOOKUP(w) */
#define ROTATING(LOOKUP)                                                            \
    ulong acc = 0x123456789abcdefUL; int p = 0, k = 1, u = 0;                       \
    for (int i = 0; i < n; ++i) {                                                   \
        const uint w = (uint)(acc >> 32);                                           \
        SYMBOL(LOOKUP(w))                                                           \
        acc = (acc << len) | (acc >> (64 - len));                                   \
    }                                                                               \
    out[get_global_id(0)] = p + k + u + (int)acc;

/* a loop over a bit buffer topped up from d, 4 bytes at a time, by TOP_UP (which sets `word`, the next 4 bytes
 * big-endian, and may prepare the next) */
#define BUFFERED(START, TOP_UP)                                                     \
    ulong acc = 0; int p = 0, k = 1, u = 0, avail = 0, lpos = 0;                    \
    START                                                                           \
    for (int i = 0; i < n; ++i) {                                                   \
        if (avail < 32) {                                                           \
            uint word;                                                              \
            TOP_UP                                                                  \
            acc |= (ulong)word << (32 - avail);                                     \
            avail += 32;                                                            \
        }                                                                           \
        const uint w = (uint)(acc >> 32);                                           \
        SYMBOL(t[w >> 23])                                                          \
        acc <<= len; avail -= len;                                                  \
    }                                                                               \
    out[get_global_id(0)] = p + k + u + (int)acc;

#define HASHED(w) ((int)(((w) >> 23) * 2654435761u) & 0xFFFF)  /* stands for the lookup */
#define GLOBAL(w) t[(w) >> 23]
#define LOCAL(w) lt[(w) >> 23]

__kernel void k_alu(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    ROTATING(HASHED)
}
__kernel void k_ldg(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    ROTATING(GLOBAL)
}
__kernel void k_lds(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    __local int lt[512];
    for (int i = get_local_id(0); i < 512; i += get_local_size(0)) lt[i] = t[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0)) return;
    ROTATING(LOCAL)
}
__kernel void k_ldg_refill(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    BUFFERED(, { const uchar4 v = vload4(0, d + lpos); word = as_uint(v.s3210); lpos += 4; })
}
__kernel void k_prefetch(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    /* the next top-up's bytes loaded one top-up early */
    BUFFERED(uchar4 next = vload4(0, d);, { word = as_uint(next.s3210); lpos += 4; next = vload4(0, d + lpos); })
}
__kernel void k_word(__global const int *t, __global const uchar *d, __global int *out, const int n) {
    BUFFERED(__global const uint *dw = (__global const uint *)d;,
             { word = as_uint(as_uchar4(dw[lpos >> 2]).s3210); lpos += 4; })
}
"""


def main(argv=None, counts=(1000, 11000), repeats: int = 7) -> tuple[dict, dict]:
    """({kernel: ns an iteration}, {kernel: what its work-item wrote after the longer run}) on the device `argv[0]`
    (default auto), printed as it goes. The three kernels that top the buffer up decode the same bits."""
    argv = sys.argv[1:] if argv is None else argv
    dev = devs.cl_device(devs.resolve(argv[0] if argv else "auto"))
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prg = cl.Program(ctx, SRC).build()
    rng = np.random.default_rng(0)
    t = rng.integers(0, 1 << 11, 512).astype(np.int32)
    d = rng.integers(0, 255, 1 << 16).astype(np.uint8)
    mf = cl.mem_flags
    tb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=t)
    db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=d)
    ob = cl.Buffer(ctx, mf.READ_WRITE, 4 * 1024)
    out, wrote = {}, {}
    for name in KERNELS:
        k = cl.Kernel(prg, name)
        size = 64 if name == "k_lds" else 1  # k_lds: a work-group fills the table, one work-item then runs
        medians = []
        for n in counts:
            k.set_args(tb, db, ob, np.int32(n))
            times = []
            for _ in range(repeats):
                e = cl.enqueue_nd_range_kernel(q, k, (size,), (size,))
                e.wait()
                times.append(e.profile.end - e.profile.start)
            medians.append(float(np.median(times)))
        out[name] = (medians[1] - medians[0]) / (counts[1] - counts[0])
        result = np.empty(1, np.int32)
        cl.enqueue_copy(q, result, ob)
        wrote[name] = int(result[0])
        print(f"{name:14s} {out[name]:.1f} ns per iteration (single work-item)", flush=True)
    return out, wrote


KERNELS = ("k_alu", "k_ldg", "k_lds", "k_ldg_refill", "k_prefetch", "k_word")

if __name__ == "__main__":
    main()
