"""The remote backend of an HTTP front-end process: readiness, admission and results come from the engine process
over the link (`engine_link.EngineClient`), or from one engine process per device (`routing.EngineRouter`);
uploads are decoded here, into the crops or images the engines' device workers take: small ones on the event loop
(`inline`), the others in this process's decoding threads."""

from functools import partial
import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ...modelinput import ModelInput
from ..metrics import Metrics
from ..scheduling.devicedecode import DEVICE_MODES, encoded_here, encoded_or_decoded, note_cpu
from ..scheduling.errors import Unavailable
from ..scheduling.imaging import decode_and_crop, decode_for_engine
from ..settings import Settings
from .admission import SharedCount
from .engine_link import EngineClient
from .inline import decodes_inline
from .routing import EngineRouter


class RemoteBackend:
    def __init__(self, settings: Settings, metrics: Metrics, address: str | tuple[str, ...], authkey: bytes,
                 index: int, shared: SharedCount | None = None):
        """`address`: the engine's Unix socket, or one per engine process (as many as settings.engine_count).
        `shared`: the server's admission count, which --max-queue bounds over every front end (`admission`); without
        it (a front end alone, in tests) this front end admits up to --max-queue by itself."""
        self.settings = settings
        self.metrics = metrics
        self.index = index
        if isinstance(address, str) or len(address) == 1:
            address = address if isinstance(address, str) else address[0]
            self.engine = EngineClient(address, authkey, settings.max_queue, metrics, index, shared=shared)
        else:
            self.engine = EngineRouter(list(address), authkey, settings.max_queue, metrics, index, shared=shared,
                                       devices=settings.devices)
        self.pool: ThreadPoolExecutor | None = None
        self.on_change: Callable[[], None] = lambda: None
        self.on_all_dead: Callable[[str], None] = lambda reasons: None

    @property
    def queue(self):
        return self.engine.queue

    def start(self) -> None:
        """Start the decoding threads and connect to the engine."""
        self.pool = ThreadPoolExecutor(self.settings.preprocess_threads, thread_name_prefix="vggserve-preprocess")
        self.engine.connect()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.engine.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def readiness(self) -> tuple[bool, str, str]:
        state = self.engine.state
        if state is None:
            return False, "not_ready", "waiting for the engine process"
        return tuple(state["ready"])

    def liveness(self) -> tuple[bool, str]:
        state = self.engine.state
        return (True, "serving") if state is None else tuple(state["live"])

    def admit(self) -> None:
        state = self.engine.state
        if state is None:
            raise Unavailable("not_ready", "the engine process has not answered yet; retry in a moment")
        if state["refusal"] is not None:
            raise state["refusal"]

    def model_info(self) -> dict:
        return (self.engine.state or {}).get("info") or {}

    def devices(self) -> list[dict]:
        return []

    def weights_sha256(self) -> str | None:
        return None

    async def describe(self, metadata: Callable[[], dict]) -> dict:
        """The engine's metadata, and which front end answered."""
        described = await self.engine.call("metadata")
        described["frontend"] = {"index": self.index, "pid": os.getpid()}
        return described

    async def prepare(self, data: bytes) -> tuple[ModelInput, float]:
        """(crop or image, seconds): the engine resizes on its device when it can (images), else it gets crops, and
        normalises them. With --decode gpu|auto and an engine that decodes on its device, a JPEG it takes goes to
        it as it is, compressed (`devicedecode`), decided on the event loop (`encoded_here`)."""
        info = self.model_info()
        task = decode_for_engine if info.get("resizes_on_device") else decode_and_crop
        if self.settings.decode in DEVICE_MODES:
            note = note_cpu(self.metrics)
            if info.get("decodes_on_device"):
                taken = encoded_here(data, info.get("preprocessing", "torchvision"), self.settings.max_pixels)
                if isinstance(taken, tuple):  # the JPEGs the device takes need no decoding thread
                    return taken
                task = partial(encoded_or_decoded, task=task, note=note, why=taken)
            else:
                note("no_device")
        return await self.run(partial(task, data, info.get("preprocessing", "torchvision"), self.settings.max_pixels,
                                      decode=self.settings.cpu_decode), data)

    async def run(self, task: Callable[[], tuple[ModelInput, float]], data: bytes) -> tuple[ModelInput, float]:
        """task(): on the event loop for a small upload (`inline.decodes_inline`: the thread hop would cost more
        than the decode), in a decoding thread otherwise."""
        if decodes_inline(data):
            return task()
        return await asyncio.get_running_loop().run_in_executor(self.pool, task)
