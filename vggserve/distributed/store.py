"""The batch job's output files, written only by rank 0, safe against a kill at any moment.

Files (OUTPUT is `--output`, e.g. results.jsonl):

    OUTPUT                    one line per classified image, exactly as `vggserve classify --json` prints it:
                              {"image": "<path>", "predictions": [{"index", "label", "probability"}, ...]}
    <OUTPUT stem>.errors.jsonl  one line per image that could not be read or decoded:
                              {"image": "<path>", "error": "<reason>", "type": "<exception class>"}

Guarantees:
- Lines are appended with one unbuffered write per chunk of images, and fsync'd at least every
  FSYNC_INTERVAL seconds and at the end. A killed job leaves only whole lines, except possibly a torn last
  line; opening the store again cuts that torn tail off (and says so), so no partial line survives a rerun.
- Every image is in at most one line of one of the two files: rank 0 is the only writer, it writes an image
  once, and a rerun skips every image already in either file (`done`).
- Errored images are not retried by a rerun, unless `retry_errors` is set: then the errors file is emptied
  (atomically) and those images are classified again.
- An exclusive flock on OUTPUT keeps a second job from writing the same files at the same time.
- Files that do not exist yet are created by `start()`, once the job has started (every rank has its model):
  a job that fails to set up (no such GPU, bad weights) leaves no empty files, or folders, behind. Opening
  checks only that they could be created.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

from ..errors import VggserveError

FSYNC_INTERVAL = 2.0


class OutputError(VggserveError):
    """The output files cannot be created, locked, read or written."""

    exit_code = 2


def errors_path_for(output: str | os.PathLike) -> Path:
    """`results.jsonl` -> `results.errors.jsonl` (the errors file sits beside the output)."""
    output = Path(output)
    return output.with_name(f"{output.stem}.errors.jsonl")


def result_line(image: str, predictions: list[dict]) -> str:
    """The JSON line (no newline) recorded for a classified image; same layout as `classify --json`."""
    return json.dumps({"image": image, "predictions": predictions})


def error_line(image: str, reason: str, kind: str) -> str:
    """The JSON line (no newline) recorded for an image that could not be classified."""
    return json.dumps({"image": image, "error": reason, "type": kind})


class JsonlAppender:
    """One append-only JSON-lines file: recovered on open (torn tail cut), then appended to in whole lines.

    A file that exists is opened (and locked) at once; one that does not is only checked to be creatable, and
    made by `create()`. `read=False`: do not look at an existing file now (`create()` opens whatever is there).
    """

    def __init__(self, path: Path, lock: bool = False, read: bool = True):
        self.path = path
        self.lock = lock
        self.discarded_bytes = 0
        self.images: list[str] = []
        self._fd = -1
        self._last_sync = time.monotonic()
        self._made_here = not (read and path.exists())
        if self._made_here:
            check_creatable(path)
        else:
            self._open(os.O_RDWR | os.O_APPEND)

    def create(self) -> None:
        """Open the file, creating it (and its folder) if needed; nothing to do if it is open already."""
        if self._fd >= 0:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the folder of {self.path}: {exc.strerror}") from exc
        self._open(os.O_RDWR | os.O_APPEND | os.O_CREAT)
        if self.images and self._made_here:
            self.close()
            raise OutputError(f"{self.path} was written by something else while this job started; run it again")

    def _open(self, flags: int) -> None:
        """Open (and lock) the file and read its whole lines; on failure nothing stays open or locked."""
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot open {self.path}: {exc.strerror}") from exc
        try:
            if self.lock:
                self._lock(fd)
            self.images = self._recover(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._last_sync = time.monotonic()

    def _lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise OutputError(f"{self.path} is being written by another batch job; wait for it to end") from exc
        except OSError:
            pass  # a file system without flock: go on unlocked

    def _recover(self, fd: int) -> list[str]:
        """Images of the whole lines; a torn last line (no newline at the end) is truncated away."""
        data = b""
        with open(fd, "rb", closefd=False) as handle:
            handle.seek(0)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self.discarded_bytes = len(data) - end
            os.ftruncate(fd, end)
            os.fsync(fd)
        images = []
        for number, raw in enumerate(data[:end].splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                images.append(record["image"])
            except (ValueError, KeyError, TypeError) as exc:
                raise OutputError(
                    f"{self.path}:{number}: not a batch output line; give another --output or repair the file"
                ) from exc
        return images

    def append(self, lines: list[str]) -> None:
        """Append whole lines with one write (looping only on short writes)."""
        if not lines:
            return
        data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            if time.monotonic() - self._last_sync >= FSYNC_INTERVAL:
                self.sync()
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror}") from exc

    def sync(self) -> None:
        os.fsync(self._fd)
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1


class ResultStore:
    """OUTPUT and its errors file. `done`: images already recorded (skipped by this run). Nothing is created or
    changed on disk before `start()` (an existing OUTPUT is locked, and a torn tail cut, at once)."""

    def __init__(self, output: str | os.PathLike, retry_errors: bool = False):
        self.output = Path(output)
        self.errors_path = errors_path_for(self.output)
        self.retry_errors = retry_errors
        if self.output.resolve() == self.errors_path.resolve():
            raise OutputError(f"--output {output}: name it differently from its errors file")
        self.results = JsonlAppender(self.output, lock=True)
        try:
            self.errors = JsonlAppender(self.errors_path, read=not retry_errors)
        except BaseException:
            self.results.close()
            raise
        self.done = set(self.results.images) | set(self.errors.images)
        self.result_count = len(set(self.results.images))
        self.error_count = len(set(self.errors.images))

    def start(self) -> None:
        """The job has started: create the files that do not exist yet; for `retry_errors`, empty the errors
        file (atomically) first."""
        self.results.create()
        if self.retry_errors:
            _empty_atomically(self.errors_path)
        self.errors.create()

    @property
    def discarded_bytes(self) -> int:
        """Bytes of torn last lines cut off when the files were opened."""
        return self.results.discarded_bytes + self.errors.discarded_bytes

    def write(self, results: list[str], errors: list[str]) -> None:
        """Record finished images: result lines and error lines (JSON, no newline)."""
        self.results.append(results)
        self.errors.append(errors)
        self.result_count += len(results)
        self.error_count += len(errors)

    def close(self) -> None:
        try:
            self.errors.close()
        finally:
            self.results.close()


def check_creatable(path: Path) -> None:
    """OutputError now, rather than after the models are loaded, when `path` could not be created: its nearest
    existing folder is not a folder, or takes no new entry. That is tried, not inferred from permissions (root may
    write anywhere, except in /proc, on a read-only mount, ...): a hidden file made and removed in `path`'s folder,
    or a hidden folder in the nearest existing one when `path`'s folder is still to be made."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot create {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot create {path}: no permission to write in {folder}")
    what = "a file" if folder == path.parent else "a folder"
    try:
        if folder == path.parent:
            fd, probe = tempfile.mkstemp(prefix=".vggserve-probe-", dir=folder)
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".vggserve-probe-", dir=folder))
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {folder} does not take {what} ({exc.strerror or exc}); "
                          f"choose a path in a folder you can write") from None


def _empty_atomically(path: Path) -> None:
    """Replace `path` by an empty file in one rename (a kill leaves either the old or the empty file)."""
    if not path.exists():
        return
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        raise OutputError(f"cannot reset {path} for --retry-errors: {exc.strerror}") from exc
