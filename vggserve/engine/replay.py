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

from ..ops.launch import NotRecordable, Recording
from ..runtime import clib

ENV = "VGGSERVE_REPLAY"  # "0": run the steps every time (for comparison)


def enabled_by_default() -> bool:
    return os.environ.get(ENV, "1").strip() != "0"


class Plan:
    """One recorded forward pass: `enqueue(queue)` launches its kernels in order."""

    __slots__ = ("launches", "calls")

    def __init__(self, launches: list):
        self.launches = launches  # (kernel, grid, local): keeps the kernels (and through them their arguments) alive
        size = ctypes.c_size_t
        self.calls = [(ctypes.c_void_p(k.int_ptr), len(g), (size * len(g))(*g),
                       None if lo is None else (size * len(lo))(*lo)) for k, g, lo in launches]

    def enqueue(self, queue) -> None:
        try:
            launch = clib.enqueue_nd_range_kernel()
        except (OSError, AttributeError):  # no ctypes route to the library: pyopencl's calls, with their events
            for kernel, grid, local in self.launches:
                cl.enqueue_nd_range_kernel(queue, kernel, grid, local)
            return
        q = ctypes.c_void_p(queue.int_ptr)
        for kernel, dims, grid, local in self.calls:
            code = launch(q, kernel, dims, None, grid, local, 0, None, None)
            if code:
                raise RuntimeError(f"clEnqueueNDRangeKernel failed with OpenCL error {code} in a replayed forward "
                                   f"pass (set {ENV}=0 to run the steps directly)")


class Plans:
    """An engine's recorded forward passes by key, the least recently used dropped past LIMIT."""

    LIMIT = 128

    def __init__(self):
        self._plans: OrderedDict = OrderedDict()
        self.recorded = 0  # recordings made (tests and benchmarks read it)

    def run(self, key, queue, steps) -> None:
        """Replay `key`'s plan on `queue`, recording it first from `steps()` (which makes the launches) if there is
        none. A forward pass that cannot be recorded (ops.launch.NotRecordable) runs directly, now and after."""
        plans = self._plans
        plan = plans.get(key)
        if plan is None:
            if key in plans:  # known not to record
                steps()
                return
            try:
                with Recording(queue) as recording:
                    steps()
            except NotRecordable:
                plans[key] = None
                steps()
                return
            plan = plans[key] = Plan(recording.launches)
            self.recorded += 1
            while len(plans) > self.LIMIT:
                plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        plan.enqueue(queue)

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return sum(1 for p in self._plans.values() if p is not None)
