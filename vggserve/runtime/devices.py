"""OpenCL platform and device discovery, device specs, and diagnosis of the usual set-up failures.

Device specs: "auto" (first GPU, else first CPU), "cpu", "gpu" (= "gpu:0"), "gpu:N" (N-th GPU over all platforms),
"cpu:N", or "P:D" (platform index P, device index D as `vggserve devices` lists them). Where one worker per
device makes sense (`vggserve serve`), "all" means every usable GPU, or the CPU when there is none.
A platform whose compiler cannot build a trivial kernel (for example PoCL's LLVM not knowing the host CPU) is
skipped with a note, so one broken installation does not hide a working one.
"""

import glob
import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache

import pyopencl as cl

from ..errors import DeviceError
from ..wording import count
from . import warmstart

NVIDIA_LIB = "libnvidia-opencl.so.1"
NVIDIA_LIB_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                   "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib")
_PROBE_SRC = "__kernel void probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"


@dataclass(frozen=True)
class DeviceInfo:
    platform_index: int
    device_index: int
    platform_name: str
    name: str
    kind: str  # "gpu", "cpu" or "other"
    compute_units: int
    global_mem: int
    local_mem: int
    driver_version: str
    usable: bool
    problem: str  # why not usable, empty when usable

    @property
    def spec(self) -> str:
        return f"{self.platform_index}:{self.device_index}"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.platform_name})"


def _kind(device) -> str:
    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.CPU:
        return "cpu"
    return "other"


def _probe(device) -> str:
    """Build and run a one-line kernel; return '' if it works, else the first line of the failure."""
    try:
        ctx = cl.Context([device])
        prg = cl.Program(ctx, _PROBE_SRC).build()
        queue = cl.CommandQueue(ctx)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
        prg.probe(queue, (16,), None, buf)
        queue.finish()
        return ""
    except cl.Error as exc:
        text = " ".join(str(exc).split())
        if "unknown target CPU" in text:
            return ("its compiler does not know this CPU (PoCL built with an old LLVM, e.g. the "
                    "pocl-binary-distribution wheel); install Debian/Ubuntu's pocl-opencl-icd instead")
        return text[:300]


def _probe_marker(device):
    """Where a passed probe of this device, driver and platform is remembered (None without a cache folder)."""
    from .programs import cache_dir

    key = "\0".join((device.platform.version, device.name, device.driver_version, _PROBE_SRC))
    return cache_dir().parent / "probes" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".ok")


def _probe_once(device) -> str:
    """`_probe`, skipped when the same device, driver and platform passed it before: a probe compiles a kernel
    and creates a context, a few hundred ms of every start on a GPU. Failures are not remembered, so a mended
    installation is seen at once. VGGSERVE_NO_PROGRAM_CACHE=1 turns the memory off with the program cache."""
    if os.environ.get("VGGSERVE_NO_PROGRAM_CACHE", "") in ("1", "true", "yes"):
        return _probe(device)
    marker = _probe_marker(device)
    if marker.exists():
        return ""
    problem = _probe(device)
    if not problem:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass
    return problem


@lru_cache(maxsize=1)
def list_devices() -> tuple[DeviceInfo, ...]:
    """Every OpenCL device of every platform, probed once per process."""
    warmstart.wait()  # an early discovery (runtime/warmstart.py) initialises the same drivers: let it finish
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    found = []
    for pi, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:
            devices = []
        for di, d in enumerate(devices):
            problem = _probe_once(d)
            found.append(DeviceInfo(pi, di, platform.name.strip(), d.name.strip(), _kind(d), d.max_compute_units,
                                    d.global_mem_size, d.local_mem_size, d.driver_version, not problem, problem))
    return tuple(found)


def nvidia_driver_library() -> str | None:
    """Path of the NVIDIA OpenCL driver library if one is installed (usual folders and LD_LIBRARY_PATH), else None."""
    extra = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for folder in (*NVIDIA_LIB_DIRS, *extra):
        path = os.path.join(folder, NVIDIA_LIB)
        if os.path.exists(path):
            return path
    return None


def nvidia_registered() -> bool:
    vendors = os.environ.get("OCL_ICD_VENDORS", "/etc/OpenCL/vendors")
    files = [vendors] if os.path.isfile(vendors) else glob.glob(os.path.join(vendors, "*.icd"))
    for f in files:
        try:
            if "nvidia" in open(f).read().lower():
                return True
        except OSError:
            pass
    return False


def diagnose(devices=None) -> list[str]:
    """Human-readable problems with the OpenCL set-up and how to fix each (empty when all is well)."""
    devices = list_devices() if devices is None else devices
    notes = []
    lib = nvidia_driver_library()
    has_nvidia = any("nvidia" in d.platform_name.lower() for d in devices)
    if lib and not has_nvidia and not nvidia_registered():
        notes.append(
            f"an NVIDIA driver is installed ({lib}) but no OpenCL ICD registers it; fix: "
            f"mkdir -p ~/.vggserve-icd && echo {lib} > ~/.vggserve-icd/nvidia.icd && "
            f"export OCL_ICD_VENDORS=~/.vggserve-icd  (or, as root: echo {lib} > /etc/OpenCL/vendors/nvidia.icd)")
    if not devices:
        notes.append("no OpenCL platform found; fix: install an OpenCL driver, e.g. `apt-get install "
                      "pocl-opencl-icd` for the CPU, or your GPU vendor's driver")
    for d in devices:
        if not d.usable:
            notes.append(f"device {d.spec} {d.label} is unusable: {d.problem}")
    return notes


def usable_gpus() -> list[DeviceInfo]:
    """The usable GPUs in the order "gpu:N" numbers them."""
    return [d for d in list_devices() if d.usable and d.kind == "gpu"]


def resolve(spec: str = "auto") -> DeviceInfo:
    """The device a spec selects; DeviceError with the list of choices if it selects nothing."""
    spec = (spec or "auto").strip().lower()
    devices = list_devices()
    usable = [d for d in devices if d.usable]
    gpus = usable_gpus()
    cpus = [d for d in usable if d.kind == "cpu"]

    def missing(what: str) -> DeviceError:
        choices = ", ".join(f"{d.spec} {d.label}" for d in usable) or "none"
        hint = "; ".join(diagnose(devices))
        return DeviceError(f"{what} (usable devices: {choices})" + (f"; {hint}" if hint else ""))

    def pick(pool, n, what):
        if n < len(pool):
            return pool[n]
        raise missing(f"no {what} device number {n}" if pool else f"no usable {what} device")

    if spec == "auto":
        if usable:
            return (gpus or cpus or usable)[0]
        raise DeviceError("no usable OpenCL device; " + ("; ".join(diagnose(devices)) or "run `vggserve devices`"))
    kind, _, num = spec.partition(":")
    if kind in ("gpu", "cpu"):
        if num and not num.isdigit():
            raise DeviceError(f"bad device spec {spec!r}: use auto, cpu, gpu, gpu:N, cpu:N or P:D")
        return pick(gpus if kind == "gpu" else cpus, int(num or 0), kind.upper())
    if kind.isdigit() and num.isdigit():
        for d in devices:
            if d.platform_index == int(kind) and d.device_index == int(num):
                if not d.usable:
                    raise DeviceError(f"device {spec} {d.label} is unusable: {d.problem}")
                return d
        on_platform = sum(d.platform_index == int(kind) for d in devices)
        where = (f"platform {kind} has {count(on_platform, 'device')}, numbered from 0" if on_platform
                 else f"there is no OpenCL platform {kind} with devices")
        raise missing(f"no OpenCL device {spec}: {where}")
    raise DeviceError(f"bad device spec {spec!r}: use auto, cpu, gpu, gpu:N, cpu:N or P:D (see `vggserve devices`)")


def expand(spec: str) -> tuple[str, ...]:
    """`all` -> every usable GPU ("gpu:0", "gpu:1", ...), or ("cpu",) when there is none; other specs unchanged."""
    if spec.strip().lower() != "all":
        return (spec,)
    return tuple(f"gpu:{i}" for i in range(len(usable_gpus()))) or ("cpu",)


def cl_device(info: DeviceInfo):
    """The pyopencl Device object behind a DeviceInfo."""
    return cl.get_platforms()[info.platform_index].get_devices()[info.device_index]
