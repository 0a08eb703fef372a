"""examples/make_images.py writes the README sample pictures; the committed copies open and preprocess."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vggserve.images import open_image
from vggserve.preprocess import load_and_preprocess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SAMPLES = {"sunset.jpg": ("JPEG", "RGB", (320, 240)), "sticker.png": ("PNG", "RGBA", (160, 160)),
           "rings_gray.png": ("PNG", "L", (200, 150))}


def load_script():
    spec = importlib.util.spec_from_file_location("make_images", EXAMPLES / "make_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_writes_three_small_pictures_of_different_formats_and_modes(tmp_path):
    paths = load_script().write_samples(tmp_path)
    assert sorted(p.name for p in paths) == sorted(SAMPLES)
    assert sum(p.stat().st_size for p in paths) < 64_000
    for path in paths:
        with Image.open(path) as img:
            assert (img.format, img.mode, img.size) == SAMPLES[path.name]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_committed_sample_matches_a_fresh_run_and_preprocesses(tmp_path, name):
    fresh = {p.name: p for p in load_script().write_samples(tmp_path)}[name]
    committed = EXAMPLES / "images" / name
    a, b = np.asarray(open_image(committed), dtype=int), np.asarray(open_image(fresh), dtype=int)
    assert np.abs(a - b).max() <= 2  # JPEG encoders of other libjpeg versions may differ slightly
    out = load_and_preprocess(committed)
    assert out.shape == (3, 224, 224) and np.isfinite(out).all()
