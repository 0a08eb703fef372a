"""Where weights are looked for when none are given: `find_weights()`.

Order: an explicit path; else ``$VGGSERVE_WEIGHTS``; else the first fetched file found in
``<cache>/weights/`` (cache = ``$VGGSERVE_CACHE_DIR`` or ``platformdirs.user_cache_dir("vggserve")``), in the
order of `provenance.SOURCES`. Never falls back to random weights.
"""

import os
from pathlib import Path

import platformdirs

from ..errors import WeightsNotFound
from .provenance import SOURCES

ENV_WEIGHTS = "VGGSERVE_WEIGHTS"
ENV_CACHE = "VGGSERVE_CACHE_DIR"

HOW_TO_GET = (
    "run `vggserve weights fetch`, pass --weights PATH, set VGGSERVE_WEIGHTS=PATH, "
    "or make random test weights with `vggserve weights init --seed 0 --output PATH`"
)


def cache_dir() -> Path:
    """vggserve's cache folder: $VGGSERVE_CACHE_DIR, else the platform's user cache dir for "vggserve"."""
    override = os.environ.get(ENV_CACHE)
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("vggserve"))


def weights_dir() -> Path:
    """The folder `vggserve weights fetch` fills and `find_weights` searches: <cache>/weights."""
    return cache_dir() / "weights"


def find_weights(explicit=None) -> Path:
    """The weights file to use (see the module docstring for the order); WeightsNotFound names what is missing."""
    if explicit is not None and str(explicit) != "":
        path = Path(explicit).expanduser()
        return named_file(path, f"weights file {path} does not exist", f"weights file {path} is a folder")
    env = os.environ.get(ENV_WEIGHTS)
    if env:
        path = Path(env).expanduser()
        return named_file(path, f"{ENV_WEIGHTS}={env}: no such weights file", f"{ENV_WEIGHTS}={env} is a folder")
    folder = weights_dir()
    for source in SOURCES:
        candidate = folder / source.local_name
        if candidate.is_file():  # follows links; a dangling link (cleaned hub cache) is skipped
            return candidate
    raise WeightsNotFound(f"no VGG16 weights found (looked in {folder}): {HOW_TO_GET}")


def named_file(path: Path, missing: str, folder: str) -> Path:
    """`path` when it is a file, else WeightsNotFound: `missing`, or for a folder `folder` and what to do."""
    if path.is_dir():
        raise WeightsNotFound(f"{folder}, not a weights file; name the file in it")
    if not path.is_file():
        raise WeightsNotFound(missing)
    return path
