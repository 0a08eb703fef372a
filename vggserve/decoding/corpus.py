"""Photo-like images for measuring and checking decoders: the realistic mix that `benchmarks/decoders.py` times and
the tests compare with Pillow, and photo crops for the fast mode's agreement (`benchmarks/decode_agreement.py`).

    files = write_mix("corpus/")              # {name: path}: the mix below, written once
    files = write_mix("corpus/", scale=0.25)  # the same kinds at a quarter of the sides (tests)

The mix, as users send it: ImageNet-sized JPEGs (500x375, 4:2:0), phone thumbnails of 1 to 2 MP, 12 MP phone photos
(one stored sideways with EXIF orientation 6), a progressive JPEG, 4:4:4 and 4:2:2 JPEGs, a PNG, a gray and a CMYK
JPEG. Pictures are synthetic but photo-like for a JPEG coder: smooth shading, hard edges, texture and sensor noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageDraw, ImageFilter


@dataclass(frozen=True)
class Kind:
    """One kind of file in the mix: `count` files of `size` (width, height) saved as `fmt` with `options`."""

    name: str
    size: tuple[int, int]
    fmt: str = "JPEG"
    options: dict = field(default_factory=dict)
    count: int = 1
    mode: str = "RGB"
    orientation: int = 1


MIX = (
    Kind("imagenet", (500, 375), options=dict(quality=90), count=4),
    Kind("imagenet_portrait", (375, 500), options=dict(quality=90)),
    Kind("thumb_1mp", (1280, 960), options=dict(quality=85)),
    Kind("thumb_2mp", (1600, 1200), options=dict(quality=85)),
    Kind("photo_12mp", (4000, 3000), options=dict(quality=92)),
    Kind("photo_12mp_sideways", (4000, 3000), options=dict(quality=92), orientation=6),
    Kind("progressive", (1024, 768), options=dict(quality=90, progressive=True)),
    Kind("subsampling_444", (500, 375), options=dict(quality=95, subsampling=0)),
    Kind("subsampling_422", (640, 480), options=dict(quality=90, subsampling=1)),
    Kind("png", (500, 375), fmt="PNG"),
    Kind("gray", (500, 375), options=dict(quality=90), mode="L"),
    Kind("cmyk", (500, 375), options=dict(quality=90), mode="CMYK"),
)


def photo_like(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB picture with what JPEG coders meet in photos: smooth shading, hard-edged shapes, texture, noise."""
    rng = np.random.default_rng(seed)
    shading = Image.fromarray(rng.integers(20, 235, (6, 8, 3), dtype=np.uint8)).resize((width, height),
                                                                                      Image.BICUBIC)
    draw = ImageDraw.Draw(shading)
    for _ in range(12):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        w, h = rng.uniform(0.05, 0.4) * width, rng.uniform(0.05, 0.4) * height
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = [x0, y0, x0 + w, y0 + h]
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    shading = shading.filter(ImageFilter.GaussianBlur(radius=max(1.0, width / 1500)))
    pixels = np.asarray(shading).astype(np.int16)
    # fine texture and grain: a 500x375 JPEG at quality 90 is ~75 KB, a 12 MP one at 92 ~4.5 MB, as photos are
    texture = rng.integers(-14, 15, (height // 2 + 1, width // 2 + 1, 1), dtype=np.int16)
    pixels += np.repeat(np.repeat(texture, 2, axis=0), 2, axis=1)[:height, :width]
    pixels += rng.integers(-6, 7, pixels.shape, dtype=np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def write_mix(folder: str | Path, scale: float = 1.0, kinds=MIX) -> dict[str, Path]:
    """Write every kind of the mix into `folder` (sides times `scale`), reusing files already there when they have
    the size asked for (a folder written at another scale is rewritten). Each file is written whole or not at all,
    so a run killed while writing leaves no truncated file for the next one to reuse."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for k, kind in enumerate(kinds):
        width, height = (max(16, round(side * scale)) for side in kind.size)
        stored = (height, width) if kind.orientation != 1 else (width, height)  # see _save
        for i in range(kind.count):
            name = f"{kind.name}_{i}.{'png' if kind.fmt == 'PNG' else 'jpg'}" if kind.count > 1 else \
                f"{kind.name}.{'png' if kind.fmt == 'PNG' else 'jpg'}"
            path = folder / name
            if _stored_size(path) != stored:
                _save(photo_like(width, height, seed=100 * k + i), kind, path)
            files[name] = path
    return files


def _stored_size(path: Path) -> tuple[int, int] | None:
    """(width, height) in the file's header; None when there is no readable image file."""
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, ValueError):
        return None


def _save(image: Image.Image, kind: Kind, path: Path) -> None:
    """Save under a temporary name beside `path`, then rename it into place."""
    from ..tempfiles import temporary_beside

    options = dict(kind.options)
    if kind.orientation != 1:  # stored turned; the EXIF tag says how to show it
        image = image.transpose(Image.Transpose.ROTATE_90)
        exif = Image.Exif()
        exif[0x0112] = kind.orientation
        options["exif"] = exif
    fd, temporary = temporary_beside(path)
    try:
        with open(fd, "wb") as handle:
            image.convert(kind.mode).save(handle, kind.fmt, **options)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def camera_exif(orientation: int = 1, endian: str = "<") -> Image.Exif:
    """EXIF as a phone camera writes it (`endian` "<" for an II header, ">" for MM): IFD0 with the make, model,
    orientation, resolution, software and date, an Exif IFD of exposure tags with a maker note, and a GPS IFD."""
    exif = Image.Exif()
    exif.endian = endian
    exif.update({0x010F: "Phone Maker", 0x0110: "Phone 12 Pro", 0x0112: orientation, 0x011A: 72.0, 0x011B: 72.0,
                 0x0128: 2, 0x0131: "17.4.1", 0x0132: "2024:05:01 12:34:56", 0x0213: 1})
    exif.get_ifd(ExifTags.IFD.Exif).update({
        0x829A: 1 / 120, 0x829D: 1.8, 0x8822: 2, 0x8827: 64, 0x9000: b"0232", 0x9003: "2024:05:01 12:34:56",
        0x9004: "2024:05:01 12:34:56", 0x9201: 6.9, 0x9202: 1.7, 0x9204: 0.0, 0x9207: 5, 0x9209: 16,
        0x920A: 4.2, 0x927C: bytes(range(256)) * 8, 0xA001: 65535, 0xA002: 4000, 0xA003: 3000, 0xA402: 0,
        0xA403: 0, 0xA405: 26, 0xA406: 0, 0xA432: (1.54, 6.0, 1.6, 2.4), 0xA433: "Phone Maker",
        0xA434: "Phone 12 Pro back camera"})
    exif.get_ifd(ExifTags.IFD.GPSInfo).update({1: "N", 2: (51.0, 30.0, 12.5), 3: "W", 4: (0.0, 7.0, 39.9),
                                               5: b"\x00", 6: 24.5})
    return exif


def sample_photos() -> list[np.ndarray]:
    """Real photos shipped with scikit-image and scikit-learn, where those are installed (RGB uint8 arrays)."""
    photos = []
    try:
        from skimage import data

        for name in ("astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "hubble_deep_field", "retina"):
            try:
                image = getattr(data, name)()
            except Exception:  # a picture the installed version does not ship, or must download
                continue
            if image.ndim == 3 and image.shape[2] >= 3:
                photos.append(np.ascontiguousarray(image[:, :, :3]))
    except ImportError:
        pass
    try:
        from sklearn.datasets import load_sample_images

        photos.extend(np.asarray(image) for image in load_sample_images().images)
    except ImportError:
        pass
    return photos


def photo_crops(photos: list[np.ndarray], count: int, seed: int = 0, sides=(1200, 1600, 2000, 3000, 4000)):
    """`count` (name, PIL image) pairs: random crops (half to all of each side) of `photos`, upscaled to phone-photo
    sizes (longer side from `sides`) with a little grain, so that the fast mode has something to scale down."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        photo = photos[index % len(photos)]
        height, width = photo.shape[:2]
        h, w = int(height * rng.uniform(0.5, 1.0)), int(width * rng.uniform(0.5, 1.0))
        top, left = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1)
        crop = Image.fromarray(photo[top:top + h, left:left + w])
        longer = int(rng.choice(sides))
        size = (longer, max(1, round(longer * h / w))) if w >= h else (max(1, round(longer * w / h)), longer)
        big = np.asarray(crop.resize(size, Image.BICUBIC)).astype(np.int16)
        big += rng.integers(-2, 3, big.shape, dtype=np.int16)
        yield f"crop{index:04d}.jpg", Image.fromarray(np.clip(big, 0, 255).astype(np.uint8))
