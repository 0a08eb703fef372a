"""preprocess against an independent computation of torchvision's Resize(256)/CenterCrop(224)/ToTensor/Normalize.

The resize reference re-implements Pillow's 8-bit BILINEAR resampling (libImaging/Resample.c) in numpy:
separable triangle filter whose support grows with the downscale factor, coefficients normalised per output
pixel and rounded to fixed point with 22 fractional bits, horizontal pass then vertical pass (since Pillow 13
vertical first when the height shrinks by more than twice as many pixels as the width), each rounding and
clipping to 0..255, a pass skipped when its dimension is unchanged. (Pillow also limits the first pass to
the rows the second pass reads; the dense weight matrices here compute all rows, with the same result.)
It must equal Pillow bit for bit.
"""

import numpy as np
import PIL
import pytest
from PIL import Image

from image_corpus import GOOD, build_corpus
from vggserve.images import ImageTooLarge, open_image
from vggserve.preprocess import (
    CAFFE_MEAN_BGR,
    crop_pixels,
    load_and_preprocess,
    preprocess,
    preprocess_batch,
    resize_shorter,
)

PRECISION_BITS = 22
PILLOW_MAJOR = int(PIL.__version__.split(".")[0])
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# (width, height) of sources: tiny, exact, just over, portrait/landscape, extreme, odd
AWKWARD_SIZES = [
    (1, 1), (2, 1), (1, 3), (3, 5), (7, 3), (224, 224), (225, 300), (300, 225), (257, 1000), (1000, 257),
    (256, 256), (333, 517), (512, 384), (641, 479), (255, 257), (800, 255), (300, 2000), (40, 100),
]


def noise(width, height, seed=0):
    return np.random.default_rng(seed + width * 7919 + height).integers(0, 256, (height, width, 3), dtype=np.uint8)


# --- independent reference


def triangle_weights(in_size, out_size):
    """Dense (out_size, in_size) fixed-point weights of Pillow's bilinear filter for one axis."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    inverse = 1.0 / filterscale
    weights = np.zeros((out_size, in_size), dtype=np.int64)
    for out in range(out_size):  # one row of the coefficient table per output position
        centre = (out + 0.5) * scale
        first = max(int(centre - support + 0.5), 0)
        stop = min(int(centre + support + 0.5), in_size)
        taps = [max(0.0, 1.0 - abs((tap - centre + 0.5) * inverse)) for tap in range(first, stop)]
        total = 0.0
        for tap in taps:  # sequential sum, as the C loop does
            total += tap
        if total != 0.0:
            taps = [tap / total for tap in taps]
        fixed = [int(0.5 + tap * (1 << PRECISION_BITS)) for tap in taps]  # taps are never negative
        weights[out, first:stop] = fixed
    return weights


def resample_axis(pixels, weights, axis):
    """Apply fixed-point weights along `axis` of uint8 (H, W, C); round half up, clip to 0..255."""
    moved = np.moveaxis(pixels, axis, 0).astype(np.float64)  # integer sums stay exact below 2**53
    summed = np.tensordot(weights.astype(np.float64), moved, axes=(1, 0)).astype(np.int64)
    result = np.clip((summed + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.moveaxis(result, 0, axis)


def vertical_pass_first(in_width, in_height, width, height):
    """Pillow 13+ (python-pillow/Pillow#9549) resamples rows first when the height shrinks by more than
    twice as many pixels as the width; earlier versions always go horizontal first."""
    shrink_h, shrink_w = in_height - height, in_width - width
    return PILLOW_MAJOR >= 13 and shrink_h > 0 and shrink_h > 2 * shrink_w


def reference_resize(pixels, width, height):
    """Pillow's BILINEAR resize of uint8 (H, W, 3) to (height, width, 3)."""
    in_height, in_width = pixels.shape[:2]
    passes = [(1, in_width, width), (0, in_height, height)]
    if vertical_pass_first(in_width, in_height, width, height):
        passes.reverse()
    for axis, in_size, out_size in passes:
        if in_size != out_size:  # Pillow skips a pass whose dimension is unchanged
            pixels = resample_axis(pixels, triangle_weights(in_size, out_size), axis=axis)
    return pixels


def reference_geometry(pixels):
    """Shorter side to 256 (long side truncated), then the central 224 x 224, as uint8 (224, 224, 3)."""
    height, width = pixels.shape[:2]
    if width <= height:
        size = (256, int(256 * height / width))
    else:
        size = (int(256 * width / height), 256)
    if size != (width, height):
        pixels = reference_resize(pixels, *size)
    height, width = pixels.shape[:2]
    top = int(round((height - 224) / 2.0))  # Python rounds halves to even, as torchvision relies on
    left = int(round((width - 224) / 2.0))
    return pixels[top : top + 224, left : left + 224]


def reference_torchvision(pixels):
    """float64 reference of ToTensor + Normalize: (x / 255 - mean) / std, channels first."""
    x = reference_geometry(pixels).astype(np.float64).transpose(2, 0, 1) / 255.0
    return (x - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]


# --- the resize itself


@pytest.mark.parametrize("in_size, out_size", [(1, 256), (3, 256), (224, 256), (1000, 996), (517, 256), (7, 3)])
def test_reference_weights_are_normalised_to_one_in_fixed_point(in_size, out_size):
    sums = triangle_weights(in_size, out_size).sum(axis=1)
    assert np.all(np.abs(sums - (1 << PRECISION_BITS)) <= in_size)


@pytest.mark.parametrize("size", AWKWARD_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_pillow_bilinear_equals_the_reference_exactly(size):
    pixels = noise(*size)
    img = Image.fromarray(pixels)
    target = (256, int(256 * size[1] / size[0])) if size[0] <= size[1] else (int(256 * size[0] / size[1]), 256)
    expected = reference_resize(pixels, *target)
    got = np.asarray(img.resize(target, Image.BILINEAR))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "source, target",
    [((50, 50), (100, 10)), ((50, 50), (10, 100)), ((100, 90), (97, 80)), ((100, 90), (95, 80)), ((9, 9), (3, 3))],
)
def test_pillow_bilinear_pass_order_matches_the_reference(source, target):
    pixels = noise(*source, seed=9)
    got = np.asarray(Image.fromarray(pixels).resize(target, Image.BILINEAR))
    np.testing.assert_array_equal(got, reference_resize(pixels, *target))


@pytest.mark.parametrize(
    "size, expected",
    [((225, 300), (256, 341)), ((300, 225), (341, 256)), ((257, 1000), (256, 996)), ((1, 1), (256, 256)),
     ((224, 224), (256, 256)), ((3, 5), (256, 426)), ((641, 479), (342, 256))],
)
def test_shorter_side_becomes_256_and_long_side_is_truncated(size, expected):
    assert resize_shorter(Image.new("RGB", size)).size == expected


def test_image_already_at_256_is_not_resampled(monkeypatch):
    img = Image.fromarray(noise(256, 300))

    def no_resize(*args, **kwargs):
        raise AssertionError("resize called")

    monkeypatch.setattr(Image.Image, "resize", no_resize)
    assert resize_shorter(img) is img
    out = preprocess(img)
    x = np.asarray(img)[38:262, 16:240].astype(np.float64).transpose(2, 0, 1) / 255.0
    expected = (x - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-6)


# --- crop offsets and padding, checked on pictures whose pixels encode their own coordinates


def coordinates(width, height):
    """uint8 (H, W, 3): R = row % 256, G = column % 256, B = 16 * (row // 256) + column // 256."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([rows % 256, cols % 256, 16 * (rows // 256) + cols // 256], axis=-1).astype(np.uint8)


@pytest.mark.parametrize(
    "width, height, top, left",
    [
        (224, 224, 0, 0),
        (256, 256, 16, 16),
        (341, 256, 16, 58),  # (341 - 224) / 2 = 58.5 rounds to even: 58
        (343, 256, 16, 60),  # 59.5 -> 60
        (256, 345, 60, 16),  # 60.5 -> 60
        (225, 227, 2, 0),  # 0.5 -> 0, 1.5 -> 2
        (256, 996, 386, 16),
    ],
)
def test_centre_crop_offsets_round_halves_to_even_like_torchvision(width, height, top, left):
    crop = crop_pixels(Image.fromarray(coordinates(width, height)))
    assert crop.shape == (224, 224, 3)
    np.testing.assert_array_equal(crop, coordinates(width, height)[top : top + 224, left : left + 224])


@pytest.mark.parametrize(
    "width, height, pad_left, pad_top, top, left",
    [(100, 300, 62, 0, 38, 0), (101, 224, 61, 0, 0, 0), (300, 1, 0, 111, 0, 38), (5, 6, 109, 109, 0, 0)],
)
def test_smaller_than_crop_is_zero_padded_first_like_torchvision(width, height, pad_left, pad_top, top, left):
    source = coordinates(width, height) + 1  # no zero pixels in the source
    crop = crop_pixels(Image.fromarray(source))
    inside = crop[pad_top : pad_top + min(height, 224), pad_left : pad_left + min(width, 224)]
    np.testing.assert_array_equal(inside, source[top : top + min(height, 224), left : left + min(width, 224)])
    assert int(crop.astype(int).sum()) == int(inside.astype(int).sum())  # everything else is zero


# --- the whole transform


@pytest.mark.parametrize("size", AWKWARD_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_torchvision_mode_matches_the_reference_transform(size):
    pixels = noise(*size, seed=1)
    out = preprocess(Image.fromarray(pixels))
    assert out.shape == (3, 224, 224) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out, reference_torchvision(pixels), rtol=0, atol=2e-6)


def test_torchvision_mode_uses_torchvisions_float32_operation_order():
    # ToTensor divides the float32 pixels by 255; Normalize subtracts then divides by float32 mean and std
    pixels = noise(300, 260, seed=2)
    geometry = reference_geometry(pixels).transpose(2, 0, 1).astype(np.float32)
    mean = np.array(MEAN, dtype=np.float32)[:, None, None]
    std = np.array(STD, dtype=np.float32)[:, None, None]
    expected = (geometry / np.float32(255) - mean) / std
    np.testing.assert_array_equal(preprocess(Image.fromarray(pixels)), expected)


def test_every_8_bit_value_normalises_to_the_imagenet_formula():
    rows, cols = np.mgrid[0:256, 0:256]
    values = ((rows + cols) % 256).astype(np.uint8)  # the central crop holds all 256 values
    img = Image.fromarray(np.stack([values, 255 - values, values], axis=-1))  # 256 x 256: no resampling
    out = preprocess(img).astype(np.float64)
    crop = values[16:240, 16:240].astype(np.float64) / 255.0
    for channel, plane in enumerate([crop, 1.0 - crop, crop]):
        expected = (plane - MEAN[channel]) / STD[channel]
        np.testing.assert_allclose(out[channel], expected, rtol=0, atol=2e-6)
    assert len(np.unique(out[0])) == 256


def test_caffe_mode_is_bgr_minus_mean_in_0_255_without_std():
    pixels = noise(341, 256, seed=3)
    out = preprocess(Image.fromarray(pixels), mode="caffe")
    geometry = reference_geometry(pixels).astype(np.float32)
    expected = np.stack([geometry[..., 2] - np.float32(103.939), geometry[..., 1] - np.float32(116.779),
                         geometry[..., 0] - np.float32(123.68)])
    assert out.shape == (3, 224, 224) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)
    assert CAFFE_MEAN_BGR.ravel().tolist() == pytest.approx([103.939, 116.779, 123.68])


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "CMYK", "1"])
def test_any_mode_is_converted_to_rgb_before_the_transform(mode):
    rgb = Image.fromarray(noise(230, 240, seed=4))
    img = rgb.convert(mode)
    np.testing.assert_array_equal(preprocess(img), preprocess(img.convert("RGB")))


def test_extreme_aspect_ratio_is_centre_cropped_to_64_to_1_before_resizing():
    pixels = noise(3, 5000, seed=5)
    out = preprocess(Image.fromarray(pixels))
    kept = pixels[(5000 - 192) // 2 : (5000 - 192) // 2 + 192]  # 64 * 3 rows around the centre
    np.testing.assert_allclose(out, reference_torchvision(kept), rtol=0, atol=2e-6)
    assert preprocess(Image.new("RGB", (1, 10_000_000 // 10))).shape == (3, 224, 224)


def test_uint8_pixels_are_taken_and_other_arrays_refused_not_cast():
    """preprocess(np.asarray(img) / 255) made a black picture: float pixels were cast to uint8 without a word."""
    pixels = noise(230, 240, seed=7)
    np.testing.assert_array_equal(preprocess(pixels), preprocess(Image.fromarray(pixels)))
    for bad in (pixels / 255.0, pixels.astype(np.int16) * 2, pixels[..., 0], np.dstack([pixels, pixels[..., :1]]),
                pixels[:0]):
        with pytest.raises(ValueError, match=r"uint8 RGB of shape \(h, w, 3\)"):
            preprocess(bad)


def test_unknown_mode_is_a_value_error():
    with pytest.raises(ValueError, match="caffe"):
        preprocess(Image.new("RGB", (4, 4)), mode="tensorflow")


# --- batches and files


def test_batch_is_the_stack_of_single_images():
    images = [Image.fromarray(noise(w, h, seed=6)) for w, h in [(300, 225), (224, 224), (3, 5)]]
    batch = preprocess_batch(images, mode="caffe")
    assert batch.shape == (3, 3, 224, 224) and batch.dtype == np.float32
    for i, img in enumerate(images):
        np.testing.assert_array_equal(batch[i], preprocess(img, mode="caffe"))
    assert preprocess_batch([]).shape == (0, 3, 224, 224)


def test_load_and_preprocess_opens_then_preprocesses_every_corpus_picture(tmp_path):
    files = build_corpus(tmp_path)
    for name in GOOD:
        np.testing.assert_array_equal(load_and_preprocess(files[name]), preprocess(open_image(files[name])))
    data = files["rgba.png"].read_bytes()
    np.testing.assert_array_equal(load_and_preprocess(data, "caffe"), preprocess(open_image(data), "caffe"))
    with pytest.raises(ImageTooLarge):
        load_and_preprocess(data, max_pixels=100)
