"""Long program compiles (runtime/buildprogress.py) shown on stderr while a command runs.

On a terminal: the notice, then one line rewritten in place each second ("3 done, 12 s, now kernels/..."), then
the summary in its place. Otherwise (a log, CI): the notice, a progress line every LOG_INTERVAL_S, the summary.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

from ..runtime.buildprogress import log as build_log

LOG_INTERVAL_S = 10.0
PREFIX = "vggserve: "


class BuildLogHandler(logging.Handler):
    """Writes the build progress records to `stream` (default: sys.stderr at the time of each record)."""

    def __init__(self, stream=None, clock=time.monotonic):
        super().__init__(logging.DEBUG)
        self.stream, self.clock = stream, clock
        self._line_open = False  # a tick line is on the terminal without its newline
        self._last_line = None  # clock() of the last line written, off a terminal

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream or sys.stderr
            stage, text = getattr(record, "build_stage", None), PREFIX + record.getMessage()
            if _is_terminal(stream):
                self._to_terminal(stream, stage, text)
            elif stage != "tick" or self._last_line is None or self.clock() - self._last_line >= LOG_INTERVAL_S:
                stream.write(text + "\n")
                self._last_line = self.clock()
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)

    def _to_terminal(self, stream, stage: str | None, text: str) -> None:
        if stage == "tick":
            stream.write("\r\x1b[K" + text)
            self._line_open = True
            return
        if self._line_open:
            stream.write("\r\x1b[K")
            self._line_open = False
        stream.write(text + "\n")


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def build_progress_on_stderr():
    """Show long compiles on stderr while the block runs (the records stay off the root logger meanwhile)."""
    handler = BuildLogHandler()
    level, propagate = build_log.level, build_log.propagate
    build_log.addHandler(handler)
    build_log.setLevel(logging.DEBUG)
    build_log.propagate = False
    try:
        yield handler
    finally:
        build_log.removeHandler(handler)
        build_log.setLevel(level)
        build_log.propagate = propagate
