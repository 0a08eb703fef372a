"""Decode one uploaded image into a `ModelInput`, off the event loop: in a thread of the preprocessing pool
(`prepare_image`: the float32 tensor), or split between a worker process (`decode_and_crop`: decode + geometry, the
GIL-bound part) and the main process (`normalize`: crop -> tensor, the same arithmetic as `preprocess`). An HTTP
front end sends the engine crops, or images that the engine's device resizes (`decode_for_engine`); with --decode
gpu, JPEGs the engine's device decodes go to it compressed instead (`devicedecode`).

Every task returns (ModelInput, seconds spent) and raises ImageErrors for images the service refuses; they pickle
back from a worker process unchanged."""

import logging
import time

from ...errors import ImageError
from ...images import ALLOWED_FORMATS, ImageDecodeError
from ...modelinput import ModelInput

log = logging.getLogger("vggserve.serving")


def open_upload(data: bytes, max_pixels: int, formats=ALLOWED_FORMATS, decode: str = "exact"):
    """The upload's upright RGB pixels (`decoding.decode_pixels` in `decode` mode, with the service's limits): a PIL
    image or a uint8 array; any decoder failure other than an ImageError is ImageDecodeError."""
    from ...decoding import decode_pixels

    try:
        return decode_pixels(data, decode, max_pixels=max_pixels, formats=formats)
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: any decoder failure is the input's, not a 500
        log.info("decoder failed on an upload: %r", exc)
        raise ImageDecodeError(f"the file could not be decoded as an image ({type(exc).__name__}: {exc}); send a "
                               "JPEG, PNG, WebP, GIF, BMP or TIFF file") from exc


def prepare_image(data: bytes, mode: str, max_pixels: int, formats=ALLOWED_FORMATS,
                  decode: str = "exact") -> tuple[ModelInput, float]:
    """(the float32 (3, 224, 224) tensor, seconds spent)."""
    from ...preprocessing import preprocess

    return _decode(data, mode, max_pixels, formats, lambda image: ModelInput.tensor(preprocess(image, mode)), decode)


def decode_and_crop(data: bytes, mode: str, max_pixels: int, formats=ALLOWED_FORMATS,
                    decode: str = "exact") -> tuple[ModelInput, float]:
    """In a worker process or a front end: (the uint8 (224, 224, 3) centre crop, seconds spent)."""
    from ...preprocessing import center_crop

    return _decode(data, mode, max_pixels, formats, lambda image: ModelInput.crop(center_crop(image)), decode)


def decode_for_engine(data: bytes, mode: str, max_pixels: int, formats=ALLOWED_FORMATS,
                      decode: str = "exact") -> tuple[ModelInput, float]:
    """In an HTTP front end whose engine resizes on the device: (`modelinput.device_input`, seconds): the decoded
    RGB image whose Resize(256) + CenterCrop(224) the engine's device does (the same pixels as `center_crop`, at a
    fraction of the CPU), or the crop, as `decode_and_crop`, for images that keep their size or whose decoded pixels
    exceed modelinput.RAW_LIMIT_BYTES. With --decode gpu the one-process service takes it too, for the files the
    device does not decode (`devicedecode`): its batches then go to the engine's submit as images."""
    from ...modelinput import device_input

    return _decode(data, mode, max_pixels, formats, device_input, decode)


def _decode(data: bytes, mode: str, max_pixels: int, formats, convert, decode: str = "exact") -> tuple[ModelInput, float]:
    """(convert(decoded image), seconds spent), after checking `mode` (the paths that leave the normalisation to
    later still refuse a wrong one now)."""
    from ...decoding.decode import close_pixels
    from ...preprocessing import check_mode

    started = time.perf_counter()
    check_mode(mode)
    image = open_upload(data, max_pixels, formats, decode)
    try:
        prepared = convert(image)
    finally:
        close_pixels(image)
    return prepared, time.perf_counter() - started


def normalize(crop: ModelInput, mode: str) -> tuple[ModelInput, float]:
    """In the main process: (the float32 tensor, seconds spent) from `decode_and_crop`'s crop."""
    started = time.perf_counter()
    tensor = ModelInput.tensor(crop.as_tensor(mode))
    return tensor, time.perf_counter() - started
