"""OpenCL start-up begun early, in a background thread, so that it overlaps the process's imports.

Starting an OpenCL driver is slow: the first platform query loads and initialises every vendor library (about
0.25 s for NVIDIA's on an H100 host), and the first context on a GPU costs another 0.1-0.2 s. None of that needs
numpy or pyopencl, which take longer still to import. `start()` makes those calls at once from a daemon thread
through ctypes, which lets go of the GIL during each foreign call, so the imports go on meanwhile:

    import vggserve
    vggserve.start_device_discovery("gpu")   # returns at once
    model = vggserve.VGG16.load(...)           # finds the platforms up and, on the first GPU, a context ready

The thread uses the same OpenCL loader library that pyopencl links against (the one its wheel bundles), found
without importing pyopencl, so the loader it warms is the one pyopencl will use. Where pyopencl has no bundled
loader, the system's loader warms the vendor drivers, and no context is made ahead (it would come from another
loader). `devices.list_devices` waits for the thread before it enumerates; `take_context(device)` hands the early
context to the model that asks for that device and releases it for any other. The `vggserve` commands that build
a model call `start` themselves. VGGSERVE_EARLY_DISCOVERY=0 turns it off.

The drivers read the environment (getenv) while they start, and glibc's setenv may move the array getenv walks:
another thread changing the environment meanwhile can crash the process (SIGSEGV, no message; numpy's import does
it, setting and unsetting OPENBLAS_MAIN_FREE). So the variables known to be set by imports are set before the thread
starts (the importer then leaves them alone), and while the thread runs any other thread's os.putenv/os.unsetenv
waits for it (an audit hook). At exit the process waits for the thread too: a driver half-started while the
interpreter and the libraries' destructors run is the same kind of crash.
"""

import atexit
import ctypes
import ctypes.util
import glob
import importlib.util
import os
import sys
import threading
import time

from ..distributed.mpi import several_ranks

CL_DEVICE_TYPE_GPU = 1 << 2
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CONTEXT_SPECS = ("auto", "gpu", "gpu:0", "all")  # specs whose device is the first GPU when there is one
# variables that imports set (numpy's sets this one around loading OpenBLAS, then unsets it) unless already set:
# set before the thread starts, with the value the importer gives, they are not touched while it runs
SET_BY_IMPORTS = {"OPENBLAS_MAIN_FREE": "1"}
ENVIRONMENT_EVENTS = ("os.putenv", "os.unsetenv")
WAIT_S = 30.0  # the longest an environment change, or the exit, waits for the thread

_lock = threading.Lock()
_thread: threading.Thread | None = None
# what the thread found; "started"/"finished": its perf_counter() times, for start-up reports
_early = {"device": None, "context": None, "library": None, "error": None, "started": None, "finished": None}


def loader_library() -> tuple[str | None, bool]:
    """(path of the OpenCL loader to call, whether it is pyopencl's own); (None, False) if there is none.

    pyopencl's wheels bundle a patched ocl-icd that reads PYOPENCL_HOME (set by `import pyopencl`) and crashes
    without it: it is set here to the value pyopencl gives it."""
    spec = importlib.util.find_spec("pyopencl")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(os.path.join(folder, ".libs", "libOpenCL*.so*")))
        if found:
            os.environ.setdefault("PYOPENCL_HOME", os.path.abspath(folder))
            return found[0], True
    return ctypes.util.find_library("OpenCL"), False


def _discover(path: str, own_loader: bool, want_context: bool) -> None:
    lib = ctypes.CDLL(path)
    count = ctypes.c_uint(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(count)) != 0 or count.value == 0:
        return
    platforms = (ctypes.c_void_p * count.value)()
    lib.clGetPlatformIDs(count.value, platforms, None)
    lib.clGetDeviceIDs.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_uint)]
    first_gpu = None
    for platform in platforms:
        n = ctypes.c_uint(0)
        if lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n)) != 0 or not n.value:
            continue
        devices = (ctypes.c_void_p * n.value)()
        lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n.value, devices, None)
        gpu = (ctypes.c_void_p * 1)()
        if first_gpu is None and lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_GPU, 1, gpu, None) == 0 and gpu[0]:
            first_gpu = gpu[0]
    if not (want_context and own_loader and first_gpu):
        return
    lib.clCreateContext.restype = ctypes.c_void_p
    lib.clCreateContext.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    device = ctypes.c_void_p(first_gpu)
    err = ctypes.c_int(0)
    context = lib.clCreateContext(None, 1, ctypes.byref(device), None, None, ctypes.byref(err))
    if err.value == 0 and context:
        _early.update(device=first_gpu, context=context, library=lib)


def _run(path: str, own_loader: bool, want_context: bool) -> None:
    started = time.perf_counter()
    try:
        _discover(path, own_loader, want_context)
    except Exception as exc:  # noqa: BLE001 - early discovery is only a head start; the usual path reports errors
        _early["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _early.update(started=started, finished=time.perf_counter())


def _environment_guard(event: str, args) -> None:
    """Audit hook: another thread's change to the environment waits until the discovery thread has finished."""
    if event in ENVIRONMENT_EVENTS and _early["finished"] is None:
        wait(WAIT_S)  # returns at once in the discovery thread itself


def start(spec: str | None = "auto") -> bool:
    """Begin OpenCL discovery in the background (once per process); with a spec that selects the first GPU
    (auto, gpu, gpu:0, all), also make that GPU's context, unless this is one of several MPI ranks. False if it
    did not start (turned off, already started, or no OpenCL loader)."""
    global _thread
    if os.environ.get("VGGSERVE_EARLY_DISCOVERY", "1").lower() in ("0", "false", "no"):
        return False
    with _lock:
        if _thread is not None:
            return False
        path, own_loader = loader_library()
        if not path:
            return False
        # several MPI ranks each bind their own GPU: an early context on the first one would suit one rank only
        want_context = (spec or "auto").strip().lower() in CONTEXT_SPECS and not several_ranks()
        for key, value in SET_BY_IMPORTS.items():
            os.environ.setdefault(key, value)
        sys.addaudithook(_environment_guard)
        atexit.register(wait, WAIT_S)
        _thread = threading.Thread(target=_run, args=(path, own_loader, want_context), name="vggserve-discovery",
                                   daemon=True)
        _thread.start()
    return True


def times() -> tuple[float, float] | None:
    """(started, finished) perf_counter() times of the early discovery, once it has finished; else None."""
    return (_early["started"], _early["finished"]) if _early["finished"] is not None else None


def wait(timeout_s: float = 30.0) -> None:
    """Wait for the early discovery, if one was started (so that OpenCL is not initialised twice at once)."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)


def take_context(device):
    """The early context if it was made for `device` (a pyopencl Device), as a pyopencl Context that the caller
    owns; else None. Either way the early context is handed out or released: only the first call can get it."""
    wait()
    with _lock:
        pointer, lib = _early["context"], _early["library"]
        _early["context"] = None
    if pointer is None:
        return None
    if _early["device"] != device.int_ptr:
        lib.clReleaseContext.argtypes = [ctypes.c_void_p]
        lib.clReleaseContext(ctypes.c_void_p(pointer))
        return None
    import pyopencl as cl

    return cl.Context.from_int_ptr(pointer, retain=False)
