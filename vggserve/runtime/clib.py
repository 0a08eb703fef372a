"""The OpenCL library that pyopencl itself calls, through ctypes: for the few calls pyopencl has no cheap or no
binding for (engine/replay.py's launches without an event object; runtime/cmdbuf.py's command buffers). pyopencl's
handles (`int_ptr`) are the library's own, so they pass straight through."""

import ctypes
import functools
import glob
import os

import pyopencl as cl


@functools.cache
def library():
    """pyopencl's bundled ICD loader where its wheel has one (already loaded, so the same library), else the
    system's."""
    here = os.path.dirname(cl.__file__)
    found = sorted(glob.glob(os.path.join(here, "..", "pyopencl.libs", "libOpenCL*.so*")))
    return ctypes.CDLL(found[0] if found else "libOpenCL.so.1")


@functools.cache
def enqueue_nd_range_kernel():
    """clEnqueueNDRangeKernel with its argument types set (ctypes releases the GIL during the call)."""
    f = library().clEnqueueNDRangeKernel
    size = ctypes.POINTER(ctypes.c_size_t)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, size, size, size, ctypes.c_uint, ctypes.c_void_p,
                  ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f
