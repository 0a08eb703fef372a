"""The OpenCL library that pyopencl itself calls, through ctypes: for the few calls pyopencl has no cheap or no
binding for (engine/replay.py's launches without an event object; runtime/cmdbuf.py's command buffers). pyopencl's
handles (`int_ptr`) are the library's own, so they pass straight through."""

import ctypes
import functools
import glob
import os

import numpy as np
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


def check(code: int, what: str, error: type = RuntimeError) -> None:
    """Raise `error` naming the call when an OpenCL call returned a nonzero code."""
    if code != 0:
        raise error(f"{what} failed with OpenCL error {code}")


class ArgumentError(TypeError):
    """A kernel argument of a kind `kernel_with_args` does not pass (the caller falls back to pyopencl)."""


@functools.cache
def _kernel_calls():
    lib = library()
    create, set_arg, release = lib.clCreateKernel, lib.clSetKernelArg, lib.clReleaseKernel
    create.restype, create.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]
    set_arg.restype, set_arg.argtypes = ctypes.c_int32, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t,
                                                         ctypes.c_void_p]
    release.restype, release.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    return create, set_arg, release


def kernel_with_args(program, name: str, args) -> int:
    """A new kernel object (its raw handle) of `program`'s function `name` with `args` set: buffers (or None),
    Python ints (as int32, as `ops.launch.Launch` passes them), numpy scalars, local memory. Without pyopencl's
    Kernel, whose construction costs NVIDIA's host about 0.2 ms (engine/replay.py records one per launch).
    ArgumentError for another kind of argument; RuntimeError when the library refuses."""
    create, set_arg, release = _kernel_calls()
    err = ctypes.c_int32(0)
    handle = create(ctypes.c_void_p(program.int_ptr), name.encode(), ctypes.byref(err))
    check(err.value, f"clCreateKernel({name})")
    if not handle:
        raise RuntimeError(f"clCreateKernel({name}) returned no kernel")
    try:
        for index, value in enumerate(args):
            if isinstance(value, cl.MemoryObjectHolder) or value is None:
                pointer = ctypes.c_void_p(None if value is None else value.int_ptr)
                size, where = ctypes.sizeof(pointer), ctypes.byref(pointer)
            elif isinstance(value, cl.LocalMemory):
                size, where = value.size, None
            elif isinstance(value, (int, np.generic)) and not isinstance(value, bool):
                data = (np.int32(value) if isinstance(value, int) else value).tobytes()
                size, where = len(data), ctypes.c_char_p(data)
            else:
                raise ArgumentError(f"{name}: argument {index} is a {type(value).__name__}")
            check(set_arg(handle, index, size, where), f"clSetKernelArg({name}, {index})")
    except BaseException:
        release(handle)
        raise
    return handle


def release_kernel(handle: int) -> None:
    _kernel_calls()[2](handle)
