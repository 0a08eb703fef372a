"""The device JPEG decoder (vggserve.decoding.device) against Pillow, bit for bit: a generated corpus at every
subsampling, quality, table kind and awkward size; the CPU fallback for what it does not take; hostile streams
giving the CPU path's pixels or error; the IDCT kernel against a numpy ISLOW; the Huffman lookup tables.

Runs on the OpenCL device `VGGSERVE_TEST_DEVICE` picks (PoCL in CI)."""

from __future__ import annotations

import gc
import io

import numpy as np
import pyopencl as cl
import pytest
from PIL import Image

import jpeg_corpus as corpus
from vggserve.decoding import decode_on_device, decode_pixels
from vggserve.decoding.device import CPU, DEVICE, parse, prepare
from vggserve.decoding.device.tables import huffman_table
from vggserve.errors import ImageError


@pytest.fixture(scope="module")
def device(test_device):
    return test_device


def cpu_answer(data: bytes):
    try:
        return np.asarray(decode_pixels(data))
    except ImageError as exc:
        return exc


def assert_same(result, data: bytes, name: str = ""):
    want = cpu_answer(data)
    if isinstance(want, Exception):
        assert isinstance(result, ImageError), f"{name}: the CPU path raises {want!r}, the device gave pixels"
        assert (type(result), str(result)) == (type(want), str(want)), name
    else:
        assert isinstance(result, np.ndarray), f"{name}: {result!r}"
        assert result.dtype == np.uint8 and result.shape == want.shape, name
        assert np.array_equal(result, want), f"{name}: {int((result != want).sum())} values differ"


def test_every_pillow_jpeg_of_the_corpus_decodes_on_the_device_as_pillow(device):
    files = corpus.pillow_corpus()
    result = decode_on_device([d for _, d in files], device)
    for (name, data), got, path in zip(files, result, result.paths):
        assert path == DEVICE, f"{name}: {result.reasons[files.index((name, data))]}"
        assert_same(got, data, name)


@pytest.mark.skipif(not corpus.has_cjpeg(), reason="needs cjpeg (apt install libjpeg-turbo-progs: install.sh does)")
def test_cjpeg_subsamplings_and_restart_intervals_decode_on_the_device_as_pillow(device):
    files = corpus.cjpeg_corpus(device=True)
    assert len(files) >= 40
    result = decode_on_device([d for _, d in files], device)
    for i, (name, data) in enumerate(files):
        assert result.paths[i] == DEVICE, f"{name}: {result.reasons[i]}"
        assert_same(result[i], data, name)


@pytest.mark.skipif(not corpus.has_cjpeg(), reason="needs cjpeg (apt install libjpeg-turbo-progs: install.sh does)")
def test_arithmetic_and_progressive_files_fall_back_to_the_cpu_with_its_pixels(device):
    files = corpus.cjpeg_corpus(device=False)
    result = decode_on_device([d for _, d in files], device)
    for i, (name, data) in enumerate(files):
        assert result.paths[i] == CPU and result.reasons[i], name
        assert_same(result[i], data, name)


def test_other_formats_and_undecodable_inputs_take_the_cpu_path_with_its_errors(device):
    pixels = corpus.picture(30, 20)
    png, cmyk = io.BytesIO(), io.BytesIO()
    Image.fromarray(pixels).save(png, "PNG")
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG")
    inputs = [png.getvalue(), cmyk.getvalue(), b"", b"\xff\xd8\xff", b"GIF89a nonsense",
              corpus.pillow_jpeg(pixels, progressive=True)]
    result = decode_on_device(inputs, device)
    assert result.paths == [CPU] * len(inputs)
    for data, got in zip(inputs, result):
        assert_same(got, data)


def test_one_batch_mixes_sizes_kinds_and_fallbacks_in_input_order(device):
    files = [corpus.pillow_jpeg(corpus.picture(w, h, w), subsampling=s) for w, h, s in
             [(5, 300, 2), (301, 7, 1), (64, 64, 0)]]
    inputs = [files[0], b"junk", files[1], corpus.pillow_jpeg(corpus.picture(9, 9), progressive=True), files[2]]
    result = decode_on_device(inputs, device)
    assert result.paths == [DEVICE, CPU, DEVICE, CPU, DEVICE]
    for data, got in zip(inputs, result):
        assert_same(got, data)


def with_exif_orientation(data: bytes, orientation: int) -> bytes:
    image = Image.open(io.BytesIO(data))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", quality="keep", subsampling="keep", exif=exif.tobytes())
    return out.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_turns_the_image_as_the_cpu_path_does(device, orientation):
    data = with_exif_orientation(corpus.pillow_jpeg(corpus.picture(13, 7, 2), subsampling=2), orientation)
    result = decode_on_device([data], device)
    assert result.paths == [DEVICE], result.reasons
    assert_same(result[0], data, f"orientation {orientation}")


def test_the_pixel_limit_and_the_format_allowlist_apply_as_on_the_cpu(device):
    data = corpus.pillow_jpeg(corpus.picture(40, 30))
    for limits in (dict(max_pixels=1000), dict(formats=("PNG",))):
        result = decode_on_device([data], device, **limits)
        assert result.paths == [CPU]
        with pytest.raises(ImageError) as info:
            decode_pixels(data, **limits)
        assert isinstance(result[0], ImageError) and str(result[0]) == str(info.value)


# ---- hostile streams: the CPU path's pixels or error, never a crash or a hang ---------------------------------

def _segment(data: bytes, marker: int) -> int:
    """Offset of the first segment with this marker."""
    at = data.find(bytes([0xFF, marker]))
    assert at > 0
    return at


def hostile_inputs() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(3)
    good = corpus.pillow_jpeg(corpus.picture(48, 40, 1), quality=90, subsampling=2)
    restart = corpus.pillow_jpeg(corpus.picture(48, 40, 1), subsampling=2, restart_marker_blocks=2)
    start = parse(good).scan_start
    out = []
    for cut in (start - 3, start + 1, start + 50, len(good) // 2, len(good) - 40, len(good) - 3, len(good) - 2):
        out.append((f"truncated at {cut}", good[:cut]))
    for k in range(24):
        flipped = bytearray(good)
        at = int(rng.integers(start, len(good) - 2))
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        out.append((f"bit flipped at {at}", bytes(flipped)))
    for k in range(8):
        flipped = bytearray(restart)
        at = int(rng.integers(parse(restart).scan_start, len(restart) - 2))
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        out.append((f"restart file, bit flipped at {at}", bytes(flipped)))
    dht = _segment(good, 0xC4)
    wrong = bytearray(good)
    wrong[dht + 5 + 3], wrong[dht + 5 + 4] = wrong[dht + 5 + 4], wrong[dht + 5 + 3]  # two code-length counts swapped
    out.append(("Huffman counts swapped", bytes(wrong)))
    incomplete = bytearray(good)
    incomplete[dht + 5 + 2] = 0  # a DC table with fewer codes than its symbols need: codes go missing
    out.append(("Huffman table incomplete", bytes(incomplete)))
    oversubscribed = bytearray(good)
    oversubscribed[dht + 5] = 3  # three codes of one bit
    out.append(("Huffman table oversubscribed", bytes(oversubscribed)))
    sof = _segment(good, 0xC0)
    for name, height in (("taller", 80), ("shorter", 20), ("one row", 1)):
        changed = bytearray(good)
        changed[sof + 5:sof + 7] = height.to_bytes(2, "big")
        out.append((f"header {name} than the data", bytes(changed)))
    wider = bytearray(good)
    wider[sof + 7:sof + 9] = (4000).to_bytes(2, "big")
    out.append(("header wider than the data", bytes(wider)))
    endless = good[:start] + b"\xff\x00" * 200 + b"\xff\xd9"
    out.append(("a stream that never completes a block", endless))
    zeros = good[:start] + b"\x00" * 5000 + b"\xff\xd9"
    out.append(("zeros for data", zeros))
    out.append(("no EOI", good[:-2]))
    out.append(("junk after the scan", good[:-2] + b"\x12\x34" + good[-2:]))
    out.append(("restart markers removed", restart.replace(b"\xff\xd0", b"").replace(b"\xff\xd1", b"")))
    rst = bytearray(restart)
    at = bytes(rst).find(b"\xff\xd1")
    rst[at + 1] = 0xD5
    out.append(("restart marker out of order", bytes(rst)))
    return out


def test_hostile_streams_give_the_cpu_paths_pixels_or_error(device):
    inputs = hostile_inputs()
    result = decode_on_device([d for _, d in inputs], device)
    for i, (name, data) in enumerate(inputs):
        assert_same(result[i], data, name)
    # most of them the device decoder itself must refuse or flag
    assert result.paths.count(CPU) >= len(inputs) // 2


# ---- the stages against numpy --------------------------------------------------------------------------------

def islow_numpy(coef: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """jidctint.c's ISLOW for (n, 64) int16 natural-order coefficients -> (n, 8, 8) uint8, in int64 numpy."""
    c = {k: v for k, v in dict(f0298=2446, f0390=3196, f0541=4433, f0765=6270, f0899=7373, f1175=9633, f1501=12299,
                                 f1847=15137, f1961=16069, f2053=16819, f2562=20995, f3072=25172).items()}

    def one_d(i):  # i: list of 8 arrays
        z1 = (i[2] + i[6]) * c["f0541"]
        t2, t3 = z1 - i[6] * c["f1847"], z1 + i[2] * c["f0765"]
        t0, t1 = (i[0] + i[4]) << 13, (i[0] - i[4]) << 13
        t10, t13, t11, t12 = t0 + t3, t0 - t3, t1 + t2, t1 - t2
        a0, a1, a2, a3 = i[7], i[5], i[3], i[1]
        z1, z2, z3, z4 = a0 + a3, a1 + a2, a0 + a2, a1 + a3
        z5 = (z3 + z4) * c["f1175"]
        a0, a1, a2, a3 = a0 * c["f0298"], a1 * c["f2053"], a2 * c["f3072"], a3 * c["f1501"]
        z1, z2 = z1 * -c["f0899"], z2 * -c["f2562"]
        z3, z4 = z3 * -c["f1961"] + z5, z4 * -c["f0390"] + z5
        a0, a1, a2, a3 = a0 + z1 + z3, a1 + z2 + z4, a2 + z2 + z3, a3 + z1 + z4
        return [t10 + a3, t11 + a2, t12 + a1, t13 + a0, t13 - a0, t12 - a1, t11 - a2, t10 - a3]

    d = coef.astype(np.int64).reshape(-1, 8, 8) * quant.astype(np.int64).reshape(8, 8)
    cols = one_d([d[:, k, :] for k in range(8)])  # each (n, 8 columns)
    ws = np.stack([((x + (1 << 10)) >> 11).astype(np.int32).astype(np.int64) for x in cols], axis=1)
    rows = one_d([ws[:, :, k] for k in range(8)])  # each (n, 8 rows)
    out = np.stack([(x + (1 << 17)) >> 18 for x in rows], axis=2)
    wrapped = ((out & 1023) ^ 512) - 512
    return np.clip(wrapped + 128, 0, 255).astype(np.uint8)


def idct_on_device(test_device, coefs: np.ndarray, quant: np.ndarray, bw: int):
    """jpeg_idct over (n, 64) int16 coefficients laid out as one plane `bw` blocks wide (n a multiple of bw):
    the (n, 8, 8) samples and the image's status."""
    from vggserve.decoding.device.decoder import IDCT_WG, JpegDecoder, idct_grid
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(test_device))
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    decoder = JpegDecoder(ctx, dev)
    total = coefs.shape[0]
    bh = total // bw
    plane = np.array([[0, bw, bh, 0, 0, 0, 0, 0, 1, 1, 0, 0]], np.int32)
    meta = np.concatenate([plane.ravel(), quant.astype(np.int32)])
    mf = cl.mem_flags
    cbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(coefs, np.int16))
    mbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=meta)
    out = cl.Buffer(ctx, mf.READ_WRITE, total * 64)
    status = np.zeros(1, np.int32)
    sbuf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=status)
    decoder.k_idct(queue, idct_grid(total), (IDCT_WG,), cbuf, mbuf, np.int32(0), np.int32(plane.size), out, sbuf,
                   np.int32(0), np.int32(1), np.int32(total))
    host = np.empty((bh * 8, bw * 8), np.uint8)
    cl.enqueue_copy(queue, host, out)
    cl.enqueue_copy(queue, status, sbuf)
    return host.reshape(bh, 8, bw, 8).transpose(0, 2, 1, 3).reshape(-1, 8, 8), int(status[0])


@pytest.mark.parametrize("nblocks, bw", [(1, 1), (3, 3), (35, 7), (130, 13)])
def test_the_idct_kernel_is_islow_exactly_on_awkward_block_counts(test_device, nblocks, bw):
    rng = np.random.default_rng(nblocks)
    coef = rng.integers(-60, 60, (nblocks, 64)).astype(np.int16)
    coef[:, 20:] *= rng.random((nblocks, 44)) < 0.2  # sparse high frequencies, some all-zero rows/columns
    coef[::3, 1:] = 0  # DC-only blocks (libjpeg's shortcuts)
    quant = rng.integers(1, 60, 64).astype(np.int32)
    quant[0] = 8
    bh = -(-nblocks // bw)
    coefs = np.zeros((bw * bh, 64), np.int16)
    coefs[:nblocks] = coef
    got, status = idct_on_device(test_device, coefs, quant, bw)
    assert np.array_equal(got, islow_numpy(coefs, quant))
    assert status == 0


def test_the_idct_kernel_is_islow_exactly_at_the_largest_coefficients_it_takes(test_device):
    """The kernel's arithmetic is 32-bit where libjpeg's is 64-bit: blocks at the limit (every dequantised value
    +-4096, signs chosen to push pass 2's sums past 2^31, and random ones), exact; one step past it is flagged."""
    rng = np.random.default_rng(7)
    signs = np.array([[1 if (r ^ c) & 1 else -1 for c in range(8)] for r in range(8)])
    blocks = [np.full(64, 4096), np.full(64, -4096), 4096 * signs.ravel(), -4096 * signs.ravel(),
              4096 * np.where(np.arange(64) % 9 == 0, 1, -1)]
    blocks += list(rng.choice([-4096, 4096], (40, 64)))
    blocks += list(rng.integers(-4096, 4097, (40, 64)))
    coefs = np.array(blocks[:85], np.int16)
    quant = np.ones(64, np.int32)
    got, status = idct_on_device(test_device, coefs, quant, 5)
    assert np.array_equal(got, islow_numpy(coefs, quant))
    assert status == 0
    quant[63] = 2  # 4096 * 2 in the last coefficient of every block: past the limit, the image left to the CPU
    _, status = idct_on_device(test_device, coefs, quant, 5)
    assert status == 5  # JI_TOO_LARGE


def canonical_codes(counts, symbols):
    """(length, code, symbol) of a Huffman table's canonical codes (JPEG's BITS and HUFFVAL), shortest first."""
    code, index = 0, 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            yield length, code, symbols[index]
            code += 1
            index += 1
        code <<= 1


def test_huffman_lookup_entries_are_the_canonical_codes():
    counts = (0, 2, 1, 3, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1)  # codes of 2, 3, 4, 10 and 16 bits
    symbols = bytes(range(9))
    t = huffman_table(counts, symbols)
    for length, code, symbol in canonical_codes(counts, symbols):
        if length <= 9:
            prefix = code << (9 - length)
            assert t[prefix] == (length << 8) | symbol
        else:
            assert t[code >> (length - 9)] == 0 and t[512 + length] >= code
            assert t[547 + t[530 + length] + code] == symbol
    assert t[512 + 17] == 0x7FFFFFFF


def test_the_parser_refuses_what_the_device_does_not_decode_with_a_reason():
    good = corpus.pillow_jpeg(corpus.picture(10, 10))
    assert parse(good)
    assert parse(b"\x89PNG").reason == "not a JPEG"
    assert "progressive" in parse(corpus.pillow_jpeg(corpus.picture(10, 10), progressive=True)).reason
    for cut in range(0, parse(good).scan_start, 7):
        assert not parse(good[:cut])  # a damaged header never raises
    assert prepare(good, max_pixels=99).reason == "more pixels than the limit"


# ---- the parallel entropy decoding: every configuration gives libjpeg's coefficients ------------------------

def decode_with(decoder, queue, datas):
    from vggserve.decoding.device import Window

    files = [prepare(d) for d in datas]
    assert all(files)
    windows, offset = [], 0
    for f in files:
        windows.append(Window.whole(f, offset))
        offset += f.size[0] * f.size[1] * 3
    out = cl.Buffer(decoder.context, cl.mem_flags.READ_WRITE, offset)
    run = decoder.enqueue(queue, files, windows, out)
    host = np.empty(offset, np.uint8)
    cl.enqueue_copy(queue, host, out)
    images = [host[w.offset:w.offset + f.size[0] * f.size[1] * 3].reshape(f.size[1], f.size[0], 3)
              for f, w in zip(files, windows)]
    return images, run


def decoded_as_pillow(decoder, queue, datas):
    """Decode `datas` in one batch, assert every file took the device and came out as Pillow's; the run."""
    images, run = decode_with(decoder, queue, datas)
    assert all(run.ok()), run.reasons()
    for data, got in zip(datas, images):
        assert_same(got, data)
    return run


@pytest.fixture(scope="module")
def cl_setup(test_device):
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(test_device))
    ctx = cl.Context([dev])
    return ctx, dev, cl.CommandQueue(ctx)


@pytest.mark.parametrize("chunk_bytes, rounds, lookback", [(8, 2, 0), (16, 3, None), (37, 4, 100), (64, 2, None),
                                                           (64, 3, 0), (32, 2, 1000), (256, 3, 0), (100000, 2, None),
                                                           (64, 0, None)])
def test_parallel_entropy_decoding_in_any_chunking_gives_pillows_pixels(cl_setup, chunk_bytes, rounds, lookback):
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=chunk_bytes, rounds=rounds, lookback=lookback)
    datas = [d for _, d in corpus.pillow_corpus()[::3]]
    datas += [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=95, subsampling=s) for w, h, s in
              [(160, 120, 2), (99, 201, 1), (250, 17, 0)]]
    run = decoded_as_pillow(decoder, queue, datas)
    if rounds == 0:
        assert run.segments_in_parallel() == 0
    elif chunk_bytes <= 64:
        assert run.segments_in_parallel() > 0  # most settle; the rest went to the serial kernel, exactly


@pytest.mark.parametrize("chunk_bytes, checkpoints", [(8, 1), (64, 0), (64, 7), (256, 15), (100000, 3)])
def test_the_decoding_pass_in_any_number_of_parts_gives_pillows_pixels(cl_setup, chunk_bytes, checkpoints):
    """The decoding pass split at the checkpoints the rounds record: parts shorter than a block (several checkpoints
    at one block start), parts past a decode's end, a whole file in one chunk, and none (0: whole chunks)."""
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=chunk_bytes, rounds=4, checkpoints=checkpoints)
    datas = [d for _, d in corpus.pillow_corpus()[1::4]]
    datas += [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=q, subsampling=s, restart_marker_blocks=r)
              for w, h, s, q, r in [(160, 120, 2, 95, 0), (99, 201, 1, 40, 3), (250, 17, 0, 100, 0)]]
    run = decoded_as_pillow(decoder, queue, datas)
    assert run.segments_in_parallel() > 0


def test_a_decoder_refuses_one_round_which_could_not_tell_settled_segments(cl_setup):
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, _ = cl_setup
    with pytest.raises(ValueError, match="rounds must be 0 or at least 2"):
        JpegDecoder(ctx, dev, rounds=1)
    with pytest.raises(ValueError, match="lookback must be 0 or more bytes"):
        JpegDecoder(ctx, dev, lookback=-1)
    with pytest.raises(ValueError, match="checkpoints must be 0 to 15"):
        JpegDecoder(ctx, dev, checkpoints=16)
    with pytest.raises(ValueError, match="chunk_bytes at least 8"):
        JpegDecoder(ctx, dev, long_chunk_bytes=7)


def test_batches_enqueued_one_after_another_before_any_is_read_each_get_their_own_pixels(cl_setup):
    """The decoder's pinned staging memory is reused batch after batch: more batches in flight than it has slots
    must each decode their own files, and each keep its own statuses."""
    from vggserve.decoding.device import JpegDecoder, Window

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=64, rounds=3)
    groups = [[corpus.pillow_jpeg(corpus.picture(w + i, h, i), quality=60 + 7 * i, subsampling=i % 3)
               for w, h in [(90, 70), (41, 130)]] for i in range(5)]
    corrupt = bytearray(groups[2][1])
    corrupt[len(corrupt) // 2:len(corrupt) // 2 + 40] = b"\xa5" * 40  # the stream no longer adds up
    groups[2][1] = bytes(corrupt)
    runs = []
    for datas in groups:
        files = [prepare(d) for d in datas]
        windows, offset = [], 0
        for f in files:
            windows.append(Window.whole(f, offset))
            offset += f.size[0] * f.size[1] * 3
        out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, offset)
        runs.append((datas, files, windows, out, decoder.enqueue(queue, files, windows, out)))
    for datas, files, windows, out, run in runs:
        host = np.empty(out.size, np.uint8)
        cl.enqueue_copy(queue, host, out)
        for data, f, w, ok in zip(datas, files, windows, run.ok()):
            assert ok or data is groups[2][1]
            if ok:  # what the device accepts is Pillow's, exactly
                assert_same(host[w.offset:w.offset + f.size[0] * f.size[1] * 3].reshape(f.size[1], f.size[0], 3), data)


@pytest.mark.parametrize("long_from", [0, 2_000, 10 ** 9])
def test_long_segments_are_cut_into_their_own_chunk_size_and_decode_as_pillow(cl_setup, monkeypatch, long_from):
    """Segments of LONG_SEGMENT_BYTES or more get long_chunk_bytes chunks, the rest chunk_bytes: every segment is
    covered by its chunks end to end, each chunk as long as its segment's size says but the last, and the pixels of a
    batch that mixes both are Pillow's."""
    from vggserve.decoding.device import JpegDecoder
    import vggserve.decoding.device.decoder as decoder_module

    monkeypatch.setattr(decoder_module, "LONG_SEGMENT_BYTES", long_from)
    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=24, long_chunk_bytes=56, rounds=6)
    datas = [d for _, d in corpus.pillow_corpus()[::3]]
    datas += [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=q, subsampling=s, restart_marker_blocks=r)
              for w, h, s, q, r in [(160, 120, 2, 95, 0), (99, 201, 1, 90, 7), (250, 17, 0, 100, 0)]]
    run = decoded_as_pillow(decoder, queue, datas)
    seg, chunk = run.batch.seg, run.batch.chunk
    lengths = seg[:, 2] - seg[:, 1]
    longs = 0
    for index, (s_, length) in enumerate(zip(seg, lengths)):
        mine = chunk[s_[6]:s_[6] + s_[7]]
        size = 56 if length >= long_from else 24
        longs += size == 56
        assert (mine[:, 0] == index).all()
        assert mine[0, 1] == s_[1] and mine[-1, 2] == s_[2] and (mine[1:, 1] == mine[:-1, 2]).all()
        assert (mine[:-1, 2] - mine[:-1, 1] == size).all() and 0 < mine[-1, 2] - mine[-1, 1] <= max(size, length)
        assert s_[7] == max(1, -(-length // size))
    assert longs == {0: len(seg), 2_000: int((lengths >= 2_000).sum()), 10 ** 9: 0}[long_from]
    assert 0 < int((lengths >= 2_000).sum()) < len(seg)  # the middle case mixes both


@pytest.mark.parametrize("sizes", [[1], [3, 1, 255], [256], [257, 1000, 2], [700] * 100 + [1999] * 7])
def test_the_chunks_entries_are_the_sums_of_the_chunks_before_them_in_their_segment(cl_setup, sizes):
    """jpeg_prefix_*: each chunk's first block and DC predictors against numpy, over segments of awkward lengths,
    across work-groups and, with the last case (84,000 chunks), more work-groups than one tile of their totals; the
    values sum past 2^31 over the batch while each segment's stay within int32, as blocks and DC sums do."""
    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.decoder import PREFIX_WG

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev)
    rng = np.random.default_rng(len(sizes))
    n, nseg = sum(sizes), len(sizes)
    firsts = np.cumsum([0] + sizes[:-1])
    seg = np.zeros((nseg, 8), np.int32)
    seg[:, 6], seg[:, 7] = firsts, sizes
    meta = np.concatenate([np.zeros(5, np.int32), seg.reshape(-1)])  # the segment records at offset 5
    chunk = np.zeros((n, 4), np.int32)
    chunk[:, 0] = np.repeat(np.arange(nseg), sizes)
    state = rng.integers(-1_000_000, 1_000_000, (n, 8), dtype=np.int32)
    state[:, 3] = rng.integers(0, 1_000_000, n)
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a) for a in (meta, chunk, state)]
    entry = cl.Buffer(ctx, mf.READ_WRITE, n * 16)
    decoder._prefix(queue, n, bufs[0], 5, bufs[1], bufs[2], entry)
    got = np.empty((n, 4), np.int32)
    cl.enqueue_copy(queue, got, entry)
    sums = state[:, 3:7].astype(np.int64)
    want = np.zeros((n, 4), np.int64)
    for first, size in zip(firsts, sizes):
        want[first:first + size] = np.cumsum(sums[first:first + size], axis=0) - sums[first:first + size]
    assert np.abs(want).max() < 2 ** 31
    if n > PREFIX_WG * PREFIX_WG:
        assert sums[:, 0].sum() > 2 ** 31
    assert np.array_equal(got, want)


def test_threads_decoding_on_one_model_at_once_each_get_their_own_pixels(cl_setup):
    """decode_for_model holds the decoder's lock only while it launches: threads wait for their batches side by
    side (the batch job's two decode threads), more of them than the decoder has staging slots, and each gets its
    own files' pixels and its own statuses (a corrupt stream in one batch falls back there alone)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.onmodel import DeviceImage, decode_for_model

    ctx, dev, _ = cl_setup

    class OnDevice:  # what decode_for_model asks of a model
        decoder = (JpegDecoder(ctx, dev, chunk_bytes=64, rounds=3), cl.CommandQueue(ctx), threading.Lock())

        def jpeg_decoder(self):
            return self.decoder

    groups = [[corpus.pillow_jpeg(corpus.picture(w + i, h, i), quality=60 + 5 * i, subsampling=i % 3)
               for w, h in [(90, 70), (41, 130)]] for i in range(7)]
    corrupt = bytearray(groups[3][0])
    corrupt[len(corrupt) // 2:len(corrupt) // 2 + 40] = b"\xa5" * 40
    groups[3][0] = bytes(corrupt)
    model = OnDevice()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda datas: decode_for_model(model, datas), groups))
    queue = model.decoder[1]
    for datas, items in zip(groups, results):
        for data, item in zip(datas, items):
            if data is groups[3][0]:  # flagged on the device, decoded on the CPU: its pixels, or its error
                assert not isinstance(item, DeviceImage)
                continue
            assert isinstance(item, DeviceImage)
            host = np.empty(item.width * item.height * 3, np.uint8)
            cl.enqueue_copy(queue, host, item.buffer, src_offset=item.offset)
            assert_same(host.reshape(item.height, item.width, 3), data)


def test_a_batch_sets_its_kernels_arguments_in_declared_calls_only(cl_setup, monkeypatch):
    """Host time: Kernel.set_arg with a numpy int costs about 9 us on the way in, the declared set_args of all of a
    launch's arguments about 1 us; the synchronisation rounds set theirs that way too."""
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=64, rounds=4)
    datas = [corpus.pillow_jpeg(corpus.picture(120, 90, i), quality=90, subsampling=2) for i in range(3)]
    one_by_one = []
    set_arg = cl.Kernel.set_arg
    monkeypatch.setattr(cl.Kernel, "set_arg", lambda self, i, value: one_by_one.append(i) or set_arg(self, i, value))
    images, run = decode_with(decoder, queue, datas)
    assert all(run.ok()) and one_by_one == []
    for data, got in zip(datas, images):
        assert_same(got, data)


def awkward_windows():
    """(file, window box (x0, y0, width, height) of the upright image or None for all of it, row stride in pixels or
    0): widths that are not whole quads of 4 pixels, odd corners, rows longer than the window, every orientation."""
    pic, jpeg = corpus.picture, corpus.pillow_jpeg
    cases = [(jpeg(pic(1, 1, 1)), None, 0), (jpeg(pic(2, 3, 2), subsampling=2), None, 0),
             (jpeg(pic(5, 1, 3), subsampling=1), None, 7), (jpeg(pic(17, 9, 4, gray=True)), (3, 1, 13, 5), 0),
             (jpeg(pic(41, 27, 5), subsampling=2), (1, 2, 38, 25), 41), (jpeg(pic(33, 31, 6), subsampling=0), None, 0),
             (jpeg(pic(70, 50, 7), subsampling=1), (5, 3, 65, 1), 0), (jpeg(pic(130, 9, 8), subsampling=2), None, 0),
             # 4:2:0 upright (the quad kernel's own path): quads at even and odd columns, at both edges of odd widths
             (jpeg(pic(47, 21, 9), subsampling=2), (2, 3, 44, 17), 0), (jpeg(pic(47, 20, 10), subsampling=2), None, 0),
             (jpeg(pic(45, 12, 11), subsampling=2), (1, 1, 44, 10), 47), (jpeg(pic(8, 4, 12), subsampling=2), None, 0)]
    for orientation in range(1, 9):
        data = with_exif_orientation(jpeg(pic(23, 11, orientation), subsampling=2), orientation)
        cases.append((data, (1, 1, 9, 5) if orientation % 2 else None, 11 if orientation > 4 else 0))
    return cases


@pytest.mark.parametrize("kernels", ["quad", "item"])
def test_colour_variants_write_each_window_exactly_and_nothing_around_it(cl_setup, kernels):
    """Both variants of jpeg_color.cl on windows at odd byte offsets, of widths that are not whole quads and rows
    longer than the window: each window holds Pillow's pixels and every byte between them keeps its poison."""
    from vggserve.decoding.device import JpegDecoder, Window

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, kernels=kernels)
    cases = awkward_windows()
    files = [prepare(data) for data, _, _ in cases]
    windows, offset = [], 3
    for f, (_, box, stride) in zip(files, cases):
        x0, y0, w, h = box or (0, 0, *f.size)
        windows.append(Window(offset, x0, y0, w, h, stride))
        offset += (stride or w) * h * 3 + 5
    poison = np.full(offset, 0xA5, np.uint8)
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=poison)
    run = decoder.enqueue(queue, files, windows, out)
    assert all(run.ok()), run.reasons()
    host = np.empty(offset, np.uint8)
    cl.enqueue_copy(queue, host, out)
    want = poison.copy()
    for (data, _, _), win in zip(cases, windows):
        pixels = np.asarray(decode_pixels(data))[win.y0:win.y0 + win.height, win.x0:win.x0 + win.width]
        stride = win.stride or win.width
        for row in range(win.height):
            at = win.offset + row * stride * 3
            want[at:at + win.width * 3] = pixels[row].reshape(-1)
    assert np.array_equal(host, want), f"{int((host != want).sum())} bytes differ"


def test_an_unknown_kernel_variant_is_refused_with_the_known_ones(cl_setup):
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, _ = cl_setup
    with pytest.raises(ValueError, match="not one of quad, item"):
        JpegDecoder(ctx, dev, kernels="fast")


def multi_model(counts, symbols, bits: int) -> np.ndarray:
    """jpeg_multi's entries for one table, from the canonical codes themselves: for each `bits`-bit pattern, the AC
    symbols whose codes and value bits lie whole within it, up to an EOB, stopped before a run past the block."""
    codes = {(length, code): symbol for length, code, symbol in canonical_codes(counts, symbols)}
    out = np.zeros(1 << bits, np.uint16)
    for x in range(1 << bits):
        at = adv = eob = last = 0
        while at < bits:
            found = next(((n, codes[(n, (x >> (bits - at - n)) & ((1 << n) - 1))]) for n in range(1, bits - at + 1)
                          if (n, (x >> (bits - at - n)) & ((1 << n) - 1)) in codes), None)
            if found is None or at + found[0] + (found[1] & 15) > bits:
                break
            run, size = found[1] >> 4, found[1] & 15
            step = run + 1 if size else (16 if run == 15 else 0)
            if adv + step > 63:
                break
            last, at = at, at + found[0] + size
            if not size and run != 15:
                eob = 1
                break
            adv += step
        out[x] = (at | adv << 5 | eob << 11 | last << 12) if at else 0
    return out


def test_the_multi_symbol_tables_are_the_codes_read_one_by_one(cl_setup):
    """jpeg_multi against a model built from the canonical codes: the standard AC code lengths, a table of long
    codes and long runs (ZRLs, a run to coefficient 63), and one whose codes leave patterns undecodable."""
    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.decoder import MULTI_ENTRIES

    luma_like = ((0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D),  # the standard AC codes' lengths
                bytes([0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07,
                       0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xA1, 0x08, 0x23, 0x42, 0xB1, 0xC1, 0x15, 0x52, 0xD1, 0xF0])
                + bytes(range(0x24, 0x24 + 0x7D + 30)))
    tables = [luma_like,
              ((1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3), bytes([0xF0, 0x3E, 0x00, 0x11, 0xE1, 0x01])),
              ((0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), bytes([0x01, 0x00, 0x52]))]
    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev)
    tab = np.stack([huffman_table(c, sym[:sum(c)]) for c, sym in tables]).astype(np.int32)
    mf = cl.mem_flags
    meta = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.concatenate([np.zeros(5, np.int32), tab.ravel()]))
    out = cl.Buffer(ctx, mf.READ_WRITE, 2 * MULTI_ENTRIES * len(tables))
    decoder.k_multi.set_args(meta, 5, len(tables), out)
    cl.enqueue_nd_range_kernel(queue, decoder.k_multi, (MULTI_ENTRIES * len(tables),), None)
    got = np.empty((len(tables), MULTI_ENTRIES), np.uint16)
    cl.enqueue_copy(queue, got, out)
    for i, (c, sym) in enumerate(tables):
        want = multi_model(c, sym[:sum(c)], MULTI_ENTRIES.bit_length() - 1)
        assert np.array_equal(got[i], want), f"table {i}: {int((got[i] != want).sum())} entries differ"
    assert (got[0] & 31).mean() > 8  # the luma-like table takes most patterns several bits at a time
    assert ((got[1] >> 11) & 1).any() and ((got[1] >> 5) & 63).max() >= 16  # EOBs and ZRLs in the long-run table
    assert (got[2] == 0).any()  # patterns no code starts


def sync_states(decoder, queue, datas):
    """The last round's exits, the entries the chunks last decoded from, the settled flags, and the files' statuses."""
    _, run = decode_with(decoder, queue, datas)
    ok = run.ok()
    n = run.batch.chunk.shape[0]
    exits, used = np.empty((n, 8), np.int32), np.empty((n, 4), np.int32)
    cl.enqueue_copy(queue, exits, decoder._states[(decoder.rounds - 1) % 2].get(n * 32))
    cl.enqueue_copy(queue, used, decoder._used.get(n * 16))
    # the parts of a segment that find errors each offer theirs, and the highest code is kept: the reasons are
    # deterministic
    return exits, used, run.parallel.copy(), ok, run.reasons()


def stuffed_pairs(data: bytes) -> int:
    """The stuffed pairs (0xFF 0x00) in a JPEG's scans."""
    return data[data.index(b"\xff\xda"):].count(b"\xff\x00")


@pytest.mark.parametrize("chunk_bytes, lookback", [(41, 0), (53, 3), (64, None), (96, 0)])
def test_stuffed_bytes_at_every_place_of_the_bit_buffer(cl_setup, chunk_bytes, lookback):
    """je_run's register buffer drops each 0xFF's stuffed 0x00 as it loads bytes (four at a time where no 0xFF is
    among them, else one by one) and moves the position over it as the 0xFF's last bit is consumed. Noisy pictures
    at quality 97 hold dozens of stuffed pairs a file; in chunks of odd sizes, pairs fall at every offset of a
    refill, straddle refills, start chunks and end them. Every exit, entry used, settled flag and checkpoint is the
    same with the multi-symbol tables (several symbols across a pair at once) as without, every segment settles in
    the parallel decode, and the files decode as Pillow, those with restart markers too."""
    rng = np.random.default_rng(7)

    def noisy(w, h):
        base = corpus.picture(w, h, w).astype(int)
        return np.clip(base + rng.integers(-8, 9, base.shape), 0, 255).astype(np.uint8)

    good = [corpus.pillow_jpeg(noisy(96, 64), quality=97, subsampling=0),
            corpus.pillow_jpeg(noisy(67, 35), quality=97, subsampling=2),
            corpus.pillow_jpeg(noisy(80, 48), quality=97, subsampling=1, restart_marker_blocks=3)]
    assert all(stuffed_pairs(d) >= 10 for d in good), [stuffed_pairs(d) for d in good]
    _, run = either_way_the_same_states(cl_setup, good, "multi", chunk_bytes=chunk_bytes, rounds=40,
                                        lookback=lookback)
    # every segment's pixels come from the parallel decode, none from the serial kernel's
    assert run.parallel.all(), f"{int((~run.parallel.astype(bool)).sum())} segments left to the serial kernel"


@pytest.mark.parametrize("chunk_bytes, rounds, lookback", [(8, 2, 0), (37, 3, None), (128, 6, None), (64, 4, 300)])
def test_multi_symbol_rounds_leave_the_exits_of_one_symbol_at_a_time(cl_setup, chunk_bytes, rounds, lookback):
    """Every chunk's exit (bit, block, coefficient, blocks and DC sums), every entry used and every settled flag after
    the rounds are the same with the multi-symbol tables as without, on good files (entries guessed anywhere in
    their scans) and on hostile ones (guesses and exact decodes reading garbage)."""
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    datas = [d for _, d in corpus.pillow_corpus()[::2]]
    datas += [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=q, subsampling=s, optimize=o)
              for w, h, s, q, o in [(160, 120, 2, 95, False), (99, 201, 1, 40, True), (250, 17, 0, 100, False)]]
    datas += [d for _, d in hostile_inputs() if prepare(d)]
    states = [sync_states(JpegDecoder(ctx, dev, chunk_bytes=chunk_bytes, rounds=rounds, lookback=lookback,
                                      multi=multi), queue, datas) for multi in (True, False)]
    for name, a, b in zip(("exits", "entries used", "settled", "ok", "reasons"), *states):
        assert np.array_equal(a, b), name


def checkpoints_of(decoder, queue, n: int) -> np.ndarray:
    """Each chunk's checkpoints after the rounds, (n, checkpoints, 6); the fields of one a decode ended before (its bit
    -1) zeroed, as nothing reads them."""
    ck = np.empty((n, decoder.checkpoints, 6), np.int32)
    cl.enqueue_copy(queue, ck, decoder._ckpt.get(ck.nbytes))
    ck[:, :, 1:][ck[:, :, 0] < 0] = 0
    return ck


def round_cases(n: int) -> list[bytes]:
    """The first n of the synchronisation tests' own files: 4:2:0, 4:2:2 with restart markers and optimised tables,
    4:4:4 at quality 100, an optimised 4:2:0, and a 64x64 4:4:4 at 75 (in 192-byte chunks its round 1 moves blocks
    and DC sums but no exit)."""
    cases = [(160, 120, 2, 95, False, 0), (99, 201, 1, 40, True, 5), (250, 17, 0, 100, False, 0),
             (300, 200, 2, 75, True, 0), (64, 64, 0, 75, False, 0)]
    return [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=q, subsampling=s, optimize=o, restart_marker_blocks=r)
            for w, h, s, q, o, r in cases[:n]]


def either_way_the_same_states(cl_setup, good, option: str, **settings):
    """Decoders with `option` True and False leave the same exits, entries used, settled flags, statuses, reasons
    and checkpoints after the rounds, on `good` and the hostile inputs; the default decoder with `settings` decodes
    `good` as Pillow. Returns the settled flags (of `good` and the hostile inputs) and that decode of `good`'s run."""
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    datas = good + [d for _, d in hostile_inputs() if prepare(d)]
    states = []
    for value in (True, False):
        decoder = JpegDecoder(ctx, dev, **settings, **{option: value})
        got = sync_states(decoder, queue, datas)
        states.append(got + (checkpoints_of(decoder, queue, got[0].shape[0]),))
    for name, a, b in zip(("exits", "entries used", "settled", "ok", "reasons", "checkpoints"), *states):
        assert np.array_equal(a, b), name
    return states[0][2], decoded_as_pillow(JpegDecoder(ctx, dev, **settings), queue, good)


@pytest.mark.parametrize("chunk_bytes, rounds, lookback, checkpoints",
                         [(8, 3, 0, 1), (37, 4, None, 3), (128, 6, None, 3), (64, 5, 300, 7), (96, 8, 0, 15)])
def test_chunks_that_resume_their_last_decode_leave_the_exits_and_checkpoints_of_whole_decodes(
        cl_setup, chunk_bytes, rounds, lookback, checkpoints):
    """A chunk decoding again stops where it meets its last decode at a checkpoint and takes that decode's exit and
    later checkpoints, moved by the blocks and DC sums read before: every exit, entry used, settled flag and
    checkpoint is what decoding every chunk whole gives, on good files and hostile ones, and the pixels are
    Pillow's."""
    good = [d for _, d in corpus.pillow_corpus()[1::2]] + round_cases(4)
    either_way_the_same_states(cl_setup, good, "resume", chunk_bytes=chunk_bytes, rounds=rounds, lookback=lookback,
                               checkpoints=checkpoints)


@pytest.mark.parametrize("chunk_bytes, rounds, lookback, checkpoints",
                         [(8, 2, 0, 1), (8, 5, 0, 3), (37, 4, None, 3), (128, 6, None, 0), (64, 9, 300, 7),
                          (192, 20, 0, 3)])
def test_rounds_after_a_quiet_one_leave_the_states_of_rounds_over_every_chunk(cl_setup, chunk_bytes, rounds, lookback,
                                                                             checkpoints):
    """A round after one that moved no chunk's state returns at once: every exit (blocks and DC sums too, which a
    round may move where the exits stay), entry used, settled flag and checkpoint is what every round over every
    chunk gives, on good files and hostile ones, and the pixels are Pillow's."""
    good = [d for _, d in corpus.pillow_corpus()[::3]] + round_cases(5)
    settled, _ = either_way_the_same_states(cl_setup, good, "skip_quiet", chunk_bytes=chunk_bytes, rounds=rounds,
                                         lookback=lookback, checkpoints=checkpoints)
    assert settled.any()  # some segments settled in the rounds (the rest: the serial kernel)


@pytest.mark.parametrize("rounds", [3, 4, 5])
def test_a_round_that_moved_only_blocks_and_dc_sums_is_not_a_quiet_one(cl_setup, rounds):
    """On the 64x64 file alone, round 1 moves chunks' blocks and DC sums but no exit: were it counted quiet, the
    rounds after it would skip, and with an odd number of rounds the buffer of states read last would hold round 0's
    (counting only the exits as moves fails rounds 3 and 5 here)."""
    either_way_the_same_states(cl_setup, round_cases(5)[4:], "skip_quiet", rounds=rounds)


@pytest.mark.parametrize("chunk_bytes", [8, 64])
def test_parallel_decoding_flags_hostile_streams_as_the_serial_one_does(cl_setup, chunk_bytes):
    from vggserve.decoding.device import JpegDecoder

    ctx, dev, queue = cl_setup
    serial = JpegDecoder(ctx, dev, rounds=0)
    parallel = JpegDecoder(ctx, dev, chunk_bytes=chunk_bytes, rounds=3)
    files = [(n, d) for n, d in hostile_inputs() if prepare(d)]
    assert len(files) > 20
    datas = [d for _, d in files]
    a, run_a = decode_with(serial, queue, datas)
    b, run_b = decode_with(parallel, queue, datas)
    for (name, data), ok_a, ok_b, x, y in zip(files, run_a.ok(), run_b.ok(), a, b):
        if ok_b:  # whatever the parallel decoder accepts is exact
            assert_same(y, data, name)
        if ok_a:
            assert_same(x, data, name)


# ---- the whole path: decoded on the model's device, resized and cropped there, classified ----------------------

def test_logits_through_the_device_decoder_are_the_cpu_decodes_exactly(tiny_tensors, test_device):
    from PIL import Image as PILImage

    from vggserve.decoding.device.onmodel import CROP, IMAGE, DeviceImage, decode_for_model
    from vggserve.model.vgg16 import VGG16
    from vggserve.modelinput import device_input

    model = VGG16(tiny_tensors, device=test_device, max_batch_size=8)
    datas = [corpus.pillow_jpeg(corpus.picture(w, h, w), quality=90, subsampling=s)
             for w, h, s in [(300, 200, 2), (256, 300, 1), (1000, 90, 0), (224, 224, 2), (33, 700, 1)]]
    png = io.BytesIO()
    PILImage.fromarray(corpus.picture(120, 90)).save(png, "PNG")
    datas += [png.getvalue(), with_exif_orientation(datas[0], 6), b"junk"]
    items = decode_for_model(model, datas)
    kinds = [x.kind if isinstance(x, DeviceImage) else type(x).__name__ for x in items]
    assert kinds == [IMAGE, CROP, IMAGE, IMAGE, IMAGE, "ModelInput", IMAGE, "ImageDecodeError"]
    good = items[:-1]
    got = model.submit(good, "logits").result()
    want = model.submit([device_input(decode_pixels(d)) for d in datas[:-1]], "logits").result()
    assert np.array_equal(got, want)
    # mixed with host inputs in one batch, at their places
    host = [device_input(decode_pixels(datas[i])) for i in (5, 0, 1, 2)]
    mixed = [host[0], items[0], host[2], items[2]]
    assert np.array_equal(model.submit(mixed, "logits").result(), model.submit(host, "logits").result())
    # the images' buffer goes back to the decoder's pool once they are dropped, with the engine's reads noted: the
    # next call decodes into it again, and its images classify as the CPU decodes still
    lease = items[0].lease
    assert lease.reads and all(isinstance(x.lease, type(lease)) for x in good if isinstance(x, DeviceImage))
    buffer = items[0].buffer
    del items, good, mixed, lease
    gc.collect()  # the ImageError's traceback holds the call's frame, and so its images, until the collector runs
    again = decode_for_model(model, datas[:5])
    assert again[0].buffer is buffer
    assert np.array_equal(model.submit(again, "logits").result(), want[:5])


class _OnDecoder:
    """A stand-in model for decode_for_model: its decoder, queue and lock."""

    def __init__(self, decoder, queue):
        import threading

        self._jpeg = (decoder, queue, threading.Lock())

    def jpeg_decoder(self):
        return self._jpeg


def _pixels(queue, image) -> np.ndarray:
    host = np.empty(image.width * image.height * 3, np.uint8)
    cl.enqueue_copy(queue, host, image.buffer, src_offset=image.offset)
    return host.reshape(image.height, image.width, 3)


def test_decode_for_model_reuses_a_buffer_only_once_every_image_of_its_call_is_dropped(cl_setup):
    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.onmodel import decode_for_model

    ctx, dev, queue = cl_setup
    model = _OnDecoder(JpegDecoder(ctx, dev), queue)
    first = [corpus.pillow_jpeg(corpus.picture(300, 200, i), quality=90, subsampling=2) for i in range(3)]
    second = [corpus.pillow_jpeg(corpus.picture(280, 210, 9 + i), quality=80, subsampling=1) for i in range(3)]
    a = decode_for_model(model, first)
    kept = a[1]
    del a
    b = decode_for_model(model, second)
    assert b[0].buffer is not kept.buffer  # one image of the first call still held: its buffer is not reused
    assert_same(_pixels(queue, kept), first[1])
    buffer = kept.buffer
    del kept
    c = decode_for_model(model, first)
    assert c[0].buffer is buffer
    for image, data in zip(c + b, first + second):
        assert_same(_pixels(queue, image), data)


def test_decodes_started_ahead_answer_each_file_as_decode_for_model_and_in_their_own_buffers(cl_setup):
    """start_decode launches a batch's decode and returns; the next batch's is launched before the first's items()
    wait: each answers its files with Pillow's pixels (or the CPU path's answer), in a buffer of its own."""
    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.onmodel import DeviceImage, start_decode
    from vggserve.errors import ImageError

    ctx, dev, queue = cl_setup
    model = _OnDecoder(JpegDecoder(ctx, dev), queue)
    first = [corpus.pillow_jpeg(corpus.picture(300, 200, i), quality=90, subsampling=2) for i in range(3)]
    second = [corpus.pillow_jpeg(corpus.picture(257, 131, 7), quality=75, subsampling=1), b"junk"]
    started = [start_decode(model, first), start_decode(model, second), start_decode(model, [b"junk too"])]
    a, b, c = (s.items() for s in started)
    assert all(isinstance(x, DeviceImage) for x in a + b[:1])
    assert isinstance(b[1], ImageError) and isinstance(c[0], ImageError)
    assert a[0].buffer is not b[0].buffer
    for image, data in zip(a + b[:1], first + second[:1]):
        assert_same(_pixels(queue, image), data)


def test_a_reused_buffer_is_decoded_into_after_the_reads_noted_on_its_last_images(cl_setup):
    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.onmodel import decode_for_model

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev)
    model = _OnDecoder(decoder, queue)
    datas = [corpus.pillow_jpeg(corpus.picture(300, 200, 5), quality=90, subsampling=2)]
    items = decode_for_model(model, datas)
    read = cl.UserEvent(ctx)  # a read of the pixels that another queue has not run yet
    items[0].read_by(read)
    del items
    seen, enqueue = [], decoder.enqueue

    def spy(queue, files, windows, out, wait_for=None, staged=None):
        seen.append(list(wait_for or []))
        read.set_status(cl.command_execution_status.COMPLETE)
        return enqueue(queue, files, windows, out, wait_for=wait_for, staged=staged)

    decoder.enqueue = spy
    again = decode_for_model(model, datas)
    assert seen == [[read]]
    assert_same(_pixels(queue, again[0]), datas[0])


def test_files_read_into_pinned_memory_are_uploaded_from_where_they_lie_with_the_cpu_paths_answers(cl_setup,
                                                                                                    tmp_path):
    """decode_inputs reads paths into this thread's pinned FileArena and the decoder uploads them from there (no
    copy into its staging): the same answers as the CPU path for JPEGs (one with an EXIF orientation), a PNG and a
    junk file; a call with a source that is not a file (bytes) copies the files as before, with the same answers."""
    from vggserve.decoding import decode_input
    from vggserve.decoding.device import JpegDecoder, decode_inputs
    from vggserve.decoding.device.onmodel import DeviceImage, window_for

    ctx, dev, queue = cl_setup
    decoder = JpegDecoder(ctx, dev, chunk_bytes=64, rounds=3)
    model = _OnDecoder(decoder, queue)
    runs, enqueue = [], decoder.enqueue

    def spy(*args, **kwargs):
        runs.append(enqueue(*args, **kwargs))
        return runs[-1]

    decoder.enqueue = spy
    datas = [corpus.pillow_jpeg(corpus.picture(w, h, i), quality=70 + i, subsampling=i % 3)
             for i, (w, h) in enumerate([(300, 200), (1, 1), (257, 131), (64, 480)])]
    datas.insert(2, with_exif_orientation(datas[0], 6))
    png = io.BytesIO()
    Image.fromarray(corpus.picture(90, 70, 3)).save(png, "PNG")
    datas += [png.getvalue(), b"junk, not an image"]
    paths = []
    for i, data in enumerate(datas):
        paths.append(tmp_path / f"f{i}.img")
        paths[-1].write_bytes(data)
    devices = 0
    for sources in ([str(p) for p in paths], [str(p) for p in paths[:3]] + [datas[3]], [str(p) for p in paths]):
        got = decode_inputs(sources, model, "torchvision", True)
        for source, (item, problem) in zip(sources, got):
            want, want_problem = decode_input(source, "torchvision", on_device=True, catch=ImageError)
            assert problem == want_problem, source
            if isinstance(item, DeviceImage):  # its window of the CPU path's pixels, bit for bit
                data = source if isinstance(source, bytes) else open(source, "rb").read()
                window, _ = window_for(prepare(data), 0)
                pixels = np.asarray(decode_pixels(data))
                box = pixels[window.y0:window.y0 + window.height, window.x0:window.x0 + window.width]
                assert np.array_equal(_pixels(queue, item), box), source
                devices += 1
    assert [run.batch.staged for run in runs] == [True, False, True]
    assert devices == 5 + 4 + 5
    arena = decoder.file_arena()  # this thread's, which decode_inputs read into
    assert len(arena.reads) == 1  # the last upload from it, which its next read waits for
    assert np.shares_memory(runs[-1].batch.data, arena.buffer)


def test_a_batch_packed_from_staged_memory_is_a_span_of_it_only_when_every_file_lies_in_it():
    from vggserve.decoding.device.tables import SPAN_SLACK, Batch

    datas = [corpus.pillow_jpeg(corpus.picture(40 + 9 * i, 30 + 5 * i, i), subsampling=i % 3) for i in range(3)]
    frames = [prepare(d).frame for d in datas]
    copied = Batch.pack(frames, datas)
    staged = np.zeros(sum(map(len, datas)) * (SPAN_SLACK + 2), np.uint8)
    at, views = 7, []
    for d in datas:  # back to back, with a gap that the span uploads too
        staged[at:at + len(d)] = np.frombuffer(d, np.uint8)
        views.append(staged[at:at + len(d)])
        at += len(d) + 100
    batch = Batch.pack(frames, views, staged=staged)
    assert batch.staged and not copied.staged and np.shares_memory(batch.data, staged)
    for name in ("seg", "img", "comp", "plane"):
        if name != "seg":
            assert np.array_equal(getattr(batch, name), getattr(copied, name)), name
    for i, d in enumerate(datas):  # each segment's bytes are its file's scan, wherever the file lies
        for b, c in ((batch, i), (copied, i)):
            lo, hi = b.seg[c, 1], b.seg[c, 2]
            assert bytes(b.data[lo:hi]) == d[frames[i].scan_start:], (i, b.staged)
    elsewhere = views[:2] + [np.frombuffer(datas[2], np.uint8).copy()]
    assert not Batch.pack(frames, elsewhere, staged=staged).staged
    assert not Batch.pack(frames, views[:2] + [datas[2]], staged=staged).staged  # bytes: not in it
    far = staged.size - len(datas[2])  # the third file far from the others: the span would be mostly other bytes
    staged[far:] = np.frombuffer(datas[2], np.uint8)
    assert not Batch.pack(frames, views[:2] + [staged[far:]], staged=staged).staged


# ---- the batch job's chunks, decoded on the device in groups ----------------------------------------------------

def _chunk_decoder(cl_setup, **options):
    """A device chunk decoder that holds the chunks started on it (the device has enough decoded ahead, and its
    clock stands still: no chunk times out) until `gate.set()` says no more are coming (the end rule)."""
    from types import SimpleNamespace

    from vggserve.decoding.device import JpegDecoder
    from vggserve.decoding.device.chunks import STARVE_BELOW, DeviceChunkDecoder

    ctx, dev, queue = cl_setup
    job = SimpleNamespace(mode="torchvision", on_device=True, limits={})
    decoder = DeviceChunkDecoder(_OnDecoder(JpegDecoder(ctx, dev, chunk_bytes=64, rounds=3), queue), job,
                                 clock=lambda: 0.0, **options)
    decoder.ahead(STARVE_BELOW)
    return decoder, SimpleNamespace(set=decoder.finish)


def _chunks(sizes) -> list[list[bytes]]:
    """Chunks of JPEGs of mixed sizes (one a PNG, one not an image), chunk i of sizes[i] files."""
    chunks, n = [], 0
    for count in sizes:
        chunk = []
        for _ in range(count):
            w, h = 250 + 37 * (n % 5), 200 + 13 * (n % 7)
            chunk.append(corpus.pillow_jpeg(corpus.picture(w, h, n), subsampling=n % 3))
            n += 1
        chunks.append(chunk)
    png = io.BytesIO()
    Image.fromarray(corpus.picture(260, 240, 99)).save(png, "PNG")
    chunks[1][0], chunks[-1][-1] = png.getvalue(), b"not an image"
    return chunks


def _assert_chunk_answers(queue, chunk, answers):
    from vggserve.decoding.device.onmodel import DeviceImage

    assert len(answers) == len(chunk)
    for data, (item, problem) in zip(chunk, answers):
        if data == b"not an image":
            assert item is None and problem[1] == "ImageDecodeError"
        elif data.startswith(b"\x89PNG"):
            assert problem is None and not isinstance(item, DeviceImage)  # the CPU path's input
        else:
            assert problem is None and isinstance(item, DeviceImage), problem
            assert np.array_equal(_pixels(queue, item), np.asarray(decode_pixels(data)))


def test_chunks_waiting_together_are_decoded_as_groups_with_each_chunk_its_own_answers(cl_setup):
    """Seven chunks of 3, 1, 2, 4, 2, 3, 1 files started while groups are held back: groups of at most 4 chunks (the
    last one partial, as 7 is not a multiple of 4), and every chunk answers its own files in order."""
    decoder, gate = _chunk_decoder(cl_setup, group=4, group_bytes=1 << 30)
    chunks = _chunks([3, 1, 2, 4, 2, 3, 1])
    decodings = [decoder.start(chunk) for chunk in chunks]
    gate.set()
    answers = [d.result(timeout=120) for d in decodings]
    assert sorted(decoder.groups) == [3, 4]
    for chunk, got in zip(chunks, answers):
        _assert_chunk_answers(cl_setup[2], chunk, got)
    decoder.close()


def test_a_group_stops_at_its_byte_limit_and_takes_a_larger_first_chunk_alone(cl_setup):
    chunks = _chunks([2, 2, 2, 1])
    sizes = [sum(map(len, chunk)) for chunk in chunks]
    decoder, gate = _chunk_decoder(cl_setup, group=4, group_bytes=sizes[0] + sizes[1])  # 0 and 1 fit, not 2
    decodings = [decoder.start(chunk) for chunk in chunks]
    gate.set()
    answers = [d.result(timeout=120) for d in decodings]
    assert max(decoder.groups) == 2 and sum(decoder.groups) == 4  # without the limit: one group of 4
    for chunk, got in zip(chunks, answers):
        _assert_chunk_answers(cl_setup[2], chunk, got)
    decoder.close()


def test_a_lone_chunk_is_decoded_at_once_and_bad_group_settings_are_refused(cl_setup):
    from vggserve.decoding.device.chunks import DeviceChunkDecoder

    decoder, _ = _chunk_decoder(cl_setup)
    decoder.ahead(0)  # nothing decoded ahead of the device: a chunk is not held back (the starve rule)
    chunk = _chunks([2, 1])[0]
    _assert_chunk_answers(cl_setup[2], chunk, decoder.start(chunk).result(timeout=120))
    assert decoder.groups == [1] and decoder.due_counts == {"starve": 1}
    decoder.close()
    with pytest.raises(ValueError, match="decode group is 1 batch or more"):
        DeviceChunkDecoder(None, None, group=0)


def test_the_entropy_latency_benchmark_times_each_variant_and_their_exits_agree(monkeypatch, capsys):
    """benchmarks/entropy_latency.py on the test device: this tree's jpeg_sync and the local-tables variant (the
    corpus's files share Pillow's tables) time round 0 every way and leave the same exits; symbols are counted."""
    import re
    import sys
    from pathlib import Path

    from conftest import TEST_DEVICE

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import entropy_latency

    assert entropy_latency.main(["--device", TEST_DEVICE, "--files", "1", "--local-tables"]) == 0
    out = capsys.readouterr().out
    symbols = int(re.search(r"chunks of 128 bytes, (\d+) symbols a chunk", out).group(1))
    assert 50 < symbols < 1024  # 128 bytes of a q90 scan: a few bits a symbol
    rows = [line for line in out.splitlines() if "round 0, every chunk" in line]
    assert [r.split(":")[0] for r in rows] == ["this tree", "this tree, one symbol at a time", "local tables"]
    assert all(r.endswith("exits as the first: True") for r in rows), rows
    assert all(re.search(r"one chunk in all 32 lanes of a warp [0-9.]+ us", r) for r in rows), rows
    sys.modules.pop("entropy_latency", None)


def test_the_serial_latency_probe_runs_every_kernel_and_its_top_ups_read_the_same_bits(monkeypatch, capsys):
    """benchmarks/serial_latency.py on the test device: the six loops build and run one work-item each; the three
    that fill the bit buffer from the data (byte-wise, loaded a top-up ahead, as aligned words) end in the same
    state, so the faster ones time the same work."""
    import sys
    from pathlib import Path

    from conftest import TEST_DEVICE

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import serial_latency

    ns, wrote = serial_latency.main([TEST_DEVICE], counts=(10, 210), repeats=1)
    assert set(ns) == set(wrote) == set(serial_latency.KERNELS)
    assert wrote["k_ldg_refill"] == wrote["k_prefetch"] == wrote["k_word"]
    assert wrote["k_ldg"] == wrote["k_lds"]  # the same table, read from global or local memory
    out = capsys.readouterr().out
    assert all(name in out for name in serial_latency.KERNELS)
    sys.modules.pop("serial_latency", None)


BITS_PROBE = """
#include "jpeg_entropy.cl"
/* je_bits from bit p of d: before each step the next 32 bits (after a refill where fewer than 32 are loaded), then
 * the position after the step's n bits; pend last */
__kernel void je_bits_probe(__global const uchar *d, const int end, const int p0, __global const int *steps,
                            const int nsteps, __global uint *words, __global int *after)
{
    je_bits b;
    int p = p0;
    je_start(d, end, &b, p);
    for (int i = 0; i < nsteps; ++i) {
        if (b.avail < 32) je_fill(d, end, &b);
        words[i] = (uint)(b.acc >> 32);
        p = je_take(&b, p, steps[i]);
        after[i] = p;
    }
    after[nsteps] = b.pend;
}
"""


def bits_model(data: bytes, end: int, p0: int) -> tuple[list[int], list[int], int]:
    """The data bits from byte p0 // 8 with stuffing removed, each with its position (8 * byte + bit; past a stuffed
    pair, the byte after it), up to the first byte that is not data (a 0xFF not followed by 0x00, or the end); and
    that byte's bit position."""
    bits, where, q = [], [], p0 // 8
    while q < end and (data[q] != 0xFF or (q + 1 < end and data[q + 1] == 0)):
        for i in range(8):
            bits.append((data[q] >> (7 - i)) & 1)
            where.append(8 * q + i)
        q += 2 if data[q] == 0xFF else 1
    return bits, where, 8 * q


def test_bit_buffer_drops_stuffing_and_reads_zeros_past_the_data(cl_setup):
    """je_run's bit buffer against a Python model: byte strings dense with stuffed pairs, markers and ends at every
    offset, read from every bit of their first bytes in steps of 1 to 32 bits. The next 32 bits before each step are
    the data's with every stuffed 0x00 dropped and zeros past the data; the position after each step passes over a
    stuffed 0x00 exactly when the step consumes its 0xFF's last bit (never pointing into it), and counts bit for bit
    past the data's end; the end found is the first byte that is not data."""
    from vggserve.runtime.programs import kernels_dir

    ctx, dev, queue = cl_setup
    program = cl.Program(ctx, BITS_PROBE).build(options=f"-I {kernels_dir()}")
    probe = cl.Kernel(program, "je_bits_probe")
    rng = np.random.default_rng(11)
    mf = cl.mem_flags
    checked = 0
    for case in range(40):
        n = int(rng.integers(6, 60))
        raw = rng.choice(np.array([0x00, 0xFF, 0x12, 0xFE, 0x7F, 0x80, 0xA5], np.uint8), n).tolist()
        out = []
        for x in raw:  # every 0xFF stuffed, except a marker now and then
            out.append(x)
            if x == 0xFF:
                out.append(0xD0 if rng.random() < 0.1 else 0x00)
        data = bytes(out)
        end = int(rng.integers(max(1, len(data) - 4), len(data) + 1))
        padded = np.frombuffer(data + bytes(16), np.uint8)
        for p0 in range(0, 16):
            if p0 // 8 >= end or (p0 // 8 > 0 and data[p0 // 8 - 1] == 0xFF and data[p0 // 8] == 0):
                continue  # a position is never inside a stuffed pair
            steps = rng.integers(1, 33, 12).astype(np.int32)
            words, after = np.zeros(12, np.uint32), np.zeros(13, np.int32)
            bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=padded),
                    cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=steps),
                    cl.Buffer(ctx, mf.WRITE_ONLY, words.nbytes), cl.Buffer(ctx, mf.WRITE_ONLY, after.nbytes)]
            probe(queue, (1,), None, bufs[0], np.int32(end), np.int32(p0), bufs[1], np.int32(12), bufs[2], bufs[3])
            cl.enqueue_copy(queue, words, bufs[2])
            cl.enqueue_copy(queue, after, bufs[3])
            bits, where, pend = bits_model(data, end, p0)
            at = p0 % 8  # index into bits
            for i, step in enumerate(steps.tolist()):
                want = [bits[j] if j < len(bits) else 0 for j in range(at, at + 32)]
                assert int(words[i]) == int("".join(map(str, want)), 2), (case, p0, i)
                at += step
                assert after[i] == (where[at] if at < len(bits) else pend + at - len(bits)), (case, p0, i)
            assert after[12] in (pend, 2**31 - 1), (case, p0)  # found where the data ends, or not met yet
            if at >= len(bits):  # the steps read past the data: its end was met
                assert after[12] == pend, (case, p0)
            checked += 1
    assert checked > 200
