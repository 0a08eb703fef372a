"""open_image and to_rgb: accepted inputs decode as documented, rejected inputs raise the right ImageError."""

import io
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from image_corpus import BAD, EXPECTED, GOOD, build_corpus, png_with_header_size
from vggserve.errors import ImageError
from vggserve.images import (
    ALLOWED_FORMATS,
    ImageDecodeError,
    ImageTooLarge,
    UnsupportedImageFormat,
    open_image,
    to_rgb,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


def pixels(img):
    return np.asarray(img)


# --- the corpus: every good file opens to RGB of the documented size, every bad one fails as documented


@pytest.mark.parametrize("name", GOOD)
def test_good_corpus_file_opens_as_rgb_of_expected_size(corpus, name):
    img = open_image(corpus[name])
    assert img.mode == "RGB"
    assert img.size == EXPECTED[name].size
    with Image.open(corpus[name]) as raw:
        assert raw.mode == EXPECTED[name].source_mode


@pytest.mark.parametrize("name", BAD)
def test_bad_corpus_file_raises_documented_error_naming_the_file(corpus, name):
    expect = EXPECTED[name]
    with pytest.raises(expect.error) as info:
        open_image(corpus[name])
    err = info.value
    assert isinstance(err, ImageError)
    assert (err.http_status, err.code) == (expect.http_status, expect.code)
    assert expect.message in str(err)
    assert name in str(err)


@pytest.mark.parametrize("name", BAD)
def test_bad_corpus_bytes_raise_the_same_error_class_as_the_file(corpus, name):
    with pytest.raises(EXPECTED[name].error):
        open_image(corpus[name].read_bytes())


def test_error_classes_carry_http_status_and_code():
    assert (UnsupportedImageFormat.http_status, UnsupportedImageFormat.code) == (415, "unsupported_media_type")
    assert (ImageTooLarge.http_status, ImageTooLarge.code) == (413, "image_too_large")
    assert (ImageDecodeError.http_status, ImageDecodeError.code) == (400, "invalid_image")
    for cls in (UnsupportedImageFormat, ImageTooLarge, ImageDecodeError):
        assert issubclass(cls, ImageError)


def test_messages_say_what_was_wrong(corpus):
    with pytest.raises(ImageDecodeError, match="empty body"):
        open_image(b"")
    with pytest.raises(ImageDecodeError, match="^input is truncated: its image data ends early$"):
        open_image(corpus["truncated.jpg"].read_bytes())
    with pytest.raises(UnsupportedImageFormat, match=r"format 'PDF' of input is not accepted; accepted: .*JPEG"):
        open_image(corpus["document.pdf"].read_bytes())


# --- sources


@pytest.mark.parametrize("kind", ["str", "path", "bytes", "bytearray", "memoryview", "bytesio", "file"])
def test_every_source_kind_gives_the_same_pixels(corpus, kind):
    path = corpus["rgba.png"]
    data = path.read_bytes()
    if kind == "file":
        with open(path, "rb") as fp:
            img = open_image(fp)
    else:
        source = {
            "str": str(path),
            "path": path,
            "bytes": data,
            "bytearray": bytearray(data),
            "memoryview": memoryview(data),
            "bytesio": io.BytesIO(data),
        }[kind]
        img = open_image(source)
    with Image.open(path) as raw:
        expected = raw.convert("RGB")
    np.testing.assert_array_equal(pixels(img), pixels(expected))


def test_missing_file_is_a_decode_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-picture.jpg"
    with pytest.raises(ImageDecodeError, match="no-such-picture.jpg.*does not exist"):
        open_image(missing)


def test_directory_is_a_decode_error_naming_it(tmp_path):
    with pytest.raises(ImageDecodeError, match="is a directory"):
        open_image(tmp_path)


def _fifo_fed_with(path, data: bytes):
    """A named pipe at `path` and a thread that writes `data` into it once a reader opens it."""
    import threading

    os.mkfifo(path)

    def feed():
        with open(path, "wb") as pipe:  # blocks until the reader opens the pipe
            pipe.write(data)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return writer


def test_a_pipe_path_is_read_to_its_end_not_called_empty(corpus, tmp_path):
    """`vggserve classify /dev/stdin` and `<(curl ...)` name pipes, whose size is 0: they were refused as empty."""
    data = corpus["exif_orientation_6.jpg"].read_bytes()
    writer = _fifo_fed_with(tmp_path / "pipe.jpg", data)
    img = open_image(tmp_path / "pipe.jpg")
    writer.join()
    np.testing.assert_array_equal(pixels(img), pixels(open_image(data)))


def test_an_empty_pipe_is_empty(tmp_path):
    writer = _fifo_fed_with(tmp_path / "pipe.jpg", b"")
    with pytest.raises(ImageDecodeError, match="pipe.jpg' is empty"):
        open_image(tmp_path / "pipe.jpg")
    writer.join()


def test_non_image_source_types_are_type_errors(tmp_path):
    with pytest.raises(TypeError):
        open_image(12345)
    text = tmp_path / "a.txt"
    text.write_text("hello")
    with open(text) as fp, pytest.raises(TypeError, match="binary"):
        open_image(fp)


def test_messages_name_the_file_or_input_in_lower_case_wherever_they_stand(tmp_path, corpus):
    """"File 'x' is not a recognised image" stood beside "file 'x' does not exist": one spelling now."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    cases = [(tmp_path / "missing.jpg", "file '"), (notes, "file '"), (b"not an image", "input "),
             (corpus["truncated.png"], "file '"), (corpus["truncated.jpg"].read_bytes(), "input ")]
    for source, start in cases:
        with pytest.raises(ImageError) as info:
            open_image(source)
        assert str(info.value).startswith(start), str(info.value)


def test_a_truncated_image_says_so_once():
    """It said "image data is truncated: input ends early (image file is truncated (19 bytes not processed))"."""
    from image_corpus import _noise_jpeg_truncated

    with pytest.raises(ImageDecodeError) as info:
        open_image(_noise_jpeg_truncated())
    assert str(info.value) == "input is truncated: its image data ends early"


def test_a_text_mode_file_of_image_bytes_is_a_type_error_not_a_unicode_error(tmp_path):
    """open_image(open("cat.jpg")) raised UnicodeDecodeError from reading the JPEG as text; docs say TypeError."""
    jpeg = tmp_path / "cat.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9")
    with open(jpeg, encoding="utf-8") as fp, pytest.raises(TypeError, match=r"binary file object \(opened with 'rb'\)"):
        open_image(fp)


@pytest.mark.parametrize("name", ["animated.gif", "rgb.tiff", "photo.webp"])
def test_returned_image_is_loaded_and_holds_no_file_handle(corpus, name):
    path = corpus[name]  # multi-frame images and unconverted RGB ones would normally keep their file open
    img = open_image(path)
    fd_dir = "/proc/self/fd"
    if os.path.isdir(fd_dir):
        targets = set()
        for fd in os.listdir(fd_dir):
            try:
                targets.add(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                pass
        assert str(path) not in targets
    path.rename(path.with_suffix(".moved"))  # pixel access needs no file
    try:
        assert np.asarray(img).shape == (img.height, img.width, 3)
    finally:
        path.with_suffix(".moved").rename(path)


# --- limits and formats


def test_pixel_limit_is_inclusive_and_checked_before_decoding(corpus):
    path = corpus["gray.png"]  # 48 x 32 = 1536 pixels
    assert open_image(path, max_pixels=1536).size == (48, 32)
    with pytest.raises(ImageTooLarge, match="48x32 = 1536 pixels, more than the limit of 1535"):
        open_image(path, max_pixels=1535)


def test_bomb_header_is_rejected_without_warnings_or_decoding():
    data = png_with_header_size(10000, 10000)  # over Pillow's warning threshold, under its error threshold
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImageTooLarge, match="too large|more than the limit"):
            open_image(data)
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]


@pytest.mark.parametrize("size", [(10000, 10000), (30000, 30000)])  # Pillow's warning band, and past its error
def test_bomb_message_quotes_one_limit_ours(size):
    """Pillow's guard fires before ours on these headers; its message quoted its own threshold (89478485) beside
    ours, two different limits in one line."""
    with pytest.raises(ImageTooLarge) as info:
        open_image(png_with_header_size(*size), max_pixels=20_000_000)
    assert str(info.value) == f"input is {size[0] * size[1]} pixels, more than the limit of 20000000 pixels"


def test_our_limit_decides_between_pillows_warning_and_error_thresholds(monkeypatch, corpus):
    # Pillow warns above MAX_IMAGE_PIXELS and refuses above twice that; lower it so small files show both
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    path = corpus["gray.png"]  # 1536 pixels: in Pillow's warning band
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_image(path, max_pixels=5000).size == (48, 32)
        with pytest.raises(ImageTooLarge):
            open_image(path, max_pixels=1200)
        with pytest.raises(ImageTooLarge, match=r"2500 pixels, more than the limit of 2000 pixels that Pillow"):
            open_image(png_with_header_size(50, 50), max_pixels=5000)


def test_caller_can_narrow_the_format_allowlist(corpus):
    with pytest.raises(UnsupportedImageFormat, match="format 'JPEG' of .* accepted: PNG$"):
        open_image(corpus["cmyk.jpg"], formats=("png",))
    assert open_image(corpus["gray.png"], formats=["PNG"]).mode == "RGB"


@pytest.mark.parametrize("forbidden", ["SVG", "pdf", "EPS"])
def test_vector_and_document_formats_can_never_be_allowed(forbidden):
    with pytest.raises(ValueError, match="never"):
        open_image(b"anything", formats=ALLOWED_FORMATS + (forbidden,))


def test_warning_filters_are_restored_after_concurrent_use(corpus):
    before = list(warnings.filters)
    names = GOOD + BAD

    def attempt(name):
        try:
            return open_image(corpus[name]).size
        except ImageError as exc:
            return type(exc)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, names * 2))
    assert warnings.filters == before
    for name, result in zip(names * 2, results):
        expect = EXPECTED[name]
        assert result == (expect.size if name in GOOD else expect.error)


# --- orientation, frames, modes


def _red_corner(img, corner, block=6):
    arr = pixels(img).astype(int)
    rows = slice(0, block) if corner.startswith("top") else slice(-block, None)
    cols = slice(0, block) if corner.endswith("left") else slice(-block, None)
    patch = arr[rows, cols].reshape(-1, 3).mean(axis=0)
    return patch[0] > 200 and patch[1] < 60 and patch[2] < 60


@pytest.mark.parametrize("name, numpy_turns", [("exif_orientation_6.jpg", -1), ("exif_orientation_8.jpg", 1)])
def test_exif_orientation_rotates_size_and_pixels(corpus, name, numpy_turns):
    img = open_image(corpus[name])
    with Image.open(corpus[name]) as raw:
        stored = pixels(raw.convert("RGB"))
    assert stored.shape[:2] == (32, 48)
    np.testing.assert_array_equal(pixels(img), np.rot90(stored, k=numpy_turns))
    assert _red_corner(img, EXPECTED[name].marker)


@pytest.mark.parametrize("name", [n for n in GOOD if EXPECTED[n].source_mode in ("RGB", "P", "RGBA", "CMYK")])
def test_colour_pictures_keep_the_red_marker_at_the_documented_corner(corpus, name):
    assert _red_corner(open_image(corpus[name]), EXPECTED[name].marker)


def test_animated_gif_gives_its_first_frame(corpus):
    path = corpus["animated.gif"]
    with Image.open(path) as raw:
        assert raw.n_frames == 3
        first = pixels(raw.convert("RGB"))
    img = open_image(path)
    np.testing.assert_array_equal(pixels(img), first)
    assert tuple(pixels(img)[0, 0]) == (255, 0, 0)
    assert tuple(pixels(img)[30, 30]) not in ((0, 255, 0), (0, 0, 255))


def test_16_bit_png_is_scaled_to_8_bits_not_clipped(corpus):
    with Image.open(corpus["gray16.png"]) as raw:
        raw16 = pixels(raw).astype(np.float64)
    img = open_image(corpus["gray16.png"])
    got = pixels(img)
    expected = np.rint(raw16 * 255.0 / 65535.0).astype(np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(got[..., channel], expected)
    assert raw16.max() == 65535 and got.max() == 255
    assert got[15, 1, 0] == 4  # 1028 / 257 = 4: clipping would have given 255


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I;16L"])
def test_16_bit_modes_map_full_range_to_0_255(mode):
    values = np.array([[0, 128, 129, 257, 32767, 65535]], dtype=np.uint16)
    byte_order = ">" if mode == "I;16B" else "<"
    img = Image.frombytes(mode, (6, 1), values.astype(byte_order + "u2").tobytes())
    assert pixels(to_rgb(img))[0, :, 0].tolist() == [0, 0, 1, 1, 127, 255]


def test_32_bit_integer_image_is_scaled_by_its_bit_depth():
    small = Image.fromarray(np.array([[0, 257, 65535]], dtype=np.int32))  # fits 16 bits: / 257
    assert small.mode == "I"
    assert pixels(to_rgb(small))[0, :, 0].tolist() == [0, 1, 255]
    large = Image.fromarray(np.array([[-5, 0, 2**30, 2**31 - 1]], dtype=np.int32))
    assert pixels(to_rgb(large))[0, :, 0].tolist() == [0, 0, 128, 255]


def test_float_image_in_unit_range_is_scaled_and_otherwise_clipped():
    unit = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32))
    assert pixels(to_rgb(unit))[0, :, 0].tolist() == [0, 128, 255]
    wide = Image.fromarray(np.array([[-3.0, 0.4, 100.6, 300.0, np.nan]], dtype=np.float32))
    assert pixels(to_rgb(wide))[0, :, 0].tolist() == [0, 0, 101, 255, 0]


def _palette_image(transparency):
    img = Image.new("P", (2, 2))
    img.putdata([0, 1, 2, 3])
    img.putpalette([10, 20, 30, 40, 50, 60, 70, 80, 90, 200, 210, 220] + [0] * (256 * 3 - 12))
    if transparency is not None:
        img.info["transparency"] = transparency
    return img


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: Image.new("L", (3, 2), 77), id="L"),
        pytest.param(lambda: Image.new("LA", (3, 2), (77, 9)), id="LA"),
        pytest.param(lambda: Image.new("1", (3, 2), 1), id="1"),
        pytest.param(lambda: Image.new("RGBA", (3, 2), (10, 20, 30, 0)), id="RGBA-transparent"),
        pytest.param(lambda: Image.new("RGBA", (3, 2), (10, 20, 30, 128)), id="RGBA-half"),
        pytest.param(lambda: Image.new("CMYK", (3, 2), (10, 20, 30, 40)), id="CMYK"),
        pytest.param(lambda: Image.new("YCbCr", (3, 2), (100, 120, 140)), id="YCbCr"),
        pytest.param(lambda: _palette_image(None), id="P"),
        pytest.param(lambda: _palette_image(1), id="P-transparent-index"),
        pytest.param(lambda: _palette_image(bytes([255, 0, 128, 255])), id="P-transparent-table"),
    ],
)
def test_8_bit_modes_convert_exactly_like_pillow_convert_rgb_without_warnings(make):
    img = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = pixels(img.convert("RGB"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = to_rgb(img)
    assert got.mode == "RGB"
    np.testing.assert_array_equal(pixels(got), expected)


def test_alpha_is_dropped_not_composited():
    img = Image.new("RGBA", (1, 1), (10, 20, 30, 0))
    assert to_rgb(img).getpixel((0, 0)) == (10, 20, 30)


def test_palette_with_transparency_uses_palette_colours():
    img = _palette_image(bytes([0, 0, 0, 0]))
    assert pixels(to_rgb(img)).reshape(-1, 3).tolist() == [[10, 20, 30], [40, 50, 60], [70, 80, 90], [200, 210, 220]]


def test_rgb_image_is_returned_unchanged():
    img = Image.new("RGB", (2, 2), (1, 2, 3))
    assert to_rgb(img) is img


def test_unusual_modes_still_become_rgb():
    for mode in ("PA", "La", "RGBa", "RGBX", "HSV", "LAB"):
        assert to_rgb(Image.new(mode, (2, 2))).mode == "RGB"


@pytest.mark.parametrize("fmt, suffix", [("WEBP", "webp"), ("TIFF", "tiff"), ("PNG", "png"), ("GIF", "gif")])
def test_multi_frame_files_give_their_first_frame_and_stay_usable(tmp_path, fmt, suffix):
    frames = [Image.new("RGB", (20, 10), colour) for colour in ((250, 0, 0), (0, 250, 0), (0, 0, 250))]
    path = tmp_path / f"frames.{suffix}"
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], **({"lossless": True} if fmt == "WEBP" else {}))
    with Image.open(path) as raw:
        assert getattr(raw, "n_frames", 1) == 3
    img = open_image(path)
    assert img.mode == "RGB" and img.size == (20, 10)
    red, green, blue = pixels(img).reshape(-1, 3).mean(axis=0)
    assert red > 240 and green < 10 and blue < 10
    buffer = io.BytesIO()
    img.resize((4, 2)).save(buffer, "PNG")  # still usable after its file was closed


def test_read_source_reads_a_file_whole_in_few_calls_and_refuses_as_the_stream_path_does(tmp_path, monkeypatch):
    """read_source (the batch job's and the device decoder's read of every input) takes a regular file in one
    read, a file that changed since its stat to its end, and leaves everything else (missing, a directory, empty, a
    pipe) to the stream path, with its messages."""
    import vggserve.images as images

    small, large = tmp_path / "small.jpg", tmp_path / "large.jpg"
    small.write_bytes(b"\xff\xd8" + bytes(range(256)) * 40)
    large.write_bytes(os.urandom(3 * (1 << 20) + 17))
    reads = []
    real_read = os.read
    monkeypatch.setattr(images.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    for path in (small, large):
        reads.clear()
        assert images.read_source(path) == (path.read_bytes(), f"file '{path}'")
        assert reads == [path.stat().st_size + 1]  # one read: no second call to find the end
        assert images.read_source(str(path))[0] == path.read_bytes()
    # a file larger than its stat said (it grew) is read to its end; one read returning less than asked continues
    real_stat = os.stat

    def stale(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        return os.stat_result((st.st_mode, *st[1:6], st.st_size // 2, *st[7:]))

    monkeypatch.setattr(images.os, "stat", stale)
    assert images.read_source(large)[0] == large.read_bytes()
    monkeypatch.setattr(images.os, "stat", real_stat)
    monkeypatch.setattr(images.os, "read", lambda fd, n: real_read(fd, min(n, 1000)))
    assert images.read_source(large)[0] == large.read_bytes()
    monkeypatch.setattr(images.os, "read", real_read)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    for path, message in ((tmp_path / "missing.jpg", "missing.jpg' does not exist"),
                          (tmp_path, "is a directory, not an image"), (empty, "empty.jpg' is empty")):
        with pytest.raises(ImageDecodeError, match=message):
            images.read_source(path)
    writer = _fifo_fed_with(tmp_path / "pipe.jpg", small.read_bytes())
    assert images.read_source(tmp_path / "pipe.jpg")[0] == small.read_bytes()
    writer.join()
