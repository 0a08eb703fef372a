"""JPEGs decoded on a model's own device and left there: the engine resizes and crops them in place.

    items = decode_for_model(model, [jpeg_bytes, png_bytes])   # DeviceImage | ModelInput | ImageError, in order
    model.submit([x for x in items if not isinstance(x, Exception)])

A file the device decodes becomes a `DeviceImage`: its upright, aspect-limited pixels in a device buffer of this
call (an image that Resize(256) changes), or straight its 224 x 224 centre crop (one that Resize(256) keeps). Any
other file goes the CPU way, `decode_pixels` + `device_input`, with its results and errors; so does a JPEG whose
stream the device found unusual.

The calls' buffers come from a pool per decoder (`OutputPool`): a fresh buffer per batch cost the host more than the
whole decode's launches (the release of 36 MB of written memory: 2.9 ms per batch of 64 photos on PoCL). A buffer
goes back to the pool once the last DeviceImage of its call is dropped; whoever enqueues a read of a DeviceImage's
pixels passes that command's event to `DeviceImage.read_by` (the engine's submit does), and the next decode into
the buffer waits for those reads on the device.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ...images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS
from ...ops.resize import crop_tables
from ...preprocessing import CROP_SIZE, aspect_box, crop_offsets
from .decoder import Prepared, Window, prepare
from .parse import Refusal

IMAGE, CROP = "image", "crop"


@dataclass(frozen=True, eq=False)
class DeviceImage:
    """One decoded image in device memory, as the engine's submit takes it: `kind` IMAGE (width x height RGB at
    `offset` of `buffer`, to resize and crop) or CROP (the 224 x 224 crop itself). Lives in the process that
    decoded it; the buffer goes back to its decoder's pool when the last image of its call is dropped (`lease`)."""

    buffer: object
    offset: int
    width: int
    height: int
    kind: str
    form: str = "device"  # what a batch's inputs are asked for (modelinput.prepare_batch, pipeline)
    needs_resize: bool = True  # such a batch goes to submit as a list
    lease: object = None  # the pool's _Lease of `buffer` (None: a buffer of the caller's own)

    def read_by(self, event) -> None:
        """Note a command that reads these pixels (its event): the buffer's next decode waits for it."""
        if self.lease is not None:
            self.lease.reads.append(event)


class _Lease:
    """One call's hold on a pooled buffer, shared by its DeviceImages: back in the pool, with the events of the
    reads enqueued from it, when the last of them is dropped."""

    __slots__ = ("pool", "buffer", "size", "reads")

    def __init__(self, pool, buffer, size: int, reads: list):
        self.pool, self.buffer, self.size, self.reads = pool, buffer, size, reads

    def __del__(self):
        self.pool._free.append((self.size, self.buffer, self.reads))  # list.append: atomic under the GIL


class OutputPool:
    """Output buffers of one decoder's context, reused call after call (at most KEEP idle ones, KEEP_BYTES in all,
    kept; a buffer is sized with HEADROOM for the next batch's different images)."""

    KEEP, KEEP_BYTES, HEADROOM, GRAIN = 4, 512 << 20, 8, 1 << 20

    def __init__(self, context):
        self.context, self._free, self._lock = context, [], threading.Lock()

    def take(self, nbytes: int) -> tuple[_Lease, list]:
        """(a lease of a buffer of at least `nbytes`, the events of the reads its last images had enqueued: the
        decode into it waits for them)."""
        with self._lock:
            fits = [entry for entry in list(self._free) if entry[0] >= nbytes]
            if fits:
                entry = min(fits, key=lambda e: e[0])
                self._free.remove(entry)
                size, buffer, reads = entry
            else:
                size = -(-(nbytes + nbytes // self.HEADROOM) // self.GRAIN) * self.GRAIN
                buffer, reads = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size), []
            idle = sorted(list(self._free), key=lambda e: e[0])  # the smallest go first
            while idle and (len(idle) > self.KEEP or sum(e[0] for e in idle) > self.KEEP_BYTES):
                self._free.remove(idle.pop(0))
        return _Lease(self, buffer, size, []), reads


_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def output_pool(decoder) -> OutputPool:
    """The OutputPool of a JpegDecoder (made on first use)."""
    with _pools_lock:
        pool = _pools.get(decoder)
        if pool is None:
            pool = _pools[decoder] = OutputPool(decoder.context)
        return pool


def window_for(p: Prepared, offset: int) -> tuple[Window, str]:
    """Where the device writes a file for the engine: the aspect-limited box when Resize(256) changes it (the
    device resize takes it from there), else that box's centre crop, which is then the model's input as it is."""
    w, h = p.size
    box = aspect_box(w, h) or (0, 0, w, h)
    bw, bh = box[2] - box[0], box[3] - box[1]
    if crop_tables(bw, bh) is not None:
        return Window(offset, box[0], box[1], bw, bh), IMAGE
    top, left = crop_offsets(bh, bw, CROP_SIZE)
    return Window(offset, box[0] + left, box[1] + top, CROP_SIZE, CROP_SIZE), CROP


def decode_for_model(model, datas, *, max_pixels: int = DEFAULT_MAX_PIXELS, formats=ALLOWED_FORMATS,
                     cpu=None, staged=None) -> list:
    """Per file of `datas` (bytes, or contiguous uint8 buffers: `prepare`): a DeviceImage, a CPU-decoded ModelInput,
    or the ImageError the CPU path raises. `cpu(data)`: that CPU path, upright RGB pixels (a PIL image or a uint8
    array) or an ImageError (default: `decode_pixels` with these limits; the service passes its own, which makes any
    decoder failure an ImageError). `staged`: the pinned FileArena `datas` were read into, if they were
    (`JpegDecoder.enqueue`). `start_decode(...).items()` in one call."""
    return start_decode(model, datas, max_pixels=max_pixels, formats=formats, cpu=cpu, staged=staged).items()


@dataclass(eq=False)
class StartedDecode:
    """A device decode launched by `start_decode`, not waited for: `items()` waits for it and answers every file,
    so a caller can launch the next batch's decode before it waits for this one's."""

    datas: list
    chosen: list  # (index in datas, Prepared) of the files the device decodes
    windows: list  # their Windows, and kinds (IMAGE or CROP), in the same order
    kinds: list
    run: object  # the decoder's Run, None when the device decodes none
    lease: object  # the output buffer's _Lease, until items() hands it to the DeviceImages
    max_pixels: int
    formats: object
    cpu: object

    def items(self) -> list:
        """decode_for_model's answer: waits for the device's statuses, then decodes on the CPU what it refused."""
        from ...errors import ImageError
        from ...modelinput import device_input
        from ..decode import decode_pixels

        datas, cpu = self.datas, self.cpu
        items: list = [None] * len(datas)
        if self.run is not None:
            ok = self.run.ok()  # waits: pixels complete
            lease = self.lease
            for (i, _), window, kind, good in zip(self.chosen, self.windows, self.kinds, ok):
                if good:
                    items[i] = DeviceImage(lease.buffer, window.offset, window.width, window.height, kind,
                                           lease=lease)
        self.lease = self.run = None  # the DeviceImages hold the lease from here
        for i, data in enumerate(datas):
            if items[i] is None:
                try:
                    pixels = cpu(data) if cpu else decode_pixels(bytes(data), max_pixels=self.max_pixels,
                                                                  formats=self.formats)
                    items[i] = device_input(pixels)
                    if not isinstance(pixels, np.ndarray):
                        pixels.close()
                except ImageError as exc:
                    items[i] = exc
        return items


def start_decode(model, datas, *, max_pixels: int = DEFAULT_MAX_PIXELS, formats=ALLOWED_FORMATS,
                 cpu=None, staged=None) -> StartedDecode:
    """The host's part of `decode_for_model`: each file prepared, the device decode of those it takes launched on
    the model's decoder queue; the StartedDecode's `items()` waits for it."""
    chosen, windows, kinds, offset = [], [], [], 0
    for i, data in enumerate(datas):
        p = prepare(data, max_pixels, formats)
        if isinstance(p, Refusal):
            continue
        window, kind = window_for(p, offset)
        chosen.append((i, p))
        windows.append(window)
        kinds.append(kind)
        offset += window.width * window.height * 3
    run = lease = None
    if chosen:
        decoder, queue, lock = model.jpeg_decoder()
        lease, reads = output_pool(decoder).take(offset)
        with lock:  # the launches (the decode waits on the device for the reads of the buffer's last images); the
            # wait for the statuses in items() lets another thread launch its batch meanwhile
            run = decoder.enqueue(queue, [p for _, p in chosen], windows, lease.buffer, wait_for=reads or None,
                                  staged=staged)
    return StartedDecode(datas, chosen, windows, kinds, run, lease, max_pixels, formats, cpu)
