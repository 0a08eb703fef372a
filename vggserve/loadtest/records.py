"""One row per request: when it was due, when it went out, how long it took and how it ended.

All times are seconds on the harness's monotonic clock, relative to the start of the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

WARMUP = "warmup"
MEASURE = "measure"

# outcomes: "ok" (2xx), "http" (any other status), and requests that got no status at all
OK = "ok"
HTTP_ERROR = "http"
CONN_ERROR = "conn_error"  # refused, reset, DNS, protocol errors
TIMEOUT = "timeout"  # no answer within --timeout
DROPPED = "dropped"  # open loop: not sent, the client-side in-flight cap was reached
CANCELLED = "cancelled"  # still in flight at Ctrl-C or when the drain limit ran out

CSV_FIELDS = (
    "index",
    "phase",
    "scheduled_s",
    "sent_s",
    "done_s",
    "latency_ms",
    "service_ms",
    "status",
    "outcome",
    "late",
    "image",
    "bytes",
)


@dataclass
class RequestRecord:
    """A request's life. `latency_ms` runs from `scheduled_s` (open loop) or `sent_s` (closed loop)."""

    index: int
    phase: str
    scheduled_s: float
    image: str
    bytes: int
    sent_s: float | None = None
    done_s: float | None = None
    status: int = 0
    outcome: str = ""
    late: bool = False

    @property
    def latency_ms(self) -> float | None:
        """Due time to answer: in the open loop this includes any wait before the request went out."""
        if self.done_s is None or self.sent_s is None:
            return None
        return (self.done_s - self.scheduled_s) * 1000.0

    @property
    def service_ms(self) -> float | None:
        """Send to answer: what a client that ignores its schedule would report."""
        if self.done_s is None or self.sent_s is None:
            return None
        return (self.done_s - self.sent_s) * 1000.0

    @property
    def is_ok(self) -> bool:
        return self.outcome == OK

    @property
    def error_key(self) -> str | None:
        """'429', '504', 'conn_error', 'dropped', ... or None for a success: the key errors are counted by."""
        if self.outcome == OK:
            return None
        if self.outcome == HTTP_ERROR:
            return str(self.status)
        return self.outcome

    def csv_row(self) -> dict:
        """The record as one row of the per-level CSV (milliseconds to 0.001, seconds to 1 us)."""

        def rounded(value, digits):
            return "" if value is None else round(value, digits)

        return {
            "index": self.index,
            "phase": self.phase,
            "scheduled_s": rounded(self.scheduled_s, 6),
            "sent_s": rounded(self.sent_s, 6),
            "done_s": rounded(self.done_s, 6),
            "latency_ms": rounded(self.latency_ms, 3),
            "service_ms": rounded(self.service_ms, 3),
            "status": self.status,
            "outcome": self.outcome,
            "late": int(self.late),
            "image": self.image,
            "bytes": self.bytes,
        }
