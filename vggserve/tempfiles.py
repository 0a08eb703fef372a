"""`temporary_beside(target)`: the hidden temporary file a writer fills and then renames over `target`.

`tempfile.mkstemp` creates its file with mode 0600 whatever the umask, so a file written through it and renamed
into place stays readable by its owner alone: weights made by an administrator could not be read by the
service's user. The file made here gets what any new file gets, 0666 less the umask (0644 under the usual 022).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

_ATTEMPTS = 100


def temporary_beside(target: str | os.PathLike, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd open for writing, path) of a new empty file `.<target name>.<random><suffix>` in `target`'s folder."""
    target = Path(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        path = target.with_name(f".{target.name}.{secrets.token_hex(4)}{suffix}")
        try:
            return os.open(path, flags, 0o666), str(path)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target} after {_ATTEMPTS} attempts")


def replace_atomically(target: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `target`, then rename it over `target`: readers see the old file or
    the new one, never half of one. On failure (OSError, raised) the temporary file is removed."""
    fd, tmp = temporary_beside(target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
