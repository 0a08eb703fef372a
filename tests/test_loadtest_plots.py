"""What the load-test figures show, read back from the matplotlib figures themselves (no server, no images)."""

import math

import pytest

from vggserve.loadtest import plots
from vggserve.loadtest.stats import LATENCY_KEYS


@pytest.fixture
def figures(monkeypatch, tmp_path):
    """Each plot function's figure, kept open instead of written."""
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    yield kept
    for fig in kept:
        plots.plt.close(fig)


def level_row(level, latency=None, **extra):
    row = {"level": level, "label": f"r{level:g}", "mode": "open", "start_s": 0.0, "window_start_s": 1.0,
           "window_s": 5.0, "answer_span_s": 5.0, "throughput_ips": 0.0, "errors": 0}
    row.update(dict.fromkeys(LATENCY_KEYS))
    if latency is not None:
        row.update({key: latency * (1 + i / 10) for i, key in enumerate(LATENCY_KEYS)})
    row.update(extra)
    return row


def test_latency_plot_says_which_level_had_no_successful_request(figures, tmp_path):
    rows = [level_row(2, 150.0), level_row(4, 180.0), level_row(8), level_row(16, 900.0)]
    plots.plot_latency(rows, "open", tmp_path / "latency.png")
    ax = figures[0].axes[0]
    notes = [text for text in ax.texts if "no successful" in text.get_text()]
    assert len(notes) == 1 and notes[0].xy[0] == 8  # at that level's place on the x axis
    names = {name for _, name in plots.PCT_STYLES}
    percentile_lines = [line for line in ax.get_lines() if line.get_label() in names]
    assert len(percentile_lines) == len(names)
    for line in percentile_lines:  # no value at 8, and no line drawn across it from 4 to 16
        values = dict(zip(line.get_xdata(), line.get_ydata()))
        assert math.isnan(values[8]) and not any(math.isnan(values[level]) for level in (2, 4, 16))


def test_timeline_leaves_a_gap_where_no_answer_came_instead_of_an_old_p95(figures, tmp_path):
    series = [{"t_s": float(t), "width_s": 1.0, "level": "r2", "ok": ok, "errors": 0, "throughput_ips": float(ok),
               "p95_ms": p95} for t, ok, p95 in [(0, 2, 150.0), (1, 0, None), (2, 0, None), (3, 2, 160.0)]]
    plots.plot_timeline(series, [level_row(2, 150.0, start_s=0.0, window_start_s=0.5)], tmp_path / "timeline.png")
    p95_line = figures[0].axes[1].get_lines()[0]
    points = list(zip(p95_line.get_xdata(), p95_line.get_ydata()))
    # buckets 1 and 2 had no answer: between t=1 and t=3 the line has no value at all
    assert all(math.isnan(y) for x, y in points if 1.0 < x < 3.0) and any(1.0 < x < 3.0 for x, _ in points)
    assert not any(y == 150.0 for x, y in points if x > 1.0)


def test_server_split_draws_means_of_different_things_side_by_side_not_stacked(figures, tmp_path):
    rows = [level_row(c, 100.0, server_queue_ms=40.0 * c, server_preprocess_ms=2.0, server_inference_ms=150.0,
                      server_request_ms=200.0 * c, server_batch_size=float(c)) for c in (1, 4)]
    plots.plot_server_split(rows, "closed", tmp_path / "split.png")
    ax = figures[0].axes[0]
    bars = [patch for container in ax.containers for patch in container]
    assert len(bars) == 2 * len(plots.SPLIT_PARTS)
    assert all(bar.get_y() == 0 for bar in bars)  # nothing stands on another bar
    for level in range(2):
        spans = sorted((bar.get_x(), bar.get_x() + bar.get_width()) for bar in bars
                       if level - 0.5 < bar.get_x() + bar.get_width() / 2 < level + 0.5)
        assert len(spans) == len(plots.SPLIT_PARTS)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))  # side by side, no overlap
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert any("per request" in label for label in labels) and any("per batch" in label for label in labels)


def _top_of_points(ax):
    return max(y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y))


@pytest.mark.parametrize("latency", [100.0, 1.0])  # a linear y axis; a log one (p50 1 ms against max 1,000 ms)
def test_latency_plot_leaves_room_above_its_highest_marker(figures, tmp_path, latency):
    """The y axis ended at the largest value, cutting its marker in half."""
    rows = [level_row(c, latency * c, latency_max_ms=1000.0 * c) for c in (1, 4)]
    plots.plot_latency(rows, "closed", tmp_path / "latency.png")
    ax = figures[0].axes[0]
    factor = plots.LOG_HEADROOM if ax.get_yscale() == "log" else plots.HEADROOM
    assert ax.get_ylim()[1] >= _top_of_points(ax) * factor


def test_throughput_and_timeline_plots_leave_room_above_their_highest_point(figures, tmp_path):
    rows = [level_row(c, 100.0, throughput_ips=3.0 * c, start_s=10.0 * i, window_start_s=10.0 * i + 1)
            for i, c in enumerate((2, 4))]
    plots.plot_throughput(rows, "open", tmp_path / "throughput.png")
    series = [{"t_s": float(t), "width_s": 1.0, "level": "r2", "ok": 3, "errors": 1, "throughput_ips": 3.0 + t,
               "p95_ms": 100.0 + t} for t in range(20)]
    plots.plot_timeline(series, rows, tmp_path / "timeline.png")
    for ax in [figures[0].axes[0], *figures[1].axes]:
        data = [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith("_")]
        top = max(y for line in data for y in line.get_ydata() if math.isfinite(y))
        assert ax.get_ylim()[1] >= top * plots.HEADROOM, ax.get_ylabel()


def test_a_p99_equal_to_max_stays_visible_beside_it(figures, tmp_path):
    """With p99 == max the max line covered the p99 line entirely: they now differ in line style and marker,
    and max's markers are hollow, drawn over p99's."""
    rows = [level_row(c, 100.0 * c) for c in (1, 4)]
    for row in rows:
        row["latency_p99_ms"] = row["latency_max_ms"]
    plots.plot_latency(rows, "closed", tmp_path / "latency.png")
    lines = {line.get_label(): line for line in figures[0].axes[0].get_lines()}
    p99, top = lines["p99"], lines["max"]
    assert list(p99.get_ydata()) == list(top.get_ydata())
    assert (p99.get_linestyle(), p99.get_marker()) != (top.get_linestyle(), top.get_marker())
    assert top.get_linestyle() != "-" and top.get_markerfacecolor() == "none"
    assert top.get_zorder() >= p99.get_zorder() and list(lines).index("max") > list(lines).index("p99")
