"""What Pillow reads from a JPEG's header, read without Pillow: the format Pillow opens the file as and the EXIF
orientation `images.exif_orientation` gives, for `decoder.prepare` (through Pillow, a camera photo's headers cost it
0.1 to 0.2 ms of host CPU; read here, about 0.01: BENCHMARKS.md, issue 23).

    seen = pillow_view(data, frame.segments)   # (format, orientation), or None: ask Pillow itself

`format` is "MPO" for a file whose MPF segment lists several pictures, else "JPEG". The answer is given only where
Pillow certainly opens the file without an error and without a warning (a warning filter could make one an error),
so it holds whatever the filters: anything else, and every Pillow version this was not checked against, is None.
The size and the pixel limits are the caller's (the frame header's size is Pillow's).

What is mirrored, from Pillow 13 (JpegImagePlugin's marker handlers, jpeg_factory and _getmp, Image.getexif,
Exif.load, TiffImagePlugin.ImageFileDirectory_v2.load and _setitem, the dpi read at open):
- the segments before the scan: APPn, COM and the table, frame and restart segments; any other marker (which Pillow
  reads otherwise than parse.py does) gives None. Segments Pillow fails on give None: a JFIF APP0 or Adobe APP14
  too short for its fields, a Photoshop APP13 cut inside a resource name, a frame header whose component list is
  not whole, an ICC_PROFILE fragment too short for its counter before the frame header.
- EXIF: the bodies of every "Exif\\0\\0" APP1 joined (the first whole, the others after their prefix), one or two
  "Exif\\0\\0" prefixes removed, the TIFF header (II or MM; a BigTIFF, short or unknown header makes Pillow raise,
  which leaves orientation 1), IFD0 stored as Pillow stores it: the first entry of a tag wins, unknown types and
  empty values are skipped, a value or an entry past the end makes Pillow warn (None).
- Orientation (0x0112): decoded by its type as Pillow decodes it, then `int(value or 1)` (1 on any error), as
  `exif_orientation`; a numeric one of several values (Pillow warns) or a rational (None). Without it, XMP's
  tiff:Orientation (the last XMP APP1's) as getexif reads it.
- the dpi read at open (without a JFIF density): ResolutionUnit and XResolution must decode without a warning and
  XResolution be a number (else None: a short string or byte value makes that read raise IndexError).
- MPF (APP2 "MPF\\0", the last one): its TIFF directory and entries as _getmp reads them; MPO when it counts more
  than one picture and no APP1 carries an Ultra HDR "hdrgm:Version", else JPEG; a malformed one (Pillow warns) or
  one with a count or entries of unusual types gives None.
"""

from __future__ import annotations

import re
import struct

import PIL
from PIL import TiffTags

#: Pillow major versions whose reading this module was checked against (tests/test_device_exif.py).
CHECKED_PILLOW = (13,)
MIRRORS_PILLOW = int(PIL.__version__.split(".")[0]) in CHECKED_PILLOW

BYTE, ASCII, SHORT, LONG, RATIONAL, UNDEFINED, SRATIONAL = 1, 2, 3, 4, 5, 7, 10
#: Pillow's TIFF types: bytes per value (TiffImagePlugin._load_dispatch); other types are skipped.
UNIT = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}
#: the types decoded to one number per value (struct format); BYTE, ASCII, UNDEFINED decode to one bytes or str
NUMBER = {3: "H", 4: "L", 6: "b", 8: "h", 9: "l", 11: "f", 12: "d", 13: "L", 16: "Q"}
ORIENTATION, X_RESOLUTION, RESOLUTION_UNIT = 0x0112, 0x011A, 0x0128
MP_COUNT, MP_ENTRIES = 0xB001, 0xB002

_TIFF_PREFIXES = (b"MM\x00\x2a", b"II\x2a\x00", b"MM\x2a\x00", b"II\x00\x2a", b"MM\x00\x2b", b"II\x2b\x00")
_EXIF = b"Exif\x00\x00"
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')
_HDRGM = b' hdrgm:Version="'
_TRANSPARENT = frozenset([0xC4, 0xCC, 0xDB, 0xDD, 0xDF, 0xFE])  # Pillow skips or reads them as parse.py does
_ENTRY = {e: struct.Struct(e + "HHLL") for e in "<>"}  # tag, type, count, value or its offset
_BROKEN = object()  # a TIFF header Pillow raises on: getexif fails, orientation 1


def pillow_view(data: bytes, segments) -> tuple[str, int] | None:
    """(format, orientation) as Pillow's open and `exif_orientation` give them for the JPEG `data`, whose segments
    before the scan are `segments` ((marker, body start, body end), parse.py's); None where not certain."""
    if not MIRRORS_PILLOW:
        return None
    header = _read_segments(data, segments)
    if header is None:
        return None
    exif_parts, xmp, dpi, mpf, app1 = header
    orientation = _orientation(data, exif_parts, xmp, dpi)
    if orientation is None:
        return None
    fmt = "JPEG" if mpf is None else _mpf_format(data, mpf, app1)
    return None if fmt is None else (fmt, orientation)


def _read_segments(data: bytes, segments):
    """([(start, end) of EXIF APP1 bodies], XMP packet (bytes) or None, whether a JFIF density gives the dpi,
    (start, end) of the last MPF body after "MPF\\0" or None, [(start, end) of APP1 bodies]); None where Pillow
    fails on or reads a segment otherwise."""
    exif_parts, app1, icc = [], [], []
    xmp = mpf = None
    dpi = False
    for marker, start, end in segments:
        if marker == 0xDA:
            break
        size = end - start
        if marker == 0xE1:
            app1.append((start, end))
            if data.startswith(_EXIF, start, end):
                exif_parts.append((start, end))
            elif data.startswith(_XMP, start, end):
                xmp = data[start + len(_XMP):end]
        elif marker == 0xE2:
            if data.startswith(b"ICC_PROFILE\x00", start, end):
                icc.append(data[start:min(end, start + 14)])  # enough to know the first fragment's length
            elif data.startswith(b"MPF\x00", start, end):
                mpf = (start + 4, end)
        elif marker == 0xE0:
            if data.startswith(b"JFIF", start, end):
                if size < 7:
                    return None  # its version cannot be read: Pillow raises
                dpi = dpi or (size >= 12 and data[start + 7] in (1, 2))
        elif marker == 0xEE:
            if data.startswith(b"Adobe", start, end) and size < 7:
                return None
        elif marker == 0xED:
            if data.startswith(b"Photoshop 3.0\x00", start, end) and not _photoshop_readable(data[start:end]):
                return None
        elif marker == 0xC0 or marker == 0xC1:
            if (size - 6) % 3:
                return None  # a component entry cut short: Pillow's frame handler raises IndexError
            if icc:  # Pillow sorts the ICC fragments seen so far and reads the first one's 14th byte
                if len(min(icc)) < 14:
                    return None
                icc = []
        elif marker not in _TRANSPARENT and not 0xE3 <= marker <= 0xEF:
            return None
    return exif_parts, xmp, dpi, mpf, app1


def _photoshop_readable(s: bytes) -> bool:
    """Whether Pillow's walk over a Photoshop APP13's resource blocks ends without an IndexError (it stops quietly
    at a struct.error)."""
    offset = 14
    try:
        while s[offset:offset + 4] == b"8BIM":
            offset += 4
            (code,) = struct.unpack_from(">H", s, offset)
            offset += 2
            if offset >= len(s):
                return False  # the resource name's length byte is missing
            offset += 1 + s[offset]
            offset += offset & 1
            (size,) = struct.unpack_from(">L", s, offset)
            offset += 4
            if code == 0x03ED and len(s[offset:offset + size]) < 14:
                break  # ResolutionInfo's fields are read from its data: a struct.error, which ends the walk
            offset += size
            offset += offset & 1
    except struct.error:
        pass
    return True


def _orientation(data: bytes, exif_parts: list, xmp, dpi: bool) -> int | None:
    """exif_orientation's value, or None."""
    tags = {}
    if exif_parts:
        start, end = exif_parts[0]
        if len(exif_parts) == 1:
            tiff = memoryview(data)[start:end]
        else:
            tiff = memoryview(b"".join([data[start:end]] + [data[s + 6:e] for s, e in exif_parts[1:]]))
        tiff = tiff[6:]  # Exif.load removes one or two prefixes
        if tiff[:6] == _EXIF:
            tiff = tiff[6:]
        tags = _exif_ifd0(tiff) if len(tiff) else {}
        if tags is None:
            return None
        if tags is _BROKEN:
            return 1  # getexif raised: at open (caught there) or in exif_orientation; XMP is not read
        if not dpi and not _dpi_readable(tiff, tags):
            return None
    entry = tags.get(ORIENTATION)
    if entry is None:
        value = 1
        if xmp and (match := _XMP_ORIENTATION.search(xmp)):
            value = int(match[2])
    else:
        value = _decode(tiff, entry)
        if value is None:
            return None
    try:
        return int(value or 1)
    except Exception:  # as exif_orientation
        return 1


def _exif_ifd0(tiff):
    """IFD0 of EXIF's TIFF data as Pillow stores it, {tag: (type, count, endian, value offset)}; _BROKEN where
    Pillow raises on the header, None where its load warns."""
    head = bytes(tiff[:8])
    if not head.startswith(_TIFF_PREFIXES) or len(head) < 8 or head[2] == 0x2B:
        return _BROKEN  # SyntaxError, or struct.error reading the first IFD's offset (BigTIFF: past 8 bytes)
    endian = ">" if head[:2] == b"MM" else "<"
    (at,) = struct.unpack_from(endian + "L", head, 4)
    return _ifd(tiff, at, endian)


def _ifd(tiff, at: int, endian: str) -> dict | None:
    """ImageFileDirectory_v2.load of the directory at `at`: {tag: (type, count, endian, value offset)} of the stored
    tags; None where Pillow warns (a directory, an entry or a value past the end, values larger than the data)."""
    n = len(tiff)
    if at + 2 > n:
        return None
    (count,) = struct.unpack_from(endian + "H", tiff, at)
    at += 2
    if at + 12 * count + 4 > n:
        return None  # the entries or the next directory's offset are cut: OSError, warned
    tags: dict = {}
    total = 0
    field = at + 8  # where the first entry keeps a value of up to 4 bytes
    for tag, typ, cnt, offset in _ENTRY[endian].iter_unpack(tiff[at:at + 12 * count]):
        field += 12
        if tag in tags:
            continue
        unit = UNIT.get(typ)
        if unit is None or cnt == 0:
            continue  # an unknown type, an empty value: skipped quietly
        size = cnt * unit
        if size > 4:
            total += size
            if total > n or offset + size > n:
                return None  # "Tag data larger than file", or a short read that ends the load: warned
        else:
            offset = field - 12
        tags[tag] = (typ, cnt, endian, offset)
    return tags


def _decode(tiff, entry):
    """A stored tag's value as Pillow's Exif gives it (after _setitem and _fixup), or None where Pillow would warn
    (several numbers for a one-value tag) or gives a rational."""
    typ, cnt, endian, offset = entry
    if typ == BYTE or typ == UNDEFINED:
        return bytes(tiff[offset:offset + cnt])
    if typ == ASCII:
        raw = bytes(tiff[offset:offset + cnt])
        return (raw[:-1] if raw.endswith(b"\x00") else raw).decode("latin-1", "replace")
    if typ in NUMBER and cnt == 1:
        return struct.unpack_from(endian + NUMBER[typ], tiff, offset)[0]
    return None


def _warns(tag: int, entry) -> bool:
    """Whether Pillow warns decoding this tag: several numbers (or rationals) where its tag table says one."""
    typ, cnt = entry[0], entry[1]
    return typ not in (BYTE, ASCII, UNDEFINED) and cnt != 1 and TiffTags.lookup(tag).length == 1


def _dpi_readable(tiff, tags: dict) -> bool:
    """Whether the dpi read at open (ResolutionUnit, then XResolution) ends without a warning or an uncaught error:
    a number or a rational XResolution only."""
    unit = tags.get(RESOLUTION_UNIT)
    if unit is None:
        return True  # KeyError, caught
    if _warns(RESOLUTION_UNIT, unit):
        return False
    x = tags.get(X_RESOLUTION)
    if x is None:
        return True
    return not _warns(X_RESOLUTION, x) and (x[0] in NUMBER or x[0] in (RATIONAL, SRATIONAL))


def _mpf_format(data: bytes, mpf: tuple, app1: list) -> str | None:
    """jpeg_factory's choice for a file with this MPF body: "MPO", "JPEG", or None where Pillow warns (a malformed
    MP index) or the index has types this does not follow."""
    start, end = mpf
    mp = memoryview(data)[start:end]
    head = bytes(mp[:8])
    if not head.startswith(_TIFF_PREFIXES) or len(head) < 8 or head[2] == 0x2B:
        return None  # "malformed MP Index": warned
    endian = ">" if head[:2] == b"MM" else "<"
    tags = _ifd(mp, struct.unpack_from(endian + "L", head, 4)[0], endian)
    if tags is None or any(_warns(tag, entry) for tag, entry in tags.items()):
        return None  # dict(info) decodes every tag
    count, entries = tags.get(MP_COUNT), tags.get(MP_ENTRIES)
    if count is None or entries is None or count[0] not in (SHORT, LONG) or entries[0] not in (BYTE, UNDEFINED):
        return None
    quant = _decode(mp, count)
    raw = _decode(mp, entries)
    if len(raw) < 16 * quant:
        return None  # struct.error reading an entry: warned
    order = ">" if head.startswith(b"MM\x00\x2a") else "<"  # _getmp's own guess, not the directory's
    for k in range(quant):
        if (struct.unpack_from(order + "L", raw, 16 * k)[0] >> 24) & 7:
            return None  # "unsupported picture format in MPO": warned
    if quant > 1 and not any(data.find(_HDRGM, s, e) >= 0 for s, e in app1):
        return "MPO"
    return "JPEG"
