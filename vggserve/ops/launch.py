"""What every host-side kernel wrapper uses: argument-caching launches, padding arithmetic and uploads."""

import threading

import numpy as np
import pyopencl as cl

MF = cl.mem_flags


class _Recordings(threading.local):
    active = None  # the Recording this thread's launches go to, if any


_recording = _Recordings()


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class Launch:
    """A kernel whose arguments are set only when they change, with one copy of the kernel per set of arguments in
    use.

    pyopencl's set_args costs about 25 us a call, as much as a small layer's kernel on a GPU. Batches alternate
    between staging slots, and lanes (engine.py) each have their own activation buffers, so one kernel object would
    see its arguments change on every call; instead each distinct set of arguments gets a kernel object of its own
    (up to COPIES, the least recently used reused past that), and a forward pass at an unchanged batch size sets no
    argument at all. The arguments are compared as a tuple: the same buffer object (or an equal int) is the same
    argument. Python ints become int32 kernel arguments.
    """

    COPIES = 8

    __slots__ = ("kernel", "copies")

    def __init__(self, kernel):
        self.kernel = kernel
        self.copies: list = []  # [(args, cl.Kernel)], the most recently used first

    def __call__(self, queue, grid, local, *args, wait_for=None):
        recording = _recording.active
        if recording is not None:
            return recording.add(self, queue, grid, local, args, wait_for)
        copies = self.copies
        if copies and copies[0][0] == args:
            kernel = copies[0][1]
        else:
            kernel = self._kernel_for(args)
        return cl.enqueue_nd_range_kernel(queue, kernel, grid, local, wait_for=wait_for)

    def _kernel_for(self, args: tuple):
        copies = self.copies
        for i, (held, kernel) in enumerate(copies):
            if held == args:
                copies.insert(0, copies.pop(i))
                return kernel
        if not copies:
            kernel = self.kernel
        elif len(copies) < self.COPIES:
            kernel = cl.Kernel(self.kernel.program, self.kernel.function_name)
        else:
            kernel = copies.pop()[1]
        kernel.set_args(*kernel_args(args))
        copies.insert(0, (args, kernel))  # holding args keeps the buffers alive while a kernel refers to them
        return kernel


def kernel_args(args: tuple):
    """A launch's arguments as pyopencl's set_args takes them: Python ints as int32."""
    return (np.int32(a) if isinstance(a, int) else a for a in args)


class NotRecordable(RuntimeError):
    """A launch that a recording cannot hold: on another queue, or waiting for events."""


class Recording:
    """The launches made on this thread while it is active (`with Recording(queue) as r:`), held instead of
    enqueued: each as (kernel, grid, local, args), `kernel` the Launch's own (a template: whoever replays them makes a
    kernel object of its own per launch with `args` set, so that nothing a later launch sets changes it;
    engine/replay.py). Launches return None while recording."""

    def __init__(self, queue):
        self.queue = queue
        self.launches: list = []

    def __enter__(self):
        if _recording.active is not None:
            raise NotRecordable("a recording is already active on this thread")
        _recording.active = self
        return self

    def __exit__(self, *exc):
        _recording.active = None

    def add(self, launch: Launch, queue, grid, local, args: tuple, wait_for) -> None:
        if queue is not self.queue:
            raise NotRecordable(f"{launch.kernel.function_name}: launched on another queue than the recording's")
        if wait_for:
            raise NotRecordable(f"{launch.kernel.function_name}: waits for events, which a replay cannot hold")
        self.launches.append((launch.kernel, tuple(grid), None if local is None else tuple(local), args))
        return None


class PerQueue:
    """A scratch buffer that a layer writes and reads again within one forward pass (split-K partial sums, a padded
    input), one per command queue: lanes (engine.py) run forward passes at once on queues of their own, and each
    needs its own scratch. `reserve` grows it while layers are built; a queue's buffer is made on its first use
    and kept, so nothing is allocated per call after a lane's first batch."""

    __slots__ = ("ctx", "nbytes", "buffers")

    def __init__(self, ctx, nbytes: int = 0):
        self.ctx, self.nbytes, self.buffers = ctx, 0, {}
        self.reserve(nbytes)

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.nbytes:
            self.release()
            self.nbytes = nbytes

    def release(self) -> None:
        for buf in self.buffers.values():
            buf.release()
        self.buffers = {}

    def get(self, queue):
        buf = self.buffers.get(queue)
        if buf is None:
            buf = self.buffers[queue] = cl.Buffer(self.ctx, MF.READ_WRITE, max(1, self.nbytes))
        return buf


def upload(ctx, array: np.ndarray, dtype=np.float32):
    """A read-only device copy of `array` converted to `dtype` (the storage type: float32 or float16)."""
    return cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(array, dtype=dtype))


def first_last(ev):
    """(first, last) event of a layer's launches: layers return one event or a (first, last) pair."""
    return ev if isinstance(ev, tuple) else (ev, ev)
