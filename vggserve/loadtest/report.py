"""What a run leaves behind: a CSV of every request per level, summary.csv, summary.json, timeline.csv,
and the table printed at the end."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from .loops import LevelRun
from .records import CSV_FIELDS
from .stats import ERROR_COLUMNS, LATENCY_KEYS

SUMMARY_FIELDS = (
    "mode", "level", "label", "start_s", "window_start_s", "window_end_s", "end_s", "window_s",
    "requests", "sent", "ok", "errors", "late", "warmup_requests",
    "answer_span_s", "throughput_ips", "send_rate", *LATENCY_KEYS, "service_p95_ms", *ERROR_COLUMNS,
    "server_queue_ms", "server_preprocess_ms", "server_inference_ms", "server_request_ms",
    "server_batch_size", "server_requests", "server_rejected", "server_timeouts", "interrupted",
)
TIMELINE_FIELDS = ("t_s", "width_s", "level", "ok", "errors", "throughput_ips", "p95_ms")


def level_csv_name(label: str) -> str:
    """requests_c16.csv, requests_r12.5.csv."""
    return f"requests_{label}.csv"


def write_level_csv(folder: Path, run: LevelRun) -> Path:
    """Every request of one level (warm-up rows included, marked in `phase`)."""
    path = folder / level_csv_name(run.plan.label)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for record in sorted(run.records, key=lambda r: r.index):
            writer.writerow(record.csv_row())
    return path


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return round(value, 3)
    return value


def _level_cell(level):
    """A level as it was given: 16 clients, not 16.0; a rate of 12.5 as it is."""
    return int(level) if isinstance(level, float) and level.is_integer() else _cell(level)


def write_summary(folder: Path, rows: list[dict], meta: dict, series: list[dict]) -> tuple[Path, Path, Path]:
    """summary.csv (one row per level), summary.json (settings, levels, time series) and timeline.csv."""
    csv_path = folder / "summary.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SUMMARY_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**{k: _cell(row.get(k)) for k in SUMMARY_FIELDS}, "level": _level_cell(row.get("level"))})
    json_path = folder / "summary.json"
    document = {**meta, "levels": [_json_safe(row) for row in rows], "timeline": _json_safe(series)}
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    timeline_path = folder / "timeline.csv"
    with timeline_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=TIMELINE_FIELDS)
        writer.writeheader()
        for bucket in series:
            writer.writerow({k: _cell(bucket.get(k)) for k in TIMELINE_FIELDS})
    return csv_path, json_path, timeline_path


def _json_safe(value):
    """NaN and infinity are not JSON: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(rows: list[dict]) -> str:
    """The end-of-run table: one line per level, client view then the server's split."""
    header = ("level", "img/s", "p50", "p90", "p95", "p99", "max", "ok", "errors", "late",
              "queue", "prep", "infer", "batch")
    lines = [header]
    for row in rows:
        errors = ",".join(f"{k}:{v}" for k, v in row["errors_by_key"].items()) or "0"
        lines.append((
            row["label"], _fmt(row["throughput_ips"]),
            *(_fmt(row[k]) for k in ("latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms",
                                     "latency_max_ms")),
            str(row["ok"]), errors, str(row["late"]),
            _fmt(row["server_queue_ms"]), _fmt(row["server_preprocess_ms"]), _fmt(row["server_inference_ms"]),
            _fmt(row["server_batch_size"], 2),
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in lines]
    text.insert(1, "-" * len(text[0]))
    note = ("ok, errors, img/s: the measured requests (warm-up excluded); img/s = ok / s from window start to last answer"
            "\nlatency p50..max: client-side ms; queue/prep/infer: server-side mean ms; batch: mean images per batch")
    return "\n".join(text + [note])
