"""JPEG pixels straight from libjpeg-turbo (the `simplejpeg` package), used only where they are Pillow's, bit for bit.

Pillow's wheels decode JPEGs with libjpeg-turbo too, but through its incremental decoder and its own image memory;
`simplejpeg` decodes the whole file in one call, straight into an array we give it (a block of shared memory, for
the decode processes), at about 1.2 to 1.9 times Pillow's rate (BENCHMARKS.md, `benchmarks/decoders.py`). Both run
libjpeg-turbo's default (accurate) IDCT and smooth chroma upsampling, so they give the same pixels; `adopted()`
checks that on probe images once per process (every subsampling, progressive, gray, each DCT scale), and a
mismatch (another libjpeg-turbo with another rounding) leaves every JPEG to Pillow, with a log line.

The path applies to JPEG (and MPO) files that Pillow opens as RGB or L (YCbCr or gray in the file); CMYK JPEGs and
files that simplejpeg refuses in its strict mode (truncated, corrupt: anything libjpeg warns about) go to Pillow,
which decodes or reports them exactly as without this module.
"""

from __future__ import annotations

import io
import logging
from typing import Callable

import numpy as np
from PIL import Image

from ..images import dct_scale, exif_orientation

try:
    import simplejpeg
except ImportError:  # an optional speed-up: Pillow decodes everything without it
    simplejpeg = None

log = logging.getLogger("vggserve.decoding")

FORMATS = ("JPEG", "MPO")
MODES = ("RGB", "L")
_adopted: bool | None = None  # the probe's verdict, once per process

# the Image.transpose that ImageOps.exif_transpose applies for each EXIF orientation (Pillow's C transposition is
# twice as fast as numpy's strided copy on a 12 MP photo)
_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90}


def adopted() -> bool:
    """Whether JPEGs are decoded here: simplejpeg is installed and gives Pillow's pixels on the probe images."""
    global _adopted
    if _adopted is None:
        _adopted = simplejpeg is not None and _matches_pillow()
        if simplejpeg is not None and not _adopted:
            log.warning("simplejpeg %s decodes differently from Pillow %s here; JPEGs are decoded by Pillow",
                        getattr(simplejpeg, "__version__", "?"), Image.__version__)
    return _adopted


def applies(image: Image.Image) -> bool:
    """Whether a file that Pillow opened (header only) as `image` goes through this path."""
    return image.format in FORMATS and image.mode in MODES and adopted()


def decode(data: bytes, image: Image.Image, shorter_side: int | None = None,
           into: Callable[[tuple], np.ndarray | None] | None = None) -> np.ndarray | Image.Image | None:
    """Upright RGB pixels of the JPEG `data`, whose header Pillow opened as `image`, scaled down in the DCT as
    `images.dct_scale(..., shorter_side)` says (None: full size): a uint8 (h, w, 3) array, or for a file stored
    turned (EXIF orientation) an RGB PIL image turned upright. None when the path does not apply or simplejpeg
    refuses the data: the caller then decodes with Pillow.

    `into(shape)`: where to decode an upright image to (a writable uint8 array of that shape), or None for a new
    array; it is asked only when the file is stored upright (no EXIF turn), with the final shape.
    """
    if not applies(image):
        return None
    width, height = image.size
    scale = dct_scale(width, height, shorter_side) if shorter_side else 1
    shape = (-(-height // scale), -(-width // scale), 3)
    orientation = exif_orientation(image)
    out = into(shape) if into is not None and orientation == 1 else None
    pixels = _decode_scaled(data, scale, shape, out)
    if pixels is None:
        return None
    turn = _UPRIGHT.get(orientation)
    return pixels if turn is None else Image.fromarray(pixels, "RGB").transpose(turn)


def _decode_scaled(data: bytes, scale: int, shape: tuple, out: np.ndarray | None) -> np.ndarray | None:
    """simplejpeg's decode at 1/scale (libjpeg-turbo picks the scale from the minimum size), strict: any warning
    from libjpeg (premature end, corrupt data) refuses the file. None when refused."""
    try:
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_width=shape[1] if scale > 1 else 0,
                                        min_height=shape[0] if scale > 1 else 0, buffer=out, strict=True)
    except (ValueError, TypeError, OSError, MemoryError):
        return None
    if pixels.shape != shape:  # another scale than Pillow's draft would take: leave the file to Pillow
        return None
    return pixels


def _matches_pillow() -> bool:
    """Decode probe JPEGs with both libraries, at every DCT scale, and compare every byte."""
    for data in _probe_files():
        with Image.open(io.BytesIO(data)) as full:
            width, height = full.size
            want = np.asarray(full.convert("RGB"))
        if not np.array_equal(_decode_scaled(data, 1, want.shape, None), want):
            return False
        for scale in (2, 4, 8):
            with Image.open(io.BytesIO(data)) as reduced:
                reduced.draft(None, (width // scale, height // scale))
                want = np.asarray(reduced.convert("RGB"))
            if not np.array_equal(_decode_scaled(data, scale, want.shape, None), want):
                return False
    return True


def _probe_files() -> list[bytes]:
    """Small JPEGs of odd sizes: 4:4:4, 4:2:2 and 4:2:0, progressive, restart markers, and gray."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:97, 0:131]
    smooth = np.stack([x * 2, y * 2, (x + y)], axis=-1) % 256
    pixels = np.clip(smooth + rng.integers(-30, 30, smooth.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    options = [dict(subsampling=0), dict(subsampling=1), dict(subsampling=2), dict(subsampling=2, progressive=True),
               dict(subsampling=2, restart_marker_blocks=4)]
    files = []
    for extra in options:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=87, **extra)
        files.append(buffer.getvalue())
    buffer = io.BytesIO()
    image.convert("L").save(buffer, "JPEG", quality=87)
    return files + [buffer.getvalue()]
