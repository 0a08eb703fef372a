"""Sharding one batch across MPI ranks: a multi-GPU model for the HTTP service.

Start the service under mpirun with one rank per GPU. Rank 0 serves requests with a `ShardedModel`; every
other rank runs `worker_loop` until rank 0 closes the ShardedModel. The simplest way is `run_sharded`:

    from vggserve.distributed.sharding import run_sharded

    def serve(model):                       # rank 0 only; `model` is a ShardedModel
        uvicorn.run(make_app(model), ...)
        return 0                            # becomes rank 0's exit code

    sys.exit(run_sharded(serve, weights="vgg16.safetensors", device="gpu", max_batch_size=16))

`run_sharded` loads each rank's model on its device (device spec as for `vggserve batch --device`: "gpu" is
GPU number <local rank>), calls `serve` on rank 0, and closes the ShardedModel when `serve` returns or raises,
which releases the other ranks. It returns the exit code on every rank. A rank that cannot load its model
makes every rank give up: rank 0 raises RankSetupError (one line naming the rank), the others return its exit
code quietly. By hand, the same is:

    bound = load_rank_model(weights, device="gpu", max_batch_size=16, comm=comm)   # collective
    if comm.Get_rank() == 0:
        with ShardedModel(comm, bound.model) as model:
            probabilities = model.probabilities(x)
    else:
        worker_loop(comm, bound.model)

`ShardedModel` (rank 0) looks like a VGG16 model:

    logits(x)           x float32 (N, C, 224, 224), C = 3, normalised -> float32 (N, 1000); any N >= 0
    probabilities(x)    each rank applies its model's own `probabilities` to its piece -> float32 (N, 1000)
    classify(images, top_k=5)   PIL images or paths -> [[{"index", "label", "probability"}, ...], ...]
    device_name         "3 ranks: <rank 0 device>, <rank 1 device>, ..."
    max_batch_size      per-rank max_batch_size x number of ranks (a batch of that size keeps every rank busy)
    preprocessing, weights_info    those of rank 0's model (every rank must agree on preprocessing)
    ranks               [{"rank", "device_name", "max_batch_size"}, ...]
    size                number of ranks
    close()             stops the workers (also on `with` exit and at interpreter exit); idempotent

How a batch is split: the N rows of x are cut into `size` contiguous pieces in rank order whose sizes differ by
at most one (`split_counts`: the first N % size ranks get one row more), so rank r gets rows
[offset_r, offset_r + count_r). A batch smaller than the number of ranks leaves the last ranks an empty piece:
they skip their model and send nothing back. Pixels go out with MPI Scatterv and results come back with
Gatherv (buffer-based, float32), in the original row order. Each rank runs its piece on its own model, which
splits pieces larger than its max_batch_size by itself.

Failures: an exception in a worker's model does not kill the service: that worker still joins the gather (with
zeros), keeps serving, and rank 0 raises ShardError naming the rank; rank 0's own exception is raised after
the gather the same way. Only a crashed process ends the MPI job (mpirun then stops every rank).

Threads: one call at a time. A lock serialises callers, so any thread of rank 0 may call (MPI must be
initialised with MPI_THREAD_SERIALIZED or better, which mpi4py's default, MULTIPLE, gives with MPICH and
Open MPI). Workers wait for the next batch with a sleeping poll (at most ~5 ms extra latency) so idle ranks do
not spin a CPU core.
"""

from __future__ import annotations

import atexit
import threading

import numpy as np

from ..errors import VggserveError, describe
from ..predictions import top_k as top_k_predictions
from ..weights.spec import NUM_CLASSES
from ..wording import count
from .binding import RankSetupError, load_rank_model
from .mpi import mpi_world, wait

_STOP, _LOGITS, _PROBABILITIES = 0, 1, 2
_OPERATIONS = {_LOGITS: "logits", _PROBABILITIES: "probabilities"}
_HEADER = 5  # int64 [operation, N, C, H, W], broadcast from rank 0 before every batch


class ShardError(VggserveError):
    """A rank's model raised while running its piece of a sharded batch."""

    exit_code = 3


def split_counts(n: int, parts: int) -> list[int]:
    """Rows per rank for N rows over `parts` ranks: contiguous pieces, sizes differing by at most one."""
    base, extra = divmod(n, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def offsets(counts: list[int]) -> list[int]:
    """Start row of each piece."""
    return [sum(counts[:index]) for index in range(len(counts))]


def _rank_info(comm, model) -> dict:
    return {
        "rank": comm.Get_rank(),
        "device_name": str(getattr(model, "device_name", "?")),
        "max_batch_size": int(getattr(model, "max_batch_size", 1)),
        "preprocessing": getattr(model, "preprocessing", None),
    }


def _run_piece(comm, model, header: np.ndarray, x: np.ndarray | None) -> np.ndarray:
    """Scatter x (root) / receive this rank's piece, run the operation on it, gather the results in order.
    Every rank calls this for every batch. Returns the (N, 1000) result on rank 0, None elsewhere."""
    from mpi4py import MPI

    operation, n, channels, height, width = (int(value) for value in header)
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = split_counts(n, size)
    starts = offsets(counts)
    pixels = channels * height * width
    piece = np.empty((counts[rank], channels, height, width), dtype=np.float32)
    send = None
    if rank == 0:
        send = [x, [c * pixels for c in counts], [s * pixels for s in starts], MPI.FLOAT]
    comm.Scatterv(send, piece, root=0)

    result, problem = np.zeros((counts[rank], NUM_CLASSES), dtype=np.float32), None
    if counts[rank]:
        try:
            produced = getattr(model, _OPERATIONS[operation])(piece)
            result = np.ascontiguousarray(produced, dtype=np.float32).reshape(counts[rank], NUM_CLASSES)
        except Exception as exc:  # reported to rank 0 below; this rank keeps serving
            problem = f"rank {rank} ({_rank_info(comm, model)['device_name']}): {describe(exc)}"

    gathered = np.empty((n, NUM_CLASSES), dtype=np.float32) if rank == 0 else None
    receive = None
    if rank == 0:
        receive = [gathered, [c * NUM_CLASSES for c in counts], [s * NUM_CLASSES for s in starts], MPI.FLOAT]
    comm.Gatherv(result, receive, root=0)
    problems = comm.gather(problem, root=0)
    if rank == 0:
        failed = [message for message in problems if message]
        if failed:
            raise ShardError("sharded batch failed: " + "; ".join(failed))
    return gathered


class ShardedModel:
    """Rank 0's face of a model spread over every rank of `comm`; see the module docstring."""

    def __init__(self, comm, model):
        self._comm = comm.Dup()  # collective, matched by worker_loop's Dup
        self._model = model
        self._lock = threading.Lock()
        self._closed = False
        self.ranks = self._comm.gather(_rank_info(self._comm, model), root=0)
        self.size = self._comm.Get_size()
        atexit.register(self.close)
        modes = {info.pop("preprocessing") for info in self.ranks}
        if len(modes) > 1:
            self.close()
            raise VggserveError(f"ranks disagree on preprocessing ({sorted(map(str, modes))}): load the same "
                                f"weights on every rank")

    # -- the model-like surface ------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return f"{count(self.size, 'rank')}: " + ", ".join(info["device_name"] for info in self.ranks)

    @property
    def max_batch_size(self) -> int:
        return sum(info["max_batch_size"] for info in self.ranks)

    @property
    def preprocessing(self):
        return self._model.preprocessing

    @property
    def precision(self):
        return getattr(self._model, "precision", "fp32")

    @property
    def weights_info(self):
        return getattr(self._model, "weights_info", None)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._batch(_LOGITS, x)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return self._batch(_PROBABILITIES, x)

    def classify(self, images, top_k: int = 5) -> list[list[dict]]:
        """PIL images or paths -> top-k predictions per image, like VGG16.classify."""
        from PIL import Image

        from ..images import open_image
        from ..preprocessing import preprocess_batch

        images = list(images)
        if not images:
            return []
        loaded = [image if isinstance(image, Image.Image) else open_image(image) for image in images]
        return top_k_predictions(self.probabilities(preprocess_batch(loaded, self.preprocessing)), top_k)

    def close(self) -> None:
        """Release the workers (their worker_loop returns). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            wait(self._comm.Ibcast(np.array([_STOP, 0, 0, 0, 0], dtype=np.int64), root=0))
            self._comm.Free()
        atexit.unregister(self.close)

    def __enter__(self) -> "ShardedModel":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- one batch -------------------------------------------------------------------------------------
    def _batch(self, operation: int, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 4:
            raise ValueError(f"expected a batch (N, 3, 224, 224), got shape {x.shape}")
        if x.shape[0] == 0:
            return np.empty((0, NUM_CLASSES), dtype=np.float32)
        with self._lock:
            if self._closed:
                raise VggserveError("the sharded model is closed")
            header = np.array([operation, *x.shape], dtype=np.int64)
            wait(self._comm.Ibcast(header, root=0))
            return _run_piece(self._comm, self._model, header, x)


def worker_loop(comm, model) -> int:
    """Ranks other than 0: run pieces of rank 0's batches on `model` until its ShardedModel closes.

    Collective with ShardedModel(comm, ...) on rank 0. Returns the number of batches served.
    """
    comm = comm.Dup()
    comm.gather(_rank_info(comm, model), root=0)
    served = 0
    header = np.empty(_HEADER, dtype=np.int64)
    try:
        while True:
            wait(comm.Ibcast(header, root=0))
            if header[0] == _STOP:
                return served
            _run_piece(comm, model, header, None)
            served += 1
    finally:
        comm.Free()


def run_sharded(serve, weights, device: str = "gpu", max_batch_size: int = 16, comm=None,
                precision: str = "fp32") -> int:
    """Collective. Rank 0: `serve(ShardedModel)`, its return value (None -> 0) is the exit code. Other ranks:
    worker_loop until rank 0 is done, then 0. See the module docstring for setup failures."""
    comm = comm if comm is not None else mpi_world()
    try:
        bound = load_rank_model(weights, device=device, max_batch_size=max_batch_size, comm=comm,
                                precision=precision)
    except RankSetupError as exc:
        if comm.Get_rank() == 0:
            raise
        return exc.exit_code
    try:
        if comm.Get_rank() != 0:
            worker_loop(comm, bound.model)
            return 0
        with ShardedModel(comm, bound.model) as model:
            return int(serve(model) or 0)
    finally:
        if hasattr(bound.model, "close"):
            bound.model.close()
