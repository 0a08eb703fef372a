"""One image from its bytes to what the model takes: the decode step shared by `classify`, the batch job (in its
threads or decode processes) and the service's front ends.

    pixels = decode_pixels("photo.jpg", decode="fast")         # upright RGB: a PIL image or a uint8 (h, w, 3) array
    x = model_input("photo.jpg", "torchvision", on_device=True) # ModelInput: an image or a crop; a tensor if not
    x, problem = decode_input(path, mode, on_device=True)      # problem: (reason, exception type) instead of raising

Decode modes (`--decode`):
    exact  every pixel decoded, as Pillow decodes it (JPEGs through libjpeg-turbo directly where that is Pillow's
           result bit for bit, jpeg.py): the preprocessing stays torchvision's, exactly. The default.
    fast   a JPEG is scaled down while decoding, in its DCT, by the largest of 1/2, 1/4, 1/8 that keeps its shorter
           side at least 256 (what Resize(256) needs); other formats decode whole. A 12 MP photo decodes as a
           500x375 one: several times less CPU, with slightly different pixels (their predictions agree with the
           exact mode's on almost every image: BENCHMARKS.md).
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np

from ..images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS, Source, decode_opened, open_checked, read_source
from ..modelinput import ModelInput, device_input, goes_raw
from ..preprocessing import RESIZE_SHORTER, aspect_box, check_mode, preprocess
from . import jpeg
from .stages import NO_CLOCK

DECODE_MODES = ("exact", "fast")

Allocate = Callable[[tuple, type], np.ndarray]  # (shape, dtype) -> a writable array where the result may go


def check_decode(decode: str) -> None:
    """ValueError unless `decode` is one of DECODE_MODES."""
    if decode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {decode!r}; choose one of {', '.join(DECODE_MODES)}")


def decode_pixels(source: Source, decode: str = "exact", *, max_pixels: int = DEFAULT_MAX_PIXELS,
                  formats=ALLOWED_FORMATS, into: Callable[[tuple], np.ndarray | None] | None = None, clock=NO_CLOCK):
    """Upright RGB pixels of `source` (path, bytes or binary file): a PIL image (close it when done) or, for a JPEG
    that libjpeg-turbo decoded directly, a uint8 (h, w, 3) array (in `into(shape)`'s array where it gave one).
    Raises `open_image`'s ImageErrors, with the same messages."""
    check_decode(decode)
    with clock("read"):
        data, where = read_source(source)
    with clock("decode"):
        shorter_side = RESIZE_SHORTER if decode == "fast" else None
        image = open_checked(io.BytesIO(data), where, max_pixels, formats)
        try:
            pixels = jpeg.decode(data, image, shorter_side, into)
        except BaseException:
            image.close()
            raise
        if pixels is not None:
            image.close()
            return pixels
        return decode_opened(image, where, shorter_side)


def model_input(source: Source, mode: str, on_device: bool, decode: str = "exact", *, allocate: Allocate | None = None,
                clock=NO_CLOCK, **limits):
    """What the model takes for `source`, a `ModelInput`: with `on_device` (a model that resizes on its device) an
    image or a uint8 (224, 224, 3) crop (`modelinput.device_input`), else the float32 (3, 224, 224) tensor in `mode`.

    `allocate(shape, dtype)`: where an image input may be decoded straight into (the decode processes' shared memory);
    the caller sees from the result's memory whether it was. `limits`: max_pixels, formats."""
    check_mode(mode)
    into = None
    if on_device and allocate is not None:
        def into(shape):
            height, width = shape[:2]
            fits = aspect_box(width, height) is None and goes_raw(width, height)
            return allocate(shape, np.uint8) if fits else None
    pixels = decode_pixels(source, decode, into=into, clock=clock, **limits)
    with clock("decode"):
        try:
            return device_input(pixels) if on_device else ModelInput.tensor(preprocess(pixels, mode))
        finally:
            close_pixels(pixels)


def decode_input(source: Source, mode: str, *, on_device: bool = False, decode: str = "exact",
                 catch: type[BaseException] | tuple = Exception, **options):
    """(model_input(...), None) for a readable image, else (None, (reason, exception type name)).

    `catch`: the failures answered that way; any other exception propagates. The batch job records an unreadable
    image of any kind (never fatal); `vggserve classify` only `ImageError`s. `options`: model_input's keywords."""
    try:
        return model_input(source, mode, on_device, decode, **options), None
    except catch as exc:
        return None, problem_of(exc)


def problem_of(exc: BaseException) -> tuple[str, str]:
    """(reason, exception type name) recorded for an image that could not be decoded."""
    reason = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
    return reason or str(exc) or type(exc).__name__, type(exc).__name__


def close_pixels(pixels) -> None:
    """Free a decoded PIL image's memory now; arrays are left to the garbage collector."""
    if not isinstance(pixels, np.ndarray):
        pixels.close()
