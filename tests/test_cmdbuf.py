"""runtime/cmdbuf.py: kernels recorded into a cl_khr_command_buffer through ctypes and replayed (PoCL has the
extension; NVIDIA's 580 driver does not, where `Api.of` is None, as on any device without it)."""

import numpy as np
import pyopencl as cl
import pytest

from vggserve.runtime import cmdbuf
from vggserve.runtime import devices as devs

SRC = "__kernel void add(__global int *x, const int v) { x[get_global_id(0)] += v; }"


@pytest.fixture(scope="module")
def setup(test_device):
    dev = devs.cl_device(devs.resolve(test_device))
    ctx = cl.Context([dev])
    return dev, ctx, cl.CommandQueue(ctx)


def test_the_api_is_there_exactly_when_the_device_names_the_extension(setup):
    dev, _, _ = setup
    named = cmdbuf.EXTENSION in dev.extensions.split()
    assert (cmdbuf.Api.of(dev) is not None) == named
    versions = cmdbuf.extension_versions(dev)
    assert (cmdbuf.EXTENSION in versions) == named


def test_a_recording_replays_its_kernels_in_order(setup):
    dev, ctx, q = setup
    api = cmdbuf.Api.of(dev)
    if api is None:  # a device without the extension: what the engine relies on instead is engine/replay.py
        assert cmdbuf.EXTENSION not in dev.extensions.split()
        return
    n = 37
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(n, np.int32))
    program = cl.Program(ctx, SRC).build()
    recording = api.record(q)
    for v in (1, 10, 100):  # a kernel object per command: PoCL 3.1 reads the arguments at replay
        kernel = cl.Kernel(program, "add")
        kernel.set_args(buf, np.int32(v))
        recording.kernel(kernel, (n,), None)
    cb = recording.finish()
    assert cb.count == 3 and isinstance(api.capabilities(dev)["capabilities"], int)
    cb.enqueue(q).wait()
    cb.enqueue(q).wait()
    got = np.empty(n, np.int32)
    cl.enqueue_copy(q, got, buf)
    assert (got == 2 * 111).all()
    cb.release()
    with pytest.raises(cmdbuf.CommandBufferError, match="error"):
        cmdbuf._check(-59, "clEnqueueCommandBufferKHR")
