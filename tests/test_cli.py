"""The command line end to end: classify, devices, bench, tune; the no-weights and bad-image messages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parent.parent
IMAGES = sorted(str(p) for p in (ROOT / "examples" / "images").iterdir())


def vggserve(*args, env=None, timeout=300):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "vggserve", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def test_classify_json_is_one_object_per_image_matching_the_engine(tiny_weights_path):
    from vggserve import VGG16

    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", "--top-k", "3", *IMAGES)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["image"] for x in lines] == IMAGES
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE) as model:
        expected = model.classify(IMAGES, top_k=3)
    for got, want in zip(lines, expected):
        assert [p["index"] for p in got["predictions"]] == [p["index"] for p in want]
        np.testing.assert_allclose([p["probability"] for p in got["predictions"]],
                                   [p["probability"] for p in want], rtol=1e-5)
        probs = [p["probability"] for p in got["predictions"]]
        assert probs == sorted(probs, reverse=True)
        assert all(set(p) == {"index", "label", "probability"} for p in got["predictions"])


def test_classify_text_output_lists_labels_and_percentages(tiny_weights_path):
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--top-k", "2", IMAGES[0])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == IMAGES[0] and len(lines) == 3 and all("%" in line for line in lines[1:])


def test_classify_bad_image_is_one_line_and_the_good_ones_still_print(tiny_weights_path, tmp_path):
    bad = tmp_path / "notes.jpg"
    bad.write_text("not an image")
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", bad, IMAGES[0])
    assert r.returncode == 5
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and str(bad) in errors[0] and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["image"] == IMAGES[0]


def test_classify_without_weights_says_how_to_get_them(tmp_path):
    env = {"VGGSERVE_CACHE_DIR": str(tmp_path), "VGGSERVE_WEIGHTS": ""}
    r = vggserve("classify", IMAGES[0], env=env)
    assert r.returncode == 4 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()[-1:]
    assert "no VGG16 weights found" in line and "vggserve weights fetch" in line and "--weights" in line
    assert "Traceback" not in r.stderr


def test_bad_device_spec_is_a_one_line_error(tiny_weights_path):
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", "tpu:0", IMAGES[0])
    assert r.returncode == 3 and "bad device spec 'tpu:0'" in r.stderr and "Traceback" not in r.stderr


def test_devices_lists_the_selectable_spec_and_the_auto_choice():
    r = vggserve("devices", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["auto"] in [d["spec"] for d in data["devices"] if d["usable"]]
    text = vggserve("devices").stdout
    assert f"* {data['auto']}" in text


def test_bench_json_reports_layers_throughput_and_startup(tiny_weights_path):
    r = vggserve("bench", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--batch-size", "2",
                 "--iterations", "1", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["batch_size"] == 2 and data["images_per_second"] > 0 and data["device"]
    assert data["streamed_images_per_second"] > 0
    names = [layer["name"] for layer in data["layers"]]
    assert names[0] == "features.0" and names[-1] == "classifier.6" and len([n for n in names if "pool" not in n]) == 16
    assert all(layer["ms"] > 0 for layer in data["layers"])
    assert all(layer["gflops"] > 0 for layer in data["layers"] if "pool" not in layer["name"])
    assert set(data["startup"]) == {"platform_discovery_s", "program_build_first_s", "program_build_cached_s",
                                    "weight_upload_s"}


def test_tune_stores_winners_that_the_engine_then_uses(tmp_path, tiny_tensors, monkeypatch):
    from vggserve import VGG16
    from vggserve.model.reference import reference_logits
    from vggserve.runtime import devices as devs
    from vggserve import tuning
    from vggserve.runtime.params import params_for

    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    info = devs.resolve(TEST_DEVICE)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] in ("3x8x224", "64x64x14")]
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=3, repeats=1, shapes=shapes,
                                  progress=lambda _: None)
    assert set(winners) == {"3x8x224", "64x64x14"}
    assert all(t.ok for t in trials) and len(trials) == 6
    tuning.store(info.label, winners, batch=1)
    stored = params_for(info.kind, info.label)["conv_by_batch"]["1"]
    assert {key: stored[key] for key in winners} == winners
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with VGG16.load(tiny_tensors, device=TEST_DEVICE) as model:
        out = model.logits(x)
    ref = reference_logits(tiny_tensors, x)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def test_tuned_table_nearest_in_batch_is_used():
    from vggserve.runtime.params import conv_params_for

    small, large = dict(TM=32, TN=32, TK=8, WM=2, WN=2, LPAD=1), dict(TM=128, TN=128, TK=16, WM=8, WN=8, LPAD=1)
    params = {"conv": {"TM": 64}, "conv_by_batch": {"1": {"512x512x14": small}, "64": {"512x512x14": large}}}
    assert conv_params_for(params, 512, 512, 14, batch=2) == small
    assert conv_params_for(params, 512, 512, 14, batch=32) == large
    assert conv_params_for(params, 3, 64, 224, batch=32) == {"TM": 64}


def test_device_all_expands_to_one_worker_per_gpu_or_the_cpu():
    from vggserve.runtime import devices as devs

    gpus = [d for d in devs.list_devices() if d.usable and d.kind == "gpu"]
    assert devs.expand("all") == (tuple(f"gpu:{i}" for i in range(len(gpus))) or ("cpu",))
    assert devs.expand("gpu:1") == ("gpu:1",)


def test_version_prints_the_package_version_and_exits_0():
    from vggserve import __version__

    r = vggserve("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"vggserve {__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'path = "vggserve/__init__.py"' in pyproject  # one source


def test_top_k_outside_1_to_1000_is_the_same_usage_error_for_classify_and_batch(tmp_path):
    """`--top-k 0` exited 2 (argparse) while `--top-k 2000` exited 1 (checked later) for classify."""
    for command in (["classify", IMAGES[0]], ["batch", "--input", IMAGES[0], "--output", tmp_path / "r.jsonl"]):
        for value, words in (("0", "expected a positive integer, got 0"), ("2000", "must be at most 1000")):
            r = vggserve(*command, "--top-k", value)
            assert r.returncode == 2, (command, value, r.stderr)
            assert f"argument --top-k: {words}" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "r.jsonl").exists()


def test_classify_reads_an_image_piped_to_dev_stdin(tiny_weights_path):
    """`cat photo.jpg | vggserve classify /dev/stdin` was refused: a pipe's size is 0, so it was called empty."""
    r = subprocess.run([sys.executable, "-m", "vggserve", "classify", "--weights", str(tiny_weights_path),
                        "--device", TEST_DEVICE, "--json", "/dev/stdin"], input=Path(IMAGES[0]).read_bytes(),
                       capture_output=True, timeout=300, cwd=ROOT)  # input=: stdin is a pipe
    assert r.returncode == 0, r.stderr.decode()
    piped = json.loads(r.stdout)
    direct = json.loads(vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json",
                                 IMAGES[0]).stdout)
    assert piped["image"] == "/dev/stdin" and piped["predictions"] == direct["predictions"]


def test_bench_refuses_a_negative_warmup_as_a_usage_error():
    """`--warmup -1` was taken (as no warm-up) without a word, unlike a bad --iterations or --batch-size."""
    for flag, value, words in (("--warmup", "-1", "expected a non-negative integer, got -1"),
                               ("--warmup", "x", "expected a non-negative integer, got 'x'"),
                               ("--iterations", "0", "expected a positive integer, got 0"),
                               ("--batch-size", "-2", "expected a positive integer, got -2"),
                               ("--lanes", "0", "expected an integer from 1 to 4, got 0"),
                               ("--lanes", "5", "expected an integer from 1 to 4, got 5")):
        r = vggserve("bench", flag, value)
        assert r.returncode == 2 and f"argument {flag}: {words}" in r.stderr.strip().splitlines()[-1], r.stderr


def test_bench_lanes_runs_the_streamed_figure_on_that_many_lanes(tiny_weights_path):
    r = vggserve("bench", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--batch-size", "1",
                 "--iterations", "2", "--lanes", "2", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["lanes"] == 2 and data["streamed_images_per_second"] > 0


def test_classify_max_pixels_lets_a_larger_photo_through_or_refuses_a_smaller_one(tiny_weights_path):
    """A 48 MP camera photo was refused (40 MP limit) with no way round it: `serve` had --max-pixels, classify not.
    Here the limits are scaled down: sunset.jpg is 320x240 = 76800 pixels, rings_gray.png 200x150 = 30000."""
    sunset, rings = str(ROOT / "examples/images/sunset.jpg"), str(ROOT / "examples/images/rings_gray.png")
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", "--max-pixels",
                 "50000", sunset, rings)
    assert r.returncode == 5
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and sunset in errors[0] and "76800 pixels, more than the limit of 50000" in errors[0]
    assert [json.loads(line)["image"] for line in r.stdout.splitlines()] == [rings]
    r = vggserve("classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", "--max-pixels",
                 "76800", sunset)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["image"] == sunset


def test_max_pixels_is_checked_alike_by_classify_batch_and_serve(tmp_path):
    """The same range as serve's --max-pixels (1 to 2**31), refused before anything runs (exit status 2)."""
    from vggserve.serving.settings import Settings, SettingsError

    for value in ("0", "2147483649", "many"):
        for command in (["classify", IMAGES[0]], ["batch", "--input", IMAGES[0], "--output", tmp_path / "r.jsonl"]):
            r = vggserve(*command, "--max-pixels", value)
            assert r.returncode == 2, (command, value, r.stderr)
            last = r.stderr.strip().splitlines()[-1]
            shown = repr(value) if value == "many" else value
            assert f"argument --max-pixels: must be an integer from 1 to 2147483648, got {shown}" in last
        if value != "many":
            refused = f"--max-pixels must be an integer from 1 to 2147483648, got {value}"
            with pytest.raises(SettingsError, match=refused):
                Settings(max_pixels=int(value))
    assert not (tmp_path / "r.jsonl").exists()


def test_classify_with_the_device_jpeg_decoder_prints_what_exact_prints(tiny_weights_path, tmp_path):
    """`--decode gpu` (here on the test device): the same results, errors and exit status as the CPU decode."""
    import io

    from PIL import Image

    rng = np.random.default_rng(5)
    made = []
    for name, save in [("base.jpg", dict(quality=90)), ("sub422.jpg", dict(subsampling=1)),
                       ("progressive.jpg", dict(progressive=True)), ("restart.jpg", dict(restart_marker_blocks=2)),
                       ("pic.png", {})]:
        path = tmp_path / name
        Image.fromarray(rng.integers(0, 255, (300, 260, 3), dtype=np.uint8)).save(path, **save)
        made.append(str(path))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(Path(made[0]).read_bytes()[:700])
    args = ["classify", "--weights", tiny_weights_path, "--device", TEST_DEVICE, "--json", "--top-k", "3",
            *IMAGES, *made, str(broken), str(tmp_path / "missing.jpg")]
    exact = vggserve(*args, "--decode", "exact")
    device = vggserve(*args, "--decode", "gpu")
    assert exact.returncode == device.returncode == 5, device.stderr
    assert device.stdout == exact.stdout and len(exact.stdout.splitlines()) == len(IMAGES) + len(made)
    errors = lambda r: sorted(line for line in r.stderr.splitlines() if line.startswith("vggserve: error"))  # noqa: E731
    assert errors(device) == errors(exact) and len(errors(exact)) == 2


def test_classify_by_default_decodes_on_the_cpu_where_the_gpus_jpeg_decoder_does_not_build(
        tiny_weights_path, monkeypatch, capsys, caplog):
    """`--decode auto` is the default: on a GPU whose device JPEG decoder fails to build, classify says so in one
    line and prints what `--decode exact` prints (the model here: the test device said to be a GPU)."""
    import dataclasses

    from vggserve.cli import build_parser, classify
    from vggserve.cli.common import load_model

    def on_a_broken_gpu(*args, **kwargs):
        model = load_model(*args, **kwargs)
        model.device_info = dataclasses.replace(model.device_info, kind="gpu")

        def broken():
            raise RuntimeError("clBuildProgram failed: CL_BUILD_PROGRAM_FAILURE\n<the build log>")

        model.jpeg_decoder = broken
        return model

    args = ["classify", "--weights", str(tiny_weights_path), "--device", TEST_DEVICE, "--json", "--top-k", "3",
            *IMAGES]
    assert classify.run(build_parser().parse_args([*args, "--decode", "exact"])) == 0
    exact = capsys.readouterr().out
    parsed = build_parser().parse_args(args)
    assert parsed.decode == "auto"
    monkeypatch.setattr(classify, "load_model", on_a_broken_gpu)
    with caplog.at_level("WARNING", logger="vggserve"):
        assert classify.run(parsed) == 0
    assert capsys.readouterr().out == exact and exact.count("\n") == len(IMAGES)
    warned = [r.getMessage() for r in caplog.records if "JPEG decoder" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("(RuntimeError: clBuildProgram failed: CL_BUILD_PROGRAM_FAILURE); "
                                                   "JPEGs are decoded on the CPU"), warned
