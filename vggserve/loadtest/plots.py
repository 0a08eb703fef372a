"""PNG figures of a run (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

PCT_STYLES = (("latency_p50_ms", "p50"), ("latency_p90_ms", "p90"), ("latency_p95_ms", "p95"),
              ("latency_p99_ms", "p99"), ("latency_max_ms", "max"))
# p99 often equals max (few requests per level): max is drawn last, dashed with hollow markers, so the solid p99
# line shows between its dashes and p99's diamonds inside its circles
PCT_LOOKS = {"p50": {"marker": "o"}, "p90": {"marker": "s"}, "p95": {"marker": "^"}, "p99": {"marker": "D"},
             "max": {"marker": "o", "linestyle": "--", "markerfacecolor": "none", "markersize": 9}}
HEADROOM, LOG_HEADROOM = 1.1, 1.5  # the y axis ends this factor above the highest point (linear, log)
# means over different things (a request, an image, a batch): drawn side by side, never added up
SPLIT_PARTS = (("server_queue_ms", "queue (mean per request)", "#4c72b0"),
               ("server_preprocess_ms", "preprocess (mean per image)", "#dd8452"),
               ("server_inference_ms", "inference (mean per batch)", "#55a868"),
               ("server_request_ms", "whole request (mean per request)", "#8c8c8c"))
NO_SUCCESS = "no successful\nrequests"


def _load_axis(mode: str) -> str:
    return "concurrent clients" if mode == "closed" else "offered rate (requests/s)"


def _x(rows: list[dict]) -> list[float]:
    return [row["level"] for row in rows]


def _log_x(ax, rows: list[dict]) -> None:
    """Log x for spread-out levels (1, 4, 16, 64), ticks at the levels themselves."""
    levels = _x(rows)
    if len(levels) > 1 and max(levels) / min(levels) >= 8:
        ax.set_xscale("log")
    ax.set_xticks(levels)
    ax.set_xticklabels([f"{v:g}" for v in levels])
    ax.minorticks_off()


def _room_above(ax, values: list, log: bool = False) -> None:
    """y from 0 (log: a factor below the lowest point) to a factor above the highest of `values`, so the top
    marker is drawn whole rather than cut by the frame."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = max(finite, default=0.0)
    if log:
        positive = [v for v in finite if v > 0]
        ax.set_ylim(min(positive) / LOG_HEADROOM, top * LOG_HEADROOM)
    else:
        ax.set_ylim(0, top * HEADROOM if top > 0 else 1.0)


def plot_throughput(rows: list[dict], mode: str, path: Path) -> Path:
    """Images/s against load; in the open loop the offered rate is drawn as a dashed reference."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = [r["throughput_ips"] for r in rows]
    ax.plot(_x(rows), drawn, "o-", label="achieved (2xx answers/s)")
    if mode == "open":
        ax.plot(_x(rows), _x(rows), "--", color="gray", label="offered rate")
        drawn += _x(rows)
    errors = [r["errors"] / r["answer_span_s"] if r["answer_span_s"] else 0 for r in rows]
    if any(errors):
        ax.plot(_x(rows), errors, "x:", color="tab:red", label="errors/s (dropped included)")
        drawn += errors
    _log_x(ax, rows)
    ax.set_xlabel(_load_axis(mode))
    ax.set_ylabel("throughput (images/s)")
    ax.set_title(f"Throughput against load ({mode} loop)")
    _room_above(ax, drawn)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_latency(rows: list[dict], mode: str, path: Path) -> Path:
    """Client-side latency percentiles against load (log y)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, name in PCT_STYLES:
        if any(r[key] is not None for r in rows):  # a level without a value breaks the line, not bridged over
            ax.plot(_x(rows), [math.nan if r[key] is None else r[key] for r in rows], label=name, **PCT_LOOKS[name])
    _log_x(ax, rows)
    _mark_levels_without_successes(ax, rows)
    start = "due time" if mode == "open" else "send time"
    values = [r[k] for r in rows for k, _ in PCT_STYLES if r[k]]
    log = bool(values) and max(values) / min(values) > 20
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_ylabel(f"latency from {start} (ms, log scale)")
    else:
        ax.set_ylabel(f"latency from {start} (ms)")
    _room_above(ax, values, log)
    ax.set_xlabel(_load_axis(mode))
    ax.set_title(f"Latency percentiles against load ({mode} loop, successful requests)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="percentile")
    else:
        ax.text(0.5, 0.5, "no successful requests", transform=ax.transAxes, ha="center", color="gray")
    return _save(fig, path)


def _mark_levels_without_successes(ax, rows: list[dict]) -> None:
    """A level with no 2xx answer has no latency to draw: say so at its place on the x axis (when some other
    level has points; with none at all, the whole plot says it)."""
    empty = [r["level"] for r in rows if all(r[key] is None for key, _ in PCT_STYLES)]
    if len(empty) == len(rows):
        return
    for level in empty:
        ax.axvline(level, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(NO_SUCCESS, (level, 0.5), xycoords=("data", "axes fraction"), ha="center", va="center",
                    fontsize=8, color="tab:red", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def plot_server_split(rows: list[dict], mode: str, path: Path) -> Path | None:
    """Where the server's time goes per level: mean queue, preprocess, inference and whole-request ms, side by side
    (each is a mean over something else: a request, an image, a batch), with the mean batch size on top."""
    if all(r.get("server_queue_ms") is None and r.get("server_inference_ms") is None for r in rows):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"{r['level']:g}" for r in rows]
    positions = range(len(rows))
    width = 0.8 / len(SPLIT_PARTS)
    tops = [0.0] * len(rows)
    for i, (key, name, color) in enumerate(SPLIT_PARTS):
        values = [r.get(key) or 0.0 for r in rows]
        ax.bar([x + (i - (len(SPLIT_PARTS) - 1) / 2) * width for x in positions], values, width, label=name,
               color=color)
        tops = [max(t, v) for t, v in zip(tops, values)]
    for x, row, top in zip(positions, rows, tops):
        if row.get("server_batch_size") is not None:
            ax.annotate(f"batch {row['server_batch_size']:.1f}", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(positions))
    ax.set_xticklabels(labels)
    ax.set_xlabel(_load_axis(mode))
    ax.set_ylabel("server-side mean time (ms)")
    ax.set_title("Where the server's time goes (from /metrics)")
    ax.margins(y=0.12)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _steps(ax, series: list[dict], key: str, end_s: float, color: str, label: str) -> None:
    """One value per bucket, drawn as a flat step across the bucket (the last one up to `end_s`). A bucket
    without a value (no answer, so no p95) is a gap in the line, not the previous value carried on."""
    if all(b[key] is None for b in series):
        return
    t = [b["t_s"] for b in series] + [end_s]
    v = [math.nan if b[key] is None else b[key] for b in series]
    ax.step(t, v + [v[-1]], where="post", color=color, label=label)


def plot_timeline(series: list[dict], rows: list[dict], path: Path) -> Path:
    """Throughput, p95 latency and errors per second over the run; warm-ups shaded, levels labelled."""
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    end_s = series[-1]["t_s"] + series[-1]["width_s"]
    errors = [{**b, "errors_ps": b["errors"] / b["width_s"] if b["width_s"] else 0.0} for b in series]
    _steps(axes[0], series, "throughput_ips", end_s, "tab:blue", "2xx answers/s")
    _steps(axes[1], series, "p95_ms", end_s, "tab:orange", "p95")
    _steps(axes[2], errors, "errors_ps", end_s, "tab:red", "errors/s")
    axes[0].set_title("Throughput, p95 latency and errors over the run (1 s buckets, by answer time)")
    axes[0].set_ylabel("throughput\n(images/s)")
    axes[1].set_ylabel("p95 latency (ms)")
    axes[2].set_ylabel("errors (per s)")
    axes[2].set_xlabel("time since start of run (s); shaded: warm-up, not counted")
    for ax, key in zip(axes, ("throughput_ips", "p95_ms", "errors_ps")):
        _room_above(ax, [b[key] for b in errors])
        ax.grid(True, alpha=0.3)
    _mark_levels(axes, rows)
    return _save(fig, path)


def _mark_levels(axes, rows: list[dict]) -> None:
    """Shade each level's warm-up, draw a dotted line at each level's start and label it on top."""
    for row in rows:
        for ax in axes:
            ax.axvspan(row["start_s"], row["window_start_s"], color="gray", alpha=0.15, linewidth=0)
            ax.axvline(row["start_s"], color="gray", linestyle=":", linewidth=1)
        axes[0].annotate(row["label"], (row["start_s"], 1.0), xycoords=("data", "axes fraction"),
                         xytext=(3, -12), textcoords="offset points", fontsize=9, color="dimgray")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(folder: Path, rows: list[dict], mode: str, series: list[dict]) -> list[Path]:
    """All figures of a run; the server split only when /metrics gave numbers."""
    paths = []
    if rows:
        paths.append(plot_throughput(rows, mode, folder / "throughput.png"))
        paths.append(plot_latency(rows, mode, folder / "latency.png"))
        split = plot_server_split(rows, mode, folder / "server_split.png")
        if split:
            paths.append(split)
    if series:
        paths.append(plot_timeline(series, rows, folder / "timeline.png"))
    return paths
