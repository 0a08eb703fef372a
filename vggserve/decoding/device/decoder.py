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
import threading
from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl
from PIL import Image

from ...images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS, _accepted_formats, exif_orientation, open_checked
from ...ops.launch import round_up
from .exif import pillow_view
from .parse import HEAD_BYTES, Frame, Refusal, parse
from .staging import Grown, StagingRing, pinned_arena
from .tables import TAB, WIN, Batch, find_restarts

PROGRAMS = ("jpeg_huffman.cl", "jpeg_idct.cl", "jpeg_color.cl", "jpeg_entropy.cl")
# bytes of scan per work-item in the parallel entropy decoding. With round 0 guessing each chunk's entry at its own
# first byte (LOOKBACK_CHUNKS 0), 192-byte chunks settled 500x375 photos by round 8 and the photo mix by round 11 on
# an H100, with the least device time of 96 to 192 bytes and lookbacks of 0 to 256 (BENCHMARKS.md, 21st session)
CHUNK_BYTES = 192
# a long scan's chunks: a 12 MP photo's segment settles in fewer rounds with larger chunks (the photo mix's rounds
# took 3.6 ms per batch in 192-byte chunks and 2.7 in 384-byte ones; BENCHMARKS.md, 21st session), a 76 KB photo's
# in 192-byte ones. Segments of LONG_SEGMENT_BYTES or more are cut into LONG_CHUNK_BYTES.
LONG_CHUNK_BYTES = 384
LONG_SEGMENT_BYTES = 256 << 10
ROUNDS = 20  # its synchronisation rounds; a segment not settled by then is decoded serially
LOOKBACK_CHUNKS = 0  # round 0 guesses a chunk's entry by decoding from this many chunks before it
MULTI = True  # the rounds' multi-symbol tables by default (benchmarks/device_decode.py --one-symbol turns them off)
# jpeg_entropy.cl's JE_CKPTS: the states a chunk's decode records on its way (at block starts past each quarter of
# it), from which the decoding pass decodes its quarters in parallel (a work-item each)
CHECKPOINTS = 3
# a chunk decoding again from a new entry stops at the first checkpoint where it meets its last decode's state, and
# takes that decode's exit (False: every such chunk decodes whole, as before; benchmarks/device_decode.py --no-resume)
RESUME = True
# a synchronisation round after one that moved no chunk's state returns at once (False: every round checks every
# chunk, as before; the same states; benchmarks/device_decode.py --no-skip-quiet). Packing the chunks that decode
# again at the front of the grid was measured too, and taken back: slower (BENCHMARKS.md, 34th session)
SKIP_QUIET = True
MULTI_BITS = 14  # jpeg_entropy.cl's JE_MULTI: index bits of a Huffman table's multi-symbol table
MULTI_ENTRIES = 1 << MULTI_BITS  # its entries (uint16)
CHECKPOINT_INTS = 6  # jpeg_entropy.cl's JE_CK: ints per checkpoint
PREFIX_WG = 256  # jpeg_entropy.cl's JE_SCAN: chunks per work-group of the prefix sums
IDCT_WG = 64  # jpeg_idct's work-group (JI_WG): 8 work-items per block, so 8 blocks
COLOR_QX, COLOR_RB = 16, 4  # jpeg_color_quad's work-group: quads (4 pixels) along a row x rows (JC_QX, JC_RB)
KERNELS = ("quad", "item")  # the colour kernel's variants: 4 pixels per work-item (default), one (the first version)
SWAPS = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_DEFAULT_ACCEPTED = _accepted_formats(ALLOWED_FORMATS)
# the kernels' arguments, None for a buffer and int32 for a `const int`: declared, pyopencl packs the ints itself
# (1.3 us for all of jpeg_sync's; undeclared, each numpy scalar cost about 9 us of host time on the way in)
_I = np.int32
_HUFFMAN = (None, None, _I, _I, _I, _I, None, None, _I, None)
_IDCT = (None, None, _I, _I, None, None, _I, _I, _I)
_COLOR = (None, None, _I, _I, None, _I, _I)
_COLOR_QUAD = (None, None, _I, _I, None, _I)
_SYNC = (None, None, _I, _I, _I, _I, None, _I, None, None, None, None, _I, _I, _I, None, _I, None, _I, _I, None)
_MULTI = (None, _I, _I, None)
_PREFIX = ((None, _I, None, None), (None, _I), (None, _I, None, _I, None, None, None))  # groups, totals, entry
_DECODE = (None, None, _I, _I, _I, _I, None, _I, None, None, None, None, None, None)


@dataclass(frozen=True)
class Prepared:
    """A file the device decoder takes: its bytes (or the contiguous uint8 buffer `prepare` was given: the service's
    encoded input), frame, restart markers and EXIF orientation."""

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
    EXIF orientation come out as the CPU path's; a file with EXIF, XMP, MPF or ICC segments has them read as
    Pillow reads them (exif.py), or by Pillow itself where that reading is not certain of Pillow's answer.

    `data` may be any contiguous uint8 buffer (a numpy array, a memoryview): its markers are then parsed from a
    copy of its first HEAD_BYTES alone, or from a bytes copy of the whole file where it has APP1/APP2 segments or is
    refused (the same Frame, reasons and orientation as from bytes). The Prepared keeps `data` as it was given,
    not a copy (the batch job's files stay where they were read: `Batch.pack`'s `staged`)."""
    given = data
    if type(data) is bytes:
        frame = parse(data)
    else:
        frame = parse(bytes(data[:HEAD_BYTES])) if len(data) > HEAD_BYTES else None
        if not frame or frame.pillow_header:  # a frame found in the head is the whole file's: parse reads no further
            data = bytes(data)
            frame = parse(data)
    if not frame:
        return frame
    if frame.pillow_header:
        orientation = _taken_without_pillow(data, frame, max_pixels, formats)
        if orientation is None:
            try:
                with open_checked(io.BytesIO(data), "input", max_pixels, formats) as image:
                    orientation = exif_orientation(image)
            except Exception as exc:  # the CPU path raises this again, as its own error
                return Refusal(f"header refused: {exc}")
    else:
        if formats is not ALLOWED_FORMATS and "JPEG" not in _accepted_formats(formats):
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
    return Prepared(given, frame, restarts, orientation if 1 <= orientation <= 8 else 1)


def _taken_without_pillow(data: bytes, frame: Frame, max_pixels: int, formats) -> int | None:
    """The EXIF orientation, where exif.py is certain that Pillow opens `data` as a format of `formats` and that
    the pixel limits take its size (as open_checked); None leaves the file to Pillow (its refusals included, which
    keeps their messages)."""
    seen = pillow_view(data, frame.segments)
    if seen is None:
        return None
    pixels = frame.width * frame.height
    try:
        accepted = _DEFAULT_ACCEPTED if formats is ALLOWED_FORMATS else _accepted_formats(formats)
        taken = seen[0] in accepted and pixels <= max_pixels and pixels <= (Image.MAX_IMAGE_PIXELS or pixels)
    except Exception:  # bad formats or limit: open_checked raises, and prepare returns that as the refusal
        return None
    return seen[1] if taken else None


@dataclass
class Run:
    """One enqueued batch: `ok()` waits for the statuses and says, per file, whether its pixels are exact."""

    batch: Batch
    status: np.ndarray  # mapped from the staging slot's own buffer (without blocking), then copied here by keep()
    read: object  # the statuses' read event
    done: object  # the colour kernel's event (its output is complete)
    queue: object  # the queue the statuses are mapped on
    parallel: np.ndarray  # per segment, 1 where jpeg_entropy.cl decoded it, 0 where jpeg_huffman.cl did
    _kept: bool = False
    _keeping: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def keep(self) -> None:
        """Wait for the statuses, copy them out of the staging slot's mapped buffers and unmap those (before the slot
        serves another batch). Once, whichever thread asks first: the caller waiting for its batch, or a later
        batch's `enqueue` taking the slot again."""
        with self._keeping:
            if not self._kept:
                self.read.wait()
                mapped = (self.status, self.parallel)
                self.status, self.parallel, self._kept = self.status.copy(), self.parallel.copy(), True
                for array in mapped:
                    array.base.release(self.queue)

    def segments_in_parallel(self) -> int:
        self.keep()
        return int(self.parallel.sum())

    def ok(self) -> list[bool]:
        self.keep()
        nseg = self.batch.seg.shape[0]
        bad = np.zeros(self.batch.img.shape[0], bool)
        np.logical_or.at(bad, self.batch.seg_image, self.status[:nseg] != 0)
        bad |= self.status[nseg:] != 0
        return (~bad).tolist()

    def reasons(self) -> list[int]:
        """Per file, the first nonzero status code of its segments or its IDCT (kernels' JH_*, JI_*), 0 if none."""
        self.keep()
        nseg = self.batch.seg.shape[0]
        out = self.status[nseg:].tolist()
        for image, code in zip(self.batch.seg_image.tolist(), self.status[:nseg].tolist()):
            if code and not out[image]:
                out[image] = code
        return out


class JpegDecoder:
    """The three decoding kernels of one OpenCL context and device, with their scratch buffers."""

    def __init__(self, context, device, cache=None, wg: int = 64, chunk_bytes: int = CHUNK_BYTES,
                 long_chunk_bytes: int | None = None,
                 rounds: int = ROUNDS, lookback: int | None = None, kernels: str = "quad",
                 multi: bool | None = None, checkpoints: int = CHECKPOINTS, resume: bool | None = None,
                 skip_quiet: bool | None = None):
        """chunk_bytes, rounds: the parallel entropy decoding's chunk size and synchronisation rounds; rounds=0
        decodes every segment with one work-item (jpeg_huffman.cl alone). long_chunk_bytes: the chunks of segments of
        LONG_SEGMENT_BYTES or more (None: LONG_CHUNK_BYTES with the default chunk_bytes, chunk_bytes with another;
        0: chunk_bytes). lookback: the bytes before its chunk
        from which round 0 decodes to guess the chunk's entry (default LOOKBACK_CHUNKS chunks). kernels: which
        variant of jpeg_color.cl runs (KERNELS: the same bytes; benchmarks/device_decode.py --variants compares).
        multi: the rounds take plain AC symbols several at a time (jpeg_multi's tables); False: one at a time (the
        same exits, slower: kept to measure the difference); None: MULTI. checkpoints: the states each chunk's
        decode records, where the decoding pass splits the chunk into checkpoints + 1 parts (0: whole chunks).
        resume: a chunk decoding again stops where it meets its last decode at a checkpoint (the same exits; None:
        RESUME). skip_quiet: a round after one that moved no state returns at once (the same exits; None:
        SKIP_QUIET)."""
        from ...runtime.programs import ProgramCache

        if kernels not in KERNELS:
            raise ValueError(f"decoder kernels {kernels!r} is not one of {', '.join(KERNELS)}")
        if long_chunk_bytes is None:
            long_chunk_bytes = LONG_CHUNK_BYTES if chunk_bytes == CHUNK_BYTES else chunk_bytes
        long_chunk_bytes = long_chunk_bytes or chunk_bytes
        if rounds == 1 or rounds < 0 or min(chunk_bytes, long_chunk_bytes) < 8:
            raise ValueError(f"rounds must be 0 or at least 2 (a settled segment is one whose last round changed "
                             f"nothing), chunk_bytes at least 8; got {rounds}, {chunk_bytes}, {long_chunk_bytes}")
        self.long_chunk_bytes = long_chunk_bytes
        cache = cache or ProgramCache(context, device)
        self.context, self.wg, self.chunk_bytes, self.rounds = context, wg, chunk_bytes, rounds
        self.multi = MULTI if multi is None else bool(multi)
        self.resume = RESUME if resume is None else bool(resume)
        self.skip_quiet = SKIP_QUIET if skip_quiet is None else bool(skip_quiet)
        if not 0 <= checkpoints <= 15:
            raise ValueError(f"checkpoints must be 0 to 15, got {checkpoints}")
        self.checkpoints = checkpoints
        self.lookback = LOOKBACK_CHUNKS * chunk_bytes if lookback is None else lookback
        if self.lookback < 0:
            raise ValueError(f"lookback must be 0 or more bytes, got {lookback}")
        colour = {"JC_QX": COLOR_QX, "JC_RB": COLOR_RB}
        defines = {"jpeg_idct.cl": {"JI_WG": IDCT_WG}, "jpeg_color.cl": colour,
                   "jpeg_entropy.cl": {"JE_CKPTS": checkpoints, "JE_MULTI": MULTI_BITS}}
        programs = [cache.build(name, defines.get(name, {})) for name in PROGRAMS]
        self.kernels = kernels
        self.k_huffman = cl.Kernel(programs[0], "jpeg_huffman")
        self.k_idct = cl.Kernel(programs[1], "jpeg_idct")
        self.k_color = cl.Kernel(programs[2], "jpeg_color" if kernels == "item" else "jpeg_color_quad")
        self.k_sync = cl.Kernel(programs[3], "jpeg_sync")
        self.k_multi = cl.Kernel(programs[3], "jpeg_multi")
        self.k_prefix = [cl.Kernel(programs[3], name)
                         for name in ("jpeg_prefix_groups", "jpeg_prefix_totals", "jpeg_prefix_entry")]
        self.k_decode = cl.Kernel(programs[3], "jpeg_decode")
        for kernel, scalars in ((self.k_huffman, _HUFFMAN), (self.k_idct, _IDCT),
                                (self.k_color, _COLOR if kernels == "item" else _COLOR_QUAD),
                                (self.k_sync, _SYNC), (self.k_multi, _MULTI), *zip(self.k_prefix, _PREFIX),
                                (self.k_decode, _DECODE)):
            kernel.set_scalar_arg_dtypes(scalars)
        mf = cl.mem_flags
        self._data = Grown(context, mf.READ_ONLY)
        self._meta = Grown(context, mf.READ_ONLY)
        self._coef = Grown(context, mf.READ_WRITE)
        self._samples = Grown(context, mf.READ_WRITE)
        self._chunks = Grown(context, mf.READ_ONLY)
        self._states = [Grown(context, mf.READ_WRITE) for _ in range(2)]  # a round's exits, and the round's before
        self._used = Grown(context, mf.READ_WRITE)  # the entry each chunk's last decode started from
        self._multi = Grown(context, mf.READ_WRITE)  # jpeg_multi's tables, per Huffman table of the batch
        self._ckpt = Grown(context, mf.READ_WRITE)  # each chunk's checkpoints, where the decoding pass splits it
        self._changed = Grown(context, mf.READ_WRITE)  # per round, whether it moved any chunk's state (jpeg_sync)
        self.events: dict = {}  # the last batch's kernel events by stage (benchmarks/device_decode.py times them)
        self._entry = Grown(context, mf.READ_WRITE)
        self._part = Grown(context, mf.READ_WRITE)  # the prefix sums' scratch: within work-groups, their totals
        self._sums = Grown(context, mf.READ_WRITE)
        self._staging = StagingRing(context)  # pinned host memory the uploads read, a slot per batch in flight
        self._arenas = threading.local()  # each thread's pinned FileArena (file_arena)

    def file_arena(self):
        """The calling thread's FileArena of pinned memory of this decoder's context (`staging.pinned_arena`):
        files read into it are uploaded from where they lie (`enqueue`'s `staged`)."""
        arena = getattr(self._arenas, "arena", None)
        if arena is None:
            arena = self._arenas.arena = pinned_arena(self.context)
        return arena

    def enqueue(self, queue, files: list[Prepared], windows: list[Window], out, wait_for=None, staged=None) -> Run:
        """Decode `files` into `out` (a device buffer) at their `windows`: upload, entropy decoding, IDCT, upsampling
        and colour, one launch each; the statuses are read back without blocking (Run.ok waits for them).
        `staged`: where the files' bytes may already lie in pinned memory (a FileArena of `pinned_arena`'s: its
        `buffer`, and its `reads`, to which the upload's event goes when it reads from there)."""
        if not files:
            raise ValueError("a device decode needs at least one file")
        slot = self._staging.next()
        self.events = {}
        chunking = (self.chunk_bytes, self.long_chunk_bytes) if self.rounds else 0
        batch, meta, at, pixels = lay_out(files, windows, chunking,
                                          lambda role, nbytes, dtype=np.uint8: slot.array(queue, role, nbytes, dtype),
                                          None if staged is None else staged.buffer)
        nseg, nimg, nplanes = batch.seg.shape[0], batch.img.shape[0], batch.plane.shape[0]
        data_buf = self._data.get(batch.data.nbytes + 16)
        meta_buf = self._meta.get(meta.nbytes)
        coef_buf = self._coef.get(batch.blocks * 128)
        samples_buf = self._samples.get(batch.plane_bytes)
        status_buf = slot.device("status", 4 * (nseg + nimg))  # mapped for reading once the batch is done
        # one in-order queue: each command follows the one before, so no event lists are passed between them
        slot.reads = [cl.enqueue_copy(queue, data_buf, batch.data, is_blocking=False, wait_for=wait_for),
                      cl.enqueue_copy(queue, meta_buf, meta, is_blocking=False, wait_for=wait_for)]
        if batch.staged:  # the files' bytes uploaded from the arena they were read into: its next read waits
            staged.reads.append(slot.reads[0])
        cl.enqueue_fill_buffer(queue, status_buf, np.int32(0), 0, 4 * (nseg + nimg))
        settled = slot.device("settled", 4 * nseg)
        cl.enqueue_fill_buffer(queue, settled, np.int32(1 if self.rounds else 0), 0, 4 * nseg)
        if self.rounds:
            self._parallel(queue, batch, at, data_buf, meta_buf, coef_buf, status_buf, settled, slot)
        self._launch("serial", queue, self.k_huffman, nseg, data_buf, meta_buf, *at[:4], coef_buf, status_buf, nseg,
                     settled)
        self._enqueue("idct", queue, self.k_idct, idct_grid(batch.blocks), (IDCT_WG,), coef_buf, meta_buf, at[4],
                      at[5], samples_buf, status_buf, nseg, nplanes, batch.blocks)
        done = self._colour(queue, samples_buf, meta_buf, at, meta[at[6]:].reshape(-1, WIN), out, pixels)
        # the statuses come back through non-blocking maps of the slot's own buffers (a read into host memory made
        # the NVIDIA driver wait for the batch on the host)
        status, _ = cl.enqueue_map_buffer(queue, status_buf, cl.map_flags.READ, 0, (nseg + nimg,), np.int32,
                                          is_blocking=False)
        parallel, read = cl.enqueue_map_buffer(queue, settled, cl.map_flags.READ, 0, (nseg,), np.int32,
                                               is_blocking=False)
        queue.flush()
        slot.run = Run(batch, status, read, done, queue, parallel)
        return slot.run

    def _parallel(self, queue, batch, at, data_buf, meta_buf, coef_buf, status_buf, settled, slot) -> None:
        """jpeg_entropy.cl: zeroed coefficients, the synchronisation rounds, the prefix sums, the decode."""
        wg = self.wg
        chunk = slot.put(queue, "chunk", batch.chunk)
        n = chunk.shape[0]
        chunk_buf = self._chunks.get(chunk.nbytes)
        states = [g.get(n * 8 * 4) for g in self._states]
        used = self._used.get(n * 4 * 4)
        ckpt = self._ckpt.get(n * max(1, self.checkpoints) * CHECKPOINT_INTS * 4)
        entry = self._entry.get(n * 4 * 4)
        slot.reads.append(cl.enqueue_copy(queue, chunk_buf, chunk, is_blocking=False))
        cl.enqueue_fill_buffer(queue, coef_buf, np.int16(0), 0, batch.blocks * 128)
        tables = at[:4]
        ntab = batch.tab.size // TAB
        multi = self._multi.get(2 * MULTI_ENTRIES * max(1, ntab))
        if self.multi:
            self._launch("multi", queue, self.k_multi, ntab * MULTI_ENTRIES, meta_buf, at[3], ntab, multi)
        grid = (round_up(n, wg),)
        # the rounds differ in three arguments; with the scalars declared, setting all of them (1.3 us) costs less
        # than setting one int through Kernel.set_arg, and pyopencl's call path costs more than a direct launch
        k, sync = self.k_sync, self.events.setdefault("sync", [])
        changed = self._changed.get(4 * self.rounds)
        cl.enqueue_fill_buffer(queue, changed, np.int32(0), 0, 4 * self.rounds)
        for r in range(self.rounds):
            k.set_args(data_buf, meta_buf, *tables, chunk_buf, n, states[(r + 1) % 2], states[r % 2], used, settled,
                       r, self.rounds - 1, self.lookback, multi, int(self.multi), ckpt, int(self.resume),
                       int(self.skip_quiet), changed)
            sync.append(cl.enqueue_nd_range_kernel(queue, k, grid, (wg,)))
        last = states[(self.rounds - 1) % 2]
        self._prefix(queue, n, meta_buf, at[0], chunk_buf, last, entry)
        self._launch("decode", queue, self.k_decode, n * (self.checkpoints + 1), data_buf, meta_buf, *tables,
                     chunk_buf, n, last, entry, settled, ckpt, coef_buf, status_buf)

    def _prefix(self, queue, n: int, meta_buf, seg_at: int, chunk_buf, last, entry) -> None:
        """jpeg_prefix_*: each chunk's entry from the chunks before it in its segment (three launches)."""
        groups = -(-n // PREFIX_WG)
        part, sums = self._part.get(n * 16), self._sums.get(groups * 16)
        k_groups, k_totals, k_entry = self.k_prefix
        self._enqueue("prefix", queue, k_groups, (groups * PREFIX_WG,), (PREFIX_WG,), last, n, part, sums)
        self._enqueue("prefix", queue, k_totals, (PREFIX_WG,), (PREFIX_WG,), sums, groups)
        self._launch("prefix", queue, k_entry, n, meta_buf, seg_at, chunk_buf, n, part, sums, entry)

    def _colour(self, queue, samples_buf, meta_buf, at, win, out, pixels: int):
        """jpeg_color.cl, the variant of `kernels`: quad over the windows' tiles, item over their pixels."""
        if self.kernels == "item":
            return self._launch("colour", queue, self.k_color, pixels, samples_buf, meta_buf, at[4], at[6], out,
                                win.shape[0], pixels)
        return self._enqueue("colour", queue, self.k_color, (color_tiles(win) * COLOR_QX, COLOR_RB),
                             (COLOR_QX, COLOR_RB), samples_buf, meta_buf, at[4], at[6], out, win.shape[0])

    def _launch(self, name: str, queue, kernel, items: int, *args):
        """One launch of `items` work-items (rounded up to whole work-groups of `wg`), noted in `events`."""
        return self._enqueue(name, queue, kernel, (round_up(items, self.wg),), (self.wg,), *args)

    def _enqueue(self, name: str, queue, kernel, grid: tuple, local: tuple, *args):
        """One launch of `kernel` with `args` over `grid` in work-groups of `local`, noted in `events`."""
        kernel.set_args(*args)
        event = cl.enqueue_nd_range_kernel(queue, kernel, grid, local)
        self.events.setdefault(name, []).append(event)
        return event


def idct_grid(blocks: int) -> tuple:
    """jpeg_idct's grid for `blocks` blocks: 8 work-items each, in whole work-groups of IDCT_WG."""
    return (round_up(8 * blocks, IDCT_WG),)


def lay_out(files: list[Prepared], windows: list[Window], chunk_bytes, array, staged=None) -> tuple:
    """The host's layout of a batch: (Batch, its meta table, where each part of the meta starts, pixels). The
    parts are seg, img, comp, tab, plane, quant and the window table, back to back. `chunk_bytes`: the chunks'
    bytes, or (bytes, bytes of a segment of LONG_SEGMENT_BYTES or more); 0 leaves the segments unchunked.
    `array(role, nbytes, dtype=uint8)`: staging memory ("data", "meta") to write them into; `staged`: a uint8
    array the files may already lie in (Batch.pack)."""
    batch = Batch.pack([f.frame for f in files], [f.data for f in files], [f.restarts for f in files],
                       place=lambda nbytes: array("data", nbytes + 16), staged=staged)
    if chunk_bytes:
        size, long_size = chunk_bytes if isinstance(chunk_bytes, tuple) else (chunk_bytes, chunk_bytes)
        batch.chunked(size, long_size, LONG_SEGMENT_BYTES)
    win, pixels = _windows(files, windows, batch)
    parts = [batch.seg, batch.img, batch.comp, batch.tab, batch.plane, batch.quant, win]
    sizes = [p.size for p in parts]
    at = [0]
    for size in sizes[:-1]:
        at.append(at[-1] + size)
    meta = array("meta", 4 * (at[-1] + sizes[-1]), np.int32)
    for p, a, size in zip(parts, at, sizes):
        meta[a:a + size] = p.reshape(-1)
    return batch, meta, at, pixels


def color_tiles(win: np.ndarray) -> int:
    """jpeg_color_quad's work-groups for a window table: the last window's first tile and its own."""
    last = win[-1]
    return int(last[14]) + -(-int(last[4]) // COLOR_RB) * int(last[15])


def _windows(files: list[Prepared], windows: list[Window], batch: Batch) -> tuple[np.ndarray, int]:
    """jpeg_color.cl's window table and the pixels it covers."""
    n = len(files)
    if len(windows) != n:
        raise ValueError(f"{len(windows)} windows for {n} files: give each file its window")
    w = np.array([(v.offset, v.x0, v.y0, v.width, v.height, v.stride) for v in windows], np.int64).reshape(n, 6)
    orientation = np.array([f.orientation for f in files], np.int64)
    size = batch.size if batch.size is not None else np.array([(f.frame.width, f.frame.height) for f in files],
                                                              np.int64).reshape(n, 2)
    swap = (orientation >= SWAPS[0]) & (orientation <= SWAPS[-1])
    upright = np.where(swap[:, None], size[:, ::-1], size)
    corner, extent = w[:, 1:3], w[:, 3:5]
    bad = ((extent < 1) | (corner < 0) | (corner + extent > upright)).any(axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"file {i}: window {windows[i]} outside its {upright[i, 0]}x{upright[i, 1]} image")
    area = extent[:, 0] * extent[:, 1]
    plane0 = batch.img[:, 2]
    colour = batch.img[:, 1] == 3
    table = np.zeros((n, WIN), np.int32)  # int64 values wrap to int32 as the kernel reads them
    table[:, 0] = np.cumsum(area) - area
    table[:, 1], table[:, 2] = w[:, 0] & 0xFFFFFFFF, w[:, 0] >> 32
    table[:, 3:5], table[:, 5:7] = extent, corner
    table[:, 7], table[:, 8:10] = orientation, size
    table[:, 10] = plane0
    table[:, 11:13] = np.where(colour[:, None], plane0[:, None] + [1, 2], -1)
    table[:, 13] = np.where(w[:, 5] != 0, w[:, 5], extent[:, 0])
    across = -(-extent[:, 0] // (4 * COLOR_QX))
    tiles = -(-extent[:, 1] // COLOR_RB) * across
    table[:, 14], table[:, 15] = np.cumsum(tiles) - tiles, across
    return table, int(area.sum())
