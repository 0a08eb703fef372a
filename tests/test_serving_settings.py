"""Settings are validated when built, with messages that name the flag and a valid value."""

import pytest

from vggserve.serving.settings import Settings, SettingsError, parse_devices


@pytest.mark.parametrize("field, value, flag", [
    ("max_batch_size", 0, "--max-batch-size"),
    ("max_queue", -1, "--max-queue"),
    ("port", 70000, "--port"),
    ("max_wait_ms", float("nan"), "--max-wait-ms"),
    ("request_timeout_ms", "1000", "--request-timeout-ms"),
    ("max_body_bytes", 10, "--max-body-bytes"),
])
def test_out_of_range_values_fail_with_the_flag_and_an_example(field, value, flag):
    with pytest.raises(SettingsError) as info:
        Settings(**{field: value})
    message = str(info.value)
    assert flag in message and "pass e.g." in message and repr(value) in message


def test_max_files_must_fit_the_queue():
    with pytest.raises(SettingsError, match="--max-files"):
        Settings(max_files=20, max_queue=10)


def test_api_key_with_spaces_is_refused():
    with pytest.raises(SettingsError, match="VGGSERVE_API_KEY"):
        Settings(api_key="two words")


def test_device_lists_give_one_worker_each():
    assert parse_devices("gpu:0, gpu:1") == ("gpu:0", "gpu:1")
    assert parse_devices(None) == ("auto",)
    with pytest.raises(SettingsError, match="empty entry"):
        parse_devices("gpu:0,,gpu:1")


def test_a_device_given_twice_gets_a_label_of_its_own_which_an_engine_process_keeps():
    settings = Settings(devices=("gpu", "cpu:0", "gpu"), http_workers=2, engine_processes="per-device")
    assert settings.labels == ("gpu#1", "cpu:0", "gpu#2")
    assert Settings(devices=("gpu:0", "gpu:1")).labels == ("gpu:0", "gpu:1")
    third = settings.for_engine(2)
    assert third.devices == ("gpu",) and third.labels == ("gpu#2",)
    with pytest.raises(SettingsError, match="one per device"):
        Settings(devices=("gpu", "gpu"), device_labels=("a",))


def test_defaults_bind_loopback_and_hide_the_key():
    s = Settings(api_key="secret")
    assert s.host == "127.0.0.1"
    assert s.public()["api_key"] == "set"


def test_device_all_without_a_gpu_is_refused_not_quietly_the_cpu(monkeypatch):
    """`--device all` means one worker per GPU: with none, it is refused with how to serve on the CPU (issue 12,
    item 7), and with GPUs it lists each."""
    from types import SimpleNamespace

    from vggserve.errors import DeviceError
    from vggserve.runtime import devices

    monkeypatch.setattr(devices, "usable_gpus", lambda: [])
    with pytest.raises(DeviceError, match="--device cpu"):
        parse_devices("all")
    monkeypatch.setattr(devices, "usable_gpus", lambda: [SimpleNamespace(), SimpleNamespace()])
    assert parse_devices("all") == ("gpu:0", "gpu:1")
    assert parse_devices("cpu,all") == ("cpu", "gpu:0", "gpu:1")


def test_serve_device_all_on_a_machine_without_gpu_exits_3_with_one_line(tiny_weights_path):
    import subprocess
    import sys

    from vggserve.runtime.devices import usable_gpus
    from vggserve.testing.servers import python_env

    if usable_gpus():  # a GPU machine serves on its GPUs: nothing to refuse
        assert parse_devices("all")[0] == "gpu:0"
        return
    done = subprocess.run([sys.executable, "-m", "vggserve", "serve", "--weights", str(tiny_weights_path), "--device",
                           "all", "--port", "0"], env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--device cpu" in lines[0] and "serving on" not in done.stderr, done.stderr


@pytest.mark.parametrize("cpus, fronts, want", [(16, 1, 16), (2, 1, 2), (64, 1, 16), (16, 8, 4), (16, 2, 16),
                                                (2, 2, 2), (4, 8, 2)])
def test_decode_threads_by_default_are_a_share_of_the_cores_per_front_end(cpus, fronts, want):
    """One process: a thread per core (2..16); each of N front ends: twice its share of the cores, at least 2."""
    from vggserve.serving.settings import default_preprocess_threads

    assert default_preprocess_threads(fronts, cpus) == want


def test_settings_resolve_the_thread_default_from_the_front_ends_and_keep_a_given_number(monkeypatch):
    monkeypatch.setattr("vggserve.serving.settings.os.cpu_count", lambda: 16)
    assert Settings().preprocess_threads == 16
    assert Settings(http_workers=8, max_queue=256).preprocess_threads == 4
    assert Settings(http_workers=8, preprocess_threads=12).preprocess_threads == 12
    with pytest.raises(SettingsError, match="--preprocess-threads must be an integer from 1 to 256"):
        Settings(preprocess_threads=0)


@pytest.mark.parametrize("value", [0, 17, 2.5, "4", True])
def test_decode_group_is_an_integer_from_1_to_16(value):
    with pytest.raises(SettingsError) as info:
        Settings(decode_group=value)
    assert str(info.value) == (f"--decode-group must be an integer from 1 to 16, got {value!r}; pass e.g. "
                               "--decode-group 4")


def test_decode_group_defaults_to_the_batch_jobs_group_and_serve_takes_it():
    from vggserve.cli import build_parser, serve
    from vggserve.decoding.groups import GROUP

    parser = build_parser()
    assert Settings().decode_group == GROUP == 4
    assert serve._settings(parser.parse_args(["serve"])).decode_group == GROUP
    assert serve._settings(parser.parse_args(["serve", "--decode-group", "1"])).decode_group == 1
    assert serve._settings(parser.parse_args(["serve", "--decode-group", "16"])).public()["decode_group"] == 16
    for text in ("1.5", "four", "0", "17"):
        with pytest.raises(SettingsError, match=r"^--decode-group must be an integer from 1 to 16, got "):
            serve._settings(parser.parse_args(["serve", "--decode-group", text]))


def test_serve_refuses_a_bad_decode_group_with_one_line_and_exit_status_2(tiny_weights_path):
    import subprocess
    import sys

    from vggserve.testing.servers import python_env

    done = subprocess.run([sys.executable, "-m", "vggserve", "serve", "--weights", str(tiny_weights_path),
                           "--decode-group", "1.5", "--port", "0"], env=python_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["vggserve: error: --decode-group must be an integer from 1 to 16, got '1.5'; pass e.g. "
                     "--decode-group 4"], done.stderr


def test_lanes_default_to_one_and_are_refused_under_mpirun():
    assert Settings().lanes == 1 and Settings(lanes=4).lanes == 4
    with pytest.raises(SettingsError, match=r"^--lanes 2 does not work under mpirun .*drop --lanes"):
        Settings(lanes=2, devices=("mpi",), mpi=True)
    assert Settings(devices=("mpi",), mpi=True).lanes == 1


def test_max_wait_defaults_to_two_milliseconds():
    assert Settings().max_wait_ms == 2.0 and Settings().max_wait_s == 0.002
