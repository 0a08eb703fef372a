"""`vggserve batch` on stand-in models that only sleep: rank 0's model takes SLOW seconds per batch, every other
rank's FAST seconds (the weights file is found as usual but never read).

    mpiexec -n 3 python batch_with_standin_models.py SLOW FAST --weights W --input DIR --output OUT --summary S

Used by tests/test_batch_mpi.py to check that a rank 0 busy in its own chunks still feeds the other ranks.
"""

import sys

import numpy as np
from mpi4py import MPI

import vggserve.distributed.binding as binding
from vggserve.cli import main


class SleepingModel:
    """Probability 1 on class 0 for every image, after sleeping `seconds` per call (GIL released, like a device)."""

    preprocessing = "torchvision"

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.device_name = f"stand-in ({seconds} s per batch)"

    def probabilities(self, x):
        import time

        time.sleep(self.seconds)
        probs = np.zeros((x.shape[0], 1000), np.float32)
        probs[:, 0] = 1.0
        return probs

    def close(self):
        pass


if __name__ == "__main__":
    slow, fast = float(sys.argv[1]), float(sys.argv[2])
    seconds = slow if MPI.COMM_WORLD.Get_rank() == 0 else fast
    binding.load_model = lambda *args: SleepingModel(seconds)
    sys.exit(main(["batch", *sys.argv[3:]]))
