"""Checks ShardedModel against rank 0's own single-device model; run under mpiexec, prints one JSON report.

    mpiexec -n 3 python sharding_check.py WEIGHTS BATCH_SIZES FAILING_RANK

BATCH_SIZES is a comma list (e.g. 1,2,5,7). The model of rank FAILING_RANK raises whenever its piece has more
than FAILS_ABOVE rows, so rank 0 sees a ShardError for a batch big enough and normal results otherwise.
Rank 0 prints {"size", "device_name", "max_batch_size", "batches": [...], "failure": ..., "after_failure": ...};
the test asserts on it.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import vggserve.distributed.binding as binding
from vggserve.distributed.sharding import ShardError, run_sharded, split_counts

FAILS_ABOVE = 2


class FailsOnBigPieces:
    """Wraps a model; logits/probabilities raise for pieces of more than FAILS_ABOVE rows."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _check(self, x):
        if x.shape[0] > FAILS_ABOVE:
            raise RuntimeError(f"injected failure for a piece of {x.shape[0]} rows")

    def logits(self, x):
        self._check(x)
        return self._model.logits(x)

    def probabilities(self, x):
        self._check(x)
        return self._model.probabilities(x)


def compare(sharded, x, names=("logits",)) -> dict:
    model = sharded._model  # rank 0's own model: the single-device reference
    report = {"n": int(x.shape[0])}
    for name in names:
        got, want = getattr(sharded, name)(x), getattr(model, name)(x)
        report[name] = {
            "shape": list(got.shape),
            "dtype": str(got.dtype),
            "max_abs_diff": float(np.abs(got - want).max()),
            "same_argmax": bool((got.argmax(1) == want.argmax(1)).all()),
        }
    return report


def serve(sharded, sizes, failing_rank) -> int:
    rng = np.random.default_rng(7)
    report = {"size": sharded.size, "device_name": sharded.device_name, "max_batch_size": sharded.max_batch_size,
              "ranks": sharded.ranks, "batches": [], "empty_shape": list(sharded.logits(
                  np.zeros((0, 3, 224, 224), np.float32)).shape)}
    for n in sizes:  # probabilities on the largest batch only (CI time)
        names = ("logits", "probabilities") if n == max(sizes) else ("logits",)
        report["batches"].append(compare(sharded, rng.standard_normal((n, 3, 224, 224)).astype(np.float32), names))
    big = next(n for n in range(1, 64) if split_counts(n, sharded.size)[failing_rank] > FAILS_ABOVE)
    try:
        sharded.probabilities(rng.standard_normal((big, 3, 224, 224)).astype(np.float32))
        report["failure"] = None
    except ShardError as exc:
        report["failure"] = {"n": big, "message": str(exc)}
    report["after_failure"] = compare(sharded, rng.standard_normal((sharded.size, 3, 224, 224)).astype(np.float32))
    print(json.dumps(report), flush=True)
    return 0


def main() -> int:
    weights, sizes, failing_rank = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    if MPI.COMM_WORLD.Get_rank() == failing_rank:
        real = binding.load_model
        binding.load_model = lambda *args: FailsOnBigPieces(real(*args))
    return run_sharded(lambda model: serve(model, sizes, failing_rank), weights, device="cpu", max_batch_size=4)


if __name__ == "__main__":
    sys.exit(main())
