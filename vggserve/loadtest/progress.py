"""The live progress line on stderr: one line rewritten in place on a terminal, a line every few seconds
otherwise (so CI logs stay short)."""

from __future__ import annotations

import asyncio
import sys

from .loops import LevelRun
from .records import DROPPED, MEASURE
from .stats import percentiles

TTY_INTERVAL_S = 0.5
LOG_INTERVAL_S = 5.0
RECENT_S = 2.0  # throughput and p95 on the line cover the last this-many seconds


def progress_text(run: LevelRun, total_s: float) -> str:
    """'[c16 measure] 4.0/12.0 s  sent 812  ok 800  err 12  in-flight 16  41.5 img/s  p95 380.2 ms'."""
    now = run.now()
    elapsed = now - run.start_s
    if elapsed < run.plan.warmup_s:
        phase = "warmup"
    elif elapsed < run.plan.warmup_s + run.plan.duration_s:
        phase = MEASURE
    else:
        phase = "drain"  # no new requests; waiting for the answers still in flight
    records = list(run.records)
    dropped = sum(r.outcome == DROPPED for r in records)
    done = [r for r in records if r.outcome and r.outcome != DROPPED]
    ok = [r for r in done if r.is_ok]
    recent = [r.latency_ms for r in ok if r.done_s is not None and r.done_s >= now - RECENT_S]
    span = min(RECENT_S, max(elapsed, 1e-9))
    p95 = percentiles(recent)["latency_p95_ms"]
    p95_text = "-" if p95 is None else f"{p95:.1f} ms"
    dropped_text = f"  dropped {dropped}" if dropped else ""
    waiting_text = f"  waiting {run.waiting}" if run.waiting else ""
    return (f"[{run.plan.label} {phase}] {min(elapsed, total_s):.1f}/{total_s:.1f} s  "
            f"sent {len(records) - dropped}  ok {len(ok)}  err {len(done) - len(ok)}{dropped_text}  "
            f"in-flight {run.inflight}{waiting_text}  {len(recent) / span:.1f} img/s  p95 {p95_text}")


async def show_progress(run: LevelRun, stream=None) -> None:
    """Print the progress line until cancelled; the caller cancels it when the level ends."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    total_s = run.plan.warmup_s + run.plan.duration_s
    try:
        while True:
            await asyncio.sleep(TTY_INTERVAL_S if tty else LOG_INTERVAL_S)
            text = progress_text(run, total_s)
            stream.write(f"\r\x1b[K{text}" if tty else text + "\n")
            stream.flush()
    except asyncio.CancelledError:
        if tty:
            stream.write("\r\x1b[K")
            stream.flush()
        raise
