"""Host CPU of the device decoder's `prepare` for a 12 MP camera photo with EXIF: the header read without Pillow
(vggserve/decoding/device/exif.py) against the Pillow route (open_checked + exif_orientation) that `prepare` took
for every file with APP1/APP2 segments before. Times are CPU ms of this process per photo, the mean over the
repeats, and the fastest wall time of one call.

Two files: the corpus's 12 MP photo stored sideways (vggserve.decoding.corpus, EXIF with the orientation alone),
and the same picture with a phone's headers: camera EXIF (IFD0, Exif and GPS directories, a maker note), an XMP
packet and an ICC profile.

    PYTHONPATH=. python3 benchmarks/exif_host.py [--repeat 2000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import io
import struct
import tempfile
from pathlib import Path
from unittest import mock

from decode_host import timed


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def phone_headers(data: bytes) -> bytes:
    """`data` (APP0, then one EXIF APP1) with a phone's APP1 EXIF, APP1 XMP and APP2 ICC segments instead."""
    from vggserve.decoding.corpus import camera_exif

    app0_end = 4 + struct.unpack_from(">H", data, 4)[0]
    assert data[app0_end:app0_end + 2] == b"\xff\xe1", "the corpus photo has no EXIF APP1 after its APP0"
    app1_end = app0_end + 2 + struct.unpack_from(">H", data, app0_end + 2)[0]
    xmp = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/'
           b'1.0/" tiff:Orientation="6" xmp:CreatorTool="17.4.1"/></rdf:RDF></x:xmpmeta>').ljust(3000)
    icc = b"ICC_PROFILE\x00\x01\x01" + bytes(range(256)) * 14
    return (data[:app0_end] + segment(0xE1, b"Exif\x00\x00" + camera_exif(6).tobytes())
            + segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00" + xmp) + segment(0xE2, icc) + data[app1_end:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--workdir", default=None, help="where the corpus photo is written (default: a temporary folder)")
    args = ap.parse_args()
    from vggserve.decoding.corpus import MIX, write_mix
    from vggserve.decoding.device import decoder, parse, prepare
    from vggserve.decoding.device.exif import pillow_view
    from vggserve.images import exif_orientation, open_checked

    kinds = [k for k in MIX if k.name == "photo_12mp_sideways"]
    with tempfile.TemporaryDirectory() as temporary:
        path = next(iter(write_mix(Path(args.workdir or temporary), kinds=kinds).values()))
        corpus_photo = path.read_bytes()
    files = [("corpus 12 MP photo, EXIF orientation only", corpus_photo),
             ("the same, phone headers (EXIF, XMP, ICC)", phone_headers(corpus_photo))]

    def pillow(data):
        with open_checked(io.BytesIO(data), "input") as image:
            return exif_orientation(image)

    def pillow_route(data):
        with mock.patch.object(decoder, "pillow_view", lambda data, segments: None):
            return prepare(data)

    print("ms per photo: CPU mean, fastest wall")
    for name, data in files:
        frame = parse(data)
        assert prepare(data).orientation == pillow_route(data).orientation == 6
        print(f"{name} ({len(data) / 2 ** 20:.1f} MB, {frame.scan_start} bytes of headers)")
        no_patch = timed(lambda: prepare(data), args.repeat)
        with mock.patch.object(decoder, "pillow_view", lambda data, segments: None):
            patched = timed(lambda: prepare(data), args.repeat)
        rows = [("prepare, headers read without Pillow", no_patch),
                ("prepare, the Pillow route (before)", patched),
                ("  exif.pillow_view alone", timed(lambda: pillow_view(data, frame.segments), args.repeat)),
                ("  open_checked + exif_orientation alone", timed(lambda: pillow(data), args.repeat)),
                ("  parse alone", timed(lambda: parse(data), args.repeat))]
        for label, (cpu, wall) in rows:
            print(f"  {label:42s} {cpu:7.4f} {wall:7.4f}")


if __name__ == "__main__":
    main()
