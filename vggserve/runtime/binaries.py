"""A built program's binary, read without holding the GIL.

PoCL makes a program's machine code only when its binary is asked for, which for a pruned network's generated
programs takes tens of seconds each on a CPU. pyopencl's `get_info(BINARIES)` holds the GIL all that time, so no
other thread runs (the build progress of runtime/buildprogress.py among them). The same query through ctypes, on
the OpenCL loader pyopencl itself links against (`warmstart.loader_library`), lets it go. Where that loader is
not pyopencl's own, or the query fails, pyopencl's `get_info` answers.
"""

import ctypes
import functools

import pyopencl as cl

from . import warmstart


@functools.lru_cache(maxsize=1)
def _library():
    path, own = warmstart.loader_library()
    if not (path and own):
        return None  # a cl_program of pyopencl's loader goes to that loader only
    lib = ctypes.CDLL(path)
    lib.clGetProgramInfo.restype = ctypes.c_int
    lib.clGetProgramInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_size_t)]
    return lib


def program_binary(program: cl.Program) -> bytes:
    """The binary of a program built for one device."""
    lib = _library()
    if lib is not None:
        binary = _query(lib, ctypes.c_void_p(program.int_ptr))
        if binary is not None:
            return binary
    return program.get_info(cl.program_info.BINARIES)[0]


def _query(lib, handle) -> bytes | None:
    count = ctypes.c_uint(0)
    if lib.clGetProgramInfo(handle, cl.program_info.NUM_DEVICES, ctypes.sizeof(count), ctypes.byref(count),
                            None) != 0 or count.value != 1:
        return None
    size = ctypes.c_size_t(0)
    if lib.clGetProgramInfo(handle, cl.program_info.BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size),
                            None) != 0 or size.value == 0:
        return None
    buffer = ctypes.create_string_buffer(size.value)
    pointers = (ctypes.c_void_p * 1)(ctypes.cast(buffer, ctypes.c_void_p))
    if lib.clGetProgramInfo(handle, cl.program_info.BINARIES, ctypes.sizeof(pointers), pointers, None) != 0:
        return None
    return buffer.raw
