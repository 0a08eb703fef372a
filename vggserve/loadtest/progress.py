"""The live progress line on stderr: one line rewritten in place on a terminal, a line every few seconds
otherwise (so CI logs stay short)."""

from __future__ import annotations

import asyncio
import sys
from itertools import chain

from .loops import LevelRun
from .records import DROPPED, MEASURE, RequestRecord
from .stats import percentiles

TTY_INTERVAL_S = 0.5
LOG_INTERVAL_S = 5.0
RECENT_S = 2.0  # throughput and p95 on the line cover this many seconds up to the last success (see recent_start)


class ProgressTally:
    """Running counts of a level's records for the progress line, kept up to date at each tick without rescanning.

    A record is looked at on each tick until it has an outcome (set once, with its `done_s`), then counted once;
    only the successful answers since `recent_start` are kept, for the throughput and p95.
    """

    def __init__(self, run: LevelRun):
        self.run = run
        self.records = 0  # of run.records, taken in so far
        self.dropped = 0
        self.done = 0  # answered or failed (dropped excluded)
        self.ok = 0
        self._open: list[RequestRecord] = []  # taken in, no outcome yet
        self._recent: list[tuple[float, float]] = []  # (done_s, latency_ms) of recent successes
        self._last_ok_s: float | None = None  # the latest done_s of a success

    def recent_start(self, now: float) -> float:
        """Where the line's window starts: RECENT_S before the last success (before `now` while there is none),
        and not before the level's start. While a slow batch runs, no answer comes for a while: the window then
        still holds the last answers, and the rate falls gradually with the wait instead of dropping to 0."""
        latest = now if self._last_ok_s is None else self._last_ok_s
        return max(self.run.start_s, latest - RECENT_S)

    def update(self, now: float) -> tuple[list[float], float]:
        """Take in the records added and finished since the last update; (the latencies of the successes that
        ended at `recent_start` or later, the seconds from there to `now`). `now` never goes back between calls,
        and `recent_start` never goes back either, so what is dropped here is never wanted again."""
        fresh = self.run.records[self.records:]
        self.records += len(fresh)
        still_open = []
        for record in chain(self._open, fresh):
            if not record.outcome:
                still_open.append(record)
            elif record.outcome == DROPPED:
                self.dropped += 1
            else:
                self.done += 1
                if record.is_ok:
                    self.ok += 1
                    if record.done_s is not None:
                        self._recent.append((record.done_s, record.latency_ms))
                        self._last_ok_s = max(record.done_s, self._last_ok_s or record.done_s)
        self._open = still_open
        start = self.recent_start(now)
        self._recent = [entry for entry in self._recent if entry[0] >= start]
        return [latency for _, latency in self._recent], max(now - start, 1e-9)


def progress_text(tally: ProgressTally, total_s: float) -> str:
    """'[c16 measure] 4.0/12.0 s  sent 812  ok 800  err 12  in-flight 16  41.5 img/s  p95 380.2 ms'."""
    run = tally.run
    now = run.now()
    elapsed = now - run.start_s
    if elapsed < run.plan.warmup_s:
        phase = "warmup"
    elif elapsed < run.plan.warmup_s + run.plan.duration_s:
        phase = MEASURE
    else:
        phase = "drain"  # no new requests; waiting for the answers still in flight
    recent, span = tally.update(now)
    p95 = percentiles(recent)["latency_p95_ms"]
    p95_text = "-" if p95 is None else f"{p95:.1f} ms"
    dropped_text = f"  dropped {tally.dropped}" if tally.dropped else ""
    waiting_text = f"  waiting {run.waiting}" if run.waiting else ""
    return (f"[{run.plan.label} {phase}] {min(elapsed, total_s):.1f}/{total_s:.1f} s  "
            f"sent {tally.records - tally.dropped}  ok {tally.ok}  err {tally.done - tally.ok}{dropped_text}  "
            f"in-flight {run.inflight}{waiting_text}  {len(recent) / span:.1f} img/s  p95 {p95_text}")


async def show_progress(run: LevelRun, stream=None) -> None:
    """Print the progress line until cancelled; the caller cancels it when the level ends."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    total_s = run.plan.warmup_s + run.plan.duration_s
    tally = ProgressTally(run)
    try:
        while True:
            await asyncio.sleep(TTY_INTERVAL_S if tty else LOG_INTERVAL_S)
            text = progress_text(tally, total_s)
            stream.write(f"\r\x1b[K{text}" if tty else text + "\n")
            stream.flush()
    except asyncio.CancelledError:
        if tty:
            stream.write("\r\x1b[K")
            stream.flush()
        raise
