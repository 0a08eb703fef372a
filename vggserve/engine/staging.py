"""Host <-> device traffic of the engine: pinned staging memory, two batches in flight, results collected lazily.

Each `Slot` is one batch in flight: pinned (page-locked) host arrays for the input and the output and the device
buffers the input lands in. Uploads run on their own queue, so batch i+1's upload overlaps batch i's kernels;
with two slots a third submit first collects the batch that used its slot. Pinned memory is what lets the
driver DMA at full bus speed: on NVIDIA's OpenCL a buffer made with ALLOC_HOST_PTR and kept mapped is pinned,
and copies from its host pointer are asynchronous.
"""

import threading

import numpy as np
import pyopencl as cl

from ..weights.spec import INPUT_SIZE, NUM_CLASSES
from ..ops.resize import place_images
from ..runtime.hostcopy import copy_into, copy_many

MF = cl.mem_flags
S = INPUT_SIZE


def pinned(ctx, queue, shape: tuple, dtype) -> tuple:
    """(buffer, numpy array over its mapped pinned host memory); the mapping lives as long as the slot."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = cl.Buffer(ctx, MF.READ_WRITE | MF.ALLOC_HOST_PTR, nbytes)
    array, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, shape, dtype,
                                     is_blocking=True)
    return buf, array


class Slot:
    """Staging and input buffers for one batch of up to `batch` images."""

    def __init__(self, ctx, queue, batch: int):
        self.input = cl.Buffer(ctx, MF.READ_WRITE, 4 * batch * 3 * S * S)  # float32 model input
        self.pixels = cl.Buffer(ctx, MF.READ_ONLY, batch * S * S * 3)      # uint8 crops, when given pixels
        self._bufs = [pinned(ctx, queue, (batch, 3, S, S), np.float32), pinned(ctx, queue, (batch, S, S, 3), np.uint8),
                      pinned(ctx, queue, (batch, NUM_CLASSES), np.float32)]
        self.host_input, self.host_pixels, self.host_out = (a for _, a in self._bufs)
        self.raw = RawStage(ctx, queue)  # raw images for the device resize, when a batch has some
        self.pending: "Pending | None" = None

    def stage(self, copy_queue, x: np.ndarray, pinned: bool = True):
        """Start x's upload on copy_queue, from pinned memory (x copied there first) or, with pinned=False,
        straight from x (no host copy: quicker when nothing else would overlap it); returns the upload's event."""
        n = x.shape[0]
        if x.dtype == np.uint8:
            host, dev = self.host_pixels[:n], self.pixels
        else:
            host, dev = self.host_input[:n], self.input
        if pinned:
            copy_into(host, x)
        return cl.enqueue_copy(copy_queue, dev, host if pinned else x, is_blocking=False)

    def stage_images(self, copy_queue, crops: dict, raws: list) -> list:
        """Start the upload of a batch given as images: `crops` {index: uint8 (224, 224, 3)} go where they belong
        in the pixel buffer; `raws` [(index, uint8 (h, w, 3))] are packed back to back into the raw buffer (for
        the device resize, which writes their crops). Returns (upload events, [(offset, w, h, index)])."""
        n = max([*crops, *(i for i, _ in raws)]) + 1
        copies = [(self.host_pixels[i], crop) for i, crop in crops.items()]
        placed, offset = place_images(raws)
        if raws:
            host, dev = self.raw.ensure(offset)  # dev is self.raw.device
            copies += [(host[start:start + pixels.nbytes], pixels.reshape(-1))
                       for (start, _, _, _), (_, pixels) in zip(placed, raws)]
        copy_many(copies)  # every image into the pinned staging, over the copying threads when they are many
        events = [cl.enqueue_copy(copy_queue, self.pixels, self.host_pixels[:n], is_blocking=False)] if crops else []
        if raws:
            events.append(cl.enqueue_copy(copy_queue, dev, host[:offset], is_blocking=False))
        return events, placed

    def release(self, queue) -> None:
        for buf, array in self._bufs:
            array.base.release(queue)
            buf.release()
        self.input.release()
        self.pixels.release()
        self.raw.release()
        self._bufs = []


class RawStage:
    """Pinned host memory and a device buffer for one batch's raw images, made on first use and grown (never
    shrunk) to the largest batch seen: a 500x375 photo is 0.56 MB, 32 of them 18 MB."""

    MIN_BYTES = 16 << 20

    def __init__(self, ctx, queue):
        self.ctx, self.queue = ctx, queue
        self.capacity = 0
        self._pinned = self._device = None

    def ensure(self, nbytes: int) -> tuple:
        """(pinned uint8 host array, device buffer) of at least nbytes. Growing frees the old ones, so the caller
        makes sure no upload from them is still running (a slot's previous batch is collected first)."""
        if nbytes > self.capacity:
            self.release()
            self.capacity = max(nbytes, 2 * self.capacity, self.MIN_BYTES)
            self._pinned = pinned(self.ctx, self.queue, (self.capacity,), np.uint8)
            self._device = cl.Buffer(self.ctx, MF.READ_ONLY, self.capacity)
        return self._pinned[1], self._device

    @property
    def device(self):
        return self._device

    def release(self) -> None:
        if self._pinned is not None:
            buf, array = self._pinned
            array.base.release(self.queue)
            buf.release()
            self._device.release()
        self._pinned = self._device = None
        self.capacity = 0


class Pending:
    """A batch on its way through the device. `result()` waits for it and returns its (n, 1000) float32 rows."""

    def __init__(self, slot: Slot, n: int, read_event):
        self._slot, self._n, self._event = slot, n, read_event
        self._out: np.ndarray | None = None
        self._lock = threading.Lock()

    def result(self) -> np.ndarray:
        with self._lock:
            if self._out is None:
                self._event.wait()
                self._out = self._slot.host_out[:self._n].copy()
                if self._slot.pending is self:
                    self._slot.pending = None
        return self._out

    def done(self) -> bool:
        return self._out is not None or \
            self._event.command_execution_status == cl.command_execution_status.COMPLETE
