"""Pinned host memory for the device decoder's uploads, reused batch after batch.

A batch's files (about 5 MB for 64 photos), its tables and its chunks go to the device from here. Fresh host
arrays would cost a page fault per 4 KB on every batch (a 5 MB join took as long as the device's whole decode), and
uploads from pageable memory are slower. Slots are taken in turn, so the host lays out batch i + 1 while batch i's
uploads still read their slot; a slot is written again only once the uploads that read it have completed.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

SLOTS = 3


def pinned_array(context, queue, nbytes: int) -> tuple:
    """(ALLOC_HOST_PTR buffer of nbytes, its uint8 array mapped for reading and writing on `queue`, blocking): host
    memory the driver DMAs from directly. The map is undone by `array.base.release(queue)`, or when the last view
    of the array is dropped."""
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
    array, _ = cl.enqueue_map_buffer(queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,), np.uint8,
                                     is_blocking=True)
    return buffer, array


class _Pinned:
    """One growing pinned array (an ALLOC_HOST_PTR buffer kept mapped: the driver DMAs from it directly)."""

    def __init__(self, context):
        self.context, self.buffer, self.array = context, None, np.zeros(0, np.uint8)

    def get(self, queue, nbytes: int) -> np.ndarray:
        if nbytes > self.array.size:
            size = max(nbytes, self.array.size + self.array.size // 2, 1 << 16)
            self.close(queue)
            self.buffer, self.array = pinned_array(self.context, queue, size)
        return self.array[:nbytes]

    def close(self, queue) -> None:
        if self.buffer is not None:
            self.array.base.release(queue)
            self.buffer, self.array = None, np.zeros(0, np.uint8)


def pinned_arena(context):
    """A FileArena whose buffers are pinned memory of `context` (mapped ALLOC_HOST_PTR buffers, unmapped when the
    last view of one is dropped): the decoder uploads files read into it from where they lie
    (`JpegDecoder.enqueue`'s `staged`), without copying them into a slot first."""
    from ...filearena import FileArena

    queue = cl.CommandQueue(context)  # its own: a map on the decoder's queue would wait for every decode before it

    return FileArena(allocate=lambda nbytes: pinned_array(context, queue, nbytes)[1])


class Grown:
    """A device buffer that grows to the largest size asked for (by half again at least, so it rarely moves)."""

    def __init__(self, context, flags=cl.mem_flags.READ_WRITE):
        self.context, self.flags, self.size, self.buffer = context, flags, 0, None

    def get(self, nbytes: int):
        if nbytes > self.size:
            self.size = max(nbytes, self.size + self.size // 2, 4096)
            self.buffer = cl.Buffer(self.context, self.flags, self.size)
        return self.buffer


class Slot:
    """Pinned arrays by role for one batch: its uploads ("data", "meta", "chunk"), the events that read them, and
    its statuses read back ("status", "parallel")."""

    def __init__(self, context):
        self.context = context
        self._arrays: dict[str, _Pinned] = {}
        self._device: dict[str, Grown] = {}
        self.reads: list = []
        self.run = None  # the batch whose statuses are read into this slot (decoder.Run)

    def array(self, queue, role: str, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """A pinned array of `nbytes` bytes viewed as `dtype` (its contents are the slot's last batch's)."""
        pinned = self._arrays.setdefault(role, _Pinned(self.context))
        return pinned.get(queue, max(nbytes, 1))[:nbytes].view(dtype)

    def device(self, role: str, nbytes: int):
        """A device buffer of this slot's own for `role` (grown to the largest size asked for): one the host maps to
        read a batch's results while later batches run in other slots' buffers."""
        return self._device.setdefault(role, Grown(self.context)).get(nbytes)

    def put(self, queue, role: str, values: np.ndarray) -> np.ndarray:
        """`values` copied into the slot's pinned array for `role`."""
        out = self.array(queue, role, values.nbytes, values.dtype).reshape(values.shape)
        np.copyto(out, values)
        return out


class StagingRing:
    """SLOTS slots taken in turn; `next()` waits until the slot's previous uploads have read it."""

    def __init__(self, context, slots: int = SLOTS):
        self._slots = [Slot(context) for _ in range(slots)]
        self._turn = 0

    def next(self) -> Slot:
        slot = self._slots[self._turn]
        self._turn = (self._turn + 1) % len(self._slots)
        if slot.reads:
            cl.wait_for_events(slot.reads)
            slot.reads = []
        if slot.run is not None:  # its statuses move out of the slot's memory before the slot is written again
            slot.run.keep()
            slot.run = None
        return slot
