"""Decode and preprocess one uploaded image, in a thread of the preprocessing pool (never on the event loop)."""

import logging
import time

import numpy as np

from ..errors import ImageError
from .errors import ApiError

log = logging.getLogger("vggserve.serving")


def prepare_image(data: bytes, mode: str, max_pixels: int) -> tuple[np.ndarray, float]:
    """(float32 (3, 224, 224) model input, seconds spent). ImageError for images we refuse (4xx)."""
    from ..images import open_image
    from ..preprocess import preprocess

    started = time.perf_counter()
    try:
        image = open_image(data, max_pixels=max_pixels)
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: any decoder failure is the input's, not a 500
        log.info("decoder failed on an upload: %r", exc)
        raise ApiError(400, "invalid_image", f"the file could not be decoded as an image ({type(exc).__name__}: "
                       f"{exc}); send a JPEG, PNG, WebP, GIF, BMP or TIFF file") from exc
    try:
        tensor = np.ascontiguousarray(preprocess(image, mode), dtype=np.float32)
    finally:
        image.close()
    return tensor, time.perf_counter() - started
