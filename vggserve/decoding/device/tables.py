"""The int32 tables the device JPEG decoder's kernels read, built from parsed frames (their layouts are in the
kernels' banners: kernels/jpeg_huffman.cl, jpeg_idct.cl, jpeg_color.cl).

`Batch.pack(frames, datas)` lays a batch of files out for one sequence of launches: the files' bytes back to back,
the independent segments of their scans (restart intervals), each image's components and coefficient planes, the
distinct Huffman and quantisation tables once each.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .parse import Frame

SEG, IMG, COMP, TAB, PLANE, WIN, CHUNK = 8, 4, 8, 816, 12, 16, 4  # ints per record, as the kernels define them
LOOK = 9  # lookahead bits of jpeg_huffman.cl
FULL, H2V1, H1V2, H2V2, BOX = 0, 1, 2, 3, 4  # upsampling methods (jpeg_color.cl)


@lru_cache(maxsize=512)
def huffman_table(counts: tuple, symbols: bytes) -> np.ndarray:
    """jpeg_huffman.cl's table for one Huffman table: lookahead entries, maxcode, valoffset, symbols
    (jdhuff.c's jpeg_make_d_derived_tbl, with a 9-bit lookahead)."""
    t = np.zeros(TAB, np.int32)
    maxcode = np.full(18, -1, np.int64)
    valoffset = np.zeros(17, np.int64)
    code = index = 0
    for length in range(1, 17):
        n = counts[length - 1]
        if n:
            valoffset[length] = index - code
            for _ in range(n):
                if length <= LOOK:
                    span = 1 << (LOOK - length)
                    start = code << (LOOK - length)
                    t[start:start + span] = (length << 8) | symbols[index]
                code += 1
                index += 1
            maxcode[length] = code - 1
        code <<= 1
    maxcode[17] = 0x7FFFFFFF
    t[512:530] = maxcode
    t[530:547] = valoffset
    t[547:547 + len(symbols)] = np.frombuffer(symbols, np.uint8)
    t.setflags(write=False)
    return t


def upsampling(frame: Frame, comp) -> tuple[int, int, int]:
    """(method, fh, fv) libjpeg-turbo's jinit_upsampler picks for a component (fancy upsampling on); Batch.pack
    applies the same rule to a whole batch (`_methods`)."""
    fh, fv = frame.hmax // comp.h, frame.vmax // comp.v
    if (fh, fv) == (1, 1):
        return FULL, 1, 1
    if (fh, fv) == (2, 1) and comp.width > 2:
        return H2V1, 2, 1
    if (fh, fv) == (1, 2):
        return H1V2, 1, 2
    if (fh, fv) == (2, 2) and comp.width > 2:
        return H2V2, 2, 2
    return BOX, fh, fv


@lru_cache(maxsize=512)
def quant_table(quant: bytes) -> np.ndarray:
    """A quantisation table as the kernels read it: 64 int32 in natural order."""
    t = np.frombuffer(quant, "<u2").astype(np.int32)
    t.setflags(write=False)
    return t


class Template:
    """Per component of a Sampling: (h, v, DC, AC and quantisation table by their index in the file's own `huffs`
    and `quants`, fh, fv), and the class of each of its Huffman tables (0 DC, 1 AC). Batch.pack makes every row
    of a file from these and its size."""

    __slots__ = ("rows", "classes")

    def __init__(self, sampling):
        self.rows = np.array([(h, v, dc, ac, q, sampling.hmax // h, sampling.vmax // v)
                              for (_, h, v, _, _, _), (dc, ac, q) in zip(sampling.specs, sampling.local)], np.int64)
        self.classes = tuple(cls for cls, _ in sampling.hrefs)


def template(sampling) -> Template:
    """The sampling's Template (made once, kept on it)."""
    if sampling.template is None:
        sampling.template = Template(sampling)
    return sampling.template


@dataclass
class Batch:
    """One batch laid out for the kernels. Arrays are int32 unless said; counts are plain ints."""

    data: np.ndarray  # uint8, the files back to back
    seg: np.ndarray
    img: np.ndarray
    comp: np.ndarray
    tab: np.ndarray
    plane: np.ndarray
    quant: np.ndarray
    seg_image: np.ndarray  # the image of each segment
    plane_bytes: int  # sample bytes of every plane
    blocks: int
    chunk: np.ndarray | None = None  # jpeg_entropy.cl's chunks (segment, first byte, end byte, 0), after chunked()
    size: np.ndarray | None = None  # int64 (width, height) of each image as stored (before its EXIF orientation)
    staged: bool = False  # `data` is a span of the caller's staged memory (Batch.pack's `staged`), not a copy

    def chunked(self, size: int, long_size: int | None = None, long_from: int | None = None) -> None:
        """Cut every segment into chunks of `size` bytes for jpeg_entropy.cl (seg[:, 6:8] = first chunk, count);
        segments of at least `long_from` bytes (when given) into chunks of `long_size`."""
        start, end = self.seg[:, 1].astype(np.int64), self.seg[:, 2].astype(np.int64)
        per = size
        if long_size and long_size != size and long_from is not None:
            longer = end - start >= long_from
            if longer.any():  # else one size for all, the cheaper arithmetic below (no per-chunk sizes)
                per = np.where(longer, long_size, size)
        count = np.maximum(1, -(-(end - start) // per))
        first = np.cumsum(count) - count
        self.seg[:, 6], self.seg[:, 7] = first, count
        n = int(count.sum())
        self.chunk = chunk = np.empty((n, CHUNK), np.int32)
        chunk[:, 0] = np.repeat(np.arange(len(count), dtype=np.int32), count)
        if isinstance(per, int):
            lo = np.arange(0, n * per, per, dtype=np.int64)
            lo += np.repeat(start - first * per, count)  # chunk k of a segment starts k * size bytes into it
            step = per
        else:
            step = np.repeat(per, count)
            lo = (np.arange(n, dtype=np.int64) - np.repeat(first, count)) * step + np.repeat(start, count)
        chunk[:, 1] = lo
        lo += step
        chunk[:, 2] = lo
        chunk[first + count - 1, 2] = end  # every chunk but the last of its segment ends inside the segment
        chunk[:, 3] = 0

    @classmethod
    def pack(cls, frames: list[Frame], datas: list[bytes], restarts: list | None = None, place=None,
             staged=None) -> "Batch":
        """restarts[i]: the byte offsets (within file i) of its restart markers, in order, when it has a restart
        interval (`find_restarts`). `place(nbytes)`: where the files' bytes go (a uint8 array of at least nbytes,
        e.g. pinned staging memory); a fresh array by default. `staged`: a uint8 array the files may already lie in
        (the pinned memory a FileArena read them into): when every file does, and they fill most of the span they
        lie in (`in_place`), the batch's data is that span of it as it is, not a copy (`Batch.staged` True).

        Files of the same headers but their size (one `Frame.header`: parse.py caches it) form a group, whose
        tables are looked up once; every row comes from its group's Template and its file's size, with array
        operations over the whole batch."""
        n = len(frames)
        groups: dict = {}  # id of a header -> the group's first file (the frames keep the headers alive meanwhile)
        first_of = [groups.setdefault(id(f.header), i) for i, f in enumerate(frames)]
        reps = list(groups.values())
        number = np.zeros(n, np.intp)
        number[reps] = np.arange(len(reps))
        group = number[first_of]  # the group of each file
        grows, gcount, gmax, tab, quant = _groups([frames[r] for r in reps])
        files = np.array([(f.width, f.height, f.scan_start, f.restart_interval) for f in frames],
                         np.int64).reshape(n, 4)
        nbytes = np.array([len(d) for d in datas], np.int64)
        span = in_place(datas, nbytes, staged)
        hmax, vmax = gmax[group, 0], gmax[group, 1]
        mcus_x, mcus_y = -(-files[:, 0] // (8 * hmax)), -(-files[:, 1] // (8 * vmax))
        ncomp = gcount[group]
        comp0 = _starts(ncomp)
        byte0 = _starts(nbytes) if span is None else span[2]
        owner = np.repeat(np.arange(n), ncomp)  # the file of each component
        spec = grows[(_starts(gcount)[group] - comp0)[owner] + np.arange(owner.size)]  # its row in its group's
        comp, plane, nblocks = _component_rows(spec, owner, files[owner, 0], files[owner, 1], hmax[owner],
                                               vmax[owner], mcus_x[owner], mcus_y[owner])
        total = int(nbytes.sum()) if span is None else span[1] - span[0]
        if max(total, 64 * nblocks) >= 1 << 31:  # the kernels' tables hold int32 offsets
            from ...wording import count

            raise ValueError(f"a batch of {count(n, 'file')} is too large for one decode ({total} bytes, {nblocks} "
                             f"blocks; at most 2 GiB of each): decode it in smaller batches")
        img = np.zeros((n, IMG), np.int32)
        img[:, 0], img[:, 1], img[:, 2] = mcus_x, ncomp, comp0
        seg = _segments(files, restarts, nbytes, byte0, mcus_x * mcus_y)
        data = _joined(datas, total, place) if span is None else staged[span[0]:span[1]]
        return cls(data, seg, img, comp, tab, plane, quant, seg[:, 0].copy(), 64 * nblocks, nblocks,
                   size=files[:, :2], staged=span is not None)


def _component_rows(spec, owner, width, height, hmax, vmax, mcus_x, mcus_y) -> tuple:
    """(comp rows, plane rows, blocks in all) of a batch's components: `spec` their Template rows (tables already
    the batch's), `owner` their file, the rest their file's values."""
    h, v = spec[:, 0], spec[:, 1]
    cw, ch = -(-width * h // hmax), -(-height * v // vmax)  # downsampled size
    bw, bh = mcus_x * h, mcus_y * v  # block grid
    nb = bw * bh
    block = np.cumsum(nb)
    nblocks = int(block[-1]) if block.size else 0
    block -= nb
    comp = np.zeros((owner.size, COMP), np.int32)
    comp[:, 0], comp[:, 1], comp[:, 2], comp[:, 3] = block, bw, h, v
    comp[:, 4:7] = spec[:, 2:5]
    plane = np.zeros((owner.size, PLANE), np.int32)
    plane[:, 0], plane[:, 1], plane[:, 2], plane[:, 3], plane[:, 4] = block, bw, bh, spec[:, 4], block * 64
    plane[:, 5], plane[:, 6], plane[:, 7], plane[:, 8], plane[:, 9] = owner, cw, ch, spec[:, 5], spec[:, 6]
    plane[:, 10] = _methods(spec[:, 5], spec[:, 6], cw)
    return comp, plane, nblocks


def _methods(fh: np.ndarray, fv: np.ndarray, width: np.ndarray) -> np.ndarray:
    """`upsampling`'s method for each (fh, fv, width) of a batch's components (its fh and fv are these)."""
    method = np.full(fh.shape, BOX, np.int32)
    method[(fh == 1) & (fv == 1)] = FULL
    method[(fh == 2) & (fv == 1) & (width > 2)] = H2V1
    method[(fh == 1) & (fv == 2)] = H1V2
    method[(fh == 2) & (fv == 2) & (width > 2)] = H2V2
    return method


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of a run of things of these counts starts (the exclusive prefix sum)."""
    return np.cumsum(counts) - counts


def _groups(frames: list[Frame]) -> tuple:
    """For one frame per group: (Template rows of all of them back to back, with their tables' indices in the
    batch's; components of each; (hmax, vmax) of each; Huffman tables; quantisation tables): one table per
    distinct content (and class), in the order of first use."""
    temps = [f.sampling.template or template(f.sampling) for f in frames]
    huffs: dict = {}
    quants: dict = {}
    hmap, qmap, hat, qat = [], [], [], []
    for f, t in zip(frames, temps):
        hat.append(len(hmap))
        qat.append(len(qmap))
        hmap += [huffs.setdefault((h, c), len(huffs)) for h, c in zip(f.huffs, t.classes)]
        qmap += [quants.setdefault(q, len(quants)) for q in f.quants]
    count = np.array([len(t.rows) for t in temps], np.int64)
    maxima = np.array([(f.sampling.hmax, f.sampling.vmax) for f in frames], np.int64).reshape(-1, 2)
    if not temps:
        return np.zeros((0, 7), np.int64), count, maxima, np.zeros((0, TAB), np.int32), np.zeros((0, 64), np.int32)
    rows = np.concatenate([t.rows for t in temps])
    owner = np.repeat(np.arange(len(temps)), count)
    hmap, qmap = np.array(hmap, np.int64), np.array(qmap, np.int64)
    hat, qat = np.array(hat, np.int64)[owner], np.array(qat, np.int64)[owner]
    rows[:, 2] = hmap[hat + rows[:, 2]]
    rows[:, 3] = hmap[hat + rows[:, 3]]
    rows[:, 4] = qmap[qat + rows[:, 4]]
    return (rows, count, maxima, np.stack([huffman_table(*key[0]) for key in huffs]),
            np.stack([quant_table(q) for q in quants]))


def _segments(files: np.ndarray, restarts, nbytes, byte0, mcus) -> np.ndarray:
    """The seg rows: one segment per file, or one per restart interval (split at its restart markers). files:
    per file (width, height, scan start, restart interval)."""
    n = len(files)
    scan, intervals = files[:, 2], files[:, 3]
    if not intervals.any():
        seg = np.zeros((n, SEG), np.int32)
        seg[:, 0], seg[:, 1], seg[:, 2], seg[:, 4], seg[:, 5] = np.arange(n), byte0 + scan, byte0 + nbytes, mcus, 1
        return seg
    marks = [restarts[i] if ri else [] for i, ri in enumerate(intervals.tolist())]
    nmarks = np.array([len(m) for m in marks], np.int64)
    flat = np.array([m for ms in marks for m in ms] + [0], np.int64)  # a pad: every index below stays in range
    owner = np.repeat(np.arange(n), nmarks + 1)
    k = np.arange(owner.size) - _starts(nmarks + 1)[owner]  # the segment's index in its file
    at = _starts(nmarks)[owner] + k  # the marker ending segment k (the one before it starts it)
    last = k == nmarks[owner]
    base = byte0[owner]
    ri = intervals[owner]
    first = k * ri
    seg = np.zeros((owner.size, SEG), np.int32)
    seg[:, 0] = owner
    seg[:, 1] = base + np.where(k == 0, scan[owner], flat[np.maximum(at - 1, 0)] + 2)
    seg[:, 2] = base + np.where(last, nbytes[owner], flat[np.minimum(at, flat.size - 1)])
    seg[:, 3] = first
    seg[:, 4] = np.where(ri > 0, np.minimum(ri, mcus[owner] - first), mcus[owner])
    seg[:, 5] = last
    return seg


# the most bytes a staged span may hold per byte of its files (the rest: files the device does not decode, uploaded
# with them); past this, the files are copied together as any others
SPAN_SLACK = 2


def in_place(datas: list, nbytes: np.ndarray, staged) -> tuple | None:
    """(start, end, each file's offset from start) of the span of `staged` (a uint8 array) that holds all of
    `datas`, when every one is a numpy array lying in it and the span is at most SPAN_SLACK times their bytes; else
    None."""
    if staged is None or not datas or any(type(d) is not np.ndarray or d.dtype != np.uint8 or not d.flags.c_contiguous
                                          for d in datas):
        return None
    base = staged.ctypes.data
    at = np.array([d.ctypes.data for d in datas], np.int64) - base  # (ctypes.data: 1.0 us, __array_interface__ 1.8)
    lo, hi = int(at.min()), int((at + nbytes).max())
    if lo < 0 or hi > staged.nbytes or hi - lo > SPAN_SLACK * int(nbytes.sum()) + 64:
        return None
    return lo, hi, at - lo


def _joined(datas: list[bytes], total: int, place=None) -> np.ndarray:
    """The files back to back in one uint8 array (of `place(total)` when given, else a new one)."""
    if place is None:
        return np.frombuffer(b"".join(datas), np.uint8)
    from ...runtime.hostcopy import join_into

    out = place(total)[:total]
    join_into(out, [np.frombuffer(data, np.uint8) for data in datas])  # large files over the copying threads
    return out


def find_restarts(data: bytes, frame: Frame) -> list[int] | None:
    """The offsets of the restart markers in the scan of `frame` (one between each two of its intervals), or None
    where they are not RST0, RST1, ... RST7, RST0, ... in order, or not as many as the intervals need: such a file
    goes to the CPU path, where libjpeg resynchronises with warnings."""
    scan = np.frombuffer(data, np.uint8)[frame.scan_start:]
    ff = np.flatnonzero(scan[:-1] == 0xFF)
    follow = scan[ff + 1]
    marks = ff[(follow & 0xF8) == 0xD0]
    want = -(-frame.mcus // frame.restart_interval) - 1
    if marks.size < want:
        return None
    marks = marks[:want]
    if not np.array_equal(scan[marks + 1] & 7, np.arange(want) & 7):
        return None
    return (marks + frame.scan_start).tolist()
