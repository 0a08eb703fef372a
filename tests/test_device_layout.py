"""The device JPEG decoder's host layout (tables.py's Batch.pack and chunked, decoder.py's window table) gives
exactly the arrays of the per-file Python loops it replaced, kept below as the reference, on mixed batches: gray,
4:2:0, 4:4:4, 4:2:2, cjpeg's other subsamplings, restart intervals, EXIF orientations, windows cropped, offset
past 4 GiB and strided. No OpenCL."""

from __future__ import annotations

import importlib
import io

import numpy as np
import pytest
from PIL import Image

import jpeg_corpus as corpus
from vggserve.decoding.device import Window, parse, prepare
from vggserve.decoding.device.decoder import COLOR_QX, COLOR_RB, _windows, color_tiles, lay_out
from vggserve.decoding.device.tables import CHUNK, IMG, SEG, TAB, WIN, Batch, huffman_table, upsampling

PARSE = importlib.import_module("vggserve.decoding.device.parse")  # the module (the package exports parse())


# ---- the reference: the layout as the eighth session wrote it -------------------------------------------------

def reference_pack(frames, datas, restarts):
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
    return dict(data=np.frombuffer(b"".join(datas), np.uint8), seg=seg, img=np.array(imgs, np.int32).reshape(-1, IMG),
                comp=np.array(comps, np.int32).reshape(-1, 8), tab=tab, plane=np.array(planes, np.int32).reshape(-1, 12),
                quant=quant, seg_image=seg[:, 0].copy(), plane_bytes=sample, blocks=block)


def reference_chunks(seg, size):
    seg = seg.copy()
    start, end = seg[:, 1].astype(np.int64), seg[:, 2].astype(np.int64)
    count = np.maximum(1, -(-(end - start) // size))
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    seg[:, 6], seg[:, 7] = first, count
    owner = np.repeat(np.arange(len(count)), count)
    index = np.arange(int(count.sum())) - first[owner]
    lo = start[owner] + index * size
    chunk = np.zeros((owner.size, CHUNK), np.int32)
    chunk[:, 0], chunk[:, 1], chunk[:, 2] = owner, lo, np.minimum(lo + size, end[owner])
    return seg, chunk


def reference_windows(files, windows, img):
    rows, first, tile = [], 0, 0
    for i, (f, w) in enumerate(zip(files, windows)):
        uw, uh = f.size
        if w.width < 1 or w.height < 1 or w.x0 < 0 or w.y0 < 0 or w.x0 + w.width > uw or w.y0 + w.height > uh:
            raise ValueError(f"file {i}: window {w} outside its {uw}x{uh} image")
        planes = [int(img[i, 2]) + k for k in range(len(f.frame.components))]
        rows.append((first, w.offset & 0xFFFFFFFF, w.offset >> 32, w.width, w.height, w.x0, w.y0, f.orientation,
                     f.frame.width, f.frame.height, *planes, *([-1, -1] if len(planes) == 1 else []),
                     w.stride or w.width, tile, -(-w.width // (4 * COLOR_QX))))
        first += w.width * w.height
        tile += -(-w.height // COLOR_RB) * -(-w.width // (4 * COLOR_QX))
    return np.array(rows, np.int64).reshape(-1, WIN).astype(np.int32), first


# ---- the batch ---------------------------------------------------------------------------------------------

def with_orientation(data: bytes, orientation: int) -> bytes:
    image = Image.open(io.BytesIO(data))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", quality="keep", subsampling="keep", exif=exif.tobytes())
    return out.getvalue()


def mixed_files() -> list[bytes]:
    pic = corpus.picture
    files = [
        corpus.pillow_jpeg(pic(41, 27, 1), subsampling=2),                        # 4:2:0
        corpus.pillow_jpeg(pic(17, 9, 2, gray=True), quality=70),                 # gray
        corpus.pillow_jpeg(pic(33, 31, 3), subsampling=0, quality=95),            # 4:4:4
        corpus.pillow_jpeg(pic(63, 65, 4), subsampling=1),                        # 4:2:2
        corpus.pillow_jpeg(pic(45, 37, 5), subsampling=2, restart_marker_blocks=3),
        corpus.pillow_jpeg(pic(70, 50, 6), subsampling=1, restart_marker_rows=1),
        corpus.pillow_jpeg(pic(41, 27, 7, gray=True), optimize=True, restart_marker_blocks=5),
        corpus.pillow_jpeg(pic(41, 27, 1), subsampling=2),                        # the first again: its tables shared
        corpus.pillow_jpeg(pic(23, 19, 8), quality=20, subsampling=0, optimize=True),
    ]
    files += [with_orientation(corpus.pillow_jpeg(pic(13, 7, o), subsampling=2), o) for o in (3, 5, 6, 8)]
    if corpus.has_cjpeg():
        files += [data for _, data in corpus.cjpeg_corpus(True)[:24]]
    return files


@pytest.fixture(scope="module")
def prepared():
    files = [prepare(data) for data in mixed_files()]
    assert all(files), [f.reason for f in files if not f]
    assert {len(f.frame.components) for f in files} == {1, 3}
    assert any(f.frame.restart_interval for f in files) and any(f.size != (f.frame.width, f.frame.height)
                                                                 for f in files)
    return files


def windows_for(files) -> list[Window]:
    """Whole images, crops, rows with a stride, and offsets past 4 GiB (with the low word past 2 GiB)."""
    out, offset = [], 0
    for i, f in enumerate(files):
        w, h = f.size
        if i % 3 == 0:
            window = Window(offset, 0, 0, w, h)
        elif i % 3 == 1:
            window = Window(offset + (5 << 32) + (3 << 30), w // 3, h // 4, w - w // 3, max(1, h // 2))
        else:
            window = Window(offset + 7, w - 1, h - 1, 1, 1, stride=w + 9)
        out.append(window)
        offset += w * h * 3 + 1000
    return out


def pack(files) -> Batch:
    return Batch.pack([f.frame for f in files], [f.data for f in files], [f.restarts for f in files])


def assert_batch_is(batch: Batch, want: dict):
    for name, value in want.items():
        got = getattr(batch, name)
        if isinstance(value, np.ndarray):
            assert got.dtype == value.dtype and got.shape == value.shape, name
            assert np.array_equal(got, value), name
        else:
            assert got == value, name


# ---- the tests ----------------------------------------------------------------------------------------------

def test_a_mixed_batch_packs_into_the_arrays_the_per_file_loop_made(prepared):
    want = reference_pack([f.frame for f in prepared], [f.data for f in prepared], [f.restarts for f in prepared])
    assert_batch_is(pack(prepared), want)
    for start in range(0, len(prepared), 5):  # and every run of a few files, in any order
        part = prepared[start:start + 5][::-1]
        assert_batch_is(pack(part), reference_pack([f.frame for f in part], [f.data for f in part],
                                                   [f.restarts for f in part]))


def test_packing_into_given_memory_places_the_files_bytes_there(prepared):
    memory = np.full(1 << 20, 0xAB, np.uint8)
    batch = Batch.pack([f.frame for f in prepared], [f.data for f in prepared], [f.restarts for f in prepared],
                       place=lambda nbytes: memory)
    assert np.shares_memory(batch.data, memory)
    assert batch.data.tobytes() == b"".join(f.data for f in prepared)


@pytest.mark.parametrize("pair_bytes", [1, 1 << 40], ids=["over the copying threads", "in one call here"])
def test_the_files_bytes_of_every_kind_are_joined_the_same_either_way(pair_bytes, monkeypatch):
    """tables._joined: small pieces (a batch's compressed photos) in one np.concatenate on this thread, large ones
    by hostcopy.copy_many; bytes, memoryviews and uint8 arrays alike, and nothing past them touched."""
    from vggserve.decoding.device import tables
    from vggserve.runtime import hostcopy

    monkeypatch.setattr(hostcopy, "MIN_SPLIT", 1)
    monkeypatch.setattr(hostcopy, "MIN_PAIR", pair_bytes)
    rng = np.random.default_rng(1)
    raw = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 7, 66_586, 3, 1000)]
    datas = [raw[0], memoryview(raw[1]), np.frombuffer(raw[2], np.uint8), bytearray(raw[3]), raw[4]]
    memory = np.full(sum(map(len, raw)) + 16, 0xAB, np.uint8)
    joined = tables._joined(datas, sum(map(len, raw)), lambda nbytes: memory)
    assert np.shares_memory(joined, memory) and joined.tobytes() == b"".join(raw)
    assert (memory[len(joined):] == 0xAB).all()


def test_equal_tables_parsed_apart_are_stored_once(prepared, monkeypatch):
    first = prepare(prepared[0].data)
    PARSE._dht.cache_clear()
    PARSE._dqt.cache_clear()
    PARSE._select.cache_clear()
    monkeypatch.setattr(PARSE, "_heads", ())  # and the heads kept: the file is parsed again from its markers
    again = prepare(prepared[0].data)  # the same tables, new objects
    assert first.frame.huffs[0] is not again.frame.huffs[0] and first.frame.huffs[0] == again.frame.huffs[0]
    files = [first, again, prepared[1], again]
    batch = pack(files)
    assert_batch_is(batch, reference_pack([f.frame for f in files], [f.data for f in files], [None] * 4))
    # the colour file's two DC and two AC tables once (the gray file's are Pillow's standard luminance ones too),
    # its two quantisation tables and the gray file's (another quality)
    assert batch.tab.shape[0] == 4 and batch.quant.shape[0] == 3


@pytest.mark.parametrize("size", [8, 37, 128, 1 << 20])
def test_chunking_cuts_segments_as_before(prepared, size):
    batch = pack(prepared)
    want_seg, want_chunk = reference_chunks(batch.seg, size)
    batch.chunked(size)
    assert np.array_equal(batch.seg, want_seg)
    assert batch.chunk.dtype == np.int32 and np.array_equal(batch.chunk, want_chunk)


def test_chunking_cuts_empty_and_one_byte_segments_as_before():
    seg = np.zeros((5, SEG), np.int32)
    seg[:, 1], seg[:, 2] = [0, 10, 10, 11, 300], [10, 10, 11, 300, 300]
    batch = Batch(np.zeros(300, np.uint8), seg, *[np.zeros((0, 1), np.int32)] * 5, seg[:, 0], 0, 0)
    want_seg, want_chunk = reference_chunks(seg, 16)
    batch.chunked(16)
    assert np.array_equal(batch.seg, want_seg) and np.array_equal(batch.chunk, want_chunk)


def test_the_window_table_is_the_per_file_loops(prepared):
    windows = windows_for(prepared)
    batch = pack(prepared)
    table, pixels = _windows(prepared, windows, batch)
    want, want_pixels = reference_windows(prepared, windows, batch.img)
    assert table.dtype == np.int32 and np.array_equal(table, want)
    assert pixels == want_pixels and type(pixels) is int
    assert color_tiles(table) == sum(-(-w.height // COLOR_RB) * -(-w.width // (4 * COLOR_QX)) for w in windows)


def test_a_window_outside_its_image_is_refused_naming_the_file(prepared):
    windows = windows_for(prepared)
    w, h = prepared[5].size
    windows[5] = Window(0, 1, 0, w, h)
    with pytest.raises(ValueError) as caught:
        _windows(prepared, windows, pack(prepared))
    with pytest.raises(ValueError) as want:
        reference_windows(prepared, windows, pack(prepared).img)
    assert str(caught.value) == str(want.value) and str(caught.value).startswith("file 5: window Window(")


def test_a_window_per_file_is_required(prepared):
    with pytest.raises(ValueError, match="windows for .* files: give each file its window"):
        _windows(prepared, windows_for(prepared)[:-1], pack(prepared))


def test_the_meta_table_holds_every_part_back_to_back(prepared):
    windows = windows_for(prepared)
    staging = {}

    def array(role, nbytes, dtype=np.uint8):
        staging[role] = np.zeros(nbytes, np.uint8)
        return staging[role].view(dtype)

    batch, meta, at, pixels = lay_out(prepared, windows, 64, array)
    want = reference_pack([f.frame for f in prepared], [f.data for f in prepared], [f.restarts for f in prepared])
    want_seg, want_chunk = reference_chunks(want["seg"], 64)
    win, want_pixels = reference_windows(prepared, windows, want["img"])
    parts = [want_seg, want["img"], want["comp"], want["tab"], want["plane"], want["quant"], win]
    assert np.array_equal(meta, np.concatenate([p.ravel() for p in parts]))
    assert at == np.cumsum([0] + [p.size for p in parts])[:-1].tolist() and pixels == want_pixels
    assert np.array_equal(batch.chunk, want_chunk) and np.shares_memory(meta, staging["meta"])
    assert batch.data.tobytes() == b"".join(f.data for f in prepared)


def test_frames_read_as_before(prepared):
    for f in prepared:
        frame = parse(f.data)
        assert (frame.width, frame.height, frame.mcus) == (f.frame.width, f.frame.height, f.frame.mcus)
        assert frame.mcus == frame.mcus_x * frame.mcus_y
        for c in frame.components:
            assert c.blocks_w * c.blocks_h > 0 and len(c.quant) == 128


def test_a_buffer_is_prepared_as_its_bytes_and_kept_without_a_copy_of_the_file():
    """The service's engine gives prepare the encoded input's array: only its head is copied to parse the markers,
    and every answer (frame, restarts, orientation, refusal reason) is the bytes' answer."""
    from vggserve.decoding.device.decoder import HEAD_BYTES

    big = corpus.pillow_jpeg(corpus.picture(500, 375, 3), quality=90, subsampling=2)
    restarts = corpus.pillow_jpeg(corpus.picture(300, 200, 4), subsampling=2, restart_marker_blocks=3)
    long_header = big[:2] + b"\xff\xed" + (HEAD_BYTES + 2).to_bytes(2, "big") + bytes(HEAD_BYTES) + big[2:]
    cases = mixed_files() + [big, restarts, long_header, with_orientation(big, 6), big[:HEAD_BYTES + 100],
                             long_header[:HEAD_BYTES + 100], b"\xff\xd8" + bytes(HEAD_BYTES + 10), b"junk"]
    for data in cases:
        array = np.frombuffer(data, np.uint8)
        want, got = prepare(data), prepare(array)
        assert type(got) is type(want)
        if not want:
            assert got.reason == want.reason
            continue
        assert (frame_fields(got.frame), got.restarts, got.orientation) == (frame_fields(want.frame), want.restarts,
                                                                            want.orientation)
        assert bytes(got.data) == data
        if len(data) > HEAD_BYTES and want.frame.scan_start <= HEAD_BYTES and not want.frame.pillow_header:
            assert got.data is array  # else the whole file was read as bytes: a long header, EXIF
    batch = pack([prepare(np.frombuffer(d, np.uint8)) for d in (big, restarts, long_header)])
    assert_batch_is(batch, vars(pack([prepare(d) for d in (big, restarts, long_header)])))


def test_files_of_one_encoder_share_their_parsed_header_whatever_their_size():
    a = parse(corpus.pillow_jpeg(corpus.picture(41, 27, 1), subsampling=2))
    b = parse(corpus.pillow_jpeg(corpus.picture(97, 41, 2), subsampling=2))
    other = parse(corpus.pillow_jpeg(corpus.picture(41, 27, 1), subsampling=0))
    assert a.header is b.header and (a.width, b.width) == (41, 97)
    assert other.header is not a.header and other.sampling is not a.sampling


def test_a_batch_past_the_kernels_int32_offsets_is_refused_with_the_fix(prepared):
    from vggserve.decoding.device.parse import Frame

    small = prepared[0].frame
    huge = Frame(small.header, 65535, 65535, 0, small.scan_start, False)  # 100 million blocks: 6.4 G samples
    with pytest.raises(ValueError, match="too large for one decode .* decode it in smaller batches"):
        Batch.pack([small, huge], [prepared[0].data] * 2, [None, None])


def frame_fields(frame) -> tuple:
    return (frame.header, frame.width, frame.height, frame.restart_interval, frame.scan_start, frame.pillow_header,
            frame.segments)


def with_size(data: bytes, width: int, height: int) -> bytes:
    """`data` with its frame header's height and width replaced (the scan left as it is: parse never reads it)."""
    sof = data.index(b"\xff\xc0") + 5
    return data[:sof] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 4:]


def test_a_file_with_a_parsed_files_head_but_its_size_parses_from_the_kept_head_as_from_its_markers(monkeypatch):
    """parse keeps the heads it parsed (the bytes up to the scan): a file with the same bytes but the frame's height
    and width gets the same Frame as reading its markers would give, without reading them; anything else in the head
    differing, a file ending inside the head, or a zero size goes through the markers (or is refused as they would
    be)."""
    monkeypatch.setattr(PARSE, "_heads", ())
    a = corpus.pillow_jpeg(corpus.picture(41, 27, 1), subsampling=2)
    first = parse(a)
    assert PARSE._heads and PARSE._heads[0][-1] is first
    same_head = [with_size(a, 97, 41), with_size(a, 1, 65535), with_size(a, 65535, 1)]
    want = [PARSE._parse(d) for d in same_head]  # from the markers
    real = PARSE._parse
    monkeypatch.setattr(PARSE, "_parse", lambda d: pytest.fail("the markers were read again"))
    for d, w in zip(same_head, want):
        assert frame_fields(parse(d)) == frame_fields(w)
    assert parse(with_size(a, 0, 27)) == real(with_size(a, 0, 27)) == PARSE.Refusal("zero size in the frame header")
    assert parse(with_size(a, 41, 0)) == PARSE.Refusal("zero size in the frame header")
    monkeypatch.setattr(PARSE, "_parse", real)
    other_tables = corpus.pillow_jpeg(corpus.picture(41, 27, 1), subsampling=2, quality=50)
    assert parse(other_tables).header is not first.header
    assert frame_fields(parse(other_tables)) == frame_fields(real(other_tables))
    ends_in_head = a[:first.scan_start - 1]
    assert parse(ends_in_head) == real(ends_in_head) and not parse(ends_in_head)
    sof = a.index(b"\xff\xc0")
    after_sof = sof + 2 + int.from_bytes(a[sof + 2:sof + 4], "big")
    restarts = a[:after_sof] + b"\xff\xdd\x00\x04\x00\x05" + a[after_sof:]  # the same bytes up to the size
    assert parse(restarts).restart_interval == 5 and parse(a).restart_interval == 0
    assert frame_fields(parse(restarts)) == frame_fields(real(restarts))


def test_a_long_head_is_not_kept(monkeypatch):
    """Heads longer than HEAD_BYTES (a camera's EXIF) are parsed every time: they differ from file to file,
    and comparing them would cost more than the parse."""
    monkeypatch.setattr(PARSE, "_heads", ())
    a = corpus.pillow_jpeg(corpus.picture(41, 27, 1), subsampling=2)
    pad = PARSE.HEAD_BYTES
    long_head = a[:2] + b"\xff\xed" + (pad + 2).to_bytes(2, "big") + bytes(pad) + a[2:]
    assert parse(long_head).scan_start > pad and PARSE._heads == ()
    assert parse(a) and len(PARSE._heads) == 1


@pytest.mark.parametrize("seed", range(6))
def test_a_runs_verdicts_are_each_files_first_flagged_segment_or_its_idct(seed):
    """Run.ok and Run.reasons against the rule, one segment at a time: a file is bad when any of its segments or its
    IDCT has a nonzero status; its reason is the IDCT's code, else its first flagged segment's, else 0. Files of no
    segment at all, one file, and none flagged."""
    from types import SimpleNamespace

    from vggserve.decoding.device.decoder import Run

    rng = np.random.default_rng(seed)
    files = int(rng.integers(1, 9))
    seg_image = np.sort(rng.integers(0, files, int(rng.integers(0, 40)))).astype(np.int32)
    nseg = seg_image.size
    status = np.zeros(nseg + files, np.int32)
    if seed:  # seed 0: nothing flagged
        flagged = rng.random(status.size) < 0.2
        status[flagged] = rng.integers(1, 9, int(flagged.sum()))
    batch = SimpleNamespace(seg=np.zeros((nseg, SEG), np.int32), img=np.zeros((files, IMG), np.int32),
                            seg_image=seg_image)
    run = Run(batch, status, None, None, None, np.zeros(nseg, np.int32), _kept=True)
    want_reasons = status[nseg:].tolist()
    for image, code in zip(seg_image.tolist(), status[:nseg].tolist()):
        if code and not want_reasons[image]:
            want_reasons[image] = code
    assert run.reasons() == want_reasons
    assert run.ok() == [code == 0 for code in want_reasons]
