"""JPEGs decoded on a model's own device and left there: the engine resizes and crops them in place.

    items = decode_for_model(model, [jpeg_bytes, png_bytes])   # DeviceImage | ModelInput | ImageError, in order
    model.submit([x for x in items if not isinstance(x, Exception)])

A file the device decodes becomes a `DeviceImage`: its upright, aspect-limited pixels in a device buffer of this
call (an image that Resize(256) changes), or straight its 224 x 224 centre crop (one that Resize(256) keeps). Any
other file goes the CPU way, `decode_pixels` + `device_input`, with its results and errors; so does a JPEG whose
stream the device found unusual.
"""

from __future__ import annotations

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
    decoded it; the buffer is freed when the last image of its call is dropped."""

    buffer: object
    offset: int
    width: int
    height: int
    kind: str
    form: str = "device"  # what a batch's inputs are asked for (modelinput.prepare_batch, pipeline)
    needs_resize: bool = True  # such a batch goes to submit as a list


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
                     cpu=None) -> list:
    """Per file of `datas` (bytes): a DeviceImage, a CPU-decoded ModelInput, or the ImageError the CPU path raises.
    `cpu(data)`: that CPU path, upright RGB pixels (a PIL image or a uint8 array) or an ImageError (default:
    `decode_pixels` with these limits; the service passes its own, which makes any decoder failure an ImageError)."""
    from ...errors import ImageError
    from ...modelinput import device_input
    from ..decode import decode_pixels

    items: list = [None] * len(datas)
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
    if chosen:
        decoder, queue, lock = model.jpeg_decoder()
        buffer = cl.Buffer(decoder.context, cl.mem_flags.READ_WRITE, offset)
        with lock:  # the launches; the wait below lets another thread enqueue its batch meanwhile
            run = decoder.enqueue(queue, [p for _, p in chosen], windows, buffer)
        ok = run.ok()  # waits: pixels complete
        for (i, _), window, kind, good in zip(chosen, windows, kinds, ok):
            if good:
                items[i] = DeviceImage(buffer, window.offset, window.width, window.height, kind)
    for i, data in enumerate(datas):
        if items[i] is None:
            try:
                pixels = cpu(data) if cpu else decode_pixels(data, max_pixels=max_pixels, formats=formats)
                items[i] = device_input(pixels)
                if not isinstance(pixels, np.ndarray):
                    pixels.close()
            except ImageError as exc:
                items[i] = exc
    return items
