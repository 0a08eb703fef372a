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
RECENT_S = 2.0  # throughput and p95 on the line cover the last this-many seconds


class ProgressTally:
    """Running counts of a level's records for the progress line, kept up to date at each tick without rescanning.

    A record is looked at on each tick until it has an outcome (set once, with its `done_s`), then counted once;
    only the successful answers of the last RECENT_S seconds are kept, for the throughput and p95.
    """

    def __init__(self, run: LevelRun):
        self.run = run
        self.records = 0  # of run.records, taken in so far
        self.dropped = 0
        self.done = 0  # answered or failed (dropped excluded)
        self.ok = 0
        self._open: list[RequestRecord] = []  # taken in, no outcome yet
        self._recent: list[tuple[float, float]] = []  # (done_s, latency_ms) of recent successes

    def update(self, now: float) -> list[float]:
        """Take in the records added and finished since the last update; the latencies of the successes that
        ended at `now - RECENT_S` or later (`now` never goes back between calls)."""
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
        self._open = still_open
        self._recent = [entry for entry in self._recent if entry[0] >= now - RECENT_S]
        return [latency for _, latency in self._recent]


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
    recent = tally.update(now)
    span = min(RECENT_S, max(elapsed, 1e-9))
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
