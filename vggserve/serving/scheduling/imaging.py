"""Decode and preprocess one uploaded image, off the event loop: in a thread of the preprocessing pool
(`prepare_image`), or split between a worker process (`decode_and_crop`: decode + geometry, the GIL-bound part)
and the main process (`normalize`: uint8 crop -> float32 model input, the same arithmetic as `preprocess`)."""

import logging
import time

import numpy as np

from ...errors import ImageError
from ...images import ALLOWED_FORMATS
from ..protocols.errors import ApiError

log = logging.getLogger("vggserve.serving")


def _open(data: bytes, max_pixels: int, formats):
    """`open_image` with the service's limits; any decoder failure other than an ImageError is a 400."""
    from ...images import open_image

    try:
        return open_image(data, max_pixels=max_pixels, formats=formats)
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: any decoder failure is the input's, not a 500
        log.info("decoder failed on an upload: %r", exc)
        raise ApiError(400, "invalid_image", f"the file could not be decoded as an image ({type(exc).__name__}: "
                       f"{exc}); send a JPEG, PNG, WebP, GIF, BMP or TIFF file") from exc


def prepare_image(data: bytes, mode: str, max_pixels: int,
                  formats=ALLOWED_FORMATS) -> tuple[np.ndarray, float]:
    """(float32 (3, 224, 224) model input, seconds spent). ImageError for images we refuse (4xx)."""
    from ...preprocess import preprocess

    started = time.perf_counter()
    image = _open(data, max_pixels, formats)
    try:
        tensor = np.ascontiguousarray(preprocess(image, mode), dtype=np.float32)
    finally:
        image.close()
    return tensor, time.perf_counter() - started


def decode_and_crop(data: bytes, mode: str, max_pixels: int,
                    formats=ALLOWED_FORMATS) -> tuple[np.ndarray, float]:
    """In a worker process: (contiguous uint8 (224, 224, 3) centre crop, seconds spent). The same ImageErrors
    and ApiErrors as `prepare_image` (they pickle back to the main process unchanged)."""
    return _decode(data, mode, max_pixels, formats, _uint8_crop)


def _uint8_crop(image) -> np.ndarray:
    from ...preprocess import center_crop

    return np.ascontiguousarray(center_crop(image), dtype=np.uint8)


def decode_for_engine(data: bytes, mode: str, max_pixels: int,
                      formats=ALLOWED_FORMATS) -> tuple[object, float]:
    """In an HTTP front end whose engine resizes on the device: (preprocess.RawImage, seconds), the decoded RGB
    image whose Resize(256) + CenterCrop(224) the engine's device does (the same pixels as `center_crop`, at a
    fraction of the CPU); (uint8 crop, seconds) as `decode_and_crop` for images that keep their size or whose
    decoded pixels exceed preprocess.RAW_LIMIT_BYTES. The same errors as `decode_and_crop`."""
    from ...preprocess import device_input

    return _decode(data, mode, max_pixels, formats, device_input)


def _decode(data: bytes, mode: str, max_pixels: int, formats, convert) -> tuple[object, float]:
    """(convert(decoded image), seconds spent) for the uint8 paths, after checking `mode` (which they do not use
    themselves: the normalisation happens later, elsewhere)."""
    from ...preprocess import check_mode

    started = time.perf_counter()
    check_mode(mode)
    image = _open(data, max_pixels, formats)
    try:
        pixels = convert(image)
    finally:
        image.close()
    return pixels, time.perf_counter() - started


def normalize(pixels: np.ndarray, mode: str) -> tuple[np.ndarray, float]:
    """In the main process: (float32 (3, 224, 224) model input, seconds spent) from `decode_and_crop`'s pixels."""
    from ...preprocess import normalize_pixels

    started = time.perf_counter()
    tensor = np.ascontiguousarray(normalize_pixels(pixels, mode), dtype=np.float32)
    return tensor, time.perf_counter() - started
