"""Early OpenCL discovery (vggserve/runtime/warmstart.py): the context made ahead in a background thread is the one
the model uses, results are unchanged, a context made for another device is released, and the commands that build
a model start it. Each case runs in a fresh interpreter, since discovery starts once per process. Without a GPU
(VGGSERVE_TEST_DEVICE=cpu) the CPU (PoCL) stands in for it: the thread's GPU device type is pointed at CPUs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_DEVICE
from vggserve.cli import peek_device
from vggserve.runtime import warmstart

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
from vggserve.runtime import warmstart
if sys.argv[4] == "cpu":
    warmstart.CL_DEVICE_TYPE_GPU = 1 << 1  # CL_DEVICE_TYPE_CPU: PoCL's CPU device stands in for a GPU
import vggserve
started = vggserve.start_device_discovery(sys.argv[2])
import numpy as np
from vggserve.model.vgg16 import VGG16
warmstart.wait()
early = warmstart._early["context"]
if sys.argv[3] == "other-device":  # as if the early context were made on some other device
    warmstart._early["device"] = -1
model = VGG16.load(sys.argv[1], device=sys.argv[4], max_batch_size=2)
x = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
out = model.logits_from_pixels(x)
print(json.dumps({"started": started, "early": early, "used": model.context.int_ptr,
                  "taken_twice": warmstart.take_context(model.device) is not None,
                  "error": warmstart._early["error"], "logits": out.tolist()}))
"""


def run_child(weights, spec: str, case: str = "same-device", env_extra=None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    done = subprocess.run([sys.executable, "-c", CHILD, str(weights), spec, case, TEST_DEVICE], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain_logits(tiny_weights_path):
    import numpy as np

    from vggserve.model.vgg16 import VGG16

    x = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=2) as model:
        return model.logits_from_pixels(x)


def test_the_early_context_is_the_one_the_model_uses(tiny_weights_path, plain_logits):
    import numpy as np

    got = run_child(tiny_weights_path, "auto")
    assert got["started"] and got["error"] is None
    assert got["early"] and got["used"] == got["early"]
    assert not got["taken_twice"]  # handed out once
    np.testing.assert_array_equal(np.array(got["logits"], dtype=np.float32), plain_logits)


def test_an_early_context_for_another_device_is_released_and_not_used(tiny_weights_path, plain_logits):
    import numpy as np

    got = run_child(tiny_weights_path, "auto", "other-device")
    assert got["early"] and got["used"] != got["early"]
    np.testing.assert_array_equal(np.array(got["logits"], dtype=np.float32), plain_logits)


@pytest.mark.parametrize("spec", ["cpu", "gpu:1"])
def test_a_spec_not_naming_the_first_gpu_makes_no_early_context(tiny_weights_path, spec):
    got = run_child(tiny_weights_path, spec)
    assert got["started"] and got["early"] is None


def test_several_mpi_ranks_make_no_early_context(tiny_weights_path):
    got = run_child(tiny_weights_path, "auto", env_extra={"OMPI_COMM_WORLD_SIZE": "2"})
    assert got["started"] and got["early"] is None


def test_it_can_be_turned_off(tiny_weights_path):
    got = run_child(tiny_weights_path, "auto", env_extra={"VGGSERVE_EARLY_DISCOVERY": "0"})
    assert not got["started"] and got["early"] is None


def test_the_bundled_loader_is_found_without_importing_pyopencl():
    code = ("import sys; from vggserve.runtime import warmstart; path, own = warmstart.loader_library(); "
            "print(path, own, 'pyopencl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH",
                                                                                                    "")])}).stdout.split()
    assert "libOpenCL" in out[0] and ".so" in out[0]
    assert out[2] == "False"


@pytest.mark.parametrize("argv, expected", [
    (["classify", "--weights", "w", "a.jpg"], ("classify", "auto")),
    (["bench", "--device", "gpu:1"], ("bench", "gpu:1")),
    (["serve", "--device=cpu"], ("serve", "cpu")),
    (["serve"], ("serve", "all")),
    (["devices"], ("devices", None)),
    (["--help"], (None, None)),
])
def test_the_cli_peeks_the_command_and_device(argv, expected):
    assert peek_device(argv) == expected


def test_several_ranks_are_seen_from_the_launchers_environment(monkeypatch):
    from vggserve.distributed.mpi import SIZE_VARIABLES

    for key in SIZE_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    assert not warmstart.several_ranks()
    monkeypatch.setenv("PMI_SIZE", "1")
    assert not warmstart.several_ranks()
    monkeypatch.setenv("PMI_SIZE", "4")
    assert warmstart.several_ranks()


SLOW_DRIVER = r"""
import os, sys, time
from vggserve.runtime import warmstart
def slow(path, own_loader, want_context):  # a driver that takes its time to start, reading the environment
    time.sleep(1.0)
    os.write(1, b"driver started\n")
warmstart._discover = slow
assert warmstart.start("cpu")
assert os.environ.get("OPENBLAS_MAIN_FREE") == "1"  # set ahead, so numpy's import leaves the environment alone
"""


def run_slow_driver(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("OPENBLAS_MAIN_FREE", None)
    env.pop("VGGSERVE_EARLY_DISCOVERY", None)
    done = subprocess.run([sys.executable, "-c", SLOW_DRIVER + code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_the_environment_is_not_changed_while_the_drivers_start():
    """A setenv while the driver's getenv walks the environment crashed processes now and then (SIGSEGV, no output):
    another thread's change waits until the discovery thread has finished."""
    lines = run_slow_driver("os.environ['VGGSERVE_SOME_SETTING'] = '1'; print('set, finished:', "
                            "warmstart.times() is not None); os.unsetenv('VGGSERVE_SOME_SETTING'); print('unset')")
    assert lines == ["driver started", "set, finished: True", "unset"]


def test_the_process_exits_only_after_the_drivers_have_started():
    """An error found at once (a bad argument) ended the process mid-start of the drivers: it waits for them."""
    assert run_slow_driver("print('leaving', warmstart.times() is None, flush=True)") == ["leaving True",
                                                                                        "driver started"]
