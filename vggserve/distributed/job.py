"""The batch job: classify every image of `--input` over all MPI ranks into `--output` (see docs/batch.md).

    from vggserve.distributed.job import BatchOptions, run_batch
    exit_code = run_batch(BatchOptions(input="photos/", output="results.jsonl", device="gpu"))  # collective

Phases, all ranks together:
0. clean up (local rank 0 of each machine, before MPI starts): release the shared memory that killed runs left in
   /dev/shm (ipc/orphans.py), in one line on stderr.
1. plan (rank 0): find the weights, list the inputs, check that every output file (results, errors, summary)
   can be written, open the output if it exists (cutting a torn tail), drop the images already done;
   broadcast the weights path or the error.
2. setup (every rank): bind the device by local rank, load the model; any failure ends every rank cleanly,
   with no output file created.
3. run: rank 0 creates the output files that do not exist yet, then coordinates (coordinator.Coordinator, on
   its main thread) and classifies (on a helper thread when the MPI thread level allows), the others take chunks
   from it (workqueue); results go to the output as they arrive. An exception on any rank (with more than one
   rank) prints that rank's message and aborts every rank (MPI_Abort, exit status 1); with one rank it is raised
   as usual.
4. summary (rank 0): progress bar closed, totals and per-rank throughput printed (and written as JSON).

Exit status (every rank alike): 0 when every image of the input has a result line; 5 (as `classify`) when the job
is complete but some images are in the errors file, recorded by this run or an earlier one and not retried; 143
after SIGTERM and 130 after Ctrl-C (stopping.py: the work done so far is kept, one line says how to go on); others
for errors before or during the work.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageError, describe
from ..images import DEFAULT_MAX_PIXELS
from ..jsonfile import write_json_atomically
from .binding import RankSetupError, load_rank_model
from .inputs import list_inputs
from .coordinator import Coordinator
from .mpi import abort_all, barrier, end_all, helper_threads_allowed, local_rank_from_environment, world
from .pipeline import ChunkOutcome, ChunkRunner, RankStats, decode_group
from .stopping import STOPS, signal_name, stop_exit_code, stop_signal, stop_signals
from .store import OutputError, ResultStore, check_creatable
from .summary import format_summary, summarize
from .workqueue import CoordinatorLink, agreed_group, chunk_size, chunked, rank_tokens, work_for_coordinator
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
    decode_threads: int | str = "auto"  # per rank, with decode_procs=0; "auto": cores.HostShare.decode_threads
    decode_procs: int | str = "auto"  # decode processes per rank; "auto": cores.HostShare.decode_procs
    decode_timeout_s: float = 60.0  # a decode process taking longer on one image is replaced (the image: an error)
    decode: str = "exact"  # or "fast" (vggserve.decoding.decode), "gpu", "auto" (vggserve.decoding.device)
    max_pixels: int = DEFAULT_MAX_PIXELS  # larger images (width x height from the header) are recorded as errors
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
    """Collective over `comm` (default MPI.COMM_WORLD). Returns the exit code (module docstring); errors before any
    image is classified are raised on rank 0 (one line for the user) and returned quietly as a code elsewhere."""
    _release_orphans()
    with stop_signals():
        comm = comm if comm is not None else world()
        plan = None
        try:
            plan, shared = _share_plan(options, comm)
            return _set_up_and_run(options, comm, plan, shared)
        except STOPS as exc:  # stopped before the work began (during it, _run ends the job)
            _stopped(exc, comm, plan)
            return stop_exit_code(exc)


def _set_up_and_run(options: BatchOptions, comm, plan: Plan | None, shared: dict) -> int:
    rank = comm.Get_rank()
    started = time.perf_counter()
    if "error" in shared:
        if rank == 0:
            raise shared["exception"]
        return shared["error"][1]
    if shared["todo"] == 0:
        if rank == 0:
            plan.store.close()
            failed = f", {shared['failed']} of them in its errors file ({_retry_hint(shared['failed'])})" if shared["failed"] else ""
            print(f"batch: nothing to do: {'the' if plan.skipped == 1 else 'all'} {count(plan.skipped, 'image')} "
                  f"{'is' if plan.skipped == 1 else 'are'} already in {options.output} or its errors file{failed}")
        return _exit_code(shared["failed"])
    try:
        bound = load_rank_model(shared["weights"], options.device, options.batch_size, comm,
                                precision=options.precision)
    except RankSetupError as exc:
        if rank != 0:
            return exc.exit_code
        plan.store.close()
        raise
    return _run(options, comm, plan, bound, setup_seconds=time.perf_counter() - started)


def _exit_code(failed: int) -> int:
    """5 (ImageError's, as `classify`) when images are in the errors file, else 0."""
    return ImageError.exit_code if failed else 0


def _retry_hint(n: int = 2) -> str:
    """How to classify the `n` images of the errors file again."""
    them = "it" if n == 1 else "them"
    return f"fix or replace {them} and rerun with --retry-errors to classify {them} again"


def _release_orphans() -> None:
    """Release the shared memory that killed runs left on this machine, saying so in one line (on local rank 0 of
    each machine, known from the launcher's variables before MPI starts; every rank where none says)."""
    from ..ipc.orphans import describe_released, release_orphans

    if local_rank_from_environment() not in (None, 0):
        return
    released = release_orphans()
    if released:
        print(f"vggserve batch: {describe_released(released)}", file=sys.stderr, flush=True)


def _stopped(exc: BaseException, comm, plan: Plan | None) -> None:
    """After a stop signal: rank 0 closes the output and says in one line what is done and how to go on; with
    several ranks every rank is then ended (end_all: does not return)."""
    if comm.Get_rank() == 0:
        if plan is not None:
            plan.store.close()
        print(f"vggserve batch: {_stop_message(exc, plan)}", file=sys.stderr, flush=True)
    if comm.Get_size() > 1:
        end_all(comm, stop_exit_code(exc))


def _stop_message(exc: BaseException, plan: Plan | None) -> str:
    stopped = f"stopped by {signal_name(stop_signal(exc))}"
    if plan is None:
        return f"{stopped} before any image was classified; run the same command again to start"
    store = plan.store
    total = plan.skipped + len(plan.todo)
    done = store.result_count + store.error_count
    return (f"{stopped}; {done} of {count(total, 'image')} {'is' if done == 1 else 'are'} recorded in {store.output} "
            f"and {store.errors_path.name}; run the same command again to classify the other {total - done}")


def _share_plan(options: BatchOptions, comm) -> tuple[Plan | None, dict]:
    """Rank 0 makes the plan; every rank learns the weights path and the amount of work, or the error."""
    plan, shared, error = None, None, None
    if comm.Get_rank() == 0:
        try:
            plan = make_plan(options)
            shared = {"weights": plan.weights, "todo": len(plan.todo), "failed": plan.store.error_count}
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
    share = bound.host_share.choose(options.decode_procs, options.decode_threads)
    _limit_copy_threads(share["copy_threads"])
    group = agreed_group(comm, decode_group(bound.model, options.decode))  # collective: every rank, same count
    tokens = rank_tokens(size, group)
    runner = ChunkRunner(bound.model, top_k=options.top_k, decode_threads=max(1, share["decode_threads"]),
                         decode_procs=share["decode_processes"], decode=options.decode,
                         decode_timeout_s=options.decode_timeout_s, max_pixels=options.max_pixels,
                         chunks_held=tokens + 1)
    stats = RankStats(rank, bound.device, clock=runner.clock, waits=runner.waits, decoder=runner.decoder,
                      host_share=share)
    progress = None
    try:
        try:
            if rank == 0:
                plan.store.start()
                progress = _progress_bar(plan, options.progress)
                started = time.perf_counter()
                chunks = chunked(plan.todo, chunk_size(len(plan.todo), size, options.batch_size))
                coordinator = Coordinator(CoordinatorLink(comm), runner, stats, chunks,
                                          _recorder(plan.store, progress), threaded=helper_threads_allowed(),
                                          group=group)
                stats_by_rank = coordinator.run()
                wall = time.perf_counter() - started
            else:
                work_for_coordinator(comm, runner, stats, tokens)
        except BaseException as exc:
            if size > 1:
                if progress is not None:
                    progress.close()
                if isinstance(exc, STOPS):
                    _stopped(exc, comm, plan)
                abort_all(comm, f"rank {rank} ({bound.device})", exc, program="vggserve batch")
            raise
        barrier(comm)
        code = comm.bcast(_exit_code(plan.store.error_count) if rank == 0 else None, root=0)
        if rank == 0:
            progress.close()
            summary = summarize(stats_by_rank, bound.ranks, wall, setup_seconds, plan.skipped,
                                str(plan.store.output), str(plan.store.errors_path))
            print(format_summary(summary), flush=True)
            if code:
                n = plan.store.error_count
                print(f"vggserve batch: {count(n, 'image')} could not be classified: {'it is' if n == 1 else 'they are'} "
                      f"listed in {plan.store.errors_path} ({_retry_hint(n)})", file=sys.stderr, flush=True)
            if options.summary_path:
                _write_summary(Path(options.summary_path), summary)
        return code
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


def _limit_copy_threads(threads: int) -> None:
    """This rank's engine copies each batch into its staging memory on at most `threads` threads (its share of the
    host's cores, cores.HostShare.copy_threads), not on as many as the whole host would give one process."""
    from ..runtime import hostcopy

    hostcopy.THREADS = threads  # read at every copy (hostcopy._threads); this process is the rank's alone


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
