"""A whole load test: a readiness check, then each level in turn (scraping /metrics around its measured
window), writing results after every level so that Ctrl-C or a crash mid-run keeps what was measured."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

from ..errors import VggserveError
from .client import ClientPool, make_client
from .config import LoadTestConfig
from .images import ImageSet
from .loops import LevelPlan, LevelRun, run_closed, run_open
from .metrics import Snapshot, scrape, server_split
from .plots import write_plots
from .progress import show_progress
from .report import write_level_csv, write_summary
from .stats import summarize, timeline

READY_POLL_S = 0.5


@dataclass
class RunResult:
    """What a run measured and where it wrote it."""

    rows: list[dict] = field(default_factory=list)
    runs: list[LevelRun] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False


def run_loadtest(config: LoadTestConfig, wait_ready_s: float = 0.0, images: ImageSet | None = None) -> RunResult:
    """Run every level of `config` and write its outputs; SIGINT stops early and still writes them.

    `images` defaults to the files of config.images.
    """
    images = images or ImageSet.from_folder(config.images)
    try:
        Path(config.output).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VggserveError(f"cannot create --output {str(config.output)!r}: {exc.strerror}") from None
    return asyncio.run(_run(config, images, wait_ready_s))


async def _run(config: LoadTestConfig, images: ImageSet, wait_ready_s: float) -> RunResult:
    stop = asyncio.Event()
    with _sigint_sets(stop):
        result = RunResult()
        meta = _meta(config, images)
        clock0 = time.perf_counter()
        async with make_client(4, 10.0, config.headers) as side_client:
            await _check_ready(side_client, config, wait_ready_s, result)
            for level in config.levels:
                if stop.is_set():
                    break
                await _run_level(config, images, level, clock0, stop, side_client, result)
                result.files.append(write_level_csv(Path(config.output), result.runs[-1]))
                # kept current, in case the process is killed
                _write_summary(config, result, meta, timeline(result.runs))
        result.interrupted = stop.is_set() or any(run.interrupted for run in result.runs)
        meta["interrupted"] = result.interrupted
        series = timeline(result.runs)
        result.files += _write_summary(config, result, meta, series)
        result.files += write_plots(Path(config.output), result.rows, config.mode, series)
        return result


@contextlib.contextmanager
def _sigint_sets(stop: asyncio.Event):
    """Within the block, the first Ctrl-C sets `stop` (the run winds down and writes its results); a second
    one raises KeyboardInterrupt as usual. Main thread only; elsewhere nothing is installed."""
    loop = asyncio.get_running_loop()

    def first_ctrl_c() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        print("\nvggserve loadtest: stopping, writing what was measured (Ctrl-C again to quit now)",
              file=sys.stderr)

    try:
        loop.add_signal_handler(signal.SIGINT, first_ctrl_c)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


async def _check_ready(client: httpx.AsyncClient, config: LoadTestConfig, wait_s: float,
                       result: RunResult) -> None:
    """GET /health/ready (polling up to `wait_s`): unreachable is an error, not-ready only a warning."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            response = await client.get(config.ready_url)
            if response.status_code == 200 or time.monotonic() >= deadline:
                break
        except httpx.HTTPError as exc:
            if time.monotonic() >= deadline:
                raise VggserveError(f"cannot reach {config.url}: {type(exc).__name__} {exc}".strip()) from None
        await asyncio.sleep(READY_POLL_S)
    if response.status_code != 200:
        _warn(result, f"{config.ready_url} answered HTTP {response.status_code}; measuring anyway")


def _plan(config: LoadTestConfig, level: float) -> LevelPlan:
    return LevelPlan(
        mode=config.mode, level=level, label=config.level_label(level), url=config.classify_url,
        warmup_s=config.warmup_s, duration_s=config.duration_s, max_requests=config.max_requests,
        max_inflight=config.max_inflight, overflow=config.overflow,
        lag_threshold_s=config.lag_threshold_ms / 1000.0, drain_s=config.timeout_s + 1.0, multipart=config.multipart,
        protocol=config.protocol,
    )


async def _run_level(config: LoadTestConfig, images: ImageSet, level: float, clock0: float,
                     stop: asyncio.Event, side_client: httpx.AsyncClient, result: RunResult) -> None:
    """One level: the loop, a scrape when its warm-up ends and one after it, the progress line."""
    plan = _plan(config, level)
    connections = int(level) if config.mode == "closed" else config.max_inflight
    before_task = None
    if config.scrape_metrics:
        before_task = asyncio.create_task(_scrape_later(side_client, config.metrics_url, plan.warmup_s))
    run = LevelRun(plan, clock0)
    loop = run_closed if config.mode == "closed" else run_open
    async with ClientPool(connections, config.timeout_s, config.headers) as pool:
        progress_task = asyncio.create_task(show_progress(run)) if config.progress else None
        try:
            await loop(pool, images, run, stop)
        finally:
            if progress_task:
                progress_task.cancel()
                await asyncio.gather(progress_task, return_exceptions=True)
    before = after = None
    if before_task and not before_task.done():  # stopped during warm-up: no window to compare
        before_task.cancel()
        await asyncio.gather(before_task, return_exceptions=True)
    elif before_task:
        before, why = before_task.result()
        if before is not None:
            after, why = await scrape(side_client, config.metrics_url)
        if why:
            _warn(result, f"{plan.label}: {why}; no server-side split for this level")
    result.runs.append(run)
    result.rows.append(summarize(run, server_split(before, after)))


async def _scrape_later(client: httpx.AsyncClient, url: str, delay_s: float) -> tuple[Snapshot | None, str | None]:
    await asyncio.sleep(delay_s)
    return await scrape(client, url)


def _write_summary(config: LoadTestConfig, result: RunResult, meta: dict, series: list[dict]) -> list[Path]:
    """The summary files as of now; `series` is timeline(result.runs)."""
    meta["warnings"] = list(result.warnings)
    return list(write_summary(Path(config.output), result.rows, meta, series))


def _meta(config: LoadTestConfig, images: ImageSet) -> dict:
    return {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_json(),
        "images": images.describe(),
        "interrupted": False,
        "warnings": [],
    }


def _warn(result: RunResult, message: str) -> None:
    result.warnings.append(message)
    print(f"vggserve loadtest: warning: {message}", file=sys.stderr)
