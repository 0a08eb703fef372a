"""JPEG decoding on the OpenCL device, bit for bit as Pillow (libjpeg-turbo's ISLOW IDCT, fancy upsampling, its
colour tables), for baseline Huffman-coded 8-bit files; every other file falls back to the CPU path per image.

Stages, one module or kernel file each, in libjpeg-turbo's layout:
    parse.py                 markers and tables (the only CPU work per file), or the reason for the CPU path
    exif.py                  what Pillow reads from the APP1/APP2 segments (EXIF orientation, MPO), without Pillow
    tables.py                the batch's layout for the kernels: segments, planes, Huffman lookup tables
    kernels/jpeg_huffman.cl  entropy decoding, one work-item per restart interval (jdhuff.c)
    kernels/jpeg_idct.cl     dequantisation + ISLOW IDCT, 8 work-items per block (jidctint.c)
    kernels/jpeg_color.cl    upsampling + YCbCr->RGB + EXIF orientation into a window (jdsample.c, jdcolor.c)
    decoder.py               prepare() per file, JpegDecoder.enqueue() per batch

    from vggserve.decoding import decode_on_device
    result = decode_on_device([open("a.jpg", "rb").read(), b"not an image"], device="auto")
    result[0]      # uint8 (h, w, 3), identical to np.asarray(decode_pixels(data))
    result[1]      # the ImageError decode_pixels raises for it
    result.paths   # ["device", "cpu"]: which path each input took
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from ...images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS
from .decoder import JpegDecoder, Prepared, Run, Window, prepare
from .parse import Refusal, parse

__all__ = ["DEVICE", "CPU", "Decoded", "JpegDecoder", "Prepared", "Refusal", "Run", "Window", "decode_on_device",
           "parse", "prepare"]

DEVICE, CPU = "device", "cpu"
_decoders: dict = {}
_lock = threading.Lock()


class Decoded(list):
    """decode_on_device's answer: per input, a uint8 (h, w, 3) array or the ImageError; `.paths[i]` is "device"
    or "cpu" (the CPU fallback: another format, a JPEG kind the device does not decode, a stream it found
    corrupt), and `.reasons[i]` why a JPEG took the CPU path ("" for the device)."""

    def __init__(self, items, paths, reasons):
        super().__init__(items)
        self.paths, self.reasons = paths, reasons


def _decoder_for(device):
    """(decoder, queue, lock) for a device spec, made once per process; or a model's own (`Engine.jpeg_decoder`)."""
    from ...runtime import devices as devs

    if hasattr(device, "jpeg_decoder"):
        return device.jpeg_decoder()
    info = devs.resolve(device)
    key = (info.platform_index, info.device_index)
    with _lock:
        if key not in _decoders:
            dev = devs.cl_device(info)
            context = cl.Context([dev])
            _decoders[key] = (JpegDecoder(context, dev), cl.CommandQueue(context), threading.Lock())
        return _decoders[key]


def decode_on_device(datas, device="auto", *, max_pixels: int = DEFAULT_MAX_PIXELS,
                     formats=ALLOWED_FORMATS) -> Decoded:
    """Decode a list of encoded images (bytes): JPEGs the device decoder takes in one sequence of launches on
    `device` (a device spec, or a model, whose context and programs are then used), everything else through
    `decode_pixels` on the CPU, with its results and errors."""
    from ..decode import decode_pixels

    datas = [bytes(d) for d in datas]
    items: list = [None] * len(datas)
    paths, reasons = [CPU] * len(datas), [""] * len(datas)
    chosen, windows, offset = [], [], 0
    for i, data in enumerate(datas):
        p = prepare(data, max_pixels, formats)
        if isinstance(p, Refusal):
            reasons[i] = p.reason
            continue
        chosen.append((i, p))
        windows.append(Window.whole(p, offset))
        offset += p.size[0] * p.size[1] * 3
    if chosen:
        decoder, queue, lock = _decoder_for(device)
        host = np.empty(offset, np.uint8)
        with lock:
            out = cl.Buffer(decoder.context, cl.mem_flags.READ_WRITE, max(offset, 1))
            run = decoder.enqueue(queue, [p for _, p in chosen], windows, out)
            ok, why = run.ok(), run.reasons()
            cl.enqueue_copy(queue, host, out)
        for (i, p), w, good, code in zip(chosen, windows, ok, why):
            if good:
                width, height = p.size
                items[i] = host[w.offset:w.offset + width * height * 3].reshape(height, width, 3)
                paths[i] = DEVICE
            else:
                reasons[i] = f"the device found the stream unusual (code {code})"
    for i, data in enumerate(datas):
        if paths[i] == CPU:
            try:
                items[i] = np.asarray(decode_pixels(data, max_pixels=max_pixels, formats=formats))
            except Exception as exc:
                from ...errors import ImageError

                if not isinstance(exc, ImageError):
                    raise
                items[i] = exc
    return Decoded(items, paths, reasons)


_arenas = threading.local()


def _file_arena():
    """This thread's FileArena: decode_inputs reads its paths into it, and nothing it answers refers to it."""
    arena = getattr(_arenas, "arena", None)
    if arena is None:
        from ...filearena import FileArena

        arena = _arenas.arena = FileArena()
    return arena


def decode_inputs(sources, model, mode: str, on_device: bool, **limits) -> list:
    """`decoding.decode_input`'s answer for each of `sources` (paths or bytes), with the JPEGs decoded on `model`'s
    device and left there (`onmodel.DeviceImage`, resized and cropped in place by its submit): [(input, None) or
    (None, (reason, exception type))], in order. Used by `classify --decode gpu` and the batch job's device decoder.
    Paths are read into the calling thread's FileArena (no fresh bytes per file). A model that does not resize on
    its device (`on_device` False) gets the decoded pixels as tensors, prepared here."""
    from ...errors import ImageError
    from ...modelinput import ModelInput
    from ...preprocessing import preprocess
    from ..decode import decode_input, problem_of
    from .onmodel import decode_for_model

    out: list = [None] * len(sources)
    datas, where = [], []
    arena = model.jpeg_decoder()[0].file_arena() if on_device else _file_arena()  # on_device: pinned, uploaded as is
    for i, got in enumerate(arena.read(sources)):  # views of this thread's arena, done with on return
        if isinstance(got, ImageError):
            out[i] = (None, problem_of(got))
        else:
            datas.append(got)
            where.append(i)
    if not datas:
        return out
    if on_device:
        items = decode_for_model(model, datas, staged=arena, **limits)
    else:
        items = [x if isinstance(x, Exception) else ModelInput.tensor(preprocess(x, mode))
                 for x in decode_on_device(datas, model, **limits)]
    for i, item in zip(where, items):
        if isinstance(item, Exception):  # the CPU path again on the source itself: its message names the file
            out[i] = decode_input(sources[i], mode, on_device=on_device, catch=ImageError, **limits)
        else:
            out[i] = (item, None)
    return out
