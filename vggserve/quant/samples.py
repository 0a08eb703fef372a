"""The images a calibration runs on: listed from a folder, checked before the long pass, decoded in batches.

Every image is read as `vggserve classify` reads it (`decoding.decode_pixels`, exact mode) and preprocessed as the
weights want (`preprocessing.preprocess`), so the ranges measured are those the model will see.
An unreadable image stops the calibration, naming the file (TensorRT's calibrator fails on a bad batch too): a
calibration that skipped files would describe a set of images other than the one asked for, without a word.
"""

from __future__ import annotations

import io
import os
from typing import Iterator

import numpy as np

from ..decoding.decode import close_pixels, decode_pixels
from ..distributed.inputs import IMAGE_EXTENSIONS, InputError, scan_directory
from ..errors import CalibrationError, ImageError
from ..images import open_checked, read_source
from ..preprocessing import preprocess

STOPPED = "calibration stopped and nothing was written; remove or replace that file"


def list_images(folder: str | os.PathLike, limit: int | None = None) -> list[str]:
    """The image files below `folder` (recursively, sorted by relative path; by extension, any case), the first
    `limit` of them where given. CalibrationError when there is no such folder or no image in it."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise CalibrationError(f"--images {folder} {what}; give a folder of sample images")
    try:
        paths = scan_directory(folder)
    except InputError as exc:
        raise CalibrationError(str(exc).replace("--input", "--images", 1)) from None
    if not paths:
        raise CalibrationError(f"--images {folder}: no image files below it (extensions "
                               f"{' '.join(sorted(IMAGE_EXTENSIONS))}, any case)")
    return paths[:limit] if limit else paths


def check_headers(paths: list[str]) -> None:
    """Each file read and its header checked (format, size), no pixel decoded: a bad file stops the run before
    the long pass rather than after it. Raises the ImageError, naming the file."""
    for path in paths:
        try:
            data, where = read_source(path)
            open_checked(io.BytesIO(data), where).close()
        except ImageError as exc:
            raise stopped(exc) from None


def batches(paths: list[str], mode: str, batch_size: int) -> Iterator[np.ndarray]:
    """float32 (B, 3, 224, 224) batches of the images, preprocessed in `mode`."""
    for start in range(0, len(paths), batch_size):
        yield np.stack([_tensor(path, mode) for path in paths[start:start + batch_size]])


def _tensor(path: str, mode: str) -> np.ndarray:
    try:
        pixels = decode_pixels(path, "exact")
    except ImageError as exc:
        raise stopped(exc) from None
    try:
        return preprocess(pixels, mode)
    finally:
        close_pixels(pixels)


def stopped(exc: ImageError) -> ImageError:
    """The same error (its class, exit status and message naming the file), saying that the run stopped."""
    return type(exc)(f"{exc}; {STOPPED}")
