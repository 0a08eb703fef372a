"""`write_json_atomically`: a JSON file that readers see whole or not at all."""

from __future__ import annotations

import json
import os

from .tempfiles import replace_atomically


def write_json_atomically(path: str | os.PathLike, data) -> None:
    """Write `data` as indented JSON (and a final newline) to a hidden temporary file of its own beside `path`,
    then rename it over `path`: a reader, or a kill at any moment, sees the old file or the new one, never half of
    one; two writers never share a temporary file, and a failed write leaves none behind."""
    replace_atomically(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
