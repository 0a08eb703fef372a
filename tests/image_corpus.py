"""A small corpus of awkward image inputs, and what `vggserve.images.open_image` must make of each.

Usage from any test (tests/ is on sys.path under pytest):

    from image_corpus import EXPECTED, build_corpus
    files = build_corpus(tmp_path)          # {name: Path}, written in well under a second
    for name, path in files.items():
        expect = EXPECTED[name]             # Good(...) or Bad(...)

Good entries open to an RGB image of `Good.size` (width, height: EXIF orientation already applied);
`Good.source_mode` is the mode Pillow itself reports for the file. Bad entries raise `Bad.error`, whose
`http_status` and `code` are repeated here for HTTP tests, with `Bad.message` somewhere in the message.
Every good picture has a pure red marker block in its displayed top-left corner (except where
`Good.marker` says otherwise), so tests can check orientation and frame selection.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vggserve.images import ImageDecodeError, ImageTooLarge, UnsupportedImageFormat

RED = (255, 0, 0)


@dataclass(frozen=True)
class Good:
    """An input `open_image` accepts: RGB result of `size`, red marker at `marker` ("top-left", ...)."""

    source_mode: str
    size: tuple[int, int]
    marker: str = "top-left"


@dataclass(frozen=True)
class Bad:
    """An input `open_image` rejects with `error` (`http_status`, `code`); `message` is in its text."""

    error: type
    message: str

    @property
    def http_status(self) -> int:
        return self.error.http_status

    @property
    def code(self) -> str:
        return self.error.code


EXPECTED: dict[str, Good | Bad] = {
    "gray.png": Good("L", (48, 32)),
    "gray_alpha.png": Good("LA", (32, 48)),
    "palette.png": Good("P", (40, 40)),
    "palette_transparent.png": Good("P", (40, 40)),
    "rgba.png": Good("RGBA", (50, 30)),
    "cmyk.jpg": Good("CMYK", (40, 24)),
    "gray16.png": Good("I;16", (64, 16)),
    "bilevel.bmp": Good("1", (40, 40)),
    "rgb.tiff": Good("RGB", (30, 20)),
    "exif_orientation_6.jpg": Good("RGB", (32, 48), marker="top-right"),
    "exif_orientation_8.jpg": Good("RGB", (32, 48), marker="bottom-left"),
    "animated.gif": Good("P", (36, 36)),
    "photo.webp": Good("RGB", (45, 30)),
    "empty.jpg": Bad(ImageDecodeError, "is empty"),
    "notes.txt": Bad(ImageDecodeError, "not a recognised image"),
    "truncated.jpg": Bad(ImageDecodeError, "truncated"),
    "truncated.png": Bad(ImageDecodeError, "truncated"),
    "drawing.svg": Bad(UnsupportedImageFormat, "format 'SVG'"),
    "document.pdf": Bad(UnsupportedImageFormat, "format 'PDF'"),
    "figure.eps": Bad(UnsupportedImageFormat, "format 'EPS'"),
    "favicon.ico": Bad(UnsupportedImageFormat, "format 'ICO'"),
    "bomb_30000x30000.png": Bad(ImageTooLarge, "900000000 pixels, more than the limit of"),
    "bomb_10000x10000.png": Bad(ImageTooLarge, "100000000 pixels, more than the limit of"),
    "header_8000x6000.png": Bad(ImageTooLarge, "48000000 pixels"),
}

GOOD = [name for name, e in EXPECTED.items() if isinstance(e, Good)]
BAD = [name for name, e in EXPECTED.items() if isinstance(e, Bad)]


def build_corpus(folder: str | Path) -> dict[str, Path]:
    """Write every EXPECTED entry into `folder` (created if needed); returns {name: path}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in EXPECTED:
        path = folder / name
        path.write_bytes(_WRITERS[name]())
        paths[name] = path
    return paths


def marked_rgb(width: int, height: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: smooth colour gradient with an 8x8 pure red block at the top-left."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([40 + 0 * x, 60 + 120 * x // max(width, 1), 80 + 120 * y // max(height, 1)], axis=-1)
    pixels = pixels.astype(np.uint8)
    pixels[:8, :8] = RED
    return pixels


def _encode(img: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def _gray() -> bytes:
    return _encode(Image.fromarray(marked_rgb(48, 32)).convert("L"), "PNG")


def _gray_alpha() -> bytes:
    img = Image.fromarray(marked_rgb(32, 48)).convert("LA")
    img.putalpha(Image.linear_gradient("L").resize((32, 48)))
    return _encode(img, "PNG")


def _palette(transparent: bool) -> bytes:
    img = Image.fromarray(marked_rgb(40, 40)).quantize(16)
    if not transparent:
        return _encode(img, "PNG")
    alpha = bytes(range(0, 256, 16))  # one alpha per palette entry: Pillow keeps it as bytes
    return _encode(img, "PNG", transparency=alpha)


def _rgba() -> bytes:
    img = Image.fromarray(marked_rgb(50, 30)).convert("RGBA")
    img.putalpha(128)
    return _encode(img, "PNG")


def _cmyk() -> bytes:
    return _encode(Image.fromarray(marked_rgb(40, 24)).convert("CMYK"), "JPEG", quality=95)


def _gray16() -> bytes:
    """16-bit greyscale: columns 0..63 hold 0, 257, ..., plus 65535 in the last column."""
    values = (np.arange(64, dtype=np.uint32) * 257 * 4).clip(0, 65535).astype(np.uint16)
    values[-1] = 65535
    pixels = np.tile(values, (16, 1))
    pixels[:8, :8] = 65535  # the marker: white rather than red in a grey image
    return _encode(Image.fromarray(pixels), "PNG")


def _bilevel() -> bytes:
    return _encode(Image.fromarray(marked_rgb(40, 40)).convert("1"), "BMP")


def _tiff() -> bytes:
    return _encode(Image.fromarray(marked_rgb(30, 20)), "TIFF")


def _exif_rotated(orientation: int) -> bytes:
    """Stored 48 x 32 with the red block at the stored top-left; displays 32 x 48 after rotation."""
    img = Image.fromarray(marked_rgb(48, 32))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(img, "JPEG", quality=95, exif=exif.tobytes())


def _animated_gif() -> bytes:
    frames = [Image.fromarray(marked_rgb(36, 36))]
    frames += [Image.new("RGB", (36, 36), colour) for colour in ((0, 255, 0), (0, 0, 255))]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def _webp() -> bytes:
    return _encode(Image.fromarray(marked_rgb(45, 30)), "WEBP", lossless=True)


def _noise_jpeg_truncated() -> bytes:
    noise = np.random.default_rng(7).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = _encode(Image.fromarray(noise), "JPEG", quality=90)
    return data[: len(data) // 2]


def _noise_png_truncated() -> bytes:
    noise = np.random.default_rng(8).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = _encode(Image.fromarray(noise), "PNG")
    return data[: len(data) // 2]


def _svg() -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
        b'<rect width="10" height="10" fill="red"/></svg>\n'
    )


def _pdf() -> bytes:
    return _encode(Image.fromarray(marked_rgb(20, 20)), "PDF")


def _eps() -> bytes:
    return (
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\n"
        b"newpath 0 0 moveto 10 0 lineto 10 10 lineto closepath fill\nshowpage\n%%EOF\n"
    )


def _ico() -> bytes:
    return _encode(Image.fromarray(marked_rgb(16, 16)), "ICO", sizes=[(16, 16)])


def png_with_header_size(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height (8-bit grey) but whose IDAT holds one row: tiny on disk."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    one_row = zlib.compress(b"\x00" * (width + 1))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", one_row) + chunk(b"IEND", b"")


_WRITERS = {
    "gray.png": _gray,
    "gray_alpha.png": _gray_alpha,
    "palette.png": lambda: _palette(transparent=False),
    "palette_transparent.png": lambda: _palette(transparent=True),
    "rgba.png": _rgba,
    "cmyk.jpg": _cmyk,
    "gray16.png": _gray16,
    "bilevel.bmp": _bilevel,
    "rgb.tiff": _tiff,
    "exif_orientation_6.jpg": lambda: _exif_rotated(6),
    "exif_orientation_8.jpg": lambda: _exif_rotated(8),
    "animated.gif": _animated_gif,
    "photo.webp": _webp,
    "empty.jpg": lambda: b"",
    "notes.txt": lambda: b"This is a text file, not a picture.\n",
    "truncated.jpg": _noise_jpeg_truncated,
    "truncated.png": _noise_png_truncated,
    "drawing.svg": _svg,
    "document.pdf": _pdf,
    "figure.eps": _eps,
    "favicon.ico": _ico,
    "bomb_30000x30000.png": lambda: png_with_header_size(30000, 30000),
    "bomb_10000x10000.png": lambda: png_with_header_size(10000, 10000),
    "header_8000x6000.png": lambda: png_with_header_size(8000, 6000),
}
