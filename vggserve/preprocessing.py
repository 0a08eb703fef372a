"""VGG16 input preprocessing: PIL image -> float32 array (3, 224, 224), channels first.

`mode="torchvision"` reproduces torchvision's evaluation transform for PIL images exactly:
Resize(256) with Pillow BILINEAR, CenterCrop(224), ToTensor (x / 255 in float32), Normalize
((x - mean) / std in float32), channels R, G, B.
`mode="caffe"` is what Keras' VGG16 weights expect: the same geometry, channels B, G, R, values in 0..255
minus the per-channel ImageNet mean (103.939, 116.779, 123.68), no std scaling.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from PIL import Image

from .images import Source, open_image, to_rgb

RESIZE_SHORTER = 256
CROP_SIZE = 224
#: Long side / short side above which the source is first centre-cropped (bounds the resized image size).
MAX_ASPECT_RATIO = 64
MODES = ("torchvision", "caffe")

TORCHVISION_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
TORCHVISION_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
#: Caffe/Keras means in B, G, R order, 0..255 scale.
CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], dtype=np.float32).reshape(3, 1, 1)


def preprocess(img: Image.Image, mode: str = "torchvision") -> np.ndarray:
    """A PIL image in any mode (or uint8 RGB pixels (h, w, 3); another array is a ValueError) -> C-contiguous float32
    array (3, 224, 224) for VGG16 in `mode`."""
    check_mode(mode)
    return normalize_pixels(center_crop(img), mode)


def center_crop(img: Image.Image | np.ndarray) -> np.ndarray:
    """The geometry of `preprocess` alone: RGB, aspect bound, Resize(256), CenterCrop(224) -> uint8 (224, 224, 3).

    `img`: a PIL image, or uint8 RGB pixels (h, w, 3) as `vggserve.decoding` decodes them.
    A view into the resized image's pixels (not necessarily contiguous); `np.ascontiguousarray` it to ship it.
    """
    return crop_pixels(resize_shorter(limit_aspect_ratio(as_image(img)), RESIZE_SHORTER), CROP_SIZE)


def as_image(img: Image.Image | np.ndarray) -> Image.Image:
    """An RGB PIL image of `img`: converted by `to_rgb`, or made from uint8 RGB pixels (h, w, 3) (a copy)."""
    if isinstance(img, np.ndarray):
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or 0 in img.shape:
            # a cast would turn float pixels in 0..1 into black and wrap values past 255, without a word
            raise ValueError(f"pixels must be uint8 RGB of shape (h, w, 3), got {img.dtype} {img.shape}; "
                             "a PIL image in any mode works too")
        return Image.fromarray(np.ascontiguousarray(img), "RGB")
    return to_rgb(img)


def normalize_pixels(pixels: np.ndarray, mode: str = "torchvision") -> np.ndarray:
    """The arithmetic of `preprocess` alone: uint8 (224, 224, 3) RGB from `center_crop` -> float32 (3, 224, 224).

    `preprocess(img, mode)` is exactly `normalize_pixels(center_crop(img), mode)`, bit for bit.
    """
    check_mode(mode)
    chw = pixels.transpose(2, 0, 1).astype(np.float32, order="C")
    if mode == "torchvision":
        chw /= np.float32(255)
        chw -= TORCHVISION_MEAN
        chw /= TORCHVISION_STD
        return chw
    bgr = np.ascontiguousarray(chw[::-1])
    bgr -= CAFFE_MEAN_BGR
    return bgr


def preprocess_batch(images: Iterable[Image.Image], mode: str = "torchvision") -> np.ndarray:
    """Preprocess each image and stack them: float32 (N, 3, 224, 224); N may be 0."""
    check_mode(mode)
    arrays = [preprocess(img, mode) for img in images]
    if not arrays:
        return np.empty((0, 3, CROP_SIZE, CROP_SIZE), dtype=np.float32)
    return np.stack(arrays)


def load_and_preprocess(source: Source, mode: str = "torchvision", **limits) -> np.ndarray:
    """`open_image(source, **limits)` then `preprocess`: float32 (3, 224, 224). Raises `ImageError`s."""
    check_mode(mode)
    return preprocess(open_image(source, **limits), mode)


def limit_aspect_ratio(img: Image.Image, max_ratio: int = MAX_ASPECT_RATIO) -> Image.Image:
    """Centre-crop the long side to `max_ratio` times the short side; `img` itself when within the ratio.

    torchvision would resize a 1 x 100000 image to 256 x 25600000 before cropping; this bound keeps the
    intermediate image under 256 x 16384. Only such extreme images differ (slightly) from torchvision.
    """
    box = aspect_box(*img.size, max_ratio)
    return img if box is None else img.crop(box)


def aspect_box(width: int, height: int, max_ratio: int = MAX_ASPECT_RATIO) -> tuple[int, int, int, int] | None:
    """(left, top, right, bottom) of `limit_aspect_ratio`'s centre crop; None when the image is within the ratio."""
    short = min(width, height)
    if max(width, height) <= max_ratio * short:
        return None
    keep = max_ratio * short
    if width > height:
        left = (width - keep) // 2
        return left, 0, left + keep, height
    top = (height - keep) // 2
    return 0, top, width, top + keep


def resized_size(width: int, height: int, shorter: int = RESIZE_SHORTER) -> tuple[int, int]:
    """(width, height) after torchvision's Resize(shorter): long side int(shorter * long / short)."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def resize_shorter(img: Image.Image, shorter: int = RESIZE_SHORTER) -> Image.Image:
    """Resize so the shorter side is `shorter`, Pillow BILINEAR; the same object if already that size."""
    size = resized_size(img.width, img.height, shorter)
    if size == img.size:
        return img
    return img.resize(size, Image.BILINEAR)


def crop_offsets(height: int, width: int, crop: int = CROP_SIZE) -> tuple[int, int]:
    """(top, left) of torchvision's CenterCrop on an image at least `crop` in both sides."""
    return int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0))


def crop_pixels(img: Image.Image, crop: int = CROP_SIZE) -> np.ndarray:
    """torchvision CenterCrop(crop) of an RGB image as uint8 (crop, crop, 3).

    A side shorter than `crop` is first zero-padded by (crop - side) // 2 before and the rest after, as
    torchvision's center_crop does; the offsets are then computed on the padded size.
    """
    pixels = np.asarray(img, dtype=np.uint8)
    height, width = pixels.shape[:2]
    if height < crop or width < crop:
        pad_h, pad_w = max(crop - height, 0), max(crop - width, 0)
        pixels = np.pad(pixels, ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
        height, width = pixels.shape[:2]
    top, left = crop_offsets(height, width, crop)
    return pixels[top : top + crop, left : left + crop]


def check_mode(mode: str) -> None:
    """ValueError unless `mode` is one of MODES (for callers that validate before decoding, as `preprocess` does)."""
    if mode not in MODES:
        raise ValueError(f"unknown preprocessing mode {mode!r}; choose one of {', '.join(MODES)}")


