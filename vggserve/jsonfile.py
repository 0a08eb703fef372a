"""`write_json_atomically`: a JSON file that readers see whole or not at all."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomically(path: str | os.PathLike, data) -> None:
    """Write `data` as indented JSON (and a final newline) to a hidden temporary file beside `path`, then rename
    it over `path`: a reader, or a kill at any moment, sees the old file or the new one, never half of one."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)
