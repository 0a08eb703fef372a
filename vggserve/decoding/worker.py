"""One decode process of a `DecodePool` (pool.py): decodes the sources it is sent, one at a time, into its region
of the pool's shared memory, and answers with where the pixels lie.

Started by the pool as a fresh interpreter (`python -c ...` with the socket's descriptor as argument: no OpenCL
context, MPI state or threads inherited), it receives a `WorkerStart`, says ("ready", pid), then receives lists of
sources and answers each list with one message: the list of its sources' answers, in order, each one of

    ("shared", start, end, shape, dtype, form, stage seconds)  the model input lies in its region of the pool's
                                                               shared memory, at positions [start, end)
    ("inline", array, form, stage seconds)                     no room there: the array itself (pickled)
    ("error", (reason, type name), stage seconds)              the image could not be decoded

`form`: the `modelinput.ModelInput` form of the array (image, crop or tensor). Before each source it notes in the
ring's header that it begins one (`RegionWriter.begin`), so the pool knows which source of a list it died or hung
on. It ends when the pool sends
None or closes the socket, and dies with the pool (Linux: PR_SET_PDEATHSIG, tied to the pool's supervisor thread,
which starts every process). SIGINT and
SIGTERM are ignored: a Ctrl+C in the terminal reaches the whole process group, as does a SIGTERM sent to the group
(or to a container's processes), and the pool stops its processes itself once its rank has stopped.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from ..ipc.ring import RegionSpec, RegionWriter
from .decode import model_input, problem_of
from .stages import StageClock


#: What a decode process runs for each source unless its DecodeJob names another task ("module:function", called
#: as task(source, job, allocate, clock)). Read by the pool when it starts; tests point it at stand-ins that crash
#: or hang.
DEFAULT_TASK = "vggserve.decoding.worker:decode_task"


@dataclass(frozen=True)
class DecodeJob:
    """What every decode process of a pool does with a source: `model_input(source, mode, on_device, decode,
    max_pixels=..., formats=...)`, through `task` (None: DEFAULT_TASK)."""

    mode: str
    on_device: bool
    decode: str = "exact"
    max_pixels: int | None = None  # None: open_image's default
    formats: tuple | None = None  # None: open_image's default
    task: str | None = None

    @property
    def limits(self) -> dict:
        """The `model_input` keywords this job sets: max_pixels and formats, where not None."""
        return {k: v for k, v in (("max_pixels", self.max_pixels), ("formats", self.formats)) if v is not None}


@dataclass(frozen=True)
class WorkerStart:
    job: DecodeJob
    region: RegionSpec | None  # None: no shared memory, every answer inline
    parent: int  # the pool's process id


def decode_task(source, job: DecodeJob, allocate, clock):
    """The model input for `source`, as `decoding.model_input` makes it."""
    return model_input(source, job.mode, job.on_device, job.decode, allocate=allocate, clock=clock, **job.limits)


def _resolve(task: str):
    module, _, name = task.partition(":")
    return getattr(importlib.import_module(module), name)


class Decoder:
    """Runs the job on one source after another, placing results in the region."""

    def __init__(self, start: WorkerStart):
        self.job = start.job
        self.task = _resolve(start.job.task)
        self.writer = RegionWriter(start.region) if start.region is not None else None

    def begin(self) -> None:
        if self.writer is not None:
            self.writer.begin()

    def answer(self, source):
        clock = StageClock()
        taken: list = []  # the block the decoder asked for, if any: [(block, array)]

        def allocate(shape, dtype):
            got = self.writer.allocate(shape, dtype) if self.writer is not None else None
            if got is None:
                return None
            taken.append(got)
            return got[1]

        try:
            result = self.task(source, self.job, allocate, clock)
        except Exception as exc:  # an unreadable image: answered, never fatal
            for block, _ in taken:
                self.writer.undo(block)
            return ("error", problem_of(exc), clock.seconds)
        form, pixels = result.form, result.array
        if taken and _same_memory(pixels, taken[0][1]):
            return _shared(taken[0][0], pixels, form, clock)
        for block, _ in taken:  # decoded elsewhere after all (another library, a turned image)
            self.writer.undo(block)
        with clock("copy"):
            got = self.writer.allocate(pixels.shape, pixels.dtype) if self.writer is not None else None
            if got is not None:
                np.copyto(got[1], pixels)
        if got is None:
            return ("inline", pixels, form, clock.seconds)
        return _shared(got[0], pixels, form, clock)


def _shared(block, pixels: np.ndarray, form: str, clock: StageClock) -> tuple:
    return ("shared", block.start, block.end, pixels.shape, pixels.dtype.str, form, clock.seconds)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.ctypes.data == b.ctypes.data


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the thread that started it ends; elsewhere the closed socket ends it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def serve(conn: Connection) -> None:
    start: WorkerStart = conn.recv()
    _die_with_parent(start.parent)
    decoder = Decoder(start)
    from . import jpeg

    jpeg.adopted()  # the probe, before the first image
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        answers = []
        for source in message:
            decoder.begin()
            answers.append(decoder.answer(source))
        conn.send(answers)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[-1]))
    try:
        serve(conn)
    finally:
        conn.close()
