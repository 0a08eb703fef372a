"""Device buffers for kernel tests: inputs, NaN-poisoned outputs, read-back, and the relative error they report."""

import numpy as np
import pyopencl as cl

MF = cl.mem_flags


def to_device(ctx, a):
    return cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a, np.float32))


def read(queue, buf, shape):
    out = np.empty(shape, np.float32)
    cl.enqueue_copy(queue, out, buf)
    return out


def poisoned(ctx, queue, n):
    """An output buffer filled with NaN, so an element the kernel never writes fails the comparison."""
    buf = cl.Buffer(ctx, MF.READ_WRITE, 4 * max(n, 1))
    cl.enqueue_copy(queue, buf, np.full(max(n, 1), np.nan, np.float32))
    return buf


def rel_err(out, ref):
    """max |out - ref| / max |ref|."""
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
