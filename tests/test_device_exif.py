"""The device decoder's reading of JPEG headers without Pillow (vggserve/decoding/device/exif.py) against Pillow's
own: on generated files (Pillow's EXIF at every orientation in both byte orders, orientation as every TIFF type,
XMP, MPO, ICC, damaged, truncated and doubled EXIF, segments Pillow fails on) and on byte-flipped APP1 segments,
`prepare` gives what the Pillow route gives, and wherever the fast reader answers, Pillow opens the file without a
warning as the same format with the same orientation. No OpenCL device is used."""

from __future__ import annotations

import io
import struct
import warnings
from unittest import mock

import numpy as np
import pytest
from PIL import Image, TiffImagePlugin

import jpeg_corpus as corpus
from vggserve.decoding.corpus import camera_exif
from vggserve.decoding.device import decoder, exif, parse, prepare
from vggserve.images import exif_orientation, open_checked

# the Pillow route warns on the damaged files; pillow_reading records its warnings whatever this filter says
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SETTINGS = [dict(), dict(max_pixels=24 * 16 - 1), dict(formats=("JPEG",)), dict(formats=("MPO",)),
            dict(formats=["jpeg", "mpo"]), dict(formats=("PNG",)), dict(formats=("PDF",))]


# ---- files -----------------------------------------------------------------------------------------------------

def base(**options) -> bytes:
    """A 24x16 Pillow JPEG (APP0 JFIF, no APP1/APP2)."""
    return corpus.pillow_jpeg(corpus.picture(24, 16, 3), quality=85, subsampling=2, **options)


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def with_segments(data: bytes, *segments: bytes, before: int | None = None) -> bytes:
    """`data` with `segments` inserted after its APP0 (or before its first segment of marker `before`)."""
    if before is None:
        at = 2 + 2 + struct.unpack_from(">H", data, 4)[0] if data[2:4] == b"\xff\xe0" else 2
    else:
        at = data.index(bytes([0xFF, before]))
    return data[:at] + b"".join(segments) + data[at:]


def tiff(entries, endian: str = "<", magic: bytes | None = None, count: int | None = None, cut: int | None = None,
         next_ifd: int = 0) -> bytes:
    """A TIFF header and IFD0 of `entries` (tag, type, count, value bytes in `endian`: in the entry up to 4 bytes,
    else after the directory); `count` overrides the entry count, `cut` truncates the result."""
    head = (magic or (b"II*\x00" if endian == "<" else b"MM\x00*")) + struct.pack(endian + "L", 8)
    table = struct.pack(endian + "H", len(entries) if count is None else count)
    values = b""
    after = 8 + 2 + 12 * len(entries) + 4
    for tag, typ, cnt, value in entries:
        if len(value) <= 4:
            field = value.ljust(4, b"\x00")
        else:
            field = struct.pack(endian + "L", after + len(values))
            values += value
        table += struct.pack(endian + "HHL", tag, typ, cnt) + field
    out = head + table + struct.pack(endian + "L", next_ifd) + values
    return out if cut is None else out[:cut]


def app1_exif(tiff_bytes: bytes) -> bytes:
    return segment(0xE1, b"Exif\x00\x00" + tiff_bytes)


def exif_file(tiff_bytes: bytes) -> bytes:
    return with_segments(base(), app1_exif(tiff_bytes))


def app1_xmp(packet: bytes) -> bytes:
    return segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00" + packet)


def xmp_orientation(value: bytes, form: str = "attribute") -> bytes:
    inner = b'tiff:Orientation="' + value + b'"' if form == "attribute" else \
        b"<tiff:Orientation>" + value + b"</tiff:Orientation>"
    return b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description ' + inner + b"/></x:xmpmeta>"


def pillow_exif(orientation, endian: str = "<", camera: bool = False, **options) -> bytes:
    if camera:
        tags = camera_exif(orientation, endian)
    else:
        tags = Image.Exif()
        tags.endian = endian
        tags[0x0112] = orientation
    return base(exif=tags, **options)


def mpo(frames: int = 2, **options) -> bytes:
    first = Image.fromarray(corpus.picture(24, 16, 3))
    out = io.BytesIO()
    first.save(out, "MPO", save_all=True, append_images=[Image.fromarray(corpus.picture(24, 16, k))
                                                         for k in range(frames - 1)], **options)
    return out.getvalue()


def mpf(entries_count: int, attributes=(0x030000, 0), endian: str = "<", magic: bytes | None = None,
        count_type: int = 4, entries_type: int = 7) -> bytes:
    """An APP2 MPF segment: MP index with NumberOfImages `entries_count` and one 16-byte entry per attribute."""
    raw = b"".join(struct.pack(endian + "LLLHH", a, 1000, 0, 0, 0) for a in attributes)
    count_value = struct.pack(endian + ("L" if count_type == 4 else "H"), entries_count)
    body = tiff([(0xB000, 7, 4, b"0100"), (0xB001, count_type, 1, count_value), (0xB002, entries_type, len(raw), raw)],
                endian, magic=magic)
    return segment(0xE2, b"MPF\x00" + body)


def orientation_as(typ: int, cnt: int, value: bytes, endian: str = "<") -> bytes:
    return with_segments(base(), app1_exif(tiff([(0x0112, typ, cnt, value)], endian)))


def photoshop(*blocks: bytes) -> bytes:
    return segment(0xED, b"Photoshop 3.0\x00" + b"".join(blocks))


def resource(code: int, data: bytes, name: bytes = b"") -> bytes:
    head = b"8BIM" + struct.pack(">H", code) + bytes([len(name)]) + name
    head += b"\x00" * (len(head) % 2)
    return head + struct.pack(">L", len(data)) + data + b"\x00" * (len(data) % 2)


def cut_app1(data: bytes, keep: int) -> bytes:
    """`data` with its first APP1's body cut to `keep` bytes (the segment length rewritten)."""
    at = data.index(b"\xff\xe1")
    length = struct.unpack_from(">H", data, at + 2)[0]
    return data[:at + 2] + struct.pack(">H", keep + 2) + data[at + 4:at + 4 + keep] + data[at + 2 + length:]


def generated() -> list[tuple[str, bytes, bool]]:
    """(name, file, whether the fast reader must answer) for every kind of header the tests hold against Pillow."""
    s = struct.pack
    files = []
    for endian in "<>":
        for o in range(0, 10):
            files.append((f"pillow exif {o} {endian}", pillow_exif(o, endian), True))
            files.append((f"camera exif {o} {endian}", pillow_exif(o, endian, camera=True), True))
        files.append((f"camera exif dpi {endian}", pillow_exif(6, endian, camera=True, dpi=(300, 300)), True))
        files.append((f"orientation LONG {endian}", orientation_as(4, 1, s(endian + "L", 8), endian), True))
        files.append((f"orientation SHORT {endian}", orientation_as(3, 1, s(endian + "H", 3), endian), True))
        files.append((f"orientation 2 SHORTs {endian}", orientation_as(3, 2, s(endian + "HH", 6, 3), endian), False))
    files += [
        ("orientation SSHORT -3", orientation_as(8, 1, s("<h", -3)), True),
        ("orientation SLONG 5", orientation_as(9, 1, s("<l", 5)), True),
        ("orientation SBYTE 7", orientation_as(6, 1, s("<b", 7)), True),
        ("orientation BYTE 6", orientation_as(1, 1, b"\x06"), True),
        ("orientation BYTE '6'", orientation_as(1, 1, b"6"), True),
        ("orientation BYTE '12345'", orientation_as(1, 5, b"12345"), True),
        ("orientation ASCII '6'", orientation_as(2, 2, b"6\x00"), True),
        ("orientation ASCII 'TopLeft'", orientation_as(2, 8, b"TopLeft\x00"), True),
        ("orientation ASCII empty", orientation_as(2, 1, b"\x00"), True),
        ("orientation UNDEFINED 8", orientation_as(7, 1, b"8"), True),
        ("orientation FLOAT 6.0", orientation_as(11, 1, s("<f", 6.0)), True),
        ("orientation DOUBLE nan", orientation_as(12, 1, s("<d", float("nan"))), True),
        ("orientation DOUBLE inf", orientation_as(12, 1, s("<d", float("inf"))), True),
        ("orientation RATIONAL 6/1", orientation_as(5, 1, s("<LL", 6, 1)), False),
        ("orientation LONG8 7", orientation_as(16, 1, s("<Q", 7)), True),
        ("orientation type 99", orientation_as(99, 1, s("<H", 6)), True),
        ("orientation count 0", orientation_as(3, 0, b""), True),
        ("orientation 65535", orientation_as(3, 1, s("<H", 65535)), True),
        ("orientation twice", with_segments(base(), app1_exif(tiff([(0x0112, 3, 1, s("<H", 3)),
                                                                     (0x0112, 3, 1, s("<H", 6))]))), True),
        ("orientation twice, first empty", with_segments(base(), app1_exif(tiff([(0x0112, 3, 0, b""),
                                                                                 (0x0112, 3, 1, s("<H", 6))]))), True),
        ("orientation twice, first of no type", with_segments(base(), app1_exif(
            tiff([(0x0112, 77, 1, s("<H", 2)), (0x0112, 3, 1, s("<H", 5))]))), True),
    ]
    plain = tiff([(0x0112, 3, 1, s("<H", 6))])
    many = tiff([(0x010F, 2, 6, b"Maker\x00"), (0x0110, 2, 12, b"Phone Model\x00"), (0x0112, 3, 1, s("<H", 8)),
                 (0x011A, 5, 1, s("<LL", 72, 1)), (0x0128, 3, 1, s("<H", 2))])
    files += [
        ("tiff header XX", exif_file(tiff([(0x0112, 3, 1, s("<H", 6))], magic=b"XX*\x00")), True),
        ("tiff header MM*0", exif_file(tiff([(0x0112, 3, 1, s(">H", 6))], ">", magic=b"MM*\x00")), True),
        ("tiff header II0*", exif_file(tiff([(0x0112, 3, 1, s("<H", 6))], magic=b"II\x00*")), True),
        ("bigtiff header", exif_file(tiff([(0x0112, 3, 1, s("<H", 6))], magic=b"II+\x00")), True),
        ("tiff header cut to 5", with_segments(base(), app1_exif(plain[:5])), True),
        ("exif prefix only", with_segments(base(), segment(0xE1, b"Exif\x00\x00")), True),
        ("exif prefix twice", with_segments(base(), segment(0xE1, b"Exif\x00\x00Exif\x00\x00" + plain)), True),
        ("exif prefix three times", with_segments(base(), segment(0xE1, b"Exif\x00\x00" * 3 + plain)), True),
        ("ifd offset past the end", with_segments(base(), app1_exif(b"II*\x00" + s("<L", 5000) + plain[8:])), False),
        ("ifd count past the end", exif_file(tiff([(0x0112, 3, 1, s("<H", 6))], count=9)), False),
        ("next ifd offset cut", with_segments(base(), app1_exif(plain[:-2])), False),
        ("value past the end", with_segments(base(), app1_exif(
            tiff([(0x010F, 2, 40, b"M" * 40), (0x0112, 3, 1, s("<H", 6))])[:-10])), False),
        ("values larger than the data", with_segments(base(), app1_exif(
            tiff([(0x010F, 7, 60000, b"M" * 8), (0x0112, 3, 1, s("<H", 6))])[:40])), False),
        ("values overlapping, more than the data", with_segments(base(), app1_exif(
            tiff([(0x010F, 7, 40, b"M" * 40), (0x0112, 3, 1, s("<H", 6))] + [(t, 7, 40, b"") for t in (1, 2, 3)]))),
         False),
        ("no orientation", with_segments(base(), app1_exif(tiff([(0x010F, 2, 6, b"Maker\x00")]))), True),
        ("two exif app1, first wins", with_segments(base(), app1_exif(plain), app1_exif(
            tiff([(0x0112, 3, 1, s("<H", 3))]))), True),
        ("two exif app1, ifd0 continued in the second", with_segments(base(), app1_exif(
            tiff([(0x010F, 2, 4, b"Mak\x00"), (0x0112, 3, 1, s("<H", 5))])[:22]),
            app1_exif(tiff([(0x010F, 2, 4, b"Mak\x00"), (0x0112, 3, 1, s("<H", 5))])[22:])), True),
        ("exif app1 after xmp", with_segments(base(), app1_xmp(xmp_orientation(b"3")), app1_exif(plain)), True),
        ("other app1", with_segments(base(), segment(0xE1, b"http://ns.adobe.com/xmp/extension/\x00abc")), True),
    ]
    for keep in range(0, len(many) + 6, 3):
        files.append((f"camera exif cut to {keep}", cut_app1(with_segments(base(), app1_exif(many)), keep), False))
    full = pillow_exif(6, camera=True)
    for keep in (8, 10, 14, 20, 30, 60, 100, 200, 400, 800, 1600):
        files.append((f"pillow camera exif cut to {keep}", cut_app1(full, keep), False))
    files += [
        ("xmp only, attribute", with_segments(base(), app1_xmp(xmp_orientation(b"6"))), True),
        ("xmp only, element", with_segments(base(), app1_xmp(xmp_orientation(b"8", "element"))), True),
        ("xmp only, 0", with_segments(base(), app1_xmp(xmp_orientation(b"0"))), True),
        ("xmp only, 9", with_segments(base(), app1_xmp(xmp_orientation(b"9"))), True),
        ("xmp only, no orientation", with_segments(base(), app1_xmp(b"<x:xmpmeta/>")), True),
        ("xmp only, empty", with_segments(base(), app1_xmp(b"")), True),
        ("two xmp, last wins", with_segments(base(), app1_xmp(xmp_orientation(b"6")),
                                             app1_xmp(xmp_orientation(b"3"))), True),
        ("xmp and exif orientation", with_segments(base(), app1_exif(plain), app1_xmp(xmp_orientation(b"3"))), True),
        ("xmp and exif without", with_segments(base(), app1_exif(tiff([(0x010F, 2, 4, b"Mak\x00")])),
                                               app1_xmp(xmp_orientation(b"3"))), True),
        ("xmp and broken exif", with_segments(base(), app1_exif(b"XX"), app1_xmp(xmp_orientation(b"3"))), True),
        ("xmp and empty exif", with_segments(base(), segment(0xE1, b"Exif\x00\x00"),
                                             app1_xmp(xmp_orientation(b"7"))), True),
        ("xmp and truncated exif", with_segments(base(), app1_exif(plain[:-2]), app1_xmp(xmp_orientation(b"7"))),
         False),
    ]
    res = [(0x0112, 3, 1, s("<H", 6))]
    files += [
        ("resolution usual", with_segments(base(), app1_exif(tiff(res + [(0x011A, 5, 1, s("<LL", 72, 1)),
                                                                         (0x0128, 3, 1, s("<H", 2))]))), True),
        ("resolution cm", with_segments(base(), app1_exif(tiff(res + [(0x011A, 5, 1, s("<LL", 72, 1)),
                                                                      (0x0128, 3, 1, s("<H", 3))]))), True),
        ("resolution zero denominator", with_segments(base(), app1_exif(tiff(res + [(0x011A, 5, 1, s("<LL", 0, 0)),
                                                                                    (0x0128, 3, 1, s("<H", 2))]))),
         True),
        ("resolution SHORT", with_segments(base(), app1_exif(tiff(res + [(0x011A, 3, 1, s("<H", 72)),
                                                                         (0x0128, 3, 1, s("<H", 2))]))), True),
        ("resolution ASCII '7'", with_segments(base(), app1_exif(tiff(res + [(0x011A, 2, 2, b"7\x00"),
                                                                             (0x0128, 3, 1, s("<H", 2))]))), False),
        ("resolution BYTE", with_segments(base(), app1_exif(tiff(res + [(0x011A, 1, 1, b"\x48"),
                                                                        (0x0128, 3, 1, s("<H", 2))]))), False),
        ("resolution ASCII without unit", with_segments(base(), app1_exif(tiff(res + [(0x011A, 2, 2, b"7\x00")]))),
         True),
        ("resolution unit twice", with_segments(base(), app1_exif(tiff(res + [(0x011A, 5, 1, s("<LL", 72, 1)),
                                                                              (0x0128, 3, 2, s("<HH", 2, 2))]))),
         False),
        ("resolution ASCII '7' with a jfif density", with_segments(base(dpi=(96, 96)), app1_exif(
            tiff(res + [(0x011A, 2, 2, b"7\x00"), (0x0128, 3, 1, s("<H", 2))]))), True),
    ]
    files += [
        ("mpo 2 frames", mpo(2), True),
        ("mpo 3 frames with exif", mpo(3, exif=camera_exif(6)), True),
        ("mpf of one picture", with_segments(base(), app1_exif(plain), mpf(1, (0x030000,))), True),
        ("mpf of two pictures", with_segments(base(), app1_exif(plain), mpf(2)), True),
        ("mpf big endian", with_segments(base(), app1_exif(plain), mpf(2, endian=">")), True),
        ("mpf MM*0 header", with_segments(base(), app1_exif(plain), mpf(2, endian=">", magic=b"MM*\x00")), True),
        ("mpf MM*0 header, entries read as II", with_segments(base(), app1_exif(plain), mpf(
            2, (0x030000, 1), endian=">", magic=b"MM*\x00")), False),
        ("mpf count SHORT", with_segments(base(), app1_exif(plain), mpf(2, count_type=3)), True),
        ("mpf entries BYTE", with_segments(base(), app1_exif(plain), mpf(2, entries_type=1)), True),
        ("mpf count past the entries", with_segments(base(), app1_exif(plain), mpf(3)), False),
        ("mpf of zero pictures", with_segments(base(), mpf(0)), True),
        ("mpf picture format 1", with_segments(base(), app1_exif(plain), mpf(2, (0x030000, 1 << 24))), False),
        ("mpf bad header", with_segments(base(), segment(0xE2, b"MPF\x00XXXX\x00\x00\x00\x08")), False),
        ("mpf without count", with_segments(base(), segment(0xE2, b"MPF\x00" + tiff([(0xB000, 7, 4, b"0100")]))),
         False),
        ("ultra hdr", with_segments(base(), app1_exif(plain), app1_xmp(b'<x hdrgm:Version="1.0"/>'), mpf(2)),
         True),
        ("two mpf, last one counts", with_segments(base(), mpf(2), mpf(1, (0x030000,))), True),
        ("icc profile", base(icc_profile=b"\x00" * 700), True),
        ("icc profile split", base(icc_profile=bytes(range(256)) * 400), True),
        ("icc fragment of 12 bytes", with_segments(base(), segment(0xE2, b"ICC_PROFILE\x00")), False),
        ("icc fragment of 13 bytes", with_segments(base(), segment(0xE2, b"ICC_PROFILE\x00\x01")), False),
        ("icc fragments of 13 and 14 bytes", with_segments(base(), segment(0xE2, b"ICC_PROFILE\x00\x02"),
                                                           segment(0xE2, b"ICC_PROFILE\x00\x01\x01")), True),
        ("icc fragment of 12 bytes after the frame", with_segments(base(), segment(0xE2, b"ICC_PROFILE\x00"),
                                                                   before=0xDA), True),
        ("fpxr app2", with_segments(base(), segment(0xE2, b"FPXR\x00\x00\x01")), True),
        ("other app2", with_segments(base(), segment(0xE2, b"something")), True),
        ("jfif app0 of 5 bytes", with_segments(base(), segment(0xE0, b"JFIF\x00"), app1_exif(plain)), False),
        ("jfif app0 of 7 bytes", with_segments(base(), segment(0xE0, b"JFIF\x00\x01\x02"), app1_exif(plain)), True),
        ("adobe app14 of 6 bytes", with_segments(base(), segment(0xEE, b"Adobe\x00"), app1_exif(plain)), False),
        ("adobe app14 of 12 bytes", with_segments(base(), segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01"),
                                                  app1_exif(plain)), True),
        ("photoshop iptc", with_segments(base(), app1_exif(plain), photoshop(resource(0x0404, b"\x1c\x02\x00")),
                                         ), True),
        ("photoshop resolution", with_segments(base(), app1_exif(plain), photoshop(resource(0x03ED, bytes(16)),
                                                                                   resource(0x0404, b"x"))), True),
        ("photoshop short resolution", with_segments(base(), app1_exif(plain), photoshop(resource(0x03ED, bytes(6)),
                                                                                         b"8BIM\x04\x04")), True),
        ("photoshop cut in a name", with_segments(base(), app1_exif(plain), photoshop(b"8BIM\x04\x04")), False),
        ("photoshop cut in a size", with_segments(base(), app1_exif(plain), photoshop(b"8BIM\x04\x04\x00\x00\x00")),
         True),
        ("comment", with_segments(base(), segment(0xFE, b"a comment"), app1_exif(plain)), True),
        ("app15", with_segments(base(), segment(0xEF, b"vendor data"), app1_exif(plain)), True),
        ("reserved marker 0x02", with_segments(base(), segment(0x02, b"xx"), app1_exif(plain)), False),
        ("jpg0 marker", with_segments(base(), segment(0xF0, b"xx"), app1_exif(plain)), False),
        ("dhp marker", with_segments(base(), segment(0xDE, b"\x08\x00\x10\x00\x18\x01"), app1_exif(plain)), False),
        ("exp and dac markers", with_segments(base(), segment(0xDF, b"\x11"), segment(0xCC, b"\x00\x00"),
                                              app1_exif(plain)), True),
        ("restart interval", with_segments(pillow_exif(6), segment(0xDD, b"\x00\x00"), before=0xDA), True),
    ]
    frame = with_segments(base(), app1_exif(plain))
    sof = frame.index(b"\xff\xc0")
    length = struct.unpack_from(">H", frame, sof + 2)[0]
    for extra in (1, 2, 3):
        longer = frame[:sof + 2] + struct.pack(">H", length + extra) + frame[sof + 4:sof + 2 + length] + \
            b"\x00" * extra + frame[sof + 2 + length:]
        files.append((f"frame header with {extra} bytes more", longer, extra == 3))
    return files


GENERATED = generated()


# ---- the two routes --------------------------------------------------------------------------------------------

def outcome(p) -> tuple:
    if not p:
        return ("refused", p.reason)
    return ("taken", p.orientation, p.frame.width, p.frame.height, p.restarts)


def pillow_route(data: bytes, **settings):
    """prepare as it was: every file with APP1/APP2 segments read by Pillow."""
    with mock.patch.object(decoder, "pillow_view", lambda data, segments: None):
        return prepare(data, **settings)


def pillow_reading(data: bytes) -> tuple:
    """(format, exif_orientation, warnings) of Pillow's open without pixel limits (the fast reader leaves those to
    its caller), or ("error", message, warnings)."""
    with warnings.catch_warnings(record=True) as caught, mock.patch.object(Image, "MAX_IMAGE_PIXELS", None):
        warnings.simplefilter("always")
        try:
            with open_checked(io.BytesIO(data), "input", 2 ** 40) as image:
                seen = (image.format, exif_orientation(image))
        except Exception as exc:
            seen = ("error", str(exc))
    return (*seen, [str(w.message) for w in caught])


def fast_reading(data: bytes):
    frame = parse(data)
    assert frame and frame.pillow_header
    return exif.pillow_view(data, frame.segments)


def assert_fast_agrees(name: str, data: bytes) -> bool:
    """Where the fast reader answers, Pillow opens `data` without a warning, as that format and orientation; and
    prepare's outcome is the Pillow route's under every setting. True where the fast reader answered."""
    fast = fast_reading(data)
    if fast is not None:
        fmt, orientation, caught = pillow_reading(data)
        assert (fmt, orientation) == fast, name
        assert caught == [], f"{name}: Pillow warns {caught}, the fast reader answered {fast}"
    for settings in SETTINGS:
        assert outcome(prepare(data, **settings)) == outcome(pillow_route(data, **settings)), (name, settings)
    return fast is not None


# ---- tests -----------------------------------------------------------------------------------------------------

def test_the_reader_is_checked_against_the_installed_pillow():
    # a Pillow outside CHECKED_PILLOW sends every file to Pillow: run this file with it, then add its version
    assert exif.MIRRORS_PILLOW, f"Pillow {Image.__version__}: check exif.py against it and add it to CHECKED_PILLOW"
    assert exif.UNIT == {t: size for t, (size, _) in TiffImagePlugin.ImageFileDirectory_v2._load_dispatch.items()}
    assert all(struct.calcsize("<" + fmt) == exif.UNIT[t] for t, fmt in exif.NUMBER.items())
    assert exif._TIFF_PREFIXES == tuple(TiffImagePlugin.PREFIXES)


@pytest.mark.parametrize("name, data, answers", GENERATED, ids=[g[0] for g in GENERATED])
def test_prepare_reads_every_generated_header_as_the_pillow_route(name, data, answers):
    answered = assert_fast_agrees(name, data)
    if answers:
        assert answered, f"{name}: the fast reader left it to Pillow"


def test_every_exif_orientation_in_both_byte_orders_comes_out_as_pillows_without_pillow():
    with mock.patch.object(decoder, "open_checked", side_effect=AssertionError("Pillow was asked")):
        for endian in "<>":
            for o in range(1, 9):
                for camera in (False, True):
                    p = prepare(pillow_exif(o, endian, camera=camera))
                    assert p and p.orientation == o
                    assert p.size == ((16, 24) if o >= 5 else (24, 16))
        assert prepare(mpo(2, exif=camera_exif(8))).orientation == 8
        assert prepare(with_segments(base(), app1_xmp(xmp_orientation(b"6")))).orientation == 6


def test_what_the_fast_reader_leaves_to_pillow_is_refused_with_pillows_message():
    data = pillow_exif(6, camera=True)
    refused = prepare(data, formats=("PNG",))
    assert not refused and refused.reason.startswith("header refused: format 'JPEG' of input is not accepted")
    assert prepare(mpo(2), formats=("JPEG",)).reason.startswith("header refused: format 'MPO'")
    assert prepare(data, max_pixels=100).reason.startswith("header refused: input is 24x16 = 384 pixels")
    broken = with_segments(base(), segment(0x02, b"xx"), app1_exif(tiff([(0x0112, 3, 1, b"\x06\x00")])))
    assert prepare(broken).reason == f"header refused: input is not a recognised image ({len(broken)} bytes)"


def test_pillows_own_pixel_limit_applies_to_the_fast_route_as_to_the_pillow_route(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # the 24x16 files have 384 pixels
    for name, data in [("camera", pillow_exif(6, camera=True)), ("mpo", mpo(2))]:
        for limit in (200, 384, 600, 10 ** 6):
            assert outcome(prepare(data, max_pixels=limit)) == outcome(pillow_route(data, max_pixels=limit)), \
                (name, limit)


def flipped(data: bytes, start: int, end: int, rng) -> bytes:
    """`data` with 1 to 4 random bytes of [start, end) changed to random values or bit flips."""
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        at = int(rng.integers(start, end))
        out[at] = int(rng.integers(0, 256)) if rng.random() < 0.5 else out[at] ^ (1 << int(rng.integers(0, 8)))
    return bytes(out)


def test_byte_flips_in_app1_and_mpf_never_make_the_fast_reader_disagree_with_pillow():
    rng = np.random.default_rng(23)
    sources = [pillow_exif(6, "<", camera=True), pillow_exif(3, ">", camera=True), pillow_exif(8, "<"),
               with_segments(base(), app1_exif(tiff([(0x0112, 3, 1, b"\x05\x00")])),
                             app1_xmp(xmp_orientation(b"6"))), mpo(2, exif=camera_exif(6))]
    tried = answered = 0
    for i in range(400):
        source = sources[i % len(sources)]
        segments = parse(source).segments
        wanted = [0xE1, 0xE2] if i % 5 == 4 else [0xE1]
        marker, start, end = [sg for sg in segments if sg[0] in wanted][int(rng.integers(0, len(wanted)))]
        if start + 16 < end and rng.random() < 0.8:  # mostly the TIFF header and IFD0, whose bytes Pillow reads
            end = min(end, start + 6 + 8 + 2 + 12 * 20 + 4)
        data = flipped(source, start - 2, end, rng)  # the length field included
        frame = parse(data)
        if not (frame and frame.pillow_header):
            continue
        tried += 1
        answered += assert_fast_agrees(f"flip {i}", data)
    assert tried >= 300 and answered >= tried // 2, (tried, answered)


def test_parse_keeps_every_segment_up_to_the_scan_header():
    data = pillow_exif(6, camera=True)
    frame = parse(data)
    markers = [m for m, _, _ in frame.segments]
    assert markers[:2] == [0xE0, 0xE1] and markers[-1] == 0xDA and 0xC0 in markers
    for marker, start, end in frame.segments:
        assert data[start - 4:start - 2] == bytes([0xFF, marker])
        assert struct.unpack_from(">H", data, start - 2)[0] == end - start + 2
    assert parse(base()).segments and not parse(base()).pillow_header
