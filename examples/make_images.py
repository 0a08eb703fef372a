"""Generate the small sample pictures in examples/images/ used by the README demo.

    python examples/make_images.py [OUTPUT_FOLDER]

Writes three synthetic pictures of different sizes, modes and formats (no downloads, deterministic):
  sunset.jpg         320 x 240 RGB JPEG: sky gradient, sun, hills
  sticker.png        160 x 160 RGBA PNG: a ring and a star on a transparent background
  rings_gray.png     200 x 150 greyscale PNG: concentric rings
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

DEFAULT_FOLDER = Path(__file__).resolve().parent / "images"


def sunset(width: int = 320, height: int = 240) -> Image.Image:
    """RGB landscape: vertical sky gradient, a sun disc, two layers of rolling hills."""
    t = np.linspace(0.0, 1.0, height)[:, None, None]
    top, horizon = np.array([40, 60, 140]), np.array([250, 150, 80])
    sky = (top * (1 - t) + horizon * t) * np.ones((1, width, 1))
    img = Image.fromarray(sky.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.ellipse((190, 95, 250, 155), fill=(255, 220, 120))
    for base, amplitude, colour in ((165, 18, (70, 90, 60)), (190, 12, (35, 55, 35))):
        outline = [(x, base + amplitude * math.sin(x / 37.0 + base)) for x in range(0, width + 1, 4)]
        draw.polygon(outline + [(width, height), (0, height)], fill=colour)
    return img.filter(ImageFilter.SMOOTH)


def sticker(size: int = 160) -> Image.Image:
    """RGBA: a blue ring and a yellow star, transparent elsewhere (alpha is dropped when classified)."""
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    draw.ellipse((8, 8, size - 8, size - 8), outline=(30, 90, 200, 255), width=12)
    centre, outer, inner = size / 2, size * 0.32, size * 0.13
    points = [
        (centre + (outer if i % 2 == 0 else inner) * math.sin(i * math.pi / 5),
         centre - (outer if i % 2 == 0 else inner) * math.cos(i * math.pi / 5))
        for i in range(10)
    ]
    draw.polygon(points, fill=(250, 200, 40, 255))
    return img


def rings_gray(width: int = 200, height: int = 150) -> Image.Image:
    """Greyscale ("L"): concentric rings around an off-centre point."""
    y, x = np.mgrid[0:height, 0:width]
    radius = np.hypot(x - width * 0.4, y - height * 0.55)
    return Image.fromarray((127.5 + 127.5 * np.cos(radius / 6.0)).astype(np.uint8))


def write_samples(folder: Path = DEFAULT_FOLDER) -> list[Path]:
    """Write the three pictures into `folder` (created if needed); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    outputs = [
        (sunset(), "sunset.jpg", {"quality": 85}),
        (sticker(), "sticker.png", {"optimize": True}),
        (rings_gray(), "rings_gray.png", {"optimize": True}),
    ]
    paths = []
    for img, name, options in outputs:
        path = folder / name
        img.save(path, **options)
        paths.append(path)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_FOLDER
    for written in write_samples(target):
        print(f"{written}  {written.stat().st_size} bytes")
