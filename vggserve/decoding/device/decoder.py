"""The device JPEG decoder: the host parses (parse.py) and lays out (tables.py), three kernels decode.

    prepared = prepare(data)                      # a Prepared file, or a Refusal: the CPU path takes that file
    decoder = JpegDecoder(context, device)        # builds kernels/jpeg_huffman.cl, jpeg_idct.cl, jpeg_color.cl
    run = decoder.enqueue(queue, [p1, p2], windows, out)   # one sequence of launches for the whole batch
    ok = run.ok()                                 # per file: whether the device decode was libjpeg's, exactly

`windows`: per file, where its upright RGB pixels go (`Window`): the whole image, or a box of it (the aspect-ratio
crop, the centre crop of an image that needs no resize), at a byte offset of `out` with a row stride. A file whose
decode the kernels flag (a corrupt or unusual stream) has `ok()` False: its window holds garbage and the caller
decodes it on the CPU, which gives Pillow's pixels or Pillow's error.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyopencl as cl
from PIL import Image

from ...images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS, _accepted_formats, exif_orientation, open_checked
from ...ops.launch import round_up
from .parse import Frame, Refusal, parse
from .tables import WIN, Batch, find_restarts

PROGRAMS = ("jpeg_huffman.cl", "jpeg_idct.cl", "jpeg_color.cl", "jpeg_entropy.cl")
CHUNK_BYTES = 128  # bytes of scan per work-item in the parallel entropy decoding
ROUNDS = 20  # its synchronisation rounds; a segment not settled by then is decoded serially
SWAPS = (5, 6, 7, 8)  # EXIF orientations that swap width and height


@dataclass(frozen=True)
class Prepared:
    """A file the device decoder takes: its bytes, frame, restart markers and EXIF orientation."""

    data: bytes
    frame: Frame
    restarts: list | None
    orientation: int

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the upright image, as decode_pixels returns it."""
        w, h = self.frame.width, self.frame.height
        return (h, w) if self.orientation in SWAPS else (w, h)


@dataclass(frozen=True)
class Window:
    """Where a file's pixels go: the upright image's box [x0, x0 + width) x [y0, y0 + height), written at byte
    `offset` of the output buffer with `stride` pixels per row (default: width)."""

    offset: int
    x0: int
    y0: int
    width: int
    height: int
    stride: int = 0

    @classmethod
    def whole(cls, prepared: Prepared, offset: int) -> "Window":
        w, h = prepared.size
        return cls(offset, 0, 0, w, h)


def prepare(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, formats=ALLOWED_FORMATS) -> Prepared | Refusal:
    """What the device needs to decode `data`, or why the CPU path must take it (that path then decodes it, or
    raises the error it always raises: format, size, corruption). The pixel limit, the format allowlist and the
    EXIF orientation come out as the CPU path's; a file with EXIF, XMP or MPF segments has them read by Pillow
    itself."""
    frame = parse(data)
    if not frame:
        return frame
    if frame.pillow_header:
        try:
            with open_checked(io.BytesIO(data), "input", max_pixels, formats) as image:
                orientation = exif_orientation(image)
        except Exception as exc:  # the CPU path raises this again, as its own error
            return Refusal(f"header refused: {exc}")
    else:
        if "JPEG" not in _accepted_formats(formats):
            return Refusal("JPEG is not an accepted format")
        limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
        if frame.width * frame.height > limit:
            return Refusal("more pixels than the limit")
        orientation = 1
    restarts = None
    if frame.restart_interval:
        restarts = find_restarts(data, frame)
        if restarts is None:
            return Refusal("restart markers out of order")
    return Prepared(bytes(data), frame, restarts, orientation if 1 <= orientation <= 8 else 1)


class _Grown:
    """A device buffer that grows to the largest size asked for."""

    def __init__(self, context, flags):
        self.context, self.flags, self.size, self.buffer = context, flags, 0, None

    def get(self, nbytes: int):
        if nbytes > self.size:
            self.size = max(nbytes, self.size + self.size // 2, 4096)
            self.buffer = cl.Buffer(self.context, self.flags, self.size)
        return self.buffer


@dataclass
class Run:
    """One enqueued batch: `ok()` waits for the statuses and says, per file, whether its pixels are exact."""

    batch: Batch
    status: np.ndarray
    read: object  # the statuses' read event
    done: object  # the colour kernel's event (its output is complete)
    host: tuple  # host arrays the uploads read, kept alive until the run is done
    parallel: np.ndarray  # per segment, 1 where jpeg_entropy.cl decoded it, 0 where jpeg_huffman.cl did

    def segments_in_parallel(self) -> int:
        self.read.wait()
        return int(self.parallel.sum())

    def ok(self) -> list[bool]:
        self.read.wait()
        nseg = self.batch.seg.shape[0]
        bad = np.zeros(self.batch.img.shape[0], bool)
        np.logical_or.at(bad, self.batch.seg_image, self.status[:nseg] != 0)
        bad |= self.status[nseg:] != 0
        return (~bad).tolist()

    def reasons(self) -> list[int]:
        """Per file, the first nonzero status code of its segments or its IDCT (kernels' JH_*, JI_*), 0 if none."""
        self.read.wait()
        nseg = self.batch.seg.shape[0]
        out = self.status[nseg:].tolist()
        for image, code in zip(self.batch.seg_image.tolist(), self.status[:nseg].tolist()):
            if code and not out[image]:
                out[image] = code
        return out


class JpegDecoder:
    """The three decoding kernels of one OpenCL context and device, with their scratch buffers."""

    def __init__(self, context, device, cache=None, wg: int = 64, chunk_bytes: int = CHUNK_BYTES,
                 rounds: int = ROUNDS):
        """chunk_bytes, rounds: the parallel entropy decoding's chunk size and synchronisation rounds; rounds=0
        decodes every segment with one work-item (jpeg_huffman.cl alone)."""
        from ...runtime.programs import ProgramCache

        if rounds == 1 or rounds < 0 or chunk_bytes < 8:
            raise ValueError(f"rounds must be 0 or at least 2 (a settled segment is one whose last round changed "
                             f"nothing), chunk_bytes at least 8; got {rounds}, {chunk_bytes}")
        cache = cache or ProgramCache(context, device)
        self.context, self.wg, self.chunk_bytes, self.rounds = context, wg, chunk_bytes, rounds
        programs = [cache.build(name, {}) for name in PROGRAMS]
        self.k_huffman = cl.Kernel(programs[0], "jpeg_huffman")
        self.k_idct = cl.Kernel(programs[1], "jpeg_idct")
        self.k_color = cl.Kernel(programs[2], "jpeg_color")
        self.k_sync = cl.Kernel(programs[3], "jpeg_sync")
        self.k_prefix = cl.Kernel(programs[3], "jpeg_prefix")
        self.k_decode = cl.Kernel(programs[3], "jpeg_decode")
        mf = cl.mem_flags
        self._data = _Grown(context, mf.READ_ONLY)
        self._meta = _Grown(context, mf.READ_ONLY)
        self._coef = _Grown(context, mf.READ_WRITE)
        self._samples = _Grown(context, mf.READ_WRITE)
        self._status = _Grown(context, mf.READ_WRITE)
        self._chunks = _Grown(context, mf.READ_ONLY)
        self._states = [_Grown(context, mf.READ_WRITE) for _ in range(3)]  # a round's exits, and the two before
        self._entry = _Grown(context, mf.READ_WRITE)
        self._settled = _Grown(context, mf.READ_WRITE)

    def enqueue(self, queue, files: list[Prepared], windows: list[Window], out, wait_for=None) -> Run:
        """Decode `files` into `out` (a device buffer) at their `windows`: upload, entropy decoding, IDCT, upsampling
        and colour, one launch each; the statuses are read back without blocking (Run.ok waits for them)."""
        if not files:
            raise ValueError("a device decode needs at least one file")
        batch = Batch.pack([f.frame for f in files], [f.data for f in files], [f.restarts for f in files])
        if self.rounds:
            batch.chunked(self.chunk_bytes)
        win, pixels = _windows(files, windows, batch)
        parts = [batch.seg, batch.img, batch.comp, batch.tab, batch.plane, batch.quant, win]
        at = np.cumsum([0] + [p.size for p in parts])[:-1].tolist()
        meta = np.concatenate([p.ravel() for p in parts]).astype(np.int32)
        nseg, nimg, nplanes = batch.seg.shape[0], batch.img.shape[0], batch.plane.shape[0]
        status = np.empty(nseg + nimg, np.int32)
        data_buf = self._data.get(batch.data.nbytes + 16)
        meta_buf = self._meta.get(meta.nbytes)
        coef_buf = self._coef.get(batch.blocks * 128)
        samples_buf = self._samples.get(batch.plane_bytes)
        status_buf = self._status.get(status.nbytes)
        ev = [cl.enqueue_copy(queue, data_buf, batch.data, is_blocking=False, wait_for=wait_for),
              cl.enqueue_copy(queue, meta_buf, meta, is_blocking=False, wait_for=wait_for),
              cl.enqueue_fill_buffer(queue, status_buf, np.int32(0), 0, status.nbytes)]
        wg = self.wg
        settled = self._settled.get(4 * nseg)
        ev.append(cl.enqueue_fill_buffer(queue, settled, np.int32(1 if self.rounds else 0), 0, 4 * nseg))
        if self.rounds:
            ev = self._parallel(queue, batch, at, data_buf, meta_buf, coef_buf, status_buf, settled, ev)
        e1 = self.k_huffman(queue, (round_up(nseg, wg),), (wg,), data_buf, meta_buf, np.int32(at[0]),
                            np.int32(at[1]), np.int32(at[2]), np.int32(at[3]), coef_buf, status_buf,
                            np.int32(nseg), settled, wait_for=ev)
        e2 = self.k_idct(queue, (round_up(batch.blocks, wg),), (wg,), coef_buf, meta_buf, np.int32(at[4]),
                         np.int32(at[5]), samples_buf, status_buf, np.int32(nseg), np.int32(nplanes), np.int32(batch.blocks), wait_for=[e1])
        e3 = self.k_color(queue, (round_up(pixels, wg),), (wg,), samples_buf, meta_buf, np.int32(at[4]),
                          np.int32(at[6]), out, np.int32(len(files)), np.int32(pixels), wait_for=[e2])
        parallel = np.empty(nseg, np.int32)
        read = cl.enqueue_copy(queue, status, status_buf, is_blocking=False, wait_for=[e3])
        read = cl.enqueue_copy(queue, parallel, settled, is_blocking=False, wait_for=[read])
        queue.flush()
        return Run(batch, status, read, e3, (batch.data, meta, batch.chunk), parallel)

    def _parallel(self, queue, batch, at, data_buf, meta_buf, coef_buf, status_buf, settled, wait_for):
        """jpeg_entropy.cl: zeroed coefficients, the synchronisation rounds, the prefix sums, the decode."""
        wg, nseg = self.wg, batch.seg.shape[0]
        chunk = batch.chunk
        n = chunk.shape[0]
        chunk_buf = self._chunks.get(chunk.nbytes)
        states = [g.get(n * 8 * 4) for g in self._states]
        entry = self._entry.get(n * 4 * 4)
        ev = [cl.enqueue_copy(queue, chunk_buf, chunk, is_blocking=False, wait_for=wait_for),
              cl.enqueue_fill_buffer(queue, coef_buf, np.int16(0), 0, batch.blocks * 128), *wait_for]
        tables = (np.int32(at[0]), np.int32(at[1]), np.int32(at[2]), np.int32(at[3]))
        grid = (round_up(n, wg),)
        for r in range(self.rounds):
            ev = [self.k_sync(queue, grid, (wg,), data_buf, meta_buf, *tables, chunk_buf, np.int32(n),
                              states[(r + 1) % 3], states[(r + 2) % 3], states[r % 3], settled, np.int32(r),
                              np.int32(self.rounds - 1), wait_for=ev)]
        last = states[(self.rounds - 1) % 3]
        ev = [self.k_prefix(queue, (round_up(nseg, wg),), (wg,), meta_buf, np.int32(at[0]), np.int32(nseg), last,
                            entry, wait_for=ev)]
        return [self.k_decode(queue, grid, (wg,), data_buf, meta_buf, *tables, chunk_buf, np.int32(n), last, entry,
                              settled, coef_buf, status_buf, wait_for=ev)]


def _windows(files: list[Prepared], windows: list[Window], batch: Batch) -> tuple[np.ndarray, int]:
    """jpeg_color.cl's window table and the pixels it covers."""
    rows, first = [], 0
    for i, (f, w) in enumerate(zip(files, windows)):
        uw, uh = f.size
        if w.width < 1 or w.height < 1 or w.x0 < 0 or w.y0 < 0 or w.x0 + w.width > uw or w.y0 + w.height > uh:
            raise ValueError(f"file {i}: window {w} outside its {uw}x{uh} image")
        planes = [int(batch.img[i, 2]) + k for k in range(len(f.frame.components))]
        rows.append((first, w.offset & 0xFFFFFFFF, w.offset >> 32, w.width, w.height, w.x0, w.y0, f.orientation,
                     f.frame.width, f.frame.height, *planes, *([-1, -1] if len(planes) == 1 else []),
                     w.stride or w.width, 0, 0))
        first += w.width * w.height
    table = np.array(rows, np.int64).reshape(-1, WIN)
    return table.astype(np.int32), first
