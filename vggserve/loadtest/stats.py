"""The numbers of a level: throughput, latency percentiles, errors by kind, and a per-second time series.

Definitions (docs/loadtest.md repeats them for users):
- requests: measured requests (warm-up excluded); in the open loop, every request the schedule made due in
  the window, whether it was sent or dropped. Each has exactly one outcome, so
  requests == ok + errors, and errors == sum of errors_by_key.
- every count of a row is over these same measured requests, whenever their answers came: ok is those answered
  with a 2xx, and throughput_ips is ok per second of answer_span_s, the time from the window's start to its
  end or to the last measured answer, whichever is later (answers to warm-up requests never count; answers to
  measured requests that came in the drain do, and so does the time they took).
- latency percentiles: over the successful measured requests, nearest-rank, in ms; in the open loop from
  each request's due time, in the closed loop from its send time.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .loops import LevelRun
from .records import CANCELLED, CONN_ERROR, DROPPED, TIMEOUT, RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCY_KEYS = tuple(f"latency_p{p}_ms" for p in PERCENTILES) + ("latency_max_ms", "latency_mean_ms")
ERROR_COLUMNS = ("errors_429", "errors_413", "errors_504", "errors_5xx", "errors_4xx", "errors_conn",
                 "errors_timeout", "dropped", "cancelled")


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p95/p99 (nearest rank), max and mean of `values`; all None for an empty list."""
    if not values:
        return dict.fromkeys(LATENCY_KEYS)
    data = np.asarray(values, dtype=float)
    result = {f"latency_p{p}_ms": float(np.percentile(data, p, method="inverted_cdf")) for p in PERCENTILES}
    result["latency_max_ms"] = float(data.max())
    result["latency_mean_ms"] = float(data.mean())
    return result


def error_column(key: str) -> str:
    """The summary column an error key is counted in: '429' -> errors_429, '503' -> errors_5xx, ..."""
    if key in ("429", "413", "504"):
        return f"errors_{key}"
    if key.isdigit():
        return "errors_5xx" if key.startswith("5") else "errors_4xx"
    return {CONN_ERROR: "errors_conn", TIMEOUT: "errors_timeout", DROPPED: "dropped",
            CANCELLED: "cancelled"}.get(key, "errors_4xx")


def count_errors(records: list[RequestRecord]) -> tuple[dict[str, int], dict[str, int]]:
    """(errors by key such as '429' or 'conn_error', the same folded into ERROR_COLUMNS)."""
    by_key = Counter(r.error_key for r in records if r.error_key is not None)
    columns = dict.fromkeys(ERROR_COLUMNS, 0)
    for key, count in by_key.items():
        columns[error_column(key)] += count
    return dict(sorted(by_key.items())), columns


def summarize(run: LevelRun, server: dict) -> dict:
    """One summary row (a flat dict) for a finished level; `server` comes from metrics.server_split."""
    measured = run.measured()
    ok = [r for r in measured if r.is_ok]
    window = run.window_s
    span = answer_span(run, measured)
    by_key, columns = count_errors(measured)
    sent = [r for r in measured if r.outcome != DROPPED]
    row = {
        "mode": run.plan.mode,
        "level": run.plan.level,
        "label": run.plan.label,
        "start_s": run.start_s,
        "window_start_s": run.window_start_s,
        "window_end_s": run.window_end_s,
        "end_s": run.end_s,
        "window_s": window,
        "requests": len(measured),
        "sent": len(sent),
        "ok": len(ok),
        "errors": len(measured) - len(ok),
        "late": sum(r.late for r in measured),
        "warmup_requests": len(run.records) - len(measured),
        "answer_span_s": span,
        "throughput_ips": len(ok) / span if span > 0 else 0.0,
        "send_rate": len(sent) / window if window > 0 else 0.0,
        **percentiles([r.latency_ms for r in ok]),
        "service_p95_ms": percentiles([r.service_ms for r in ok])["latency_p95_ms"],
        **columns,
        "errors_by_key": by_key,
        **server,
        "interrupted": run.interrupted,
    }
    return row


def answer_span(run: LevelRun, measured: list[RequestRecord]) -> float:
    """Seconds from the window's start to its end or to the last answer of a measured request, if later."""
    answered = [r.done_s for r in measured if r.done_s is not None]
    end = max([run.window_end_s, *answered])
    return max(end - run.window_start_s, 0.0)


def timeline(runs: list[LevelRun], bucket_s: float = 1.0) -> list[dict]:
    """Per-`bucket_s` series over the whole run: successes/s, p95 latency (ms) and errors of the answers in
    each bucket (dropped requests at their due time), with the level each bucket belongs to."""
    records = [r for run in runs for r in run.records]
    if not records:
        return []
    end = max((r.done_s if r.done_s is not None else r.scheduled_s) for r in records)
    count = int(math.floor(end / bucket_s)) + 1
    if count > 1 and end - (count - 1) * bucket_s < bucket_s / 4:
        count -= 1  # a sliver at the end joins the bucket before it
    buckets = [{"t_s": i * bucket_s, "level": "", "ok": 0, "errors": 0, "latencies": []} for i in range(count)]
    for run in runs:
        for bucket in buckets:
            if run.start_s <= bucket["t_s"] + bucket_s / 2 <= run.end_s:
                bucket["level"] = run.plan.label
    for record in records:
        at = record.done_s if record.done_s is not None else record.scheduled_s
        bucket = buckets[min(int(at / bucket_s), len(buckets) - 1)]
        if record.is_ok:
            bucket["ok"] += 1
            bucket["latencies"].append(record.latency_ms)
        else:
            bucket["errors"] += 1
    series = []
    for bucket in buckets:
        lat = bucket.pop("latencies")
        last = bucket is buckets[-1]
        width = end - bucket["t_s"] if last else bucket_s  # the last one is shorter or longer
        bucket["width_s"] = width
        bucket["throughput_ips"] = bucket["ok"] / width if width > 0 else 0.0
        bucket["p95_ms"] = percentiles(lat)["latency_p95_ms"]
        series.append(bucket)
    return series
