"""The images of a batch job, from `--input`: a directory, a list file, or one image file.

- Directory: every file below it (recursively, not following directory symlinks) whose extension is in
  IMAGE_EXTENSIONS (any case), as `os.path.join(DIR, relative path)`, sorted by relative path.
- List file: one path per line; blank lines and lines starting with '#' are skipped; a relative path is taken
  relative to the list file's directory (so a list works from any working directory). Paths need not exist:
  missing files are reported in the errors file like unreadable ones.
- A file with an image extension: that one image.

A directory with no image file below it, or a list naming none, is an InputError (a mistyped --input should not
look like a finished job).

Each path is the image's identity in results.jsonl (its "image" field) and for resuming: rerun with the same
`--input` spelling. Duplicate paths are kept once, at their first place.
"""

from __future__ import annotations

import os

from ..errors import VggserveError

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".pnm"}
)


class InputError(VggserveError):
    """--input names nothing usable."""

    exit_code = 2


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_inputs(source: str) -> list[str]:
    """The image paths named by `source` (directory, list file or image file), without duplicates; never empty."""
    source = os.fspath(source)
    if os.path.isdir(source):
        paths = scan_directory(source)
        if not paths:
            raise InputError(f"--input {source}: no image files below it (extensions "
                             f"{' '.join(sorted(IMAGE_EXTENSIONS))}, any case)")
    elif os.path.isfile(source):
        paths = [source] if is_image_name(source) else read_list_file(source)
        if not paths:
            raise InputError(f"--input {source}: the list file names no images")
    else:
        raise InputError(f"--input {source}: no such directory or file")
    return list(dict.fromkeys(paths))


def scan_directory(root: str) -> list[str]:
    """Image files below `root`, sorted by their path relative to it."""
    found = []
    for directory, subdirs, files in os.walk(root, onerror=_raise_walk_error):
        subdirs.sort()
        found.extend(os.path.join(directory, name) for name in files if is_image_name(name))
    found.sort(key=lambda path: os.path.relpath(path, root))
    return found


def _raise_walk_error(error: OSError) -> None:
    raise InputError(f"--input: cannot list {error.filename}: {error.strerror}")


def read_list_file(list_path: str) -> list[str]:
    """Paths listed one per line in `list_path`; relative ones resolved against the list's directory."""
    try:
        with open(list_path, encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise InputError(f"--input {list_path}: cannot read list file: {exc.strerror}") from exc
    base = os.path.dirname(list_path)
    paths = []
    for line in lines:
        entry = line.strip()
        if entry and not entry.startswith("#"):
            paths.append(entry if os.path.isabs(entry) else os.path.join(base, entry))
    return paths
