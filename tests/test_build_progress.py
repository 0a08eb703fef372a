"""Program compiles that take long are reported (the first start on new pruned weights compiled for two minutes
without a word): the library logs them, the command line shows them on stderr. Time is a fake clock here."""

import io
import logging
from types import SimpleNamespace

import pytest

from vggserve.cli import main
from vggserve.cli.buildlog import LOG_INTERVAL_S, BuildLogHandler, build_progress_on_stderr
from vggserve.runtime import buildprogress
from vggserve.runtime.buildprogress import NOTICE_S, BuildProgress
from vggserve.runtime.programs import ProgramCache


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, logger=buildprogress.log.name)
    return lambda: [(r.build_stage, r.getMessage()) for r in caplog.records if r.name == buildprogress.log.name]


def test_quick_compiles_say_nothing(records):
    clock = Clock()
    progress = BuildProgress("cpu", "/cache", clock=clock, thread=False)
    progress.compiling("softmax.cl")
    clock.now += NOTICE_S / 2
    progress.tick()
    progress.compiled()
    progress.finish()
    assert records() == []


def test_long_compiles_log_a_notice_then_ticks_then_a_summary(records):
    clock = Clock()
    progress = BuildProgress("pthread-haswell", "/cache/programs", clock=clock, thread=False)
    progress.compiling("gemm.cl")
    clock.now += 1.5
    progress.tick()
    progress.compiled()
    progress.compiling("conv_sparse_codegen.cl")
    clock.now += 10
    progress.tick()
    progress.compiled()
    progress.finish()
    (stage0, notice), (stage1, tick), (stage2, done) = records()
    assert (stage0, stage1, stage2) == ("notice", "tick", "done")
    assert notice.startswith("compiling OpenCL programs for pthread-haswell") and "/cache/programs" in notice
    assert tick == "compiling OpenCL programs: 1 done, 12 s, now kernels/conv_sparse_codegen.cl"
    assert done == "compiled 2 OpenCL programs in 11.5 s"


def test_the_summary_of_one_compile_says_program_not_programs(records):
    clock = Clock()
    progress = BuildProgress("cpu", "/cache", clock=clock, thread=False)
    progress.compiling("conv_sparse_codegen.cl")
    clock.now += 3
    progress.tick()
    progress.compiled()
    progress.finish()
    assert records()[-1] == ("done", "compiled 1 OpenCL program in 3.0 s")


def test_the_work_between_compiles_is_neither_ticked_nor_counted(records):
    """A pruned network's start spends time between its compiles (weights re-laid out): the run goes on to
    `finish`, and its times are compile times."""
    clock = Clock()
    progress = BuildProgress("cpu", "/cache", clock=clock, thread=False)
    progress.compiling("gemm.cl")
    clock.now += 2
    progress.tick()
    progress.compiled()
    clock.now += 60
    progress.tick()
    progress.compiling("fc_sparse.cl")
    clock.now += 1
    progress.compiled()
    progress.finish()
    assert records() == [("notice", records()[0][1]), ("done", "compiled 2 OpenCL programs in 3.0 s")]


def test_the_program_cache_reports_its_compiles_and_the_summary_on_finish(records, tmp_path):
    device = SimpleNamespace(name="fake device ", driver_version="1", platform=SimpleNamespace(version="OpenCL 3", name="fake platform"))
    cache = ProgramCache(None, device, folder=tmp_path)
    clock = Clock()
    cache.progress = BuildProgress("fake device", tmp_path, clock=clock, thread=False)
    cache.enabled = False

    def slow_compile(name, source):  # the watcher thread's tick, while the compile goes on
        clock.now += 5
        cache.progress.tick()
        return object()

    cache._compile = slow_compile
    cache.build("softmax.cl", {})
    cache.build("maxpool.cl", {})
    cache.finish()
    stages = [stage for stage, _ in records()]
    assert stages == ["notice", "tick", "done"]
    assert records()[1][1] == "compiling OpenCL programs: 1 done, 10 s, now kernels/maxpool.cl"
    assert records()[2][1] == "compiled 2 OpenCL programs in 10.0 s"


def _record(stage, message):
    record = logging.LogRecord(buildprogress.log.name, logging.INFO, __file__, 1, message, None, None)
    record.build_stage = stage
    return record


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_tick_line_is_rewritten_in_place_and_the_summary_replaces_it():
    out = Terminal()
    handler = BuildLogHandler(out)
    for stage, message in [("notice", "compiling ..."), ("tick", "1 done, 2 s"), ("tick", "2 done, 3 s"),
                           ("done", "compiled 2 OpenCL programs in 3.5 s")]:
        handler.handle(_record(stage, message))
    assert out.getvalue() == ("vggserve: compiling ...\n\r\x1b[Kvggserve: 1 done, 2 s\r\x1b[Kvggserve: 2 done, 3 s"
                              "\r\x1b[Kvggserve: compiled 2 OpenCL programs in 3.5 s\n")


def test_off_a_terminal_ticks_are_whole_lines_a_few_seconds_apart():
    out, clock = io.StringIO(), Clock()
    handler = BuildLogHandler(out, clock=clock)
    handler.handle(_record("notice", "compiling ..."))
    for i in range(25):
        clock.now += 1
        handler.handle(_record("tick", f"{i} s"))
    handler.handle(_record("done", "compiled"))
    lines = out.getvalue().splitlines()
    assert lines == ["vggserve: compiling ...", f"vggserve: {int(LOG_INTERVAL_S) - 1} s",
                     f"vggserve: {2 * int(LOG_INTERVAL_S) - 1} s", "vggserve: compiled"]


def test_a_command_shows_the_build_records_on_stderr(monkeypatch, capsys):
    from vggserve.cli import weights

    def where(args):
        buildprogress.log.info("compiling OpenCL programs for cpu", extra={"build_stage": "notice"})
        return 0

    monkeypatch.setattr(weights, "_where", where)
    assert main(["weights", "where"]) == 0
    assert capsys.readouterr().err == "vggserve: compiling OpenCL programs for cpu\n"
    assert buildprogress.log.handlers == [] and buildprogress.log.propagate  # put back after the command


def test_outside_a_command_the_records_go_to_the_logging_setup(caplog):
    with build_progress_on_stderr():
        pass
    caplog.set_level(logging.INFO, logger=buildprogress.log.name)
    buildprogress.log.info("x", extra={"build_stage": "notice"})
    assert [r.getMessage() for r in caplog.records] == ["x"]
