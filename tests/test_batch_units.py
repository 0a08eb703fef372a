"""The batch job's parts that need no MPI: inputs, device binding, the kill-safe output store, the chunk runner,
the sharding split and the summary. (tests/test_batch_mpi.py runs the whole job under mpiexec.)"""

import json
import os

import numpy as np
import pytest
from PIL import Image

from vggserve.distributed.devices import rank_device
from vggserve.distributed.inputs import InputError, list_inputs
from vggserve.distributed.mpi import SingleProcess
from vggserve.distributed.pipeline import ChunkRunner, RankStats
from vggserve.distributed.sharding import offsets, split_counts
from vggserve.distributed.store import OutputError, ResultStore, errors_path_for, result_line
from vggserve.distributed.summary import format_summary, summarize
from vggserve.distributed.workqueue import chunked
from vggserve.errors import DeviceError


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---- inputs ------------------------------------------------------------------------------------------------
def test_directory_input_lists_image_files_recursively_sorted_and_ignores_other_files(tmp_path):
    for name in ("b.jpg", "a.PNG", "sub/c.jpeg", "sub/deeper/d.webp", "notes.txt", "sub/e.json"):
        _touch(tmp_path / name)
    root = str(tmp_path)
    assert list_inputs(root) == [os.path.join(root, p) for p in ("a.PNG", "b.jpg", "sub/c.jpeg", "sub/deeper/d.webp")]


def test_list_file_skips_comments_and_blanks_resolves_relative_to_list_and_drops_duplicates(tmp_path):
    listing = tmp_path / "lists" / "images.txt"
    _touch(listing, b"# holiday\none.jpg\n\n  sub/two.png  \n/abs/three.jpg\none.jpg\nmissing.gif\n")
    base = str(tmp_path / "lists")
    assert list_inputs(str(listing)) == [
        os.path.join(base, "one.jpg"), os.path.join(base, "sub/two.png"), "/abs/three.jpg",
        os.path.join(base, "missing.gif"),
    ]


def test_single_image_file_is_its_own_input(tmp_path):
    image = _touch(tmp_path / "cat.jpg")
    assert list_inputs(str(image)) == [str(image)]


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no such directory or file"):
        list_inputs(str(tmp_path / "nowhere"))


def test_an_input_naming_no_images_is_a_clear_error_not_an_empty_job(tmp_path):
    """It used to say `nothing to do: all 0 images are already in results.jsonl` and exit 0."""
    _touch(tmp_path / "photos" / "notes.txt")
    with pytest.raises(InputError, match="no image files below it"):
        list_inputs(str(tmp_path / "photos"))
    listing = _touch(tmp_path / "list.txt", b"# nothing yet\n\n")
    with pytest.raises(InputError, match="names no images"):
        list_inputs(str(listing))


# ---- device binding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mine, everyone, share", [
    (range(16), [range(16)] * 4, 4.0),  # 4 ranks in one 16-core cpuset (srun --cpu-bind=none): a quarter each
    (range(4, 8), [range(0, 4), range(4, 8), range(8, 12), range(12, 16)], 4.0),  # bound to 4 cores apiece
    (range(2), [range(2), range(2)], 1.0),  # 2 ranks on a 2-core machine
    (range(4), [range(4), range(2, 6)], 3.0),  # overlapping bindings: the 2 shared cores count half
    (range(8), [range(8)], 8.0),  # alone
])
def test_a_rank_counts_its_share_of_the_cores_it_may_run_on(mine, everyone, share):
    """Every rank of a Slurm allocation sees the whole cpuset: each used to count all of it, and start that many
    decode processes, several times the cores there are."""
    from vggserve.distributed.cores import cpu_share

    assert cpu_share(set(mine), [sorted(cpus) for cpus in everyone]) == pytest.approx(share)


def test_a_single_rank_counts_the_cores_of_its_affinity(monkeypatch):
    from vggserve.distributed import cores

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {3, 5, 7})
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 64)
    assert cores.rank_cores(SingleProcess()) == 3.0


@pytest.mark.parametrize("cores, host, ranks, procs, copy_threads", [
    (4.0, 16, 4, 3, 4),     # 4 ranks on 16 cores
    (2.0, 16, 8, 1, 2),     # 8 ranks on 16 cores: one decode process, two copy threads each
    (1.0, 2, 2, 1, 1),      # 2 ranks on a 2-core machine
    (16.0, 16, 1, 15, 4),   # alone on 16 cores: copying never takes more than 4 threads
    (3.9999999, 16, 4, 3, 4),  # shares summed from 1/n fractions may fall just short
])
def test_a_rank_sizes_its_decoders_and_copy_threads_from_its_share_of_the_host(cores, host, ranks, procs,
                                                                               copy_threads):
    from vggserve.distributed.cores import HostShare

    share = HostShare(cores, host, ranks)
    assert (share.decode_procs, share.decode_threads, share.copy_threads) == (procs, procs, copy_threads)
    assert share.choose("auto", "auto") == {"cores": round(cores, 3), "host_cores": host, "local_ranks": ranks,
                                            "decode_processes": procs, "decode_threads": 0,
                                            "copy_threads": copy_threads}


def test_explicit_decode_settings_win_over_the_share():
    from vggserve.distributed.cores import HostShare

    share = HostShare(4.0, 16, 4)
    assert share.choose(7, "auto")["decode_processes"] == 7
    assert share.choose(0, "auto")["decode_threads"] == 3  # threads follow the share
    assert share.choose(0, 5)["decode_threads"] == 5
    assert share.choose("auto", 5)["decode_threads"] == 0  # threads only with --decode-procs 0


@pytest.mark.parametrize("threads, said", [("auto", "1 decode thread"), (3, "3 decode threads")])
def test_the_batch_job_sizes_a_rank_by_its_share_of_the_host_and_says_so(monkeypatch, tmp_path, capsys,
                                                                         tiny_weights_path, threads, said):
    """8 ranks on a 16-core host (the core count and MPI's local rank count stand in): each rank counts 2 cores, so
    one decode thread (unless --decode-threads says otherwise) and 2 copy threads; the summary says it."""
    from vggserve.distributed import binding, cores
    from vggserve.distributed.job import BatchOptions, run_batch
    from vggserve.runtime import hostcopy

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(binding, "node_layout", lambda comm: (0, 8))
    monkeypatch.setattr(binding, "rank_cores", lambda comm: cores.cpu_share(set(range(16)), [range(16)] * 8))
    monkeypatch.setattr(hostcopy, "THREADS", hostcopy.THREADS)  # put back after the test
    for i in range(3):
        Image.new("RGB", (40 + i, 30), (i * 60, 90, 0)).save(tmp_path / f"{i}.png")
    summary = tmp_path / "summary.json"
    code = run_batch(BatchOptions(input=str(tmp_path), output=str(tmp_path / "out.jsonl"),
                                  weights=str(tiny_weights_path), device="cpu", batch_size=2, decode_procs=0,
                                  decode_threads=threads, progress=False, summary_path=str(summary)))
    assert code == 0
    assert f"rank 0 share of its host: 2 of 16 cores (8 ranks on the host): {said}, 2 copy threads" \
        in capsys.readouterr().out
    share = json.loads(summary.read_text())["ranks"][0]["host_share"]
    assert share == {"cores": 2.0, "host_cores": 16, "local_ranks": 8, "decode_processes": 0,
                     "decode_threads": 1 if threads == "auto" else threads, "copy_threads": 2}
    assert hostcopy.THREADS == 2


@pytest.mark.parametrize("spec, local_rank, local_size, expected", [
    ("gpu", 0, 4, "gpu:0"),
    ("gpu", 3, 4, "gpu:3"),
    ("cpu", 2, 4, "cpu"),
    ("gpu:0,gpu:2", 1, 2, "gpu:2"),
    (" gpu:1 , 0:1 ", 1, 2, "0:1"),
    ("gpu:1", 3, 4, "gpu:1"),  # one explicit device is shared by every rank
    ("auto", 0, 1, "auto"),  # one rank per node: the engine's own choice
])
def test_device_spec_binds_by_local_rank(spec, local_rank, local_size, expected):
    assert rank_device(spec, local_rank, local_size) == expected


def test_auto_with_several_ranks_per_node_uses_cpu_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setattr("vggserve.distributed.devices.count_gpus", lambda: 0)
    assert rank_device("auto", 1, 2) == "cpu"
    monkeypatch.setattr("vggserve.distributed.devices.count_gpus", lambda: 2)
    assert rank_device("auto", 1, 2) == "gpu:1"


@pytest.mark.parametrize("spec, message", [("gpu:0,gpu:1", "lists 2 devices"), ("gpu:0,,gpu:1", "empty entry")])
def test_bad_device_lists_are_clear_errors(spec, message):
    with pytest.raises(DeviceError, match=message):
        rank_device(spec, 2, 3)


# ---- output store ------------------------------------------------------------------------------------------
def _lines(path):
    return path.read_text().splitlines()


def test_errors_file_sits_beside_the_output_with_the_output_stem():
    assert str(errors_path_for("out/results.jsonl")) == os.path.join("out", "results.errors.jsonl")
    assert str(errors_path_for("run7")) == "run7.errors.jsonl"


def test_store_records_whole_lines_and_a_reopened_store_knows_what_is_done(tmp_path):
    output = tmp_path / "deep" / "results.jsonl"
    store = ResultStore(output)
    assert store.done == set()
    store.start()
    store.write([result_line("a.jpg", [{"index": 1, "label": "x", "probability": 0.5}])],
                ['{"image": "bad.jpg", "error": "empty", "type": "ImageDecodeError"}'])
    store.close()
    assert json.loads(_lines(output)[0])["image"] == "a.jpg"
    again = ResultStore(output)
    assert again.done == {"a.jpg", "bad.jpg"} and (again.result_count, again.error_count) == (1, 1)
    again.close()


def test_torn_last_line_from_a_killed_run_is_cut_and_appends_stay_whole(tmp_path):
    output = tmp_path / "results.jsonl"
    output.write_text(result_line("a.jpg", []) + "\n" + '{"image": "b.jpg", "predic')
    store = ResultStore(output)
    assert store.done == {"a.jpg"}
    assert store.discarded_bytes == len('{"image": "b.jpg", "predic')
    store.start()
    store.write([result_line("b.jpg", [])], [])
    store.close()
    assert [json.loads(line)["image"] for line in _lines(output)] == ["a.jpg", "b.jpg"]


def test_a_corrupt_whole_line_is_an_error_not_silently_dropped(tmp_path):
    output = tmp_path / "results.jsonl"
    output.write_text("garbage\n" + result_line("a.jpg", []) + "\n")
    with pytest.raises(OutputError, match="results.jsonl:1"):
        ResultStore(output)


def test_second_job_on_the_same_output_is_refused_while_the_first_holds_it(tmp_path):
    first = ResultStore(tmp_path / "results.jsonl")
    starting = ResultStore(tmp_path / "results.jsonl")  # no file yet: both may plan, one may start
    first.start()
    with pytest.raises(OutputError, match="another batch job"):
        ResultStore(tmp_path / "results.jsonl")
    with pytest.raises(OutputError, match="another batch job"):
        starting.start()
    first.close()
    ResultStore(tmp_path / "results.jsonl").close()  # free again once the first is closed


def test_a_job_refused_at_start_closes_cleanly_and_leaves_the_first_jobs_file_alone(tmp_path):
    """The refused store kept the number of the descriptor it had closed: closing it raised EBADF (a traceback in
    place of the one-line refusal), or closed whatever file had been given that number since."""
    output = tmp_path / "results.jsonl"
    first, second = ResultStore(output), ResultStore(output)
    first.start()
    with pytest.raises(OutputError, match="another batch job"):
        second.start()
    unrelated = os.open(tmp_path / "other", os.O_CREAT | os.O_WRONLY)  # may be given the number the refusal freed
    second.close()
    os.fstat(unrelated)  # still open
    os.close(unrelated)
    first.write([result_line("a.jpg", [])], [])
    first.close()
    assert [json.loads(line)["image"] for line in _lines(output)] == ["a.jpg"]


def test_an_output_refused_for_a_corrupt_line_is_not_left_locked(tmp_path):
    output = tmp_path / "results.jsonl"
    output.write_text("garbage\n")
    with pytest.raises(OutputError, match="results.jsonl:1"):
        ResultStore(output)
    output.write_text(result_line("a.jpg", []) + "\n")  # repaired: the same process may open it again
    store = ResultStore(output)
    assert store.done == {"a.jpg"}
    store.close()


def test_a_store_creates_nothing_until_the_job_starts(tmp_path):
    """A failed set-up (no GPU, bad weights) used to leave empty results.jsonl and results.errors.jsonl behind."""
    output = tmp_path / "new" / "deeper" / "results.jsonl"
    store = ResultStore(output)
    store.close()
    assert list(tmp_path.iterdir()) == []
    store = ResultStore(output)
    store.start()
    store.close()
    assert sorted(p.name for p in output.parent.iterdir()) == ["results.errors.jsonl", "results.jsonl"]


def test_an_output_that_could_not_be_created_is_refused_before_the_job_starts(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is not a folder"):
        ResultStore(tmp_path / "file" / "results.jsonl")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OutputError, match="no permission to write"):
            ResultStore(locked / "sub" / "results.jsonl")


def test_retry_errors_forgets_recorded_errors_but_keeps_results(tmp_path):
    output = tmp_path / "results.jsonl"
    store = ResultStore(output)
    store.start()
    store.write([result_line("a.jpg", [])], ['{"image": "bad.jpg", "error": "empty", "type": "E"}'])
    store.close()
    retry = ResultStore(output, retry_errors=True)
    assert retry.done == {"a.jpg"}
    assert "bad.jpg" in errors_path_for(output).read_text()  # untouched until the job starts
    retry.start()
    assert errors_path_for(output).read_text() == ""
    retry.close()


def test_a_summary_that_could_not_be_written_is_refused_before_the_job_starts(tmp_path, tiny_weights_path):
    """It used to be found out at the very end, as a NotADirectoryError traceback after every image was done."""
    from vggserve.distributed.job import BatchOptions, make_plan

    image = _touch(tmp_path / "in" / "a.png")
    (tmp_path / "file").write_text("")
    for summary, message in ((tmp_path / "file" / "s.json", "is not a folder"), (tmp_path, "is a folder")):
        options = BatchOptions(input=str(image), output=str(tmp_path / "out" / "r.jsonl"),
                               weights=str(tiny_weights_path), summary_path=str(summary))
        with pytest.raises(OutputError, match=message):
            make_plan(options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["summary", "output"])
def test_an_output_path_that_takes_no_file_is_refused_before_the_job_starts_even_for_root(which, tmp_path,
                                                                                          tiny_weights_path):
    """`--summary /proc/nope/s.json` ran the whole job and failed at the end: /proc looks writable to root (the
    permission bits do not stop root), yet takes no new file. Creating one is tried instead."""
    from vggserve.distributed.job import BatchOptions, make_plan

    image = _touch(tmp_path / "in" / "a.png")
    paths = {"output": str(tmp_path / "out" / "r.jsonl"), "summary": str(tmp_path / "s.json")}
    paths[which] = "/proc/nope/s.json" if which == "summary" else "/proc/nope/r.jsonl"
    options = BatchOptions(input=str(image), output=paths["output"], weights=str(tiny_weights_path),
                           summary_path=paths["summary"])
    refused = r"cannot create /proc/nope/.*: (/proc does not take a folder|no permission to write in /proc)"
    with pytest.raises(OutputError, match=refused):  # the first for root, the second (as before) for other users
        make_plan(options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # and the probe left nothing behind


def test_an_output_in_a_writable_folder_passes_the_check_and_leaves_nothing_behind(tmp_path):
    from vggserve.distributed.store import check_creatable

    check_creatable(tmp_path / "new" / "deeper" / "s.json")
    check_creatable(tmp_path / "s.json")
    assert list(tmp_path.iterdir()) == []


def test_the_summary_folder_is_made_and_a_failed_write_is_one_line(tmp_path):
    from vggserve.distributed.job import _write_summary

    _write_summary(tmp_path / "new" / "s.json", {"images": 1})
    assert json.loads((tmp_path / "new" / "s.json").read_text()) == {"images": 1}
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="cannot write the summary"):
        _write_summary(tmp_path / "file" / "s.json", {})


# ---- chunk runner --------------------------------------------------------------------------------------------
class ConstantModel:
    """Stands in for the engine: probability 1 on class (number of the call's rows), records batch sizes."""

    preprocessing = "torchvision"

    def __init__(self):
        self.batches = []

    def probabilities(self, x):
        assert x.dtype == np.float32 and x.shape[1:] == (3, 224, 224)
        self.batches.append(x.shape[0])
        probs = np.zeros((x.shape[0], 1000), np.float32)
        probs[:, x.shape[0]] = 1.0
        return probs


def test_chunk_runner_classifies_readable_images_in_order_and_records_unreadable_ones(tmp_path):
    good = []
    for i in range(3):
        good.append(str(tmp_path / f"g{i}.png"))
        Image.new("RGB", (30 + i, 40), (i * 50, 0, 0)).save(good[-1])
    empty = str(_touch(tmp_path / "empty.jpg", b""))
    missing = str(tmp_path / "missing.jpg")
    model = ConstantModel()
    runner = ChunkRunner(model, top_k=2, decode_threads=2)
    stats = RankStats(rank=0, device="cpu")
    runner.submit([good[0], empty, good[1], missing, good[2]])
    outcome = runner.run_timed(stats)
    runner.close()
    assert model.batches == [3]  # only the readable images reach the model, in one batch
    results = [json.loads(line) for line in outcome.results]
    assert [r["image"] for r in results] == good
    assert all(r["predictions"][0]["index"] == 3 and len(r["predictions"]) == 2 for r in results)
    errors = {json.loads(line)["image"]: json.loads(line) for line in outcome.errors}
    assert set(errors) == {empty, missing}
    assert all(e["error"] and e["type"] for e in errors.values())
    assert (stats.images, stats.errors) == (5, 2)


# ---- chunks, split, summary ----------------------------------------------------------------------------------
def test_chunks_cover_every_path_once_in_order():
    paths = [f"{i}.jpg" for i in range(11)]
    chunks = list(chunked(paths, 4))
    assert [len(c) for c in chunks] == [4, 4, 3] and sum(chunks, []) == paths


@pytest.mark.parametrize("n, parts", [(7, 3), (2, 3), (1, 3), (0, 3), (9, 3), (5, 1), (16, 4)])
def test_split_gives_contiguous_pieces_differing_by_at_most_one(n, parts):
    counts = split_counts(n, parts)
    assert len(counts) == parts and sum(counts) == n
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)
    assert offsets(counts) == [sum(counts[:i]) for i in range(parts)]


def test_summary_counts_every_rank_including_ranks_that_got_no_work():
    ranks = [{"rank": r, "device": "cpu", "device_name": "PoCL"} for r in range(3)]
    stats = {0: {"images": 4, "errors": 1, "active_seconds": 2.0, "images_per_second": 2.0},
             1: {"images": 6, "errors": 0, "active_seconds": 2.0, "images_per_second": 3.0}}
    summary = summarize(stats, ranks, wall=2.5, setup=1.0, skipped=3, output="r.jsonl", errors_file="r.errors.jsonl")
    assert (summary["images"], summary["classified"], summary["errors"]) == (10, 9, 1)
    assert summary["images_per_second"] == 4.0 and summary["already_done"] == 3
    assert [r["images"] for r in summary["ranks"]] == [4, 6, 0]
    text = format_summary(summary)
    assert "10 images (9 classified, 1 error)" in text and "4.00 images/s" in text and len(text.splitlines()) == 6


# ---- launcher or not ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env, found", [
    ({}, None),
    ({"SLURM_NTASKS": "1"}, None),  # an allocation of one task, no launcher in sight
    ({"SLURM_NTASKS": "4"}, "SLURM_NTASKS=4"),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, "PMI_RANK=0"),  # mpiexec -n 1 (MPICH, Intel MPI)
    ({"OMPI_COMM_WORLD_SIZE": "1"}, "OMPI_COMM_WORLD_SIZE=1"),  # mpirun -n 1 (Open MPI)
    ({"VGGSERVE_MPI": "1"}, "VGGSERVE_MPI=1"),
])
def test_a_launcher_is_recognised_from_its_variables(monkeypatch, env, found):
    from vggserve.distributed import mpi

    for name in (*mpi.LAUNCHER_VARIABLES, *mpi.SIZE_VARIABLES, mpi.FORCE_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert mpi.launcher_variable() == found
    if found is None:
        world = mpi.world()
        assert isinstance(world, mpi.SingleProcess) and (world.Get_rank(), world.Get_size()) == (0, 1)
        assert mpi.node_layout(world) == (0, 1) and world.allgather("x") == ["x"] and world.bcast(3) == 3
