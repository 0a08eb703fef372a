"""Input files read back to back into one reused buffer, for callers that read many files per call and are done with
their bytes when the call returns (the batch job's device decoder: a group's JPEGs are parsed, uploaded and
decoded before the next group is read).

    arena = FileArena()
    datas = arena.read(paths)          # per path: a uint8 view of its bytes, in the arena
    ...                                # use them; the next arena.read may overwrite them

Reading a 76 KB JPEG into a fresh `bytes` object (`images.read_source`) costs its page faults as well as the copy:
54.4 against 19.6 us of CPU per file with 256 files held at a time, on a 2-core VM (`benchmarks/read_files.py`;
BENCHMARKS.md, thirty-second session). Here the memory is written once and reused, so each file costs the system
calls and the kernel's copy alone.

An arena may take its buffers from an `allocate(nbytes)` of the caller's (the device decoder's is pinned memory its
uploads read straight from, with no copy into staging first: `decoding.device.decode_inputs`). Whoever enqueues a
command that reads the arena's memory appends its event to `reads`; the next `read` waits for those first.

What is read is what `images.read_source` reads: every byte of a regular, non-empty file. Any other source (bytes,
a file object, a path that is missing, empty, a directory or a pipe, a file that grew while it was read) is left to
`read_source` itself, whose bytes or ImageError then stand in that place.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import ImageError
from .images import open_regular_file, read_source

# the first buffer's bytes; it grows to what one call needs (twice the last size, at least), then stays
FIRST_BYTES = 8 << 20
# the largest buffer kept for the next call: a decode group is 24 MB of files at most (decoding.groups.GROUP_BYTES);
# a file larger than this (a huge image, or some other large file among the inputs) is read into a buffer of its
# own, freed with its view
KEEP_BYTES = 64 << 20


def _plain(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


class FileArena:
    """One thread's buffer for reading files; not for use by two threads at once."""

    def __init__(self, first_bytes: int = FIRST_BYTES, allocate=None):
        """allocate(nbytes): a uint8 array of nbytes for the arena's kept buffers (default: np.empty); a buffer
        larger than KEEP_BYTES, used for one call, is always np.empty's."""
        self._allocate = allocate or _plain
        self._first = max(1, first_bytes)
        self._buf = None  # made by the first read
        self.reads: list = []  # events (anything with wait()) of commands still reading the arena's memory

    @property
    def nbytes(self) -> int:
        return 0 if self._buf is None else self._buf.nbytes

    @property
    def buffer(self) -> np.ndarray | None:
        """The buffer the last `read` ended in (its views lie in it unless it was outgrown meanwhile)."""
        return self._buf

    def read(self, sources) -> list:
        """Per source: a uint8 array (a view of the arena) of a regular file's bytes, or what `read_source` answers
        for any other source (its bytes), or the ImageError it raises. The views stay valid until the next `read`
        (a buffer outgrown meanwhile stays alive as long as a view of it does)."""
        while self.reads:  # the memory is written again only once what reads it is done
            self.reads.pop().wait()
        if self._buf is None:
            self._buf = self._allocate(self._first)
        out, buf, at = [], self._buf, 0
        for source in sources:
            got = None
            if isinstance(source, (str, os.PathLike)):
                got, buf, at = self._read_file(source, buf, at)
            if got is None:
                try:
                    got = read_source(source)[0]
                except ImageError as exc:  # answered in its place, as decode_inputs answers it
                    got = exc
            out.append(got)
        return out

    def _grown(self, buf: np.ndarray, need: int) -> np.ndarray:
        """A fresh buffer of at least `need` bytes, the arena's from now on unless it is larger than KEEP_BYTES;
        views of the old one keep it alive."""
        size = max(need, min(2 * buf.nbytes, KEEP_BYTES), self._first)
        if size > KEEP_BYTES:
            return _plain(size)
        self._buf = self._allocate(size)
        return self._buf

    def _read_file(self, path, buf: np.ndarray, at: int):
        """(view or None, buffer, next free byte): a regular, non-empty file (`images.open_regular_file`) that reads
        as stat saw it, else None. Four system calls, as read_source's: stat, open, one read, close."""
        opened = open_regular_file(path)
        if opened is None:
            return None, buf, at
        fd, size = opened
        try:
            if buf.nbytes - at < size + 1:
                buf, at = self._grown(buf, size + 1), 0
            view = memoryview(buf)[at:at + size + 1]  # one byte more: a file that grew since stat shows it
            got = 0
            while got < size:  # one read, unless the system returns less
                n = os.readv(fd, [view[got:]])
                if n == 0:
                    break
                got += n
            if got == 0 or got > size:  # emptied, or grown: read_source reads it as it is now
                return None, buf, at
            return buf[at:at + got], buf, at + got
        except OSError:
            return None, buf, at
        finally:
            os.close(fd)
