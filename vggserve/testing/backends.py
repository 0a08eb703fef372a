"""A stand-in backend for the service (`Service(settings, backend=InstantBackend(settings, metrics))`): ready at once,
`prepare` answers a fixed crop without decoding anything (in the event loop, or with `hop`, through a thread as a
front end's decode goes), and its queue answers every image at once with fixed probabilities. What is left of a
request's CPU is the HTTP layer's: uvicorn, the middlewares, the routes, the pipeline and the JSON answer
(benchmarks/frontend_overhead.py). Like the front ends' RemoteBackend it computes nothing itself."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..modelinput import ModelInput
from ..predictions import softmax
from ..serving.scheduling.batcher import Item, Outcome
from ..weights.spec import NUM_CLASSES


class InstantQueue:
    """The queue's interface (admit, submit, withdraw, release); every submitted image is answered at once."""

    admitted = 0  # images admitted and not answered: none, every image is answered as it is submitted

    def __init__(self, outcome: Outcome):
        self.outcome = outcome

    def __len__(self) -> int:
        return 0

    def admit(self, n: int) -> None:
        pass

    def release(self, n: int) -> None:
        pass

    def submit(self, image: ModelInput, deadline: float, want_logits: bool = False) -> Item:
        item = Item(image, deadline, want_logits)
        item.future.set_result(self.outcome)
        return item

    def withdraw(self, item: Item, error) -> bool:
        return False


class InstantBackend:
    """The backend interface of `scheduling.local.LocalBackend` and `processes.remote.RemoteBackend`, computing
    nothing: see the module's docstring."""

    def __init__(self, settings, metrics=None, hop: bool = False, seed: int = 0):
        self.settings = settings
        logits = np.random.default_rng(seed).standard_normal(NUM_CLASSES).astype(np.float32)
        self.queue = InstantQueue(Outcome(softmax(logits[None])[0], 0.0, 0.0, 1, "instant", logits))
        self.input = ModelInput.crop(np.zeros((224, 224, 3), np.uint8))
        self.hop = hop
        self.pool: ThreadPoolExecutor | None = None
        self.on_change: Callable[[], None] = lambda: None
        self.on_all_dead: Callable[[str], None] = lambda reasons: None

    def start(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="vggserve-preprocess") if self.hop else None
        self.on_change()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def readiness(self) -> tuple[bool, str, str]:
        return True, "ready", "ready"

    def liveness(self) -> tuple[bool, str]:
        return True, "serving"

    def admit(self) -> None:
        pass

    def model_info(self) -> dict:
        return {"preprocessing": "torchvision", "precision": "fp32", "device_name": "instant stand-in"}

    def devices(self) -> list[dict]:
        return [{"device": "instant", "state": "ready"}]

    def weights_sha256(self) -> str | None:
        return None

    async def describe(self, metadata: Callable[[], dict]) -> dict:
        return metadata()

    def _prepared(self, data: bytes) -> tuple[ModelInput, float]:
        return self.input, 0.0

    async def prepare(self, data: bytes) -> tuple[ModelInput, float]:
        if self.pool is None:
            return self._prepared(data)
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._prepared, data)
