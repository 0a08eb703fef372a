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
    """(method, fh, fv) libjpeg-turbo's jinit_upsampler picks for a component (fancy upsampling on)."""
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

    def chunked(self, size: int) -> None:
        """Cut every segment into chunks of `size` bytes for jpeg_entropy.cl (seg[:, 6:8] = first chunk, count)."""
        start, end = self.seg[:, 1].astype(np.int64), self.seg[:, 2].astype(np.int64)
        count = np.maximum(1, -(-(end - start) // size))
        first = np.concatenate([[0], np.cumsum(count)[:-1]])
        self.seg[:, 6], self.seg[:, 7] = first, count
        owner = np.repeat(np.arange(len(count)), count)
        index = np.arange(int(count.sum())) - first[owner]
        lo = start[owner] + index * size
        self.chunk = np.zeros((owner.size, CHUNK), np.int32)
        self.chunk[:, 0], self.chunk[:, 1], self.chunk[:, 2] = owner, lo, np.minimum(lo + size, end[owner])

    @classmethod
    def pack(cls, frames: list[Frame], datas: list[bytes], restarts: list | None = None, place=None) -> "Batch":
        """restarts[i]: the byte offsets (within file i) of its restart markers, in order, when it has a restart
        interval (`find_restarts`). `place(nbytes)`: where the files' bytes go (a uint8 array of at least nbytes,
        e.g. pinned staging memory); a fresh array by default."""
        segs, imgs, comps, planes = [], [], [], []
        tabs: dict = {}
        quants: dict = {}
        base, block, sample = 0, 0, 0
        for i, (frame, data) in enumerate(zip(frames, datas)):
            imgs.append((frame.mcus_x, len(frame.components), len(comps), 0))
            for c in frame.components:
                dc = tabs.setdefault((c.dc, 0), len(tabs))
                ac = tabs.setdefault((c.ac, 1), len(tabs))
                q = quants.setdefault(c.quant, len(quants))
                comps.append((block, c.blocks_w, c.h, c.v, dc, ac, q, 0))
                method, fh, fv = upsampling(frame, c)
                planes.append((block, c.blocks_w, c.blocks_h, q, sample, i, c.width, c.height, fh, fv, method, 0))
                block += c.blocks_w * c.blocks_h
                sample += c.blocks_w * c.blocks_h * 64
            start, end = base + frame.scan_start, base + len(data)
            ri = frame.restart_interval
            if ri:
                marks = restarts[i]
                bounds = [start] + [base + m + 2 for m in marks]
                ends = [base + m for m in marks] + [end]
                for k, (s, e) in enumerate(zip(bounds, ends)):
                    first = k * ri
                    segs.append((i, s, e, first, min(ri, frame.mcus - first), int(k == len(marks)), 0, 0))
            else:
                segs.append((i, start, end, 0, frame.mcus, 1, 0, 0))
            base += len(data)
        tab = np.stack([huffman_table(*key[0]) for key in tabs]) if tabs else np.zeros((0, TAB), np.int32)
        quant = (np.stack([np.frombuffer(q, "<u2").astype(np.int32) for q in quants]) if quants
                 else np.zeros((0, 64), np.int32))
        seg = np.array(segs, np.int32).reshape(-1, SEG)
        return cls(_joined(datas, base, place), seg, np.array(imgs, np.int32).reshape(-1, IMG),
                   np.array(comps, np.int32).reshape(-1, COMP), tab, np.array(planes, np.int32).reshape(-1, PLANE),
                   quant, seg[:, 0].copy(), sample, block)


def _joined(datas: list[bytes], total: int, place=None) -> np.ndarray:
    """The files back to back in one uint8 array (of `place(total)` when given, else a new one)."""
    if place is None:
        return np.frombuffer(b"".join(datas), np.uint8)
    from ...runtime.hostcopy import copy_many

    out = place(total)[:total]
    pairs, at = [], 0
    for data in datas:
        pairs.append((out[at:at + len(data)], np.frombuffer(data, np.uint8)))
        at += len(data)
    copy_many(pairs)  # a few threads for a large batch (numpy copies without the GIL)
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
