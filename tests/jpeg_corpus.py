"""JPEG files for the device decoder's tests: Pillow's encoder at every subsampling and quality, optimised tables,
restart markers, gray, awkward sizes; libjpeg-turbo's cjpeg (Debian's libjpeg-turbo-progs, which install.sh
installs for the tests) for the subsamplings Pillow cannot write (4:4:0, 4:1:1), restart intervals in MCUs, and
the arithmetic-coded and progressive files that must fall back to the CPU path."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
from PIL import Image


def picture(width: int, height: int, seed: int = 0, gray: bool = False) -> np.ndarray:
    """Smooth gradients with noise and a hard edge: every coefficient band gets work."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 7 + y) % 256, (y * 5 + 40) % 256, ((x + y) * 3) % 256], axis=-1).astype(np.int64)
    base[:, width // 2:] = 255 - base[:, width // 2:]
    pixels = np.clip(base + rng.integers(-50, 50, base.shape), 0, 255).astype(np.uint8)
    return pixels[..., 0] if gray else pixels


def pillow_jpeg(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def pillow_corpus() -> list[tuple[str, bytes]]:
    """(name, file) pairs, all baseline Huffman JPEGs the device decodes."""
    files = []
    sizes = [(1, 1), (2, 3), (7, 5), (8, 8), (16, 16), (17, 9), (33, 31), (63, 65), (97, 41)]
    for w, h in sizes:
        for sub in (0, 1, 2):
            files.append((f"{w}x{h} s{sub}", pillow_jpeg(picture(w, h, w * h), quality=90, subsampling=sub)))
        files.append((f"{w}x{h} gray", pillow_jpeg(picture(w, h, w + h, gray=True), quality=85)))
    small = picture(23, 19, 5)
    for q in range(1, 101):
        sub = q % 3
        files.append((f"q{q} s{sub}", pillow_jpeg(small, quality=q, subsampling=sub)))
    for sub in (0, 1, 2):
        files.append((f"optimize s{sub}", pillow_jpeg(picture(45, 37, sub), quality=80, subsampling=sub,
                                                      optimize=True)))
        files.append((f"restart blocks s{sub}", pillow_jpeg(picture(45, 37, sub), subsampling=sub,
                                                            restart_marker_blocks=3)))
        files.append((f"restart rows s{sub}", pillow_jpeg(picture(70, 50, sub), subsampling=sub,
                                                          restart_marker_rows=1)))
    files.append(("gray optimize restart", pillow_jpeg(picture(41, 27, 9, gray=True), optimize=True,
                                                      restart_marker_blocks=5)))
    return files


def has_cjpeg() -> bool:
    return shutil.which("cjpeg") is not None


def cjpeg(pixels: np.ndarray, *args: str) -> bytes:
    """cjpeg's encoding of uint8 RGB or gray pixels with `args`."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PPM")
    return subprocess.run(["cjpeg", *args], input=buffer.getvalue(), capture_output=True, check=True).stdout


CJPEG_DEVICE = [("440", ["-sample", "1x2"]), ("411", ["-sample", "4x1"]), ("422", ["-sample", "2x1"]),
                ("420", ["-sample", "2x2"]), ("444", ["-sample", "1x1"]), ("420 restart 2", ["-restart", "2B"]),
                ("440 restart", ["-sample", "1x2", "-restart", "1"]), ("411 q20 optimize",
                                                                    ["-sample", "4x1", "-quality", "20", "-optimize"]),
                ("421", ["-sample", "4x2"]), ("baseline q100", ["-quality", "100"])]
CJPEG_CPU = [("arithmetic", ["-arithmetic"]), ("progressive", ["-progressive"]),
             ("12-bit", ["-precision", "12"]), ("lossless", ["-lossless", "1"])]


def cjpeg_corpus(device: bool) -> list[tuple[str, bytes]]:
    """Files for the device (device=True) or for the CPU fallback, at awkward sizes; encoder options this cjpeg
    lacks are left out."""
    out = []
    for w, h in [(1, 1), (5, 3), (19, 11), (37, 29), (64, 48)]:
        pixels = picture(w, h, w * 31 + h)
        for name, args in (CJPEG_DEVICE if device else CJPEG_CPU):
            try:
                out.append((f"cjpeg {name} {w}x{h}", cjpeg(pixels, *args)))
            except subprocess.CalledProcessError:
                continue
        if device:
            out.append((f"cjpeg gray {w}x{h}", cjpeg(picture(w, h, 3, gray=True), "-grayscale")))
    return out
