"""benchmarks/gil_sampling.py: each engine process's GIL share under load, from py-spy's GIL-holder samples, and
serve_saturation.py --gil, which records it beside its measured window (here with a stand-in py-spy that writes a
known recording, so the plumbing is tested where py-spy cannot read other processes)."""

import os
import stat
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gil_sampling  # noqa: E402

STACKS = [
    ("vggserve-device-gpu", "Thread.run (threading.py:982);InflightRunner._feed (inflight.py:90);"
     "decode_for_model (onmodel.py:128);lay_out (decoder.py:389)", 300),
    ("vggserve-device-gpu", "Thread.run (threading.py:982);InflightRunner._feed (inflight.py:90);"
     "Engine.submit (engine.py:400)", 100),
    ("vggserve-engine-link1-reader", "Thread.run (threading.py:982);Link._read (engine_link.py:130);"
     "Link._read (engine_link.py:131)", 50),
    ("vggserve-inflight-gpu", "Thread.run (threading.py:982);InflightRunner._complete (inflight.py:141);"
     "answer (batcher.py:98)", 25),
]
RAW = "".join(f"thread ({11 + i}): {name};{stack} {n}\n" for i, (name, stack, n) in enumerate(STACKS))


def test_held_is_the_share_of_the_window_with_each_thread_and_function_and_no_run_loops():
    r = gil_sampling.held(RAW, seconds=2, rate=250)  # a window of 500 samples
    assert r["held"] == pytest.approx(475 / 500)
    assert r["threads"] == [["vggserve-device-gpu", 0.8], ["vggserve-engine-link1-reader", 0.1],
                            ["vggserve-inflight-gpu", 0.05]]
    top = dict(r["top"])
    assert top["decode_for_model"] == pytest.approx(0.6) and top["Engine.submit"] == pytest.approx(0.2)
    # a function twice in one stack counts once; the frames that wrap all of their threads' samples are left out
    assert "Link._read" not in top and "InflightRunner._feed" not in top and "Thread.run" not in top
    assert [f for f, _ in r["top"]][:2] == ["decode_for_model", "lay_out"]
    assert gil_sampling.held("", seconds=3) == {"held": 0.0, "threads": [], "top": []}


def _process(proc: Path, pid: int, cmdline: str) -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def test_engine_pids_are_the_server_and_the_engine_processes_of_its_tree(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    _process(proc, 100, "python3 -m vggserve serve --device all")
    _process(proc, 130, "python3 -m vggserve.serving.processes.engine_process")
    _process(proc, 120, "python3 -m vggserve.serving.processes.frontend")
    _process(proc, 110, "python3 -m vggserve.serving.processes.engine_process")
    _process(proc, 200, "python3 -m vggserve.serving.processes.engine_process")  # another server's
    assert gil_sampling.engine_pids(100, [100, 130, 120, 110, 140], str(proc)) == [100, 110, 130]  # 140: gone
    assert gil_sampling.engine_pids(120, [120], str(proc)) == [120]


def test_the_summary_gives_each_engines_share_or_why_it_was_not_measured():
    results = [{"pid": 100, **gil_sampling.held(RAW, 2)}, {"pid": 110, "error": "Permission denied (os error 13)"}]
    line = gil_sampling.summary(results)
    assert line == ("engine 0 95% (threads: vggserve-device-gpu 80%, vggserve-engine-link1-reader 10%; "
                    "in decode_for_model 60%, lay_out 60%, Engine.submit 20%); "
                    "engine 1 not measured (Permission denied (os error 13))")


FAKE_PY_SPY = """#!{python}
import sys, time
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
assert args[0] == "record" and "--gil" in args and "--threads" in args and "--nonblocking" in args, args
if value("--pid") == "{refused}":
    print("Error: Permission denied (os error 13)", file=sys.stderr)
    sys.exit(1)
time.sleep(float(value("--duration")))
open(value("--output"), "w").write({raw!r})
"""


def test_serve_saturation_samples_the_engines_gil_within_its_window(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "tests"))
    import serve_saturation
    from test_loadtest_rawhttp import SERVICE
    from vggserve.testing.servers import ServerProcess

    with ServerProcess.python_code(SERVICE) as server:
        server.wait_ready(60)
        fake = tmp_path / "py-spy"
        fake.write_text(FAKE_PY_SPY.format(python=sys.executable, refused=-1, raw=RAW))
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        run = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2, procs=1,
                                     warmup=0.3, duration=2.5, server_pid=server.proc.pid, gil=True)
        assert run["ok"] > 0
        # one engine, the server itself; py-spy recorded int(0.8 x 2.5) = 2 s of it
        assert [g["pid"] for g in run["gil"]] == [server.proc.pid]
        assert run["gil"][0]["held"] == pytest.approx(475 / 500)
        fake.write_text(FAKE_PY_SPY.format(python=sys.executable, refused=server.proc.pid, raw=RAW))
        refused = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2,
                                         procs=1, warmup=0.3, duration=1.5, server_pid=server.proc.pid, gil=True)
        assert refused["gil"] == [{"pid": server.proc.pid, "error": "Error: Permission denied (os error 13)"}]
        monkeypatch.setenv("PATH", "/nonexistent")  # no py-spy at all: said, and the run still measured
        missing = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2,
                                         procs=1, warmup=0.3, duration=1.5, server_pid=server.proc.pid, gil=True)
        assert missing["ok"] > 0 and "py-spy is not on PATH" in missing["gil"][0]["error"]
        plain = serve_saturation.drive(server.url, serve_saturation.synthetic_jpeg(64, 48), concurrency=2,
                                       procs=1, warmup=0.3, duration=1.0, server_pid=server.proc.pid)
        assert plain["gil"] is None
