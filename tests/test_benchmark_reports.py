"""What the benchmark scripts print, checked without running them (compare_torch.py needs torch and a GPU to run)."""

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROW = {"batch": 1, "vggserve_img_s": 2.0, "vggserve_ms": 500.0, "vggserve_kernels_ms": 450.0, "torch_img_s": 4.0,
       "torch_ms": 250.0, "torch_end_to_end_ms": 260.0, "ratio_vggserve_over_torch": 0.5, "ratio_end_to_end": 0.52,
       "max_rel_diff_vs_torch": 1e-6, "vggserve_streamed_img_s": 2.1, "torch_streamed_img_s": 3.9,
       "ratio_streamed": 0.54, "ratio_vggserve_streamed_over_torch_on_gpu": 0.5}


def test_compare_torch_on_the_cpu_reports_no_gpu_copies():
    """`--device cpu` printed "on-GPU input" and "pinned, non-blocking" for a PyTorch that ran on the CPU."""
    compare = load_script("compare_torch")
    text = "\n".join(compare.batch_report(ROW, compare.torch_wording("cpu")))
    assert "GPU" not in text and "pinned" not in text and "non-blocking" not in text
    assert "250.00 ms input in place" in text and "torch (back to back)" in text


def test_compare_torch_on_a_gpu_names_the_resident_input_and_the_pinned_copies():
    compare = load_script("compare_torch")
    text = "\n".join(compare.batch_report(ROW, compare.torch_wording("cuda")))
    assert "250.00 ms on-GPU input" in text and "torch (pinned, non-blocking)" in text
    assert "CUDA graph" not in text  # a row without the graph's figure (the CPU, or an older JSON) prints no such line


def test_compare_torch_prints_the_ratio_against_pytorch_replayed_as_a_cuda_graph():
    """Issues 25 and 26 measure batch 1 against PyTorch FP16 replayed as a CUDA graph; the report names it."""
    compare = load_script("compare_torch")
    row = dict(ROW, torch_graph_streamed_img_s=1816.0, ratio_streamed_over_graph=0.87)
    lines = compare.batch_report(row, compare.torch_wording("cuda"))
    assert len(lines) == 3
    assert "CUDA graph" in lines[2] and "1816.0 img/s" in lines[2] and "ratio 0.870" in lines[2]


def test_batch_scaling_passes_decode_and_precision_through_to_every_run_and_prints_the_rank_table(tmp_path,
                                                                                                  monkeypatch, capsys):
    """`--decode gpu` reached no run (only --precision was passed on); the per-rank table prints for every run."""
    scaling = load_script("batch_scaling")
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        summary = Path(command[command.index("--summary") + 1])
        ranks = int(command[command.index("-n") + 1])
        summary.write_text(json.dumps({
            "images": 8, "errors": 0, "wall_seconds": 1.0, "setup_seconds": 0.5, "images_per_second": 8.0 * ranks,
            "ranks": [{"rank": r, "device": f"gpu:{r}", "device_name": "stand-in", "images": 8 // ranks,
                       "images_per_second": 8.0, "wait_ms_per_image": {"device": 0.1, "decode": 0.2, "chunks": 0.0},
                       "cpu_ms_per_image": {"rank_process": 0.15, "decode": 1.7}} for r in range(ranks)]}))
        return subprocess.CompletedProcess(command, 0, "")

    monkeypatch.setattr(scaling, "make_images", lambda *args: None)
    monkeypatch.setattr(scaling.subprocess, "run", fake_run)
    monkeypatch.setattr(scaling, "launcher_command", lambda explicit, ranks, extra: ["mpiexec", "-n", str(ranks)])
    assert scaling.main(["--ranks", "1,2", "--images", "8", "--decode", "gpu", "--precision", "fp16",
                         "--workdir", str(tmp_path)]) == 0
    assert len(commands) == 2
    for command in commands:
        assert command[command.index("--decode") + 1] == "gpu"
        assert command[command.index("--precision") + 1] == "fp16"
    out = capsys.readouterr().out
    assert "--precision fp16 --decode gpu" in out
    assert "| 2 | 1 | gpu:1 | 4 | 8.0 | 0.100 | 0.200 | 0.000 | 0.150 | 1.700 |" in out


def test_decode_overlap_runs_the_engine_and_the_decoder_alone_and_together(capsys, monkeypatch):
    """benchmarks/decode_overlap.py on the CPU with a narrow network: every row prints, with each side's rate as a
    fraction of its rate alone; a device without priority hints says so instead of failing."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # it takes device_decode's corpus, as when run as a script
    overlap = load_script("decode_overlap")
    overlap.main(["--device", "cpu", "--batch", "2", "--seconds", "0.3", "--network", "fp32", "--width", "0.0625"])
    out = capsys.readouterr().out
    assert "priority hints: False" in out and "no such queue" in out
    for row in ("engine alone", "decoder alone", "both, default priority"):
        line = next(line for line in out.splitlines() if line.startswith(row))
        assert "fractions of alone" in line and "images/s" in line
    both = next(line for line in out.splitlines() if line.startswith("both, default priority"))
    assert float(both.split("=")[-1]) > 0


def test_server_floor_measures_uvicorn_and_names_granian_when_it_is_missing(monkeypatch, capsys):
    """benchmarks/server_floor.py runs a trivial app under uvicorn for real (CPU per request from /proc, every answer
    a 200 of the fixed body) and says that a server it cannot run was skipped."""
    import importlib.util as util
    import re

    floor = load_script("server_floor")
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "granian" else real(name, *a))
    assert floor.main(["--servers", "uvicorn,granian-rsgi", "--requests", "400", "--connections", "4",
                       "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    row = re.search(r"^uvicorn\s+([\d.]+) ms CPU per request \(rounds ([\d.]+), ([\d.]+)\), ([\d,]+) requests/s",
                    out, re.M)
    assert row and 0 < float(row.group(1)) < 50 and int(row.group(4).replace(",", "")) > 0, out
    assert "granian-rsgi  skipped: granian is not installed" in out


def test_smi_summary_averages_each_gpus_loaded_seconds_per_phase():
    """benchmarks/smi_summary.py: nvidia-smi's seconds grouped by GPU and by the phase host.txt gives for that
    second (child engine processes), idle seconds and malformed lines left out."""
    smi = load_script("smi_summary")
    lines = ["2026/11/27 18:10:00.100, 0, 90 %, 1980 MHz, 600.00 W, 40, 0x0000000000000000",
             "2026/11/27 18:10:01.100, 0, 70 %, 1960 MHz, 500.00 W, 40, 0x0000000000000004",
             "2026/11/27 18:10:01.100, 1, 2 %, 345 MHz, 70.00 W, 35, 0x0000000000000000",  # idle: left out
             "2026/11/27 18:10:05.100, 1, 60 %, 1980 MHz, 520.00 W, 41, 0x0000000000000000",
             "[Unknown Error]"]
    t0 = 1795803000  # 2026-11-27 18:10:00 UTC
    host = [f"{t0} 2100 0 1.0", f"{t0 + 1} 2100 0 1.1", f"{t0 + 5} 2100 3 9.0"]
    assert smi.summary(lines, host) == [
        "child engines 0 gpu 0: 2 s busy, util 80%, SM 1970 MHz, 550 W, throttle "
        "[('0x0000000000000000', 1), ('0x0000000000000004', 1)]",
        "child engines 3 gpu 1: 1 s busy, util 60%, SM 1980 MHz, 520 W, throttle [('0x0000000000000000', 1)]"]


def test_engines_side_by_side_runs_one_process_per_device_alone_then_together():
    """benchmarks/engines_side_by_side.py on PoCL as two "devices": one process alone, then two at once, each
    printing its engine and decode + network rates, and the sums against the one alone."""
    import re
    import sys

    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "engines_side_by_side.py"), "--devices", "cpu,cpu",
                          "--seconds", "0.1", "--width", "0.0625", "--images", "8", "--batch", "4", "--lead", "2"],
                         capture_output=True, text=True, timeout=1200, check=True).stdout
    lines = out.splitlines()
    rates = [line for line in lines if re.fullmatch(r"  cpu: engine [\d.]+ images/s; decode \+ network [\d.]+ "
                                                    r"images/s \([\d.]+ ms CPU per image\)", line)]
    assert lines[0] == "cpu alone:" and "2 at once:" in lines and len(rates) == 3
    summary = re.fullmatch(r"side by side: 2 devices, engine ([\d.]+) images/s \(([\d.]+)x one alone\), decode \+ "
                           r"network ([\d.]+) images/s \(([\d.]+)x one alone\)", lines[-1])
    assert summary
    together = [[float(x) for x in re.findall(r"[\d.]+(?= images/s)", line)] for line in rates[1:]]
    alone = [float(x) for x in re.findall(r"[\d.]+(?= images/s)", rates[0])]
    assert abs(float(summary.group(1)) - sum(r[0] for r in together)) < 0.11
    assert abs(float(summary.group(2)) - sum(r[0] for r in together) / alone[0]) < 0.01 + 0.2 / alone[0]
    assert abs(float(summary.group(3)) - sum(r[1] for r in together)) < 0.11


def test_read_files_times_read_source_against_the_stream_path_and_the_arena(tmp_path, capsys):
    load_script("read_files").main(["--files", "5", "--dir", str(tmp_path), "--group", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("5 files of ") and len(list(tmp_path.glob("*.jpg"))) == 5
    assert [line.split(":")[0] for line in lines[1:]] == ["read_source", "the stream path (before)",
                                                          "read_source, 2 at a time", "FileArena.read, 2 at a time"] * 2
    assert all(" us CPU, " in line and line.endswith(" us wall per file") for line in lines[1:])


def test_command_buffer_probe_records_and_replays_where_the_device_has_the_extension(tmp_path, test_device):
    import sys

    out = tmp_path / "probe.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "command_buffer_probe.py"), "--device",
                          test_device, "--kernels", "5", "--iterations", "50", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    if got["supported"]:  # PoCL: the kernels recorded once add 5 at each replay
        assert "cl_khr_command_buffer" in got["extensions"] and got["replay_correct"] and got["replay_adds"] == 5
        assert got["replay_host_us"] > 0 and got["launches_host_us"] > 0
    else:
        assert "no cl_khr_command_buffer" in run.stdout


def test_launch_cost_times_a_launch_with_and_without_events(test_device):
    import pyopencl as cl

    script = load_script("launch_cost")
    script.DEVICE = test_device
    micro = script.launch_micro(cl, 20)
    assert set(micro) == {"pyopencl_enqueue_nd_range_kernel", "ctypes_with_event", "ctypes_no_event",
                          "pyopencl_flush"}
    assert all(0 < v["host_us"] <= v["with_device_us"] for v in micro.values())  # the queue drained after


def test_scaling_rounds_alternate_one_device_and_all_and_report_medians(tmp_path, monkeypatch, capsys):
    """scaling.py --rounds 3: each row measured 1, G; G, 1; 1, G (drift over a call cancels), its images/s the
    medians of each side and its ratio the median of the rounds' back-to-back ratios, every round in the JSON."""
    scaling = load_script("scaling")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    monkeypatch.setattr("vggserve.weights.find_weights", lambda given: Path(given))
    figures = {("batch", 1): [100.0, 80.0, 90.0], ("batch", 2): [190.0, 150.0, 200.0],
               ("service", 1): [50.0, 60.0, 40.0], ("service", 2): [95.0, 100.0, 90.0]}
    calls = []

    def fake(run):
        def measure(args, weights, workdir, precision, devices):
            calls.append((run, precision, devices))
            done = sum(1 for c in calls if c[0] == run and c[1] == precision and c[2] == devices)
            return {"images_per_s": figures[(run, devices)][done - 1]}
        return measure

    monkeypatch.setattr(scaling, "batch_run", fake("batch"))
    monkeypatch.setattr(scaling, "service_run", fake("service"))
    out = tmp_path / "scaling.json"
    assert scaling.main(["--gpus", "2", "--runs", "batch,service", "--precisions", "fp16", "--rounds", "3",
                         "--weights", str(weights), "--workdir", str(tmp_path / "work"), "--json", str(out)]) == 0
    assert [c[2] for c in calls if c[0] == "batch"] == [1, 2, 2, 1, 1, 2]
    result = json.loads(out.read_text())
    assert result["rounds"] == 3
    batch, service = result["rows"]
    assert (batch["one_images_per_s"], batch["all_images_per_s"]) == (90.0, 190.0)
    assert batch["ratios"] == [1.9, 150.0 / 80.0, 200.0 / 90.0] and batch["ratio"] == 1.9
    assert service["ratios"] == [1.9, 100.0 / 60.0, 2.25] and service["ratio"] == 1.9
    rounds = [batch] + batch["later_rounds"]
    assert [r["all"]["images_per_s"] for r in rounds] == [190.0, 150.0, 200.0]
    table = capsys.readouterr().out
    assert "median of 3 rounds in turn" in table and "| 1.90x | 1.90x, 1.88x, 2.22x |" in table
    assert scaling.main(["--gpus", "2", "--rounds", "0"]) == 2


def test_in_turn_runs_every_variant_each_round_in_alternating_order_with_medians_and_ratios(tmp_path, capsys):
    in_turn = load_script("in_turn")
    trace = tmp_path / "order.txt"
    counter = tmp_path / "count.txt"
    code = in_turn.main([
        "--rounds", "3", "--pattern", r"rate: ([\d,.]+) images/s", "--log-dir", str(tmp_path / "logs"),
        "--json", str(tmp_path / "out.json"),
        # the first variant's figure grows each run: 1,000, 2,000, 3,000
        "--run", f"a=echo a >> {trace}; echo x >> {counter}; echo \"rate: $(wc -l < {counter}),000 images/s\"",
        "--run", f"b=echo b >> {trace}; echo 'rate: 1,500.5 images/s'",
        "--run", f"c=echo c >> {trace}; echo 'no figure here'"])
    assert code == 1  # c never gave a figure
    assert trace.read_text().split() == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    result = json.loads((tmp_path / "out.json").read_text())
    a, b, c = (result["variants"][n] for n in "abc")
    assert a["figures"] == [1000.0, 2000.0, 3000.0] and a["median"] == 2000.0
    assert b["figures"] == [1500.5] * 3 and b["median_ratio"] == pytest.approx(1500.5 / 2000.0)
    assert b["round_ratios"] == pytest.approx([1.5005, 1500.5 / 2000, 1500.5 / 3000])
    assert c["figures"] == [None] * 3 and c["median"] is None
    out = capsys.readouterr().out
    assert "round 2 c: failed (exit 0, no figure)" in out and "| b | 1,500.5 | 1,500.5 | 1,500.5 | 1,500.5 |" in out
    assert (tmp_path / "logs" / "b-2.txt").read_text() == "rate: 1,500.5 images/s\n"


def test_in_turn_reads_a_json_key_from_each_runs_own_file_and_refuses_bad_runs(tmp_path, capsys):
    in_turn = load_script("in_turn")
    write = "python3 -c \"import json, sys; json.dump({'rows': [{'v': 7.25}]}, open(sys.argv[1], 'w'))\" {json}"
    assert in_turn.main(["--rounds", "2", "--json-key", "rows.0.v", "--log-dir", str(tmp_path), "--run",
                         f"j={write}", "--run", "slow=sleep 5", "--timeout", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "round 1 j: 7.2" in out and "round 2 slow: failed (exit 124)" in out
    assert (tmp_path / "j-2.json").exists()
    assert in_turn.main(["--pattern", "x", "--run", "no command"]) == 2
    assert in_turn.main(["--pattern", "(", "--run", "a=true"]) == 2
    assert in_turn.main(["--pattern", "x", "--run", "a=true", "--run", "a=false"]) == 2
    assert "--run takes NAME=COMMAND" in capsys.readouterr().err
