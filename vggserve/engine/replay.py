"""A forward pass recorded once and replayed: the host's cost of a small batch cut to its launches.

At batch 1 an H200 runs VGG16's 16-20 kernels in 0.26-0.39 ms, and the host took longer to enqueue them: 350-410
us a submit (BENCHMARKS.md, twenty-seventh session), of which NVIDIA's driver is about 6 us a launch and the rest
Python (the steps' code, `Launch`'s argument check, pyopencl's event objects). So the engine records a forward
pass's launches once per (lane, input buffer, batch size) (`ops.launch.Recording`: each launch a kernel copy of its
own, its arguments set) and replays them after that, one C call a launch through ctypes with prebuilt arguments
and no event. The kernels, arguments and order are the steps' own, so the results are bit for bit those of running
the steps. OpenCL has no graphs on NVIDIA's driver (no cl_khr_command_buffer: `benchmarks/command_buffer_probe.py`),
so this is the host side of one.
"""

import ctypes
import os
from collections import OrderedDict

import pyopencl as cl

from ..ops.launch import NotRecordable, Recording, kernel_args
from ..runtime import clib

ENV = "VGGSERVE_REPLAY"  # "0": run the steps every time (for comparison)


def enabled_by_default() -> bool:
    return os.environ.get(ENV, "1").strip() != "0"


class Plan:
    """One recorded forward pass: `enqueue(queue)` launches its kernels in order. Each launch gets a kernel object
    of its own with its arguments set, made through ctypes (`clib.kernel_with_args`: pyopencl's Kernel costs
    NVIDIA's host about 0.2 ms to construct), or through pyopencl where an argument is of another kind. OSError or
    AttributeError where ctypes cannot reach the OpenCL library (Plans then runs the steps)."""

    __slots__ = ("launches", "calls", "_launch", "_raw", "_kernels")

    def __init__(self, launches: list):
        self.launches = launches  # (template kernel, grid, local, args): the args keep the buffers alive
        self._launch = clib.enqueue_nd_range_kernel()
        self._raw: list = []  # kernel handles this plan made and releases
        self._kernels: list = []  # or pyopencl kernels, where an argument is of a kind ctypes is not given
        try:
            handles = [self._made(clib.kernel_with_args(t.program, t.function_name, args))
                       for t, _, _, args in launches]
        except clib.ArgumentError:
            self.release()
            self._kernels = [cl.Kernel(t.program, t.function_name) for t, _, _, _ in launches]
            for kernel, (_, _, _, args) in zip(self._kernels, launches):
                kernel.set_args(*kernel_args(args))
            handles = [k.int_ptr for k in self._kernels]
        size = ctypes.c_size_t
        self.calls = [(ctypes.c_void_p(h), len(g), (size * len(g))(*g), None if lo is None else (size * len(lo))(*lo))
                      for h, (_, g, lo, _) in zip(handles, launches)]

    def _made(self, handle: int) -> int:
        self._raw.append(handle)
        return handle

    def enqueue(self, queue) -> None:
        launch, q = self._launch, ctypes.c_void_p(queue.int_ptr)
        for kernel, dims, grid, local in self.calls:
            code = launch(q, kernel, dims, None, grid, local, 0, None, None)
            if code:
                raise RuntimeError(f"clEnqueueNDRangeKernel failed with OpenCL error {code} in a replayed forward "
                                   f"pass (set {ENV}=0 to run the steps directly)")

    def release(self) -> None:
        """Release the kernel objects this plan made (OpenCL keeps those of launches still queued alive)."""
        raw, self._raw = self._raw, []
        for handle in raw:
            clib.release_kernel(handle)
        self._kernels = []

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
            pass


class Plans:
    """An engine's recorded forward passes by key (None: known not to record), the least recently used dropped past
    LIMIT."""

    LIMIT = 256  # a service at --max-batch-size 64 with 2 lanes can have every size recorded on every slot

    def __init__(self):
        self._plans: OrderedDict = OrderedDict()
        self.recorded = 0  # recordings made (tests and benchmarks read it)

    def record(self, key, queue, steps) -> bool:
        """Record `key`'s plan now if there is none (a warm-up: nothing is enqueued); whether one was made."""
        return key not in self._plans and self._recorded(key, queue, steps) is not None

    def run(self, key, queue, steps) -> None:
        """Replay `key`'s plan on `queue`, recording it first from `steps()` (which makes the launches) if there is
        none. A forward pass that cannot be recorded runs directly, now and after."""
        plans = self._plans
        if key in plans:
            plan = plans[key]
            plans.move_to_end(key)
        else:
            plan = self._recorded(key, queue, steps)
        if plan is None:
            steps()
        else:
            plan.enqueue(queue)

    def _recorded(self, key, queue, steps):
        """`key`'s plan from `steps()`, kept; None (kept as well) where the pass cannot be recorded: a launch the
        recording refuses (ops.launch.NotRecordable), or no ctypes route to the library."""
        try:
            with Recording(queue) as recording:
                steps()
            plan = Plan(recording.launches)
        except (NotRecordable, OSError, AttributeError):
            plan = None
        plans = self._plans
        plans[key] = plan
        if plan is not None:
            self.recorded += 1
            while len(plans) > self.LIMIT:
                plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        self._plans.clear()

    def kept(self) -> list:
        """The plans kept, least recently used first (not the passes known not to record)."""
        return [p for p in self._plans.values() if p is not None]

    def keys(self) -> list:
        """Every key known, least recently used first, those known not to record among them."""
        return list(self._plans)

    def __len__(self) -> int:
        return len(self.kept())
