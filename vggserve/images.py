"""Decoding untrusted image input into RGB Pillow images.

`open_image` takes a path, bytes or a binary file object and decides from the header alone (Pillow's lazy
open) whether the format is accepted and the pixel count is within limits, before any pixel data is decoded.
Only then is the first frame decoded, the EXIF orientation applied and the result converted to RGB with
`to_rgb`. Every failure is an `ImageError` subclass carrying `.code` and `.http_status`.

The same steps are public one by one for `vggserve.decoding`, which decodes some JPEGs with another library:
`read_source` (the bytes and the name used in messages), `open_checked` (header and limits), `decode_opened`
(the pixels), `exif_orientation`, and `dct_scale` (the reduction of the fast decode mode).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import threading
import warnings
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from .errors import ImageError

#: Default decompression-bomb limit: 40 megapixels (e.g. 8000 x 5000).
DEFAULT_MAX_PIXELS = 40_000_000

#: Pillow format names accepted by default. MPO is what Pillow calls many camera JPEGs.
ALLOWED_FORMATS = ("JPEG", "MPO", "PNG", "GIF", "WEBP", "BMP", "TIFF")

#: Formats refused whatever the caller allows: vector and document formats (EPS would run Ghostscript).
NEVER_FORMATS = frozenset({"SVG", "PDF", "EPS", "PS"})

Source = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]

# Header signatures of formats Pillow cannot identify but users send; named in the 415 message.
_FOREIGN_SIGNATURES = (
    (b"%PDF-", "PDF"),
    (b"%!PS", "PS"),
    (b"\xc5\xd0\xd3\xc6", "EPS"),
    (b"<svg", "SVG"),
)

# warnings.catch_warnings mutates process-wide state; serialise our (header-only, fast) uses of it.
_WARNINGS_LOCK = threading.Lock()


class UnsupportedImageFormat(ImageError):
    """The input is an image (or document) in a format outside the allowlist."""

    code = "unsupported_media_type"
    http_status = 415


class ImageTooLarge(ImageError):
    """The header declares more pixels than allowed (decompression-bomb guard)."""

    code = "image_too_large"
    http_status = 413


class ImageDecodeError(ImageError):
    """Empty input, not an image, or truncated/corrupt image data."""

    code = "invalid_image"
    http_status = 400


def open_image(
    source: Source,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    formats: Iterable[str] = ALLOWED_FORMATS,
    shorter_side: int | None = None,
) -> Image.Image:
    """Decode `source` into a fully loaded RGB image (first frame, EXIF orientation applied).

    `source`: a path (str or os.PathLike), bytes-like data, or a binary file object (read to its end).
    `max_pixels`: width * height above which `ImageTooLarge` is raised without decoding.
    `formats`: accepted Pillow format names (case-insensitive); SVG, PDF, EPS and PS are never accepted.
    `shorter_side`: decode a JPEG scaled down in its DCT by the largest of 1/8, 1/4, 1/2 that keeps its shorter
    side at least this long (`dct_scale`; the fast decode mode); None (default) decodes every pixel.
    Raises `UnsupportedImageFormat` (415), `ImageTooLarge` (413) or `ImageDecodeError` (400). The returned
    image is fully decoded; a file opened from a path is closed before returning.
    """
    accepted = _accepted_formats(formats)
    with _binary_stream(source) as (stream, where):
        return decode_opened(open_checked(stream, where, max_pixels, accepted), where, shorter_side)


def read_source(source: Source) -> tuple[bytes, str]:
    """(every byte of `source`, the phrase naming it in messages: "file 'x.jpg'" or "input"), with `open_image`'s
    errors for a missing, unreadable, empty or directory path and empty data."""
    if isinstance(source, (str, os.PathLike)):
        data = _read_regular_file(source)
        if data is not None:
            return data, f"file '{Path(source)}'"
    with _binary_stream(source) as (stream, where):
        return (stream.getvalue() if isinstance(stream, io.BytesIO) else stream.read()), where


def open_regular_file(path) -> tuple[int, int] | None:
    """(a read-only file descriptor, the size stat gave) of a regular, non-empty file, in two system calls (stat,
    then open: nothing else is opened), or None for anything else: a path that is missing, unreadable, empty, a
    directory or a pipe. The caller closes the descriptor."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), st.st_size
    except OSError:
        return None


def _read_regular_file(path) -> bytes | None:
    """Every byte of a regular, non-empty file in four system calls (stat, open, read, close), or None for anything
    else (`open_regular_file`), which `_binary_stream` then reads or refuses with its messages. The stream path's
    buffered file object, seeks and fstat cost half as much again per file (42-46 against 26-30 us of CPU for a 76 KB
    JPEG on a 2-core VM: benchmarks/read_files.py), and the batch job's CPU decoders read every input here."""
    opened = open_regular_file(path)
    if opened is None:
        return None
    fd, size = opened
    try:
        chunks, got = [], 0
        while True:  # one read where the file is as stat saw it; a file that changed since is read to its end
            chunk = os.read(fd, size + 1 - got if got <= size else 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got == size:
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    if not got:
        return None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def open_checked(stream: BinaryIO, where: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                 formats: Iterable[str] = ALLOWED_FORMATS) -> Image.Image:
    """Pillow's lazy open of `stream` (header only, no pixel decoded) with the format allowlist and the pixel limit
    checked; `where` names the input in messages. Raises as `open_image`; the image is closed when refused."""
    accepted = _accepted_formats(formats)
    image = _open_header(stream, where, max_pixels, accepted)
    try:
        _check_format(image, accepted, where)
        _check_pixels(image.size, max_pixels, where)
    except BaseException:
        image.close()
        raise
    return image


def decode_opened(image: Image.Image, where: str, shorter_side: int | None = None) -> Image.Image:
    """The rest of `open_image` on an image from `open_checked`: decode (scaled down as `shorter_side` says),
    turn upright, convert to RGB. The opened image is closed unless it is the one returned."""
    result = None
    try:
        if shorter_side:
            _reduce_in_dct(image, shorter_side)
        _decode(image, where)
        result = to_rgb(_exif_upright(image))
        return result
    finally:
        if result is not image:  # an upright or converted copy was made, or an error: free the frame
            image.close()


def dct_scale(width: int, height: int, shorter_side: int) -> int:
    """The largest of 8, 4, 2 and 1 by which a JPEG of `width` x `height` can be scaled down while decoding (to
    ceil(side / scale)) with its shorter side still at least `shorter_side`."""
    short = min(width, height)
    for scale in (8, 4, 2):
        if -(-short // scale) >= shorter_side:
            return scale
    return 1


def _reduce_in_dct(image: Image.Image, shorter_side: int) -> None:
    """Ask Pillow's JPEG decoder for `dct_scale`'s reduction (other formats are decoded whole)."""
    scale = dct_scale(*image.size, shorter_side)
    if image.format in ("JPEG", "MPO") and scale > 1:
        width, height = image.size
        image.draft(None, (width // scale, height // scale))  # Pillow picks the largest scale <= these ratios


def to_rgb(img: Image.Image) -> Image.Image:
    """Return `img` as an 8-bit RGB image; an RGB image is returned as is (not copied).

    Alpha is dropped exactly as `img.convert("RGB")` does (no compositing onto a background). Palette
    images use their palette colours (transparency ignored). CMYK, YCbCr, LAB, HSV, 1, L and LA use
    Pillow's conversions; PA goes through RGBA and La through LA. High-bit-depth modes are scaled, not
    clipped: I;16, I;16B, I;16L map 0..65535 to 0..255 (v * 255 / 65535, rounded; 65535 -> 255);
    "I" is treated the same when all values lie in 0..65535, else 0..2**31-1 maps to 0..255 (negatives
    become 0); "F" is multiplied by 255 when all values lie in 0..1, else clipped to 0..255 (NaN -> 0).
    Raises `ImageDecodeError` for a mode Pillow cannot convert.
    """
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I") or img.mode == "F":
        return _gray_to_rgb(_scale_to_uint8(img))
    if img.mode in ("PA", "La"):
        img = img.convert("RGBA" if img.mode == "PA" else "LA")
    if img.mode == "P" and isinstance(img.info.get("transparency"), bytes):
        img = _without_transparency(img)
    try:
        return img.convert("RGB")
    except ValueError as exc:
        raise ImageDecodeError(f"cannot convert image mode '{img.mode}' to RGB: {exc}") from exc


def _without_transparency(img: Image.Image) -> Image.Image:
    """A copy of a palette image without its per-entry alpha table.

    Pillow's P -> RGB conversion ignores that table anyway but warns about it; the pixels are the same.
    """
    copy = img.copy()
    del copy.info["transparency"]
    return copy


def _accepted_formats(formats: Iterable[str]) -> frozenset[str]:
    """Upper-cased allowlist; refuses a list that names a never-accepted format."""
    if isinstance(formats, str):
        formats = [formats]
    accepted = frozenset(f.upper() for f in formats)
    forbidden = accepted & NEVER_FORMATS
    if forbidden:
        raise ValueError(f"formats {sorted(forbidden)} can never be accepted")
    return accepted


@contextlib.contextmanager
def _binary_stream(source: Source) -> Iterator[tuple[BinaryIO, str]]:
    """A seekable binary stream over `source` and a phrase naming it for messages ("file 'x.jpg'", "input").

    A path is opened (and closed on exit) rather than read whole, so a large file that is not an image is
    refused after its first bytes; bytes and file objects are served from memory.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        where = f"file '{path}'"
        try:
            stream = open(path, "rb")
        except FileNotFoundError:
            raise ImageDecodeError(f"{where} does not exist") from None
        except IsADirectoryError:
            raise ImageDecodeError(f"{where} is a directory, not an image") from None
        except OSError as exc:
            raise ImageDecodeError(f"{where} cannot be read: {exc.strerror or exc}") from None
        with stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):  # a pipe: /dev/stdin, <(curl ...), a FIFO
                try:
                    stream = io.BytesIO(stream.read())  # its size is unknown (0) and Pillow needs to seek
                except OSError as exc:
                    raise ImageDecodeError(f"{where} cannot be read: {exc.strerror or exc}") from None
            if stream.seek(0, io.SEEK_END) == 0:
                raise ImageDecodeError(f"{where} is empty")
            stream.seek(0)
            yield stream, where
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, io.TextIOBase):  # reading it would decode the image's bytes as text first
        raise TypeError("open_image needs a binary file object (opened with 'rb'), not a text-mode file")
    elif hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("open_image needs a binary file object (opened with 'rb')")
    else:
        raise TypeError(f"open_image takes a path, bytes or a binary file object, not {type(source).__name__}")
    if not data:
        raise ImageDecodeError("empty body: no image data was sent")
    yield io.BytesIO(data), "input"


_PILLOW_SIZE = re.compile(r"Image size \((\d+) pixels\)")  # in Pillow's DecompressionBomb messages


def _open_header(stream: BinaryIO, where: str, max_pixels: int, accepted: frozenset[str]) -> Image.Image:
    """Pillow's lazy open (header only); Pillow's bomb warning/error become `ImageTooLarge`."""
    pillow_limit = Image.MAX_IMAGE_PIXELS
    action = "error" if pillow_limit is not None and max_pixels <= pillow_limit else "ignore"
    try:
        with _WARNINGS_LOCK, warnings.catch_warnings():
            warnings.simplefilter(action, Image.DecompressionBombWarning)
            return Image.open(stream)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise _too_large(where, exc, max_pixels) from None
    except UnidentifiedImageError:
        stream.seek(0)
        foreign = _foreign_format(stream.read(1024))
        if foreign is not None:
            raise _not_accepted(foreign, where, accepted) from None
        size = stream.seek(0, io.SEEK_END)
        raise ImageDecodeError(f"{where} is not a recognised image ({size} bytes)") from None
    except MemoryError:
        raise
    except Exception as exc:  # plugins raise many types on malformed headers
        raise ImageDecodeError(f"{where} has a corrupt image header: {exc}") from None


def _too_large(where: str, exc: Exception, max_pixels: int | None) -> ImageTooLarge:
    """Pillow's bomb guard fired before our own check could: say it with our limit, in `_check_pixels`' words
    (Pillow's message quotes its own threshold, a second and different limit). Without a limit of ours (while
    decoding), Pillow's message alone."""
    if max_pixels is None:
        return ImageTooLarge(f"{where} is too large to decode: {exc}")
    found = _PILLOW_SIZE.search(str(exc))
    if found is None:
        return ImageTooLarge(f"{where} is more than the limit of {max_pixels} pixels")
    pixels = int(found.group(1))
    if pixels > max_pixels:
        return ImageTooLarge(f"{where} is {pixels} pixels, more than the limit of {max_pixels} pixels")
    # within our limit, but past the one Pillow always enforces (twice Image.MAX_IMAGE_PIXELS)
    return ImageTooLarge(f"{where} is {pixels} pixels, more than the limit of "
                         f"{2 * Image.MAX_IMAGE_PIXELS} pixels that Pillow enforces (Image.MAX_IMAGE_PIXELS)")


def _foreign_format(head: bytes) -> str | None:
    """Name of a known non-raster format (PDF, SVG, ...) recognised from the first bytes, else None."""
    head = head.lstrip().lower()
    for signature, name in _FOREIGN_SIGNATURES:
        if head.startswith(signature.lower()):
            return name
    if head.startswith(b"<?xml") and b"<svg" in head:
        return "SVG"
    return None


def _check_format(image: Image.Image, accepted: frozenset[str], where: str) -> None:
    fmt = image.format or "unknown"
    if fmt.upper() not in accepted:
        raise _not_accepted(fmt, where, accepted)


def _not_accepted(fmt: str, where: str, accepted: frozenset[str]) -> UnsupportedImageFormat:
    return UnsupportedImageFormat(f"format '{fmt}' of {where} is not accepted; accepted: {', '.join(sorted(accepted))}")


def _check_pixels(size: tuple[int, int], max_pixels: int, where: str) -> None:
    width, height = size
    if width * height > max_pixels:
        raise ImageTooLarge(
            f"{where} is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels} pixels"
        )
    if width < 1 or height < 1:
        raise ImageDecodeError(f"{where} declares an empty size {width}x{height}")


def _decode(image: Image.Image, where: str) -> None:
    """Decode the first frame's pixels; truncated or corrupt data becomes `ImageDecodeError`."""
    try:
        image.load()
    except Image.DecompressionBombError as exc:
        raise _too_large(where, exc, None) from None
    except MemoryError:
        raise
    except (OSError, EOFError) as exc:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, EOFError) or "truncated" in text.lower():
            # Pillow's own words ("image file is truncated (19 bytes not processed)") would say it twice
            raise ImageDecodeError(f"{where} is truncated: its image data ends early") from None
        raise ImageDecodeError(f"image data of {where} is corrupt: {text}") from None
    except Exception as exc:  # zlib.error, struct.error, SyntaxError, ValueError... from decoders
        raise ImageDecodeError(f"image data of {where} is corrupt: {exc}") from None


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag (1..8; 1 = upright), read from the header; 1 when absent or malformed."""
    try:
        return int(image.getexif().get(ExifTags.Base.Orientation, 1) or 1)
    except Exception:
        return 1


def _exif_upright(image: Image.Image) -> Image.Image:
    """`image` turned upright by its EXIF orientation (a new image), or `image` itself when already upright.

    Malformed EXIF leaves the pixels as stored, as browsers show such pictures.
    """
    if exif_orientation(image) == 1:
        return image  # skips exif_transpose's full copy of upright pictures
    try:
        return ImageOps.exif_transpose(image)
    except Exception:
        return image


def _scale_to_uint8(img: Image.Image) -> np.ndarray:
    """(H, W) uint8 from a 16/32-bit integer or float image, scaled as documented in `to_rgb`."""
    if img.mode not in ("I;16", "I;16B", "I;16L", "I", "F"):
        img = img.convert("I")
    values = np.asarray(img)
    if img.mode == "F":
        values = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        if values.size and values.min() >= 0.0 and values.max() <= 1.0:
            values = values * 255.0
        return np.clip(np.rint(values), 0, 255).astype(np.uint8)
    values = values.astype(np.int64)
    top = 65535 if img.mode != "I" or (values.min(initial=0) >= 0 and values.max(initial=0) <= 65535) else 2**31 - 1
    scaled = (np.clip(values, 0, top) * 255 + top // 2) // top
    return scaled.astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(gray)).convert("RGB")

