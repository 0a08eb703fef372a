"""deploy/: what can be checked without root, systemd or GPUs. batch.sh's choices with stand-in commands on PATH
(nvidia-smi, mpirun) and --dry-run; the systemd unit's contents; nginx's config with the real nginx where it is
installed (error pages in the service's JSON shape, the deadline header capped below proxy_read_timeout); the
Docker build context and entrypoint."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def fake_bin(folder: Path, **scripts: str) -> Path:
    """A folder of executable sh scripts named after the keyword arguments."""
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name.replace("_", "-")
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return folder


def batch_sh(tmp_path, *args, **scripts) -> subprocess.CompletedProcess:
    """deploy/batch.sh --dry-run with only the stand-ins and the system's own /usr/bin:/bin on PATH."""
    scripts.setdefault("mpirun", 'echo "HYDRA build details:"')
    folder = fake_bin(tmp_path / "bin", **scripts)
    env = {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(DEPLOY / "batch.sh"), "--dry-run", *args], capture_output=True, text=True,
                          env=env, timeout=30)


def launched(result) -> list[str]:
    line = [x for x in result.stderr.splitlines() if x.startswith("batch.sh: ") and " -m vggserve " in x]
    assert len(line) == 1, result.stderr
    return line[0].removeprefix("batch.sh: ").split()


TWO_GPUS = 'echo "GPU 0: NVIDIA H100 (UUID: GPU-1)"; echo "GPU 1: NVIDIA H100 (UUID: GPU-2)"'


def test_batch_sh_without_a_gpu_does_not_ask_for_one(tmp_path):
    """It used to add --device gpu whatever it found: on a machine without GPU every job failed to set up."""
    done = batch_sh(tmp_path, "--weights", "w", "--input", "in", "--output", "o.jsonl")
    assert done.returncode == 0, done.stderr
    command = launched(done)
    assert command[:3] == ["mpirun", "-n", "1"] and command[-2:] == ["--device", "auto"]
    assert "found no GPU" in done.stderr


def test_batch_sh_with_a_broken_nvidia_driver_does_not_ask_for_a_gpu(tmp_path):
    done = batch_sh(tmp_path, "--input", "in", "--output", "o.jsonl",
                    nvidia_smi='echo "NVIDIA-SMI has failed because it could not communicate with the driver"; exit 9')
    assert launched(done)[-2:] == ["--device", "auto"]


def test_batch_sh_runs_one_rank_per_gpu_found(tmp_path):
    command = launched(batch_sh(tmp_path, "--input", "in", "--output", "o.jsonl", nvidia_smi=TWO_GPUS))
    assert command[:3] == ["mpirun", "-n", "2"] and command[-2:] == ["--device", "gpu"]


def test_batch_sh_keeps_the_device_it_is_given(tmp_path):
    for device in (["--device", "cpu"], ["--device=gpu:1"]):
        command = launched(batch_sh(tmp_path, "--input", "in", "--output", "o", *device, nvidia_smi=TWO_GPUS))
        assert command.count("--device") + sum(a.startswith("--device=") for a in command) == 1
        assert command[-len(device):] == device


def test_batch_sh_with_a_hostfile_asks_each_rank_for_its_gpu(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two machines\nnode1:4\nnode2:4\n")
    command = launched(batch_sh(tmp_path, "--hostfile", str(hosts), "--input", "in", "--output", "o"))
    assert command[:3] == ["mpirun", "-n", "8"] and command[-2:] == ["--device", "gpu"]
