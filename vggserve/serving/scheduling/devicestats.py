"""What OpenCL can tell about a model's device, for /metrics: the device's global memory, its compute units, and
the bytes of the OpenCL buffers the engine holds there (weights, activations, staging), found by walking the model's
attributes, so that any engine layout is counted without the engine keeping a tally. Models that are not on one
OpenCL device (stand-ins, the MPI ShardedModel) have no figures."""

import numpy as np

MAX_DEPTH = 4  # model -> layer lists -> layers -> their buffers (and a level to spare)


def _buffers(obj, seen: set, depth: int):
    import pyopencl as cl

    if id(obj) in seen or depth > MAX_DEPTH or isinstance(obj, (str, bytes, int, float, np.ndarray)):
        return
    seen.add(id(obj))
    if isinstance(obj, cl.MemoryObject):
        yield obj
        return
    if isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        children = obj
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("vggserve"):
        children = vars(obj).values()
    else:
        return
    for child in children:
        yield from _buffers(child, seen, depth + 1)


def device_figures(model) -> dict | None:
    """{"global_memory_bytes", "compute_units", "engine_bytes"} for a model on one OpenCL device, else None."""
    try:
        import pyopencl as cl
    except ImportError:
        return None
    device = getattr(model, "device", None)
    if not isinstance(device, cl.Device):
        return None
    held = 0
    for buffer in _buffers(model, set(), 0):
        try:
            held += int(buffer.size)
        except cl.Error:  # released already
            continue
    return {"global_memory_bytes": int(device.global_mem_size), "compute_units": int(device.max_compute_units),
            "engine_bytes": held}
