"""Load-test harness pieces without a server: input parsing, percentiles, /metrics arithmetic, error
buckets, the time series, and the CLI's one-line answers to bad input."""

import numpy as np
import pytest

from vggserve.errors import VggserveError
from vggserve.loadtest.config import normalise_url, parse_levels
from vggserve.loadtest.loops import LevelPlan, LevelRun, open_loop_counts
from vggserve.loadtest.metrics import SERVER_KEYS, Snapshot, server_split
from vggserve.loadtest.progress import RECENT_S, ProgressTally, progress_text
from vggserve.loadtest.records import (CANCELLED, CONN_ERROR, DROPPED, HTTP_ERROR, MEASURE, OK, TIMEOUT, WARMUP,
                                       RequestRecord)
from vggserve.loadtest.stats import count_errors, percentiles, summarize, timeline


def make_plan(mode="open", level=10.0, warmup=1.0, duration=2.0, cap=1000):
    return LevelPlan(mode=mode, level=level, label="x", url="http://127.0.0.1:1/classify",
                     warmup_s=warmup, duration_s=duration, max_requests=cap)


@pytest.mark.parametrize("typed, base", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/classify", "http://127.0.0.1:8000"),
    ("https://gpu.example:443/vgg/classify/", "https://gpu.example:443/vgg"),
])
def test_url_is_reduced_to_the_service_base(typed, base):
    assert normalise_url(typed) == base


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "ftp://host/", "http://", "http://host:port/", "http://h/?q=1"])
def test_bad_url_is_a_one_line_error(bad):
    with pytest.raises(VggserveError, match="bad --url"):
        normalise_url(bad)


def test_levels_parse_and_reject_nonsense():
    assert parse_levels("1,4,16,64", "closed") == [1, 4, 16, 64]
    assert parse_levels("2.5, 10", "open") == [2.5, 10]
    for bad, mode in [("0", "open"), ("-5", "open"), ("abc", "open"), ("1,,2", "open"), ("inf", "open"),
                      ("nan", "open"), ("1.5", "closed"), ("", "closed")]:
        with pytest.raises(VggserveError, match="bad --(rate|concurrency)"):
            parse_levels(bad, mode)


def test_a_closed_loop_of_more_clients_than_the_cap_is_a_one_line_error():
    from vggserve.loadtest.config import MAX_CONCURRENCY

    assert parse_levels(f"1,{MAX_CONCURRENCY}", "closed") == [1, MAX_CONCURRENCY]
    with pytest.raises(VggserveError, match="at most 10000 clients.*--mode open"):
        parse_levels("4,1000000", "closed")
    assert parse_levels("1000000", "open") == [1e6]  # a rate is bounded by --max-inflight instead


def test_percentiles_are_ordered_and_nearest_rank(rng):
    values = list(rng.exponential(20.0, size=997))
    p = percentiles(values)
    assert p["latency_p50_ms"] <= p["latency_p90_ms"] <= p["latency_p95_ms"] <= p["latency_p99_ms"]
    assert p["latency_p99_ms"] <= p["latency_max_ms"] == max(values)
    assert all(p[k] in values for k in ("latency_p50_ms", "latency_p99_ms"))  # nearest rank: real samples
    assert percentiles(list(range(1, 101)))["latency_p90_ms"] == 90
    assert percentiles([])["latency_p50_ms"] is None


def test_open_loop_schedule_size_follows_rate_duration_and_cap():
    assert open_loop_counts(make_plan(level=10, warmup=1, duration=2)) == (10, 20)
    assert open_loop_counts(make_plan(level=3, warmup=0, duration=1.5)) == (0, 5)  # due at 0, 1/3, ... 4/3
    assert open_loop_counts(make_plan(level=1000, warmup=1, duration=10, cap=50)) == (50, 50)


METRICS_BEFORE = """
# TYPE vggserve_queue_seconds histogram
vggserve_queue_seconds_bucket{le="+Inf"} 10
vggserve_queue_seconds_sum 0.5
vggserve_queue_seconds_count 10
# TYPE vggserve_inference_seconds histogram
vggserve_inference_seconds_bucket{le="+Inf"} 4
vggserve_inference_seconds_sum 0.2
vggserve_inference_seconds_count 4
# TYPE vggserve_batch_size histogram
vggserve_batch_size_bucket{le="+Inf"} 4
vggserve_batch_size_sum 10
vggserve_batch_size_count 4
# TYPE vggserve_requests_total counter
vggserve_requests_total{endpoint="/classify",status="200"} 10
vggserve_requests_total{endpoint="/metrics",status="200"} 3
"""

METRICS_AFTER = """
# TYPE vggserve_queue_seconds histogram
vggserve_queue_seconds_bucket{le="+Inf"} 30
vggserve_queue_seconds_sum 2.5
vggserve_queue_seconds_count 30
# TYPE vggserve_inference_seconds histogram
vggserve_inference_seconds_bucket{le="+Inf"} 9
vggserve_inference_seconds_sum 0.7
vggserve_inference_seconds_count 9
# TYPE vggserve_batch_size histogram
vggserve_batch_size_bucket{le="+Inf"} 9
vggserve_batch_size_sum 30
vggserve_batch_size_count 9
# TYPE vggserve_requests_total counter
vggserve_requests_total{endpoint="/classify",status="200"} 28
vggserve_requests_total{endpoint="/classify",status="429"} 2
vggserve_requests_total{endpoint="/metrics",status="200"} 4
# TYPE vggserve_rejected_total counter
vggserve_rejected_total{reason="queue_full"} 2
"""


def test_server_split_is_delta_sum_over_delta_count_in_ms():
    split = server_split(Snapshot.parse(METRICS_BEFORE), Snapshot.parse(METRICS_AFTER))
    assert split["server_queue_ms"] == pytest.approx(2.0 / 20 * 1000)
    assert split["server_inference_ms"] == pytest.approx(0.5 / 5 * 1000)
    assert split["server_batch_size"] == pytest.approx(20 / 5)
    assert split["server_requests"] == 20  # /classify only, every status
    assert split["server_rejected"] == 2  # absent before: counted from zero
    assert split["server_preprocess_ms"] is None  # not exported: no number rather than a made-up one
    assert set(split) == set(SERVER_KEYS)


def test_a_counter_the_server_exports_without_a_sample_yet_counts_zero_not_empty():
    """vggserve_rejected_total is labelled by reason: until the first rejection /metrics shows its HELP and TYPE
    and no sample, and summary.csv wrote server_rejected empty, as for a metric the server does not have."""
    exported = "# HELP vggserve_rejected_total Requests refused.\n# TYPE vggserve_rejected_total counter\n"
    split = server_split(Snapshot.parse(METRICS_BEFORE + exported), Snapshot.parse(METRICS_AFTER.split(
        "# TYPE vggserve_rejected_total")[0] + exported))
    assert split["server_rejected"] == 0
    assert split["server_timeouts"] is None  # not exported at all: still no number


def test_summary_csv_writes_a_whole_level_without_a_decimal_point(tmp_path):
    """summary.csv wrote 16 clients as 16.0 (the level is a float, for rates such as 12.5)."""
    import csv

    from vggserve.loadtest.report import write_summary

    rows = [{"mode": "closed", "level": 16.0, "label": "c16", "server_rejected": 0.0},
            {"mode": "open", "level": 12.5, "label": "r12.5", "server_rejected": None}]
    csv_path, _, _ = write_summary(tmp_path, rows, {}, [])
    written = list(csv.DictReader(csv_path.open()))
    assert [row["level"] for row in written] == ["16", "12.5"]
    assert [row["server_rejected"] for row in written] == ["0.0", ""]


def test_server_split_without_scrapes_has_every_key_empty():
    assert server_split(None, None) == dict.fromkeys(SERVER_KEYS)


def record(index, phase, outcome, status=0, due=0.0, sent=0.0, done=0.1):
    r = RequestRecord(index=index, phase=phase, scheduled_s=due, image="a.jpg", bytes=10)
    r.outcome, r.status = outcome, status
    if outcome != DROPPED:
        r.sent_s, r.done_s = sent, done
    return r


def test_errors_are_counted_by_status_and_kind():
    records = [record(0, MEASURE, OK, 200), record(1, MEASURE, HTTP_ERROR, 429), record(2, MEASURE, HTTP_ERROR, 429),
               record(3, MEASURE, HTTP_ERROR, 503), record(4, MEASURE, HTTP_ERROR, 504),
               record(5, MEASURE, HTTP_ERROR, 413), record(6, MEASURE, CONN_ERROR), record(7, MEASURE, DROPPED)]
    by_key, columns = count_errors(records)
    assert by_key == {"413": 1, "429": 2, "503": 1, "504": 1, "conn_error": 1, "dropped": 1}
    assert columns["errors_429"] == 2 and columns["errors_5xx"] == 1 and columns["errors_504"] == 1
    assert columns["errors_413"] == 1 and columns["errors_conn"] == 1 and columns["dropped"] == 1
    assert sum(columns.values()) == len(records) - 1


def test_open_loop_latency_runs_from_due_time_not_send_time():
    late = record(0, MEASURE, OK, 200, due=1.0, sent=1.5, done=1.6)
    assert late.latency_ms == pytest.approx(600.0)
    assert late.service_ms == pytest.approx(100.0)


def test_summary_counts_add_up_and_warmup_is_left_out():
    run = LevelRun(make_plan(), clock0=0.0)
    run.records = [record(0, WARMUP, OK, 200, 0.0, 0.0, 0.05)]
    run.records += [record(i, MEASURE, OK, 200, 1 + i / 10, 1 + i / 10, 1.05 + i / 10) for i in range(1, 20)]
    run.records += [record(20, MEASURE, HTTP_ERROR, 429, 2.9, 2.9, 2.91), record(21, MEASURE, DROPPED, due=2.95)]
    run.start_s, run.window_start_s, run.window_end_s, run.end_s = 0.0, 1.0, 3.0, 3.0
    row = summarize(run, server_split(None, None))
    assert row["requests"] == 21 and row["warmup_requests"] == 1
    assert row["ok"] + row["errors"] == row["requests"]
    assert row["sent"] == 20 and row["dropped"] == 1 and row["errors_429"] == 1
    assert row["throughput_ips"] == pytest.approx(19 / 2.0)
    assert row["latency_p50_ms"] == pytest.approx(50.0)


def test_throughput_counts_the_same_requests_as_ok():
    """The reported row: warm-up answers arriving in the window gave "img/s 1.0" beside "ok 0, timeout: 10"."""
    run = LevelRun(make_plan(warmup=2.0, duration=10.0), clock0=0.0)
    run.records = [record(i, WARMUP, OK, 200, 0.1 * i, 0.1 * i, 2.5 + i) for i in range(10)]  # answered in window
    run.records += [record(10 + i, MEASURE, TIMEOUT, 0, 2 + i, 2 + i, 12 + i) for i in range(10)]
    run.start_s, run.window_start_s, run.window_end_s, run.end_s = 0.0, 2.0, 12.0, 22.0
    row = summarize(run, server_split(None, None))
    assert (row["ok"], row["errors_by_key"], row["throughput_ips"]) == (0, {"timeout": 10}, 0.0)


def test_throughput_of_an_overloaded_level_spans_its_answers_not_its_window():
    """Open loop past saturation: 40 measured requests due in 2 s, answered at 4/s until 11 s. Dividing by the
    window would claim 20/s; the measured requests' answers span 10 s."""
    run = LevelRun(make_plan(warmup=1.0, duration=2.0), clock0=0.0)
    run.records = [record(i, MEASURE, OK, 200, 1 + i / 20, 1 + i / 20, 1.25 + i / 4) for i in range(40)]
    run.start_s, run.window_start_s, run.window_end_s, run.end_s = 0.0, 1.0, 3.0, 11.0
    row = summarize(run, server_split(None, None))
    assert row["answer_span_s"] == pytest.approx(10.0)
    assert row["throughput_ips"] == pytest.approx(4.0)
    assert row["throughput_ips"] * row["answer_span_s"] == row["ok"]


def test_timeline_buckets_hold_every_answer_once():
    run = LevelRun(make_plan(), clock0=0.0)
    run.records = [record(i, MEASURE, OK if i % 4 else HTTP_ERROR, 200 if i % 4 else 500,
                          i * 0.1, i * 0.1, i * 0.1 + 0.05) for i in range(40)]
    run.start_s, run.window_start_s, run.window_end_s, run.end_s = 0.0, 0.0, 4.0, 4.0
    series = timeline([run])
    assert sum(b["ok"] for b in series) == 30 and sum(b["errors"] for b in series) == 10
    assert [b["t_s"] for b in series] == [0.0, 1.0, 2.0, 3.0]
    assert np.isclose(sum(b["throughput_ips"] * b["width_s"] for b in series), 30)


def rescanned_progress_text(run: LevelRun, total_s: float) -> str:
    """The progress line as it was computed before ProgressTally: every record looked at on every tick."""
    now = run.now()
    elapsed = now - run.start_s
    if elapsed < run.plan.warmup_s:
        phase = "warmup"
    elif elapsed < run.plan.warmup_s + run.plan.duration_s:
        phase = MEASURE
    else:
        phase = "drain"
    records = list(run.records)
    dropped = sum(r.outcome == DROPPED for r in records)
    done = [r for r in records if r.outcome and r.outcome != DROPPED]
    ok = [r for r in done if r.is_ok]
    answered = [r.done_s for r in ok if r.done_s is not None]
    start = max(run.start_s, max(answered, default=now) - RECENT_S)
    recent = [r.latency_ms for r in ok if r.done_s is not None and r.done_s >= start]
    span = max(now - start, 1e-9)
    p95 = percentiles(recent)["latency_p95_ms"]
    p95_text = "-" if p95 is None else f"{p95:.1f} ms"
    dropped_text = f"  dropped {dropped}" if dropped else ""
    waiting_text = f"  waiting {run.waiting}" if run.waiting else ""
    return (f"[{run.plan.label} {phase}] {min(elapsed, total_s):.1f}/{total_s:.1f} s  "
            f"sent {len(records) - dropped}  ok {len(ok)}  err {len(done) - len(ok)}{dropped_text}  "
            f"in-flight {run.inflight}{waiting_text}  {len(recent) / span:.1f} img/s  p95 {p95_text}")


def test_progress_line_kept_incrementally_prints_what_a_full_rescan_prints():
    """A simulated level (warm-up, measure, drain): requests start, are dropped, and end out of order in every way;
    on each tick the running tally's line equals the rescan's."""
    rng = np.random.default_rng(5)
    run = LevelRun(make_plan(warmup=1.0, duration=3.0), clock0=0.0)
    clock = {"t": 0.0}
    run.now = lambda: clock["t"]
    tally, total_s = ProgressTally(run), 4.0
    lines, opened = [], []
    for tick in range(1, 25):
        before, clock["t"] = clock["t"], tick * 0.25
        if clock["t"] <= total_s:  # new requests until the level's time is up, then only the drain
            for _ in range(int(rng.integers(0, 12))):
                rec = record(len(run.records), WARMUP if clock["t"] <= 1.0 else MEASURE, "", 0,
                             due=float(rng.uniform(before, clock["t"])), sent=None, done=None)
                run.records.append(rec)
                if rng.random() < 0.1:
                    rec.outcome = DROPPED
                else:
                    rec.sent_s = rec.scheduled_s + float(rng.uniform(0, 0.01))
                    opened.append(rec)
        rng.shuffle(opened)  # requests end in any order
        cut = int(rng.integers(0, len(opened) + 1))
        finishing, opened = opened[:cut], opened[cut:]
        for rec in finishing:
            rec.outcome = str(rng.choice([OK, OK, OK, HTTP_ERROR, TIMEOUT, CONN_ERROR, CANCELLED]))
            rec.status = 200 if rec.outcome == OK else 429 if rec.outcome == HTTP_ERROR else 0
            if rec.outcome != CANCELLED:
                rec.done_s = max(rec.sent_s, float(rng.uniform(before, clock["t"])))
        run.inflight, run.waiting = len(opened), int(rng.integers(0, 3))
        want = rescanned_progress_text(run, total_s)
        assert progress_text(tally, total_s) == want, tick
        lines.append(want)
    assert any("dropped" in line for line in lines) and any("p95 -" not in line for line in lines)
    assert {line.split("]")[0].split()[-1] for line in lines} == {"warmup", "measure", "drain"}


def test_progress_line_keeps_a_rate_and_p95_while_a_slow_batch_runs():
    """Answers come in bursts, one batch every 5 s: between bursts the line used to show 0.0 img/s and p95 -."""
    run = LevelRun(make_plan(warmup=0.0, duration=30.0), clock0=0.0)
    clock = {"t": 0.0}
    run.now = lambda: clock["t"]
    tally = ProgressTally(run)
    run.records = [record(i, MEASURE, OK, 200, due=0.0, sent=0.0, done=5.0) for i in range(8)]
    rates = []
    for t in (5.5, 6.0, 7.5, 9.0, 9.9):  # the next batch is due at 10 s
        clock["t"] = t
        line = progress_text(tally, 30.0)
        rate = float(line.split(" img/s")[0].split()[-1])
        assert rate > 0 and "p95 5000.0 ms" in line, line
        rates.append(rate)
    assert rates == sorted(rates, reverse=True)  # falls with the wait, without a jump to zero
    assert rates[-1] == pytest.approx(8 / (9.9 - 3.0), abs=0.05)


@pytest.mark.parametrize("argv, message", [
    (["--url", "localhost:8000"], "bad --url"),
    (["--rate", "0"], "bad --rate"),
    (["--rate", "fast"], "bad --rate"),
    (["--mode", "closed", "--rate", "10"], "--rate is for --mode open"),
    (["--mode", "open"], "--mode open needs --rate"),
    (["--concurrency", "0"], "bad --concurrency"),
    (["--duration", "-1"], "bad --duration"),
    (["--max-requests", "0"], "bad --max-requests"),
])
def test_cli_answers_bad_input_with_one_line(argv, message, tmp_path, capsys):
    from vggserve.cli import main

    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8not really")
    args = ["loadtest", "--url", "http://127.0.0.1:9", "--images", str(tmp_path), "--output", str(tmp_path / "o")]
    assert main(args + argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize("flag, env, sent", [(None, None, None), ("k1", None, "k1"), (None, "k2", "k2"),
                                             ("k1", "k2", "k1")])
def test_cli_sends_the_api_key_from_the_flag_or_the_variable(flag, env, sent, tmp_path, monkeypatch):
    import argparse

    from vggserve.cli import loadtest as cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    if env:
        monkeypatch.setenv(cli.API_KEY_ENV, env)
    argv = ["loadtest", "--url", "http://127.0.0.1:9", "--images", str(tmp_path)] + (["--api-key", flag] if flag else [])
    config = cli.build_config(parser.parse_args(argv))
    assert config.api_key == sent
    assert config.headers == ({"Authorization": f"Bearer {sent}"} if sent else {})


def test_cli_rejects_a_folder_without_images(tmp_path, capsys):
    from vggserve.cli import main

    (tmp_path / "notes.txt").write_text("no images here")
    assert main(["loadtest", "--url", "http://127.0.0.1:9", "--images", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no image files" in err


@pytest.mark.parametrize("slots", [1, 7, 8, 9, 64, 513])
def test_client_pool_gives_every_slot_its_own_connection_in_small_pools(slots):
    import asyncio

    from vggserve.loadtest.client import CONNECTIONS_PER_POOL, ClientPool

    async def check():
        async with ClientPool(slots, timeout_s=1.0) as pool:
            assert sum(pool.sizes) == slots and max(pool.sizes) <= CONNECTIONS_PER_POOL
            per_client = [sum(pool.for_slot(s) is c for s in range(slots)) for c in pool.clients]
            assert per_client == pool.sizes  # no slot ever waits inside httpx for a connection

    asyncio.run(check())


def test_open_loop_slots_go_to_waiting_requests_in_the_order_they_fell_due():
    """A slot given back goes to the request that has waited longest, not to one that fell due after it (with an
    asyncio.Queue a request due later could take it before the woken waiter ran)."""
    import asyncio

    from vggserve.loadtest.loops import Slots

    async def scenario():
        slots = Slots(1)
        held = await slots.acquire()
        order = []

        async def request(name):
            slot = await slots.acquire()
            order.append(name)
            await asyncio.sleep(0)
            slots.release(slot)

        first = asyncio.create_task(request("due first"))
        await asyncio.sleep(0)  # waiting now
        slots.release(held)     # handed to "due first" ...
        assert slots.take() is None  # ... so a request falling due now finds none free (the drop mode's check)
        second = asyncio.create_task(request("due second"))
        await asyncio.gather(first, second)
        held = await slots.acquire()
        cancelled = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)  # waiting for the held slot
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        slots.release(held)
        return order, slots.take()

    order, left = asyncio.run(scenario())
    assert order == ["due first", "due second"]
    assert left == 0  # the one slot is free again, a cancelled waiter took nothing
