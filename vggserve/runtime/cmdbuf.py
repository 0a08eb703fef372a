"""Command buffers (the cl_khr_command_buffer extension) through ctypes: a forward pass recorded once, replayed
with one host call instead of one launch per kernel.

pyopencl has no binding for the extension, so its entry points come from `clGetExtensionFunctionAddressForPlatform`
of the ICD loader that pyopencl itself uses, and take pyopencl's handles (`int_ptr`). Only kernel commands are
recorded (`clCommandNDRangeKernelKHR`, whose signature is the same in every version of the extension). The extension
says a command's arguments are captured when it is recorded, but PoCL 3.1 (extension 0.9.0) reads them at each
replay, so give every command a kernel object of its own and leave its arguments alone. On an in-order queue the
recorded kernels run in their order.
"""

import ctypes
import functools

import pyopencl as cl

from .clib import check, library as _library

EXTENSION = "cl_khr_command_buffer"
DEVICE_CAPABILITIES = 0x12A9  # CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR
DEVICE_REQUIRED_QUEUE_PROPERTIES = 0x12AA  # CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR

_vp, _u32, _i32, _size = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
_SIGNATURES = {
    # name: (restype, argtypes)
    "clCreateCommandBufferKHR": (_vp, [_u32, ctypes.POINTER(_vp), _vp, ctypes.POINTER(_i32)]),
    "clFinalizeCommandBufferKHR": (_i32, [_vp]),
    "clReleaseCommandBufferKHR": (_i32, [_vp]),
    "clEnqueueCommandBufferKHR": (_i32, [_u32, _vp, _vp, _u32, ctypes.POINTER(_vp), ctypes.POINTER(_vp)]),
    "clCommandNDRangeKernelKHR": (_i32, [_vp, _vp, _vp, _vp, _u32, ctypes.POINTER(_size), ctypes.POINTER(_size),
                                         ctypes.POINTER(_size), _u32, _vp, _vp, _vp]),
}


class CommandBufferError(RuntimeError):
    pass


_check = functools.partial(check, error=CommandBufferError)


def extension_versions(device) -> dict:
    """The device's extensions that name command buffers, each with its version ("major.minor.patch"), or None
    where the driver does not report versions."""
    names = [e for e in device.extensions.split() if "command_buffer" in e]
    versions = {}
    try:
        for nv in device.extensions_with_version:
            if "command_buffer" in nv.name:
                v = nv.version
                versions[nv.name] = f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"
    except Exception:  # pre-3.0 drivers; the names are enough
        pass
    return {n: versions.get(n) for n in names}


class Api:
    """The extension's entry points for one device's platform; `Api.of(device)` is None where it has none."""

    def __init__(self, functions: dict):
        self.f = functions

    @classmethod
    def of(cls, device):
        if EXTENSION not in device.extensions.split():
            return None
        lib = _library()
        lookup = lib.clGetExtensionFunctionAddressForPlatform
        lookup.restype, lookup.argtypes = _vp, [_vp, ctypes.c_char_p]
        platform = _vp(device.platform.int_ptr)
        functions = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            address = lookup(platform, name.encode())
            if not address:
                return None
            fn = ctypes.CFUNCTYPE(restype, *argtypes)(address)
            functions[name] = fn
        return cls(functions)

    def capabilities(self, device) -> dict:
        """The device's command-buffer capabilities and required queue properties (bit fields, as numbers)."""
        info = _library().clGetDeviceInfo
        info.restype, info.argtypes = _i32, [_vp, _u32, _size, _vp, ctypes.POINTER(_size)]
        out = {}
        for name, param in (("capabilities", DEVICE_CAPABILITIES),
                            ("required_queue_properties", DEVICE_REQUIRED_QUEUE_PROPERTIES)):
            value = ctypes.c_uint64(0)
            code = info(_vp(device.int_ptr), param, 8, ctypes.byref(value), None)
            out[name] = value.value if code == 0 else f"error {code}"
        return out

    def record(self, queue) -> "Recording":
        q = (_vp * 1)(queue.int_ptr)
        err = _i32(0)
        handle = self.f["clCreateCommandBufferKHR"](1, q, None, ctypes.byref(err))
        _check(err.value, "clCreateCommandBufferKHR")
        return Recording(self, handle)


class Recording:
    """A command buffer being recorded: `kernel(...)` for each launch, then `finish()`."""

    def __init__(self, api: Api, handle):
        self.api, self.handle, self.count = api, handle, 0
        self._held = []  # the kernels and argument buffers recorded, kept alive with the command buffer

    def kernel(self, kernel, grid, local, held=()) -> None:
        dims = len(grid)
        g = (_size * dims)(*grid)
        lo = (_size * dims)(*local) if local is not None else None
        code = self.api.f["clCommandNDRangeKernelKHR"](self.handle, None, None, kernel.int_ptr, dims, None, g, lo,
                                                       0, None, None, None)
        _check(code, "clCommandNDRangeKernelKHR")
        self._held.append((kernel, held))
        self.count += 1

    def finish(self) -> "CommandBuffer":
        code = self.api.f["clFinalizeCommandBufferKHR"](self.handle)
        _check(code, "clFinalizeCommandBufferKHR")
        return CommandBuffer(self.api, self.handle, self.count, self._held)

    def abandon(self) -> None:
        self.api.f["clReleaseCommandBufferKHR"](self.handle)
        self.handle = None


class CommandBuffer:
    """A finalised recording: `enqueue(queue)` replays every kernel in order on that queue and returns its event."""

    def __init__(self, api: Api, handle, count: int, held: list):
        self.api, self.handle, self.count, self._held = api, handle, count, held

    def enqueue(self, queue, wait_for=None):
        waits = list(wait_for or ())
        wait = (_vp * len(waits))(*(e.int_ptr for e in waits)) if waits else None
        q = (_vp * 1)(queue.int_ptr)
        event = _vp()
        code = self.api.f["clEnqueueCommandBufferKHR"](1, q, self.handle, len(waits), wait, ctypes.byref(event))
        _check(code, "clEnqueueCommandBufferKHR")
        return cl.Event.from_int_ptr(event.value, retain=False)

    def release(self) -> None:
        if self.handle is not None:
            self.api.f["clReleaseCommandBufferKHR"](self.handle)
            self.handle, self._held = None, []
