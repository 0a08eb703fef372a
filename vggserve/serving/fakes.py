"""Stand-in models with the engine's interface, for tests and demos of the service without OpenCL.

`ReferenceModel` computes real VGG16 scores with the float32 numpy reference (slow but exact); `SlowModel`
returns fixed scores after sleeping, to make queues fill and deadlines pass on purpose. `crash_on_marker` is a
preprocessing-process task whose worker dies on a marker upload (`service.preprocess_task = crash_on_marker`).
"""

import os
import time

import numpy as np

from ..predictions import softmax
from ..weights.spec import NUM_CLASSES


class ReferenceModel:
    """VGG16 on numpy (float32) from torchvision-named tensors."""

    preprocessing = "torchvision"

    def __init__(self, tensors: dict, device: str = "cpu", max_batch_size: int = 16):
        self.tensors = tensors
        self.device_name = f"numpy reference ({device})"
        self.max_batch_size = max_batch_size
        self.weights_info = {"path": None, "format": "memory", "sha256": None}
        self.batch_sizes: list[int] = []

    def logits(self, x: np.ndarray) -> np.ndarray:
        from ..model.reference import reference_logits

        self.batch_sizes.append(len(x))
        return reference_logits(self.tensors, x, dtype=np.float32).astype(np.float32)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return softmax(self.logits(x))

    def close(self) -> None:
        pass


class SlowModel:
    """Sleeps `seconds_per_batch` per batch and scores class (sum of the image's pixels) mod 1000 highest;
    `fail_after` batches, raises RuntimeError (a dying device)."""

    preprocessing = "torchvision"

    def __init__(self, device: str = "cpu", seconds_per_batch: float = 0.2, max_batch_size: int = 16,
                 load_seconds: float = 0.0, fail_after: int | None = None):
        time.sleep(load_seconds)
        self.device_name = f"sleeping stand-in ({device})"
        self.seconds_per_batch = seconds_per_batch
        self.max_batch_size = max_batch_size
        self.fail_after = fail_after
        self.weights_info = {"path": None, "format": "memory", "sha256": None}
        self.batch_sizes: list[int] = []

    def logits(self, x: np.ndarray) -> np.ndarray:
        if self.fail_after is not None and len(self.batch_sizes) >= self.fail_after:
            raise RuntimeError("simulated device failure")
        self.batch_sizes.append(len(x))
        time.sleep(self.seconds_per_batch)
        out = np.zeros((len(x), NUM_CLASSES), dtype=np.float32)
        winners = np.abs(np.asarray(x, dtype=np.float64)).reshape(len(x), -1).sum(axis=1).astype(np.int64) % NUM_CLASSES
        out[np.arange(len(x)), winners] = 10.0
        return out

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        return softmax(self.logits(x))

    def close(self) -> None:
        pass


CRASH_MARKER = b"vggserve: crash this worker"


def crash_on_marker(data: bytes, mode: str, max_pixels: int, formats):
    """`imaging.decode_and_crop`, except that the worker process dies at once (as a crashing decoder would) when
    the upload starts with CRASH_MARKER."""
    from .imaging import decode_and_crop

    if bytes(data[:len(CRASH_MARKER)]) == CRASH_MARKER:
        os._exit(70)
    return decode_and_crop(data, mode, max_pixels, formats)
