"""The batch job: classify every image of `--input` over all MPI ranks into `--output` (see docs/batch.md).

    from vggserve.distributed.job import BatchOptions, run_batch
    exit_code = run_batch(BatchOptions(input="photos/", output="results.jsonl", device="gpu"))  # collective

Phases, all ranks together:
1. plan (rank 0): find the weights, list the inputs, open the output if it exists (cutting a torn tail), drop
   the images already done; broadcast the weights path or the error.
2. setup (every rank): bind the device by local rank, load the model; any failure ends every rank cleanly,
   with no output file created.
3. run: rank 0 creates the output files that do not exist yet, then coordinates (coordinator.Coordinator, on
   its main thread) and classifies (on a helper thread when the MPI thread level allows), the others take chunks
   from it (workqueue); results go to the output as they arrive. An exception on any rank (with more than one
   rank) prints that rank's message and aborts every rank (MPI_Abort, exit status 1); with one rank it is raised
   as usual.
4. summary (rank 0): progress bar closed, totals and per-rank throughput printed (and written as JSON).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import describe
from ..jsonfile import write_json_atomically
from .binding import RankSetupError, load_rank_model
from .inputs import list_inputs
from .coordinator import Coordinator
from .mpi import abort_all, barrier, helper_threads_allowed, world
from .pipeline import ChunkOutcome, ChunkRunner, RankStats
from .store import OutputError, ResultStore, check_creatable
from .summary import format_summary, summarize
from .workqueue import CoordinatorLink, chunk_size, chunked, work_for_coordinator
from ..wording import count


@dataclass
class BatchOptions:
    input: str
    output: str
    weights: str | None = None  # None: the default places (vggserve.weights.find_weights)
    batch_size: int = 16  # the model's max_batch_size, and images per chunk handed out (fewer in a small job)
    device: str = "auto"  # spec, see devices.py
    top_k: int = 5
    retry_errors: bool = False  # classify again the images listed in the errors file
    decode_threads: int = 2  # per rank, with decode_procs=0
    decode_procs: int | str = "auto"  # decode processes per rank; "auto": decoding.pool.default_procs
    decode_timeout_s: float = 60.0  # a decode process taking longer on one image is replaced (the image: an error)
    decode: str = "exact"  # or "fast" (vggserve.decoding.decode)
    precision: str = "fp32"  # the engine's precision (ops/precision.py)
    progress: bool = True  # tqdm bar on rank 0
    summary_path: str | None = None  # also write the summary dict as JSON here


@dataclass
class Plan:
    """Rank 0's view of the work: the weights to load, the open output, the images left to do."""

    weights: str
    store: ResultStore
    todo: list[str]
    skipped: int


def make_plan(options: BatchOptions) -> Plan:
    from ..weights import find_weights

    weights = os.path.abspath(find_weights(options.weights))  # ranks on other machines may start elsewhere
    paths = list_inputs(options.input)
    if options.summary_path:
        _check_summary_path(Path(options.summary_path))
    store = ResultStore(options.output, retry_errors=options.retry_errors)
    todo = [path for path in paths if path not in store.done]
    return Plan(weights, store, todo, len(paths) - len(todo))


def run_batch(options: BatchOptions, comm=None) -> int:
    """Collective over `comm` (default MPI.COMM_WORLD). Returns the exit code; errors before any image is
    classified are raised on rank 0 (one line for the user) and returned quietly as a code elsewhere."""
    comm = comm if comm is not None else world()
    rank = comm.Get_rank()
    started = time.perf_counter()
    plan, shared = _share_plan(options, comm)
    if "error" in shared:
        if rank == 0:
            raise shared["exception"]
        return shared["error"][1]
    if shared["todo"] == 0:
        if rank == 0:
            plan.store.close()
            print(f"batch: nothing to do: {'the' if plan.skipped == 1 else 'all'} {count(plan.skipped, 'image')} "
                  f"{'is' if plan.skipped == 1 else 'are'} already in {options.output} or its errors file")
        return 0
    try:
        bound = load_rank_model(shared["weights"], options.device, options.batch_size, comm,
                                precision=options.precision)
    except RankSetupError as exc:
        if rank != 0:
            return exc.exit_code
        plan.store.close()
        raise
    return _run(options, comm, plan, bound, setup_seconds=time.perf_counter() - started)


def _share_plan(options: BatchOptions, comm) -> tuple[Plan | None, dict]:
    """Rank 0 makes the plan; every rank learns the weights path and the amount of work, or the error."""
    plan, shared, error = None, None, None
    if comm.Get_rank() == 0:
        try:
            plan = make_plan(options)
            shared = {"weights": plan.weights, "todo": len(plan.todo)}
            if plan.store.discarded_bytes:
                print(f"vggserve batch: cut a partial last line ({plan.store.discarded_bytes} bytes) left by an "
                      f"interrupted run", file=sys.stderr)
        except Exception as exc:
            shared = {"error": (describe(exc), int(getattr(exc, "exit_code", 1)))}
            error = exc
    barrier(comm)
    shared = comm.bcast(shared, root=0)
    if comm.Get_rank() == 0 and "error" in shared:
        shared["exception"] = error
    return plan, shared


def _run(options: BatchOptions, comm, plan: Plan | None, bound, setup_seconds: float) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    runner = ChunkRunner(bound.model, top_k=options.top_k, decode_threads=options.decode_threads,
                         decode_procs=_decode_procs(options.decode_procs, bound.local_size),
                         decode=options.decode, decode_timeout_s=options.decode_timeout_s)
    stats = RankStats(rank, bound.device, clock=runner.clock, waits=runner.waits, decoder=runner.decoder)
    progress = None
    try:
        try:
            if rank == 0:
                plan.store.start()
                progress = _progress_bar(plan, options.progress)
                started = time.perf_counter()
                chunks = chunked(plan.todo, chunk_size(len(plan.todo), size, options.batch_size))
                coordinator = Coordinator(CoordinatorLink(comm), runner, stats, chunks,
                                          _recorder(plan.store, progress), threaded=helper_threads_allowed())
                stats_by_rank = coordinator.run()
                wall = time.perf_counter() - started
            else:
                work_for_coordinator(comm, runner, stats)
        except BaseException as exc:
            if size > 1:
                if progress is not None:
                    progress.close()
                abort_all(comm, f"rank {rank} ({bound.device})", exc, program="vggserve batch")
            raise
        barrier(comm)
        if rank == 0:
            progress.close()
            summary = summarize(stats_by_rank, bound.ranks, wall, setup_seconds, plan.skipped,
                                str(plan.store.output), str(plan.store.errors_path))
            print(format_summary(summary), flush=True)
            if options.summary_path:
                _write_summary(Path(options.summary_path), summary)
        return 0
    finally:
        runner.close()
        if hasattr(bound.model, "close"):
            bound.model.close()
        if plan is not None:
            plan.store.close()
        if progress is not None:
            progress.close()


def _check_summary_path(path: Path) -> None:
    """OutputError before any work when --summary could not be written at the end."""
    if path.is_dir():
        raise OutputError(f"--summary {path}: is a folder; name a file")
    check_creatable(path)


def _write_summary(path: Path, summary: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, summary)
    except OSError as exc:
        raise OutputError(f"cannot write the summary {path}: {exc.strerror or exc}") from exc


def _decode_procs(setting: int | str, local_size: int) -> int:
    """--decode-procs as a number: "auto" is this rank's share of its machine's cores, less one for itself."""
    if setting == "auto":
        from ..decoding.pool import default_procs

        return default_procs(local_size)
    return int(setting)


def _recorder(store: ResultStore, progress):
    """Rank 0's callback for every finished chunk: write it, then advance the progress bar."""

    def record(outcome: ChunkOutcome) -> None:
        store.write(outcome.results, outcome.errors)
        if outcome.errors:
            progress.set_postfix(errors=store.error_count, refresh=False)
        progress.update(outcome.images)

    return record


def _progress_bar(plan: Plan, enabled: bool):
    from tqdm import tqdm

    interval = 0.5 if sys.stderr.isatty() else 2.0  # a pipe: mpirun's output forwarding or a log file
    bar = tqdm(total=plan.skipped + len(plan.todo), initial=plan.skipped, unit="img", desc="batch",
               disable=not enabled, smoothing=0.05, mininterval=interval, dynamic_ncols=True, file=sys.stderr)
    bar.set_postfix(errors=plan.store.error_count, refresh=False)
    return bar
