"""`vggserve batch` under mpiexec (MPICH from PyPI) on the CPU engine with the tiny width-1/8 weights.

13 images (10 readable, 3 not), so neither 2 nor 3 ranks divide the work evenly. Expected predictions come from
the single-process engine (open_image -> preprocess -> VGG16.probabilities -> top_k), computed in this process.
The work-sharing tests run stand-in models that only sleep (mpi_scripts/batch_with_standin_models.py).
Every subprocess is bounded by a timeout.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_scripts.launch import mpiexec, subprocess_env
from PIL import Image

from vggserve.distributed.workqueue import TOKENS

pytestmark = pytest.mark.mpi

SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
RUN_TIMEOUT = 240
GOOD = 10
BAD = {"not_an_image.jpg": "text", "empty.png": "empty", "sub/truncated.jpg": "truncated"}


def batch_command(ranks, weights, images, output, *extra):
    launcher = mpiexec(ranks) if ranks else []  # ranks=None: plain python, no mpiexec
    return [*launcher, sys.executable, "-m", "vggserve", "batch", "--weights", str(weights), "--input", str(images),
            "--output", str(output), "--device", "cpu", "--no-progress", *extra]


def run(command, cwd, **env):
    return subprocess.run(command, cwd=cwd, env={**subprocess_env(), **env}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)


def read_jsonl(path):
    """Every line must be a whole JSON object (no partial lines)."""
    if not path.exists():
        return []
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path} ends in a partial line"
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A folder of 10 readable images (sizes, modes, formats vary; one nested) and 3 unreadable files."""
    folder = tmp_path_factory.mktemp("batch_images")
    (folder / "sub").mkdir()
    rng = np.random.default_rng(3)
    for i in range(GOOD):
        pixels = rng.integers(0, 256, (60 + 17 * i, 90 + 11 * i, 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
        if i == 3:
            image = image.convert("L")
        if i == 5:
            image = image.convert("RGBA")  # saved as PNG
        name = f"{'sub/' if i % 4 == 0 else ''}img{i:02d}.{'png' if i % 2 else 'jpg'}"
        image.save(folder / name)
    (folder / "not_an_image.jpg").write_text("hello")
    (folder / "empty.png").write_bytes(b"")
    (folder / "sub/truncated.jpg").write_bytes((folder / "img02.jpg").read_bytes()[:300])
    (folder / "README.txt").write_text("not an image name: ignored by the directory scan")
    return folder


@pytest.fixture(scope="module")
def expected(images, tiny_weights_path):
    """{path: predictions} for the readable images, from single-process `vggserve classify --json`."""
    from vggserve.distributed.inputs import list_inputs

    good = [p for p in list_inputs(str(images)) if os.path.relpath(p, images) not in BAD]
    assert len(good) == GOOD
    run = subprocess.run([sys.executable, "-m", "vggserve", "classify", "--json", "--device", "cpu",
                          "--weights", str(tiny_weights_path), *good], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [x["image"] for x in lines] == good
    return {x["image"]: x["predictions"] for x in lines}


def assert_same_predictions(results, expected):
    """Same images, same classes in the same order, probabilities equal to float32 precision."""
    got = {record["image"]: record["predictions"] for record in results}
    assert len(got) == len(results), "an image appears more than once"
    assert set(got) == set(expected)
    for image, predictions in expected.items():
        assert [p["index"] for p in got[image]] == [p["index"] for p in predictions], image
        assert [p["label"] for p in got[image]] == [p["label"] for p in predictions], image
        np.testing.assert_allclose([p["probability"] for p in got[image]],
                                   [p["probability"] for p in predictions], rtol=1e-5, atol=1e-7)


def assert_bad_images_listed(errors, images):
    assert sorted(e["image"] for e in errors) == sorted(str(images / name) for name in BAD)
    assert all(e["error"] and e["type"] for e in errors)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_mpiexec_ranks_give_the_single_process_predictions_and_list_unreadable_images(
        ranks, images, expected, tiny_weights_path, tmp_path):
    output = tmp_path / "results.jsonl"
    summary = tmp_path / "summary.json"
    done = run(batch_command(ranks, tiny_weights_path, images, output, "--batch-size", "2",
                             "--summary", str(summary)), tmp_path)
    assert done.returncode == 5, done.stderr  # images failed: classify's status (every result still written)
    assert f"vggserve batch: {len(BAD)} images could not be classified: they are listed in" in done.stderr
    assert_same_predictions(read_jsonl(output), expected)
    assert_bad_images_listed(read_jsonl(tmp_path / "results.errors.jsonl"), images)
    report = json.loads(summary.read_text())
    assert (report["images"], report["errors"]) == (GOOD + len(BAD), len(BAD))
    assert [r["rank"] for r in report["ranks"]] == list(range(ranks))
    assert sum(r["images"] for r in report["ranks"]) == GOOD + len(BAD)
    assert "13 images (10 classified, 3 errors)" in done.stdout
    assert all(r["decode_processes"] >= 1 and r["decode_restarts"] == 0 for r in report["ranks"])  # the default
    assert {"read", "decode", "link", "result", "rank_process"} <= set(report["ranks"][0]["cpu_ms_per_image"])
    assert "rank 0 CPU ms per image: read" in done.stdout


@pytest.mark.parametrize("ranks, extra", [(1, ["--decode-procs", "2"]), (2, ["--decode-procs", "1"]),
                                          (2, ["--decode-procs", "0", "--decode-threads", "2"])])
def test_decode_processes_or_threads_give_the_single_process_predictions(ranks, extra, images, expected,
                                                                       tiny_weights_path, tmp_path):
    output, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    done = run(batch_command(ranks, tiny_weights_path, images, output, "--batch-size", "3", "--summary",
                             str(summary), *extra), tmp_path)
    assert done.returncode == 5, done.stderr
    assert_same_predictions(read_jsonl(output), expected)
    assert_bad_images_listed(read_jsonl(tmp_path / "results.errors.jsonl"), images)
    procs = int(extra[1])
    assert [r["decode_processes"] for r in json.loads(summary.read_text())["ranks"]] == [procs] * ranks


def test_list_file_input_records_missing_files_as_errors(images, expected, tiny_weights_path, tmp_path):
    listing = images / "two.txt"  # relative entries: resolved against the list's folder
    listing.write_text("# two good, one missing\nimg01.png\nsub/img00.jpg\nmissing.jpg\n")
    output = tmp_path / "results.jsonl"
    done = run(batch_command(2, tiny_weights_path, listing, output), tmp_path)
    assert done.returncode == 5, done.stderr
    wanted = {p: expected[p] for p in (str(images / "img01.png"), str(images / "sub/img00.jpg"))}
    assert_same_predictions(read_jsonl(output), wanted)
    errors = read_jsonl(tmp_path / "results.errors.jsonl")
    assert [e["image"] for e in errors] == [str(images / "missing.jpg")]


def _processes_mentioning(marker):
    """PIDs whose command line contains `marker` (our unique output path): the job's ranks and launcher."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _decode_processes_of(pids):
    """PIDs of the decode processes (vggserve.decoding.worker) whose parent is one of `pids`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent in pids and b"vggserve.decoding.worker" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _kill_job(process, marker):
    """kill -9 the launcher's process group and every rank of the job (Hydra gives ranks their own groups). The
    ranks' decode processes are not killed here: they must end by themselves when their rank dies."""
    ranks = _processes_mentioning(marker)
    decoders = _decode_processes_of(set(ranks))
    os.killpg(process.pid, signal.SIGKILL)
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(marker), "ranks survived the kill"
    while any(Path(f"/proc/{pid}").exists() for pid in decoders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in decoders), "decode processes outlived their rank"
    return decoders


def test_rerun_after_kill_completes_every_image_exactly_once(images, expected, tiny_weights_path, tmp_path):
    output = tmp_path / "killed-run.jsonl"
    errors_file = tmp_path / "killed-run.errors.jsonl"
    command = batch_command(2, tiny_weights_path, images, output, "--batch-size", "1", "--decode-procs", "1")
    process = subprocess.Popen(command, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not (output.exists() and output.read_bytes().count(b"\n") >= 2):
            assert process.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline, "no results appeared"
            time.sleep(0.02)
    finally:
        decoders = _kill_job(process, str(output))
    assert decoders, "the ranks had decode processes"
    first = read_jsonl(output) + read_jsonl(errors_file)
    assert 2 <= len(first) < GOOD + len(BAD), "the kill should have come part way"
    with open(output, "a") as handle:  # what a write torn by the kill would leave
        handle.write('{"image": "' + str(images / "img09.png") + '", "predictions": [{"ind')

    rerun = run(batch_command(None, tiny_weights_path, images, output), tmp_path)  # one rank, no mpiexec
    assert rerun.returncode == 5, rerun.stderr
    assert "partial last line" in rerun.stderr
    assert f"{len(first)} already done before this run" in rerun.stdout
    assert_same_predictions(read_jsonl(output), expected)
    assert_bad_images_listed(read_jsonl(errors_file), images)

    again = run(batch_command(2, tiny_weights_path, images, output), tmp_path)
    assert again.returncode == 5 and "nothing to do" in again.stdout and "3 of them in its errors file" in again.stdout
    retried = run(batch_command(None, tiny_weights_path, images, output, "--retry-errors"), tmp_path)
    assert retried.returncode == 5, retried.stderr
    assert "3 images (0 classified, 3 errors)" in retried.stdout
    assert_same_predictions(read_jsonl(output), expected)
    assert_bad_images_listed(read_jsonl(errors_file), images)


def _shared_memory_of(pids):
    """Files in /dev/shm that the processes `pids` map or hold open (not those already unlinked)."""
    held = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
            targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for path in [line.split(None, 5)[-1] for line in lines] + targets:
            if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                held.add(path)
    return held


def _start_and_wait_for_results(command, output, cwd, env=None, lines=2):
    process = subprocess.Popen(command, cwd=cwd, env=env or subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (output.exists() and output.read_bytes().count(b"\n") >= lines):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the job ended or stalled before it could be interrupted: {process.communicate()[1]}")
        time.sleep(0.02)
    return process


@pytest.mark.parametrize("interrupt", ["kill -9 of one rank", "SIGTERM to mpiexec", "Ctrl-C to mpiexec"])
def test_an_interrupted_mpi_job_leaves_no_shared_memory_behind_once_it_is_run_again(interrupt, many_images,
                                                                                    tiny_weights_path, tmp_path):
    """Each interruption left an 86 MB psm_* segment per rank (the decode processes' ring) and MPICH's
    mpich_shm_* in /dev/shm, for good. The ring now has no name at all; MPICH's segments are unlinked by a rank
    that is stopped or aborted, and what a kill -9 left is released by the next run, which says so."""
    output = tmp_path / "interrupted.jsonl"
    command = batch_command(2, tiny_weights_path, many_images, output, "--batch-size", "1", "--decode-procs", "1")
    process = _start_and_wait_for_results(command, output, tmp_path)
    ranks = [pid for pid in _processes_mentioning(str(output)) if pid != process.pid]  # not mpiexec itself
    held = _shared_memory_of(ranks)
    assert held and all(Path(path).name.startswith("mpich_") for path in held), held  # none of ours has a name
    if interrupt.startswith("kill"):
        os.kill(max(ranks), signal.SIGKILL)
    else:
        process.send_signal(signal.SIGTERM if "SIGTERM" in interrupt else signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(output)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {path for path in held if Path(path).exists()}
    if interrupt.startswith("kill"):
        assert process.returncode != 0
        rerun = run(batch_command(None, tiny_weights_path, many_images, output), tmp_path)
        assert rerun.returncode == 0, rerun.stderr
        if left:  # what the killed job could not unlink is named in one line
            (line,) = [x for x in rerun.stderr.splitlines() if x.startswith("vggserve batch: released ")]
            assert all(Path(path).name in line for path in left), (left, line)
        assert not any(Path(path).exists() for path in held)
    else:
        signame = "SIGTERM" if "SIGTERM" in interrupt else "Ctrl-C (SIGINT)"
        assert process.returncode == (143 if "SIGTERM" in interrupt else 130), stderr
        assert f"vggserve batch: stopped by {signame}; " in stderr and "run the same command again" in stderr
        assert not left, f"the stopped ranks left {left}"
    read_jsonl(output)  # whole lines


@pytest.mark.parametrize("failing", [1, 0])  # rank 0's own chunks run on a helper thread beside the coordinator
def test_exception_on_one_rank_aborts_the_whole_job_promptly_with_its_message(failing, images, tiny_weights_path,
                                                                              tmp_path):
    output = tmp_path / "results.jsonl"
    command = [*mpiexec(3), sys.executable, str(SCRIPTS / "batch_with_failing_rank.py"), str(failing),
               "--weights", str(tiny_weights_path), "--input", str(images), "--output", str(output),
               "--device", "cpu", "--batch-size", "2", "--no-progress"]
    started = time.monotonic()
    done = run(command, tmp_path)
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert f"rank {failing} (cpu): RuntimeError: injected failure on rank {failing} (aborting all ranks)" in done.stderr
    read_jsonl(output)  # whatever was written is whole lines


@pytest.mark.parametrize("extra, code, message", [
    (["--weights", "/no/such/weights.safetensors"], 4, "does not exist"),  # found by rank 0 before loading
    (["--device", "nonsense,cpu"], 3, "rank 0 (nonsense): bad device spec"),  # only rank 0 fails to load
])
def test_setup_failure_ends_every_rank_with_one_clear_line(extra, code, message, images, tiny_weights_path,
                                                           tmp_path):
    done = run(batch_command(2, tiny_weights_path, images, tmp_path / "out" / "results.jsonl", *extra), tmp_path)
    assert done.returncode == code, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and lines[0].startswith("vggserve: error: ") and message in lines[0], done.stderr
    assert not (tmp_path / "out").exists(), "a failed set-up must leave no (empty) output files behind"


def test_failed_setup_of_a_single_process_leaves_no_output_files(images, tiny_weights_path, tmp_path):
    """`--device gpu` on a machine without one (here a device that exists nowhere) used to leave empty
    results.jsonl and results.errors.jsonl."""
    output = tmp_path / "results.jsonl"
    done = run(batch_command(None, tiny_weights_path, images, output, "--device", "9:9"), tmp_path)
    assert done.returncode == 3, done.stderr
    assert "no OpenCL device 9:9" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- without MPI ------------------------------------------------------------------------------------------------
UNLOADABLE_MPI = {"MPI4PY_LIBMPI": "/nonexistent/libmpi.so.12"}  # as if no MPI library were installed


def env_without_launcher() -> dict:
    from vggserve.distributed.mpi import LAUNCHER_VARIABLES, SIZE_VARIABLES

    return {k: v for k, v in subprocess_env().items() if k not in LAUNCHER_VARIABLES + SIZE_VARIABLES}


def test_without_a_launcher_the_batch_job_runs_as_one_process_without_mpi(images, expected, tiny_weights_path,
                                                                          tmp_path):
    """A plain `pip install vggserve` has mpi4py but no MPI library: `vggserve batch` used to die with
    `RuntimeError: cannot load MPI library`. Here mpi4py is not even importable."""
    output = tmp_path / "results.jsonl"
    code = ("import sys; sys.modules['mpi4py'] = None; from vggserve.cli import main; "
            "code = main(sys.argv[1:]); assert not [m for m in sys.modules if m.startswith('mpi4py.')]; sys.exit(code)")
    command = [sys.executable, "-c", code, *batch_command(None, tiny_weights_path, images, output)[3:]]
    done = subprocess.run(command, cwd=tmp_path, env=env_without_launcher(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 5, done.stderr
    assert_same_predictions(read_jsonl(output), expected)
    assert_bad_images_listed(read_jsonl(tmp_path / "results.errors.jsonl"), images)


def test_without_a_launcher_an_unloadable_mpi_library_does_not_matter(images, tiny_weights_path, tmp_path):
    output = tmp_path / "results.jsonl"
    done = subprocess.run(batch_command(None, tiny_weights_path, images, output), cwd=tmp_path,
                          env={**env_without_launcher(), **UNLOADABLE_MPI}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 5, done.stderr
    assert len(read_jsonl(output)) == GOOD


def test_under_mpiexec_an_unloadable_mpi_library_is_one_line_per_rank(images, tiny_weights_path, tmp_path):
    output = tmp_path / "results.jsonl"
    done = run(batch_command(2, tiny_weights_path, images, output), tmp_path, **UNLOADABLE_MPI)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr
    for line in lines:
        assert line.startswith("vggserve: error: started by an MPI launcher (PMI_RANK="), line
        assert "but MPI cannot be loaded (cannot load MPI library" in line and "without mpirun" in line, line
    assert not output.exists()


def test_sigterm_stops_a_single_process_job_in_one_line_that_says_how_to_go_on(many_images, tiny_weights_path,
                                                                               tmp_path):
    """It ended with Python's `resource_tracker: ... leaked shared_memory` warning and no word of its own."""
    output = tmp_path / "results.jsonl"
    command = batch_command(None, tiny_weights_path, many_images, output, "--batch-size", "1", "--decode-procs", "1")
    process = _start_and_wait_for_results(command, output, tmp_path, env=env_without_launcher())
    decoders = _decode_processes_of({process.pid})
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    done = len(read_jsonl(output)) + len(read_jsonl(tmp_path / "results.errors.jsonl"))
    lines = [line for line in stderr.splitlines() if not line.startswith("vggserve batch: released ")]  # others' orphans
    verb = "is" if done == 1 else "are"
    assert lines == [f"vggserve batch: stopped by SIGTERM; {done} of {MANY} images {verb} recorded in {output} and "
                     f"results.errors.jsonl; run the same command again to classify the other {MANY - done}"]
    assert decoders and not any(Path(f"/proc/{pid}").exists() for pid in decoders)


def test_exit_status_is_5_while_images_are_in_the_errors_file_and_0_once_each_has_a_result(images, tiny_weights_path,
                                                                                           tmp_path):
    """`batch` exited 0 with failed images where `classify` exits 5; a rerun with nothing to do says the same."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("img01.png", "img03.png", "not_an_image.jpg"):
        (folder / name).write_bytes((images / name).read_bytes())
    output = tmp_path / "results.jsonl"
    first = run(batch_command(None, tiny_weights_path, folder, output), tmp_path)
    assert first.returncode == 5, first.stderr
    assert len(read_jsonl(output)) == 2 and len(read_jsonl(tmp_path / "results.errors.jsonl")) == 1
    assert "vggserve batch: 1 image could not be classified: it is listed in" in first.stderr
    again = run(batch_command(None, tiny_weights_path, folder, output), tmp_path)
    assert again.returncode == 5 and "nothing to do" in again.stdout and "--retry-errors" in again.stdout
    (folder / "not_an_image.jpg").write_bytes((images / "img02.jpg").read_bytes())  # fixed
    fixed = run(batch_command(None, tiny_weights_path, folder, output, "--retry-errors"), tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert len(read_jsonl(output)) == 3 and read_jsonl(tmp_path / "results.errors.jsonl") == []


def test_max_pixels_sends_larger_images_to_the_errors_file(images, expected, tiny_weights_path, tmp_path):
    """`batch` had no --max-pixels (a 48 MP photo was refused with no way round it); scaled down here: img02.jpg
    is 112 x 94 = 10528 pixels, the others fewer than 8000."""
    folder = tmp_path / "sized"
    folder.mkdir()
    for name in ("sub/img00.jpg", "img01.png", "img02.jpg"):
        (folder / Path(name).name).write_bytes((images / name).read_bytes())
    output = tmp_path / "results.jsonl"
    done = run(batch_command(None, tiny_weights_path, folder, output, "--max-pixels", "8000"), tmp_path)
    assert done.returncode == 5, done.stderr
    assert_same_predictions(read_jsonl(output), {str(folder / Path(n).name): expected[str(images / n)]
                                                 for n in ("sub/img00.jpg", "img01.png")})
    (error,) = read_jsonl(tmp_path / "results.errors.jsonl")
    assert error["image"] == str(folder / "img02.jpg") and error["type"] == "ImageTooLarge"
    assert "10528 pixels, more than the limit of 8000 pixels" in error["error"]


def test_ranks_in_one_cpuset_count_a_share_of_its_cores_each(tmp_path):
    """Under a cgroup cpuset every rank used to count the whole of it (and start that many decode processes)."""
    code = ("from vggserve.distributed.cores import rank_cores; from vggserve.distributed.mpi import world; "
            "comm = world(); shares = comm.gather(rank_cores(comm)); comm.Get_rank() or print(shares)")
    done = run(["taskset", "-c", "0", *mpiexec(2), sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0.5, 0.5]"  # two ranks on one core


def test_a_decode_process_that_crashes_or_hangs_is_replaced_and_its_image_recorded(images, expected,
                                                                                   tiny_weights_path, tmp_path):
    folder = tmp_path / "faulty"
    folder.mkdir()
    for name in ("img01.png", "img02.jpg", "img06.jpg", "img07.png", "img09.png"):
        (folder / name).write_bytes((images / name).read_bytes())
    (folder / "crash.jpg").write_bytes((images / "img02.jpg").read_bytes())
    (folder / "hang.jpg").write_bytes((images / "img06.jpg").read_bytes())
    output, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    command = [*mpiexec(2), sys.executable, str(SCRIPTS / "batch_with_faulty_decoder.py"), "--weights",
               str(tiny_weights_path), "--input", str(folder), "--output", str(output), "--device", "cpu",
               "--no-progress", "--batch-size", "2", "--decode-procs", "1", "--decode-timeout", "3",
               "--summary", str(summary)]
    tests = str(Path(__file__).resolve().parent)
    done = run(command, tmp_path, PYTHONPATH=os.pathsep.join([subprocess_env()["PYTHONPATH"], tests]))
    assert done.returncode == 5, done.stderr
    good = {str(folder / name): expected[str(images / name)] for name in
            ("img01.png", "img02.jpg", "img06.jpg", "img07.png", "img09.png")}
    assert_same_predictions(read_jsonl(output), good)
    errors = {Path(e["image"]).name: e for e in read_jsonl(tmp_path / "results.errors.jsonl")}
    assert set(errors) == {"crash.jpg", "hang.jpg"}
    assert errors["crash.jpg"]["type"] == "DecodeProcessDied" and "signal 9" in errors["crash.jpg"]["error"]
    assert errors["hang.jpg"]["type"] == "DecodeTimeout" and "longer than 3 s" in errors["hang.jpg"]["error"]
    assert sum(r["decode_restarts"] for r in json.loads(summary.read_text())["ranks"]) == 2
    rerun = run(command, tmp_path, PYTHONPATH=os.pathsep.join([subprocess_env()["PYTHONPATH"], tests]))
    assert rerun.returncode == 5 and "nothing to do" in rerun.stdout  # recorded errors count as done


# ---- work sharing ------------------------------------------------------------------------------------------------
MANY = 60


@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("many_images")
    for i in range(MANY):
        Image.new("RGB", (40 + i, 30 + i), (4 * i, 0, 255 - 4 * i)).save(folder / f"i{i:02d}.png")
    return folder


def run_standins(ranks, slow, fast, images, weights, tmp_path, *extra, **env):
    """The batch job with rank 0's model sleeping `slow` s per batch and the others' `fast` s; returns
    (images per rank, summary); asserts one result line per image."""
    output, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    command = [*mpiexec(ranks), sys.executable, str(SCRIPTS / "batch_with_standin_models.py"), str(slow), str(fast),
               "--weights", str(weights), "--input", str(images), "--output", str(output), "--no-progress",
               "--summary", str(summary), *extra]
    env.setdefault("VGGSERVE_BATCH_TOKENS", str(TOKENS))  # rank 0's first deal as these tests count it
    done = run(command, tmp_path, **env)
    assert done.returncode == 0, done.stderr
    results = sorted(record["image"] for record in read_jsonl(output))
    assert results == sorted(str(path) for path in images.iterdir()), "every image exactly once"
    report = json.loads(summary.read_text())
    return [entry["images"] for entry in report["ranks"]], report


@pytest.mark.parametrize("thread_level", ["multiple", "funneled"])
def test_a_slow_rank_0_keeps_answering_while_it_classifies(thread_level, many_images, tiny_weights_path, tmp_path):
    """Rank 0 takes 1 s per chunk of 2, the others 10 ms: while rank 0 classifies its first deal, the two workers
    must get the other chunks, evenly. (Answering only between its own chunks gave rank 0 a chunk per second and
    let the workers wait: 12 images on rank 0 instead of 6.)"""
    # decoding on threads: this is about the coordinator; decode processes starting at different speeds on a
    # loaded 2-core machine would make the workers' shares uneven for reasons of their own
    counts, report = run_standins(3, 1.0, 0.01, many_images, tiny_weights_path, tmp_path, "--batch-size", "2",
                                  "--decode-procs", "0", MPI4PY_RC_THREAD_LEVEL=thread_level)
    assert counts[0] <= (TOKENS + 1) * 2, counts  # its first deal, or one chunk more on a very busy machine
    assert min(counts[1:]) >= 20 and abs(counts[1] - counts[2]) <= 10, counts


def test_at_thread_level_single_rank_0_answers_between_its_own_steps(many_images, tiny_weights_path, tmp_path):
    counts, _ = run_standins(3, 0.2, 0.01, many_images, tiny_weights_path, tmp_path, "--batch-size", "2",
                             MPI4PY_RC_THREAD_LEVEL="single")
    assert min(counts) > 0, counts


def test_three_images_over_two_ranks_give_rank_1_work(images, expected, tiny_weights_path, tmp_path):
    """The default batch size (16) would make one chunk of the three images; the job cuts it smaller."""
    folder = tmp_path / "three"
    folder.mkdir()
    names = ["img01.png", "img03.png", "img06.jpg"]
    for name in names:
        (folder / name).write_bytes((images / name).read_bytes())
    output, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    done = run(batch_command(2, tiny_weights_path, folder, output, "--summary", str(summary)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert_same_predictions(read_jsonl(output), {str(folder / n): expected[str(images / n)] for n in names})
    counts = [entry["images"] for entry in json.loads(summary.read_text())["ranks"]]
    assert counts[1] >= 1 and sum(counts) == 3, counts


@pytest.mark.parametrize("ranks", [None, 2])
def test_the_device_jpeg_decoder_gives_the_batch_job_the_same_results_and_errors(ranks, images, expected,
                                                                                  tiny_weights_path, tmp_path):
    """`--decode gpu` (on the test device): JPEGs decoded where the model runs, the rest on the rank; same lines."""
    output = tmp_path / "results.jsonl"
    done = run(batch_command(ranks, tiny_weights_path, images, output, "--decode", "gpu"), tmp_path)
    assert done.returncode == 5, done.stderr  # the unreadable files are in the errors file
    assert_same_predictions(read_jsonl(output), expected)
    errors = read_jsonl(tmp_path / "results.errors.jsonl")
    assert sorted(os.path.relpath(e["image"], images) for e in errors) == sorted(BAD)
