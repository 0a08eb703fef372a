"""The host's part of the device JPEG decoder: markers and tables only, never the entropy-coded data.

`parse(data)` reads a JPEG's markers up to its scan and returns a `Frame`: the size, the components with their
sampling factors and tables, the restart interval and where the scan's bytes start. It returns a `Refusal` (with the
reason) for every file the device decoder does not take, which then goes to the CPU path, as it is: progressive,
arithmetic-coded, lossless, 12-bit or 16-bit files, CMYK/YCCK/RGB-stored colour, files of several scans, sampling
factors that libjpeg-turbo refuses or that need a generic upsampler, tables missing or invalid, damaged headers.
The rule is to refuse whatever is not certain to decode as libjpeg-turbo does: the CPU path then gives Pillow's
pixels or Pillow's error, exactly.

Conventions as in libjpeg-turbo (jdinput.c, jdhuff.c): for a component with sampling factors (h, v) in an image of
W x H with maxima (hmax, vmax), its samples cover ceil(W * h / hmax) x ceil(H * v / vmax) ("downsampled" size); an
interleaved scan has ceil(W / (8 hmax)) x ceil(H / (8 vmax)) MCUs of h x v blocks per component, a scan of one
component has one block per MCU over ceil(width / 8) x ceil(height / 8) blocks of that component.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: JPEG zigzag order: ZIGZAG[k] is the natural (row-major) index of the k-th coefficient in the stream.
ZIGZAG = np.array([0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
                   13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52,
                   45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63], dtype=np.int32)

SOF_NAMES = {0xC0: "baseline", 0xC1: "extended sequential", 0xC2: "progressive", 0xC3: "lossless",
             0xC5: "differential sequential", 0xC6: "differential progressive", 0xC7: "differential lossless",
             0xC9: "arithmetic sequential", 0xCA: "arithmetic progressive", 0xCB: "arithmetic lossless",
             0xCD: "arithmetic differential sequential", 0xCE: "arithmetic differential progressive",
             0xCF: "arithmetic differential lossless"}
MAX_BLOCKS_IN_MCU = 10  # libjpeg's D_MAX_BLOCKS_IN_MCU
RGB_IDS = (0x52, 0x47, 0x42)  # 'R', 'G', 'B': libjpeg takes such a file's colours as RGB, not YCbCr


@dataclass(frozen=True)
class Refusal:
    """Why the device decoder does not take a file (the CPU path decodes or refuses it)."""

    reason: str

    def __bool__(self) -> bool:  # a refusal is falsy, a Frame truthy: `if not (frame := parse(data))`
        return False


@dataclass(frozen=True)
class Component:
    id: int
    h: int  # sampling factors
    v: int
    quant: bytes  # 64 uint16 little-endian, natural order
    dc: tuple  # (counts[16], symbols) of its DC Huffman table
    ac: tuple
    width: int  # downsampled size in samples
    height: int
    blocks_w: int  # the block grid the scan codes (padded to whole MCUs)
    blocks_h: int


class Sampling:
    """What a file's frame and scan headers fix apart from its size, shared by every file with the same headers
    (cached): the sampling maxima and, per component, (id, h, v, quant number, DC number, AC number) (h = v = 1,
    maxima 1, for one component); the distinct tables they name in first use: `hrefs` ((class, number) of Huffman
    tables, DC then AC per component), `qrefs` (quantisation numbers), and `local` per component (its DC, AC and
    quantisation table's index in those). `template`: tables.py's rows for it, computed there once."""

    __slots__ = ("hmax", "vmax", "specs", "hrefs", "qrefs", "local", "template")

    def __init__(self, hmax: int, vmax: int, specs: tuple):
        self.hmax, self.vmax, self.specs = hmax, vmax, specs
        hrefs: dict = {}
        qrefs: dict = {}
        self.local = tuple((hrefs.setdefault((0, s[4]), len(hrefs)), hrefs.setdefault((1, s[5]), len(hrefs)),
                            qrefs.setdefault(s[3], len(qrefs))) for s in specs)
        self.hrefs, self.qrefs, self.template = tuple(hrefs), tuple(qrefs), None


class Frame:
    """A parsed file: its `header` (Sampling, huffs, quants), shared by the files of the same headers but their
    size (`_select`), its size, restart interval (MCUs, 0 for none), where its entropy-coded bytes start,
    whether it has APP1 or APP2 segments (EXIF, XMP, MPF, ICC: orientation and format are then read as Pillow
    reads them, exif.py) and `segments`: (marker, body start, body end) of every segment up to the scan header's,
    in file order. `huffs`: the (counts, symbols) of the Huffman tables in `sampling.hrefs`; `quants`: 64 uint16 LE
    per `sampling.qrefs`. Read-only."""

    __slots__ = ("header", "width", "height", "restart_interval", "scan_start", "pillow_header", "segments",
                 "_components")

    def __init__(self, header: tuple, width: int, height: int, restart_interval: int, scan_start: int,
                 pillow_header: bool, segments: tuple = ()):
        self.header, self.width, self.height = header, width, height
        self.restart_interval, self.scan_start, self.pillow_header = restart_interval, scan_start, pillow_header
        self.segments = segments
        self._components = None

    sampling = property(lambda self: self.header[0])
    huffs = property(lambda self: self.header[1])
    quants = property(lambda self: self.header[2])
    hmax = property(lambda self: self.header[0].hmax)
    vmax = property(lambda self: self.header[0].vmax)

    @property
    def mcus_x(self) -> int:
        return -(-self.width // (8 * self.sampling.hmax))

    @property
    def mcus_y(self) -> int:
        return -(-self.height // (8 * self.sampling.vmax))

    @property
    def mcus(self) -> int:
        return self.mcus_x * self.mcus_y

    @property
    def components(self) -> tuple:
        """Component per component, Y (Cb, Cr) (made on first use)."""
        if self._components is None:
            sampling, w, h = self.sampling, self.width, self.height
            mx, my = self.mcus_x, self.mcus_y
            self._components = tuple(
                Component(cid, ch, cv, self.quants[q], self.huffs[dc], self.huffs[ac], -(-w * ch // sampling.hmax),
                          -(-h * cv // sampling.vmax), mx * ch, my * cv)
                for (cid, ch, cv, _, _, _), (dc, ac, q) in zip(sampling.specs, sampling.local))
        return self._components


_STANDALONE = frozenset([0xD8, 0x01, 0xD9, *range(0xD0, 0xD8)])  # markers without a length, refused before the scan


def parse(data: bytes) -> Frame | Refusal:
    """The Frame of the JPEG `data`, or the Refusal that sends it to the CPU path. Never raises for any bytes."""
    try:
        d = data if type(data) is bytes else bytes(data)
        known = _known_head(d)  # a Refusal is falsy: compared with None
        return _parse(d) if known is None else known
    except (IndexError, struct.error, ValueError) as exc:
        return Refusal(f"damaged header ({exc})")


HEAD_BYTES = 4096  # a short head: the bytes up to the scan of most files (a photo's are ~600 bytes); longer ones
# carry large APP segments (a camera's EXIF), which differ from file to file
HEADS = 16  # short heads kept, the latest first: an encoder's files share theirs but the size
_heads: tuple = ()  # (bytes before the frame's size, where it is, bytes after it up to the scan, its Frame)


def _size(d: bytes, at: int) -> tuple[int, int] | Refusal:
    """(height, width) of the frame header whose size is at byte `at` of `d`, or libjpeg's refusal of a zero."""
    height, width = (d[at] << 8) | d[at + 1], (d[at + 2] << 8) | d[at + 3]
    return Refusal("zero size in the frame header") if height == 0 or width == 0 else (height, width)


def _known_head(d: bytes) -> Frame | Refusal | None:
    """The Frame of `d` where its bytes up to the scan are a kept head's but the height and width (which _parse
    reads there and nowhere else: everything else it returns is a function of those bytes alone), else None."""
    for before, at, after, f in _heads:
        if len(d) >= f.scan_start and d.startswith(before) and d[at + 4:f.scan_start] == after:
            size = _size(d, at)
            if type(size) is Refusal:
                return size
            return Frame(f.header, size[1], size[0], f.restart_interval, f.scan_start, f.pillow_header, f.segments)
    return None


def _keep_head(d: bytes, at: int, frame: Frame) -> Frame:
    """Keep `d`'s head (its frame's size at byte `at`) if short, for `_known_head`; return `frame`."""
    global _heads
    if frame.scan_start <= HEAD_BYTES:
        head = (d[:at], at, d[at + 4:frame.scan_start], frame)
        _heads = (head, *_heads[:HEADS - 1])  # one assignment: threads see either tuple
    return frame


def _parse(d: bytes) -> Frame | Refusal:
    n = len(d)
    if n < 4 or d[0] != 0xFF or d[1] != 0xD8:
        return Refusal("not a JPEG")
    pos = 2
    dhts: list[bytes] = []  # the bodies of the table segments, in order
    dqts: list[bytes] = []
    sof = None
    restart = 0
    jfif = pillow_header = False
    adobe = None
    segments: list = []  # (marker, body start, body end) of each segment up to the scan header's
    while True:
        if pos + 4 > n:
            return Refusal("no scan")
        if d[pos] != 0xFF:
            return Refusal("bytes between markers")  # libjpeg skips them with a warning
        marker = d[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            return Refusal(f"marker 0x{marker:02X} before the scan")
        start, end = pos + 4, pos + 2 + ((d[pos + 2] << 8) | d[pos + 3])
        if end < start or end > n:
            return Refusal("segment past the end of the file")
        pos = end
        segments.append((marker, start, end))
        if marker == 0xC4:
            body = d[start:end]
            if type(why := _dht(body)) is str:
                return Refusal(why)
            dhts.append(body)
        elif marker == 0xDB:
            body = d[start:end]
            if type(why := _dqt(body)) is str:
                return Refusal(why)
            dqts.append(body)
        elif marker == 0xE1 or marker == 0xE2:  # exif.py reads them where `segments` says
            pillow_header = True
        elif marker == 0xDA:
            body = d[start:end]
            if sof is None:
                return Refusal("scan before the frame header")
            if sof[0] != 8:
                return Refusal(f"{sof[0]}-bit samples")
            size = _size(d, sof_at + 1)
            if type(size) is Refusal:
                return size
            height, width = size
            sampling = _sampling(sof[5:], body, jfif, adobe)
            if type(sampling) is str:
                return Refusal(sampling)
            header = _select(tuple(dhts), tuple(dqts), sampling)
            if header is None:
                return Refusal("a table the scan uses is missing")
            return _keep_head(d, sof_at + 1, Frame(header, width, height, restart, pos, pillow_header, tuple(segments)))
        elif marker in (0xC0, 0xC1):
            if sof is not None:
                return Refusal("two frame headers")
            sof, sof_at = d[start:end], start
        elif marker in SOF_NAMES:
            return Refusal(f"{SOF_NAMES[marker]} JPEG")
        elif marker == 0xDD:
            if end - start != 2:
                return Refusal("bad restart interval")
            restart = (d[start] << 8) | d[start + 1]
        elif marker == 0xE0:
            jfif = jfif or (end - start >= 14 and d[start:start + 5] == b"JFIF\0")  # jdmarker.c's APP0_DATA_LEN
        elif marker == 0xEE:
            if d[start:min(start + 5, end)] == b"Adobe" and end - start >= 12:
                adobe = d[start + 11]
        elif marker == 0xDC:
            return Refusal("DNL marker")


@lru_cache(maxsize=1024)
def _select(dhts: tuple, dqts: tuple, sampling: Sampling) -> tuple | None:
    """A Frame's header: (sampling, huffs, quants), the tables `sampling` names as the table segments `dhts`,
    `dqts` (checked bodies, in file order: a later table replaces one of its class and number) define them; None
    where one is missing. Cached: files with the same headers but their size share it, and a batch's layout
    takes their rows and tables once per header."""
    huff: dict = {}
    quant: dict = {}
    for body in dhts:
        huff.update(_dht(body))
    for body in dqts:
        quant.update(_dqt(body))
    try:
        return sampling, tuple([huff[r] for r in sampling.hrefs]), tuple([quant[q] for q in sampling.qrefs])
    except KeyError:
        return None


@lru_cache(maxsize=256)
def _dqt(body: bytes) -> dict | str:
    """{table number: 64 uint16 LE in natural order} of a DQT segment's body, or why it is refused (cached: most
    files of one encoder carry the same tables)."""
    quant, i = {}, 0
    while i < len(body):
        pq, tq = body[i] >> 4, body[i] & 15
        if pq > 1 or tq > 3:
            return "bad quantisation table"
        n = 64 * (pq + 1)
        raw = np.frombuffer(bytes(body[i + 1:i + 1 + n]), dtype=">u2" if pq else np.uint8)
        if raw.size != 64:
            return "short quantisation table"
        natural = np.zeros(64, np.uint16)
        natural[ZIGZAG] = raw
        quant[tq] = natural.astype("<u2").tobytes()
        i += 1 + n
    return quant


@lru_cache(maxsize=256)
def _dht(body: bytes) -> dict | str:
    """{(class, number): (counts, symbols)} of a DHT segment's body, or why it is refused (cached)."""
    huff, i = {}, 0
    while i < len(body):
        tc, th = body[i] >> 4, body[i] & 15
        if tc > 1 or th > 3:
            return "bad Huffman table"
        counts = tuple(body[i + 1:i + 17])
        total = sum(counts)
        if len(counts) != 16 or total > 256 or i + 17 + total > len(body):
            return "bad Huffman table"
        symbols = bytes(body[i + 17:i + 17 + total])
        if (why := check_huffman(counts, symbols, tc == 0)) is not None:
            return why
        huff[(tc, th)] = (counts, symbols)
        i += 17 + total
    return huff


def check_huffman(counts, symbols: bytes, dc: bool) -> str | None:
    """libjpeg's jpeg_make_d_derived_tbl checks: codes that fit their lengths, DC symbols of at most 15 bits. An
    all-ones code of some length is legal there too; the device decoder reads a code like libjpeg."""
    code = 0
    for length in range(1, 17):
        code += counts[length - 1]
        if code > (1 << length):
            return "Huffman table with too many codes"
        code <<= 1
    if dc and any(s > 15 for s in symbols):
        return "DC Huffman symbol beyond 15"
    return None


@lru_cache(maxsize=1024)
def _sampling(sof: bytes, sos: bytes, jfif: bool, adobe) -> Sampling | str:
    """The Sampling of the frame header from its component count on (`sof`) and the scan header `sos`, or why
    the file is refused (cached: files from one encoder share it, whatever their sizes)."""
    nf = sof[0]
    if nf not in (1, 3) or len(sof) < 1 + 3 * nf:
        return f"{nf} components"
    comps = [(sof[1 + 3 * i], sof[2 + 3 * i] >> 4, sof[2 + 3 * i] & 15, sof[3 + 3 * i]) for i in range(nf)]
    if nf == 3 and not jfif:  # libjpeg's colour space guess (jdapimin.c): JFIF, else Adobe's transform, else ids
        if adobe is not None and adobe != 1:
            return "colours stored as RGB" if adobe == 0 else "unknown Adobe transform"
        if adobe is None and tuple(c[0] for c in comps) == RGB_IDS:
            return "colours stored as RGB"
    if any(not (1 <= h <= 4 and 1 <= v <= 4) for _, h, v, _ in comps):
        return "bad sampling factors"
    hmax, vmax = max(c[1] for c in comps), max(c[2] for c in comps)
    ns = sos[0]
    if ns != nf or len(sos) != 4 + 2 * ns:
        return "not one scan of every component"
    ss, se, ahal = sos[1 + 2 * ns], sos[2 + 2 * ns], sos[3 + 2 * ns]
    if ss != 0 or se != 63 or ahal != 0:
        return "bad scan parameters"
    scan = [(sos[1 + 2 * i], sos[2 + 2 * i] >> 4, sos[2 + 2 * i] & 15) for i in range(ns)]
    if [s[0] for s in scan] != [c[0] for c in comps]:
        return "scan components differ from the frame's"
    if nf == 3:
        y = comps[0]
        if (y[1], y[2]) != (hmax, vmax) or any(hmax % c[1] or vmax % c[2] for c in comps):
            return "sampling factors this decoder does not upsample"
        if sum(c[1] * c[2] for c in comps) > MAX_BLOCKS_IN_MCU:
            return "too many blocks in an MCU"
    else:
        hmax = vmax = 1  # one component: its samples are the image whatever its factors say
        comps = [(cid, 1, 1, tq) for cid, _, _, tq in comps]
    return Sampling(hmax, vmax, tuple((cid, h, v, tq, td, ta) for (cid, h, v, tq), (_, td, ta) in zip(comps, scan)))
