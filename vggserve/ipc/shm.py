"""Pixels and tensors from an HTTP front end to the engine process through shared memory instead of the link's
socket.

A decoded photo is half a megabyte; sent through the link it is copied into the socket, out of it and into a new
array, all in the engine process while its device worker waits for the GIL. Instead each front end owns an
`Arena`, a POSIX shared-memory segment the engine maps once (its name comes in the "hello" message): the front end
copies a model input's array (uint8 pixels of an image or a crop, a v2 request's float32 tensor, or the bytes of a
file the engine's device decodes) into a block of it and sends only `Shared(offset, shape, form, dtype)`; the
engine's queue holds a
view of the block, which the device worker copies into its pinned staging memory. The block is freed when the
engine's answer for that image arrives, and the engine answers only after it has copied the pixels (or decided
not to compute them), so a block is never reused while the engine may still read it.

Blocks are handed out first-in first-out around the segment (answers come back in about the order images went
out); when the arena has no room (or no shared memory could be made, e.g. a tiny /dev/shm) the pixels travel
inline in the message as before.

Named segments are called `vggserve_<pid>_<random>` after the process that made them (`segment_name`), so that
one left behind by a killed process can be told from a live one's and released (ipc/orphans.py).
`anonymous_segment` makes one that has no name at all: the decode processes' ring (ring.py) is handed to them as a
descriptor, so the kernel frees it with the last process that holds it, however that process ends.
"""

import logging
import mmap
import os
import secrets
import threading
from multiprocessing import shared_memory
from typing import NamedTuple

import numpy as np

from ..modelinput import CROP, FORMS, ModelInput

log = logging.getLogger("vggserve.ipc")

ARENA_BYTES = 32 << 20  # per front end: ~57 decoded 500x375 photos in flight
ALIGN = 64
SEGMENT_PREFIX = "vggserve_"  # named segments: vggserve_<pid of the creator>_<random hex>


class Shared(NamedTuple):
    """Where the array of a model input of `form` (modelinput.FORMS), `shape` and `dtype` lies in the sender's
    arena. A named tuple: one is sent per image over the engine link, and it unpickles in half a dataclass's time."""

    offset: int
    shape: tuple
    form: str
    dtype: str = "uint8"


class Arena:
    """The front end's side: a shared-memory segment and a FIFO block allocator over it (thread-safe)."""

    def __init__(self, nbytes: int = ARENA_BYTES):
        self.memory = create_segment(nbytes)
        self.size = nbytes
        self._lock = threading.Lock()
        self._blocks: dict[int, list] = {}  # start -> [end, freed], in allocation order
        self._head = 0  # where the next block starts

    @property
    def name(self) -> str:
        return self.memory.name

    def _find(self, nbytes: int) -> int | None:
        if not self._blocks:
            self._head = 0
            return 0 if nbytes <= self.size else None
        tail = next(iter(self._blocks))  # oldest live block
        if self._head > tail:  # live region [tail, head): room after head, else wrap to the start
            if self._head + nbytes <= self.size:
                return self._head
            return 0 if nbytes <= tail else None
        return self._head if self._head + nbytes <= tail else None  # wrapped: room between head and tail

    def put(self, pixels: np.ndarray, form: str) -> Shared | None:
        """Copy the array of a model input of `form` into a free block; None when there is no room (the caller
        sends it inline)."""
        if form not in FORMS:
            raise ValueError(f"a shared model input's form is one of {', '.join(FORMS)}, got {form!r}")
        nbytes = pixels.nbytes
        with self._lock:
            start = self._find(nbytes)
            if start is None:
                return None
            self._blocks[start] = [start + nbytes, False]
            self._head = -(-(start + nbytes) // ALIGN) * ALIGN
        np.copyto(np.ndarray(pixels.shape, pixels.dtype, self.memory.buf, start), pixels)
        return Shared(start, pixels.shape, form, pixels.dtype.name)

    def put_image(self, image) -> Shared | None:
        """`put` for a queued `ModelInput` of any form (or a bare uint8 crop); `Mapped.image` undoes it."""
        if not isinstance(image, ModelInput):
            image = ModelInput(CROP, image)
        return self.put(image.array, image.form)

    def free(self, shared: Shared) -> None:
        """The engine has answered for that image: its block (and any freed ones behind the oldest) return."""
        with self._lock:
            block = self._blocks.get(shared.offset)
            if block is None:
                return
            block[1] = True
            while self._blocks:
                start = next(iter(self._blocks))
                if not self._blocks[start][1]:
                    break
                del self._blocks[start]

    def close(self) -> None:
        self.memory.close()
        self.memory.unlink()


def segment_name() -> str:
    """A new segment name that says which process made it: vggserve_<pid>_<8 hex digits>."""
    return f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


def create_segment(nbytes: int) -> shared_memory.SharedMemory:
    """A new POSIX shared-memory segment of `nbytes` named by `segment_name`, its pages reserved now: a full
    /dev/shm then fails here (OSError, ENOSPC), not later with SIGBUS on a write. The creator closes and unlinks
    it; one left by a killed creator is released by the next `vggserve batch` (ipc/orphans.py)."""
    for _ in range(8):
        try:
            memory = shared_memory.SharedMemory(name=segment_name(), create=True, size=nbytes)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError("no free shared-memory name after 8 attempts")
    try:
        _reserve(memory._fd, nbytes)
    except OSError:
        memory.close()
        memory.unlink()
        raise
    return memory


def anonymous_segment(nbytes: int) -> int:
    """A descriptor of `nbytes` of new shared memory that no name refers to (close-on-exec: pass it to a child in
    Popen's pass_fds; map it with `map_descriptor`). Linux: memfd_create; elsewhere a POSIX segment unlinked as
    soon as it is open. Its pages are reserved now, as in `create_segment`."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("vggserve-ring", os.MFD_CLOEXEC)
    else:
        import _posixshmem

        name = "/" + segment_name()
        fd = _posixshmem.shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
        _posixshmem.shm_unlink(name)
    try:
        os.ftruncate(fd, nbytes)
        _reserve(fd, nbytes)
    except OSError:
        os.close(fd)
        raise
    return fd


def map_descriptor(fd: int) -> mmap.mmap:
    """The whole of a shared-memory descriptor, mapped (the mapping keeps its own reference to the memory)."""
    return mmap.mmap(fd, os.fstat(fd).st_size)


def _reserve(fd: int, nbytes: int) -> None:
    if hasattr(os, "posix_fallocate"):  # Linux; elsewhere the segment is used as it is
        os.posix_fallocate(fd, 0, nbytes)


class Mapped:
    """The engine's side: a front end's arena mapped by name; `view` gives an image's pixels. Mapped with mmap
    rather than SharedMemory, which would register the segment with a resource tracker (a process of its own) as
    if this process owned it."""

    def __init__(self, name: str):
        import _posixshmem

        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
        try:
            self.memory = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def view(self, shared: Shared) -> np.ndarray:
        return np.ndarray(shared.shape, np.dtype(shared.dtype), self.memory, shared.offset)

    def image(self, shared: Shared) -> ModelInput:
        """The model input `Arena.put_image` stored, over a view of its block (no copy)."""
        return ModelInput(shared.form, self.view(shared))

    def close(self) -> None:
        """Let go of the mapping: it is unmapped when the last view of it is gone. (Closing the mmap here would unmap
        it under views still referenced: numpy holds no buffer export on it, so mmap.close() would not refuse.)"""
        self.memory = None


def make_arena(nbytes: int = ARENA_BYTES) -> Arena | None:
    """An arena, or None (with a log line) where shared memory cannot be had: pixels then travel inline."""
    try:
        return Arena(nbytes)
    except OSError as exc:
        log.warning("no shared memory for pixels (%s); they go through the engine link", exc)
        return None
